//! The docs a newcomer reads first stay true to the code: the module map in
//! docs/architecture.md names every source file, and every file it names
//! exists; README names the two set-up commands and only docs that exist.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `src/`, as `src/…` paths.
fn sources(dir: &Path, out: &mut BTreeSet<String>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(root()).unwrap();
            out.insert(rel.to_string_lossy().into_owned());
        }
    }
}

#[test]
fn the_architecture_module_map_names_every_source_file_and_only_those() {
    let doc = fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let map = doc
        .split("## Module map")
        .nth(1)
        .and_then(|rest| rest.split("```").nth(1))
        .expect("docs/architecture.md has a Module map code block");
    let named: BTreeSet<String> = map
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.starts_with("src/"))
        .map(str::to_string)
        .collect();
    let mut actual = BTreeSet::new();
    sources(&root().join("src"), &mut actual);
    let missing: Vec<_> = actual.difference(&named).collect();
    let stale: Vec<_> = named.difference(&actual).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/architecture.md's module map lacks {missing:?} and names files that do not exist: {stale:?}"
    );
}

#[test]
fn readme_names_the_two_commands_and_links_only_docs_that_exist() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    assert!(readme.contains("\ncargo run --example demo\n"));
    assert!(readme.contains("\nbash scripts/test.sh\n"));
    let mut links = 0;
    for part in readme.split("](").skip(1) {
        let target = part.split(')').next().unwrap();
        if target.starts_with("http") {
            continue;
        }
        let file = target.split('#').next().unwrap();
        assert!(
            root().join(file).exists(),
            "README links {target}, which does not exist"
        );
        links += 1;
    }
    assert!(links >= 10, "README's docs map: {links} links");
}
