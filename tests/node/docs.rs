//! The docs a newcomer reads first stay true to the code: the module map in
//! docs/architecture.md names every source file, and every file it names
//! exists; README names the two set-up commands and only docs that exist;
//! docs/dra.md lists every flag, probe and metric of the DRA driver.

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

/// docs/dra.md's reference section, where every flag, probe and metric of
/// the driver is listed.
fn dra_reference() -> String {
    let doc = fs::read_to_string(root().join("docs/dra.md")).unwrap();
    doc.split("\n## Flags, probes and metrics\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/dra.md has a '## Flags, probes and metrics' section")
        .to_string()
}

/// The long flags `nodefabric-dra --help` prints, as a reader sees them.
fn dra_help_flags() -> Vec<String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nodefabric-dra"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::trim_start)
        // A flag's own line: `-h, --help` and `--node-name <NAME>` alike;
        // help text that names a flag does not start with one.
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("--")))
        .map(|w| w.trim_end_matches(',').trim_start_matches("--").to_string())
        .filter(|f| f != "help" && f != "version")
        .collect()
}

#[test]
fn docs_dra_lists_every_flag_of_the_driver_with_its_environment_variable_and_default() {
    use clap::CommandFactory;
    let reference = dra_reference();
    let command = nodefabric::dra::cli::DraCli::command();
    let flags = dra_help_flags();
    assert!(flags.len() >= 16, "--help lists {flags:?}");
    for flag in &flags {
        let row = reference
            .lines()
            .find(|l| l.starts_with(&format!("| `--{flag}` |")))
            .unwrap_or_else(|| panic!("docs/dra.md has no table row for --{flag}"));
        assert!(
            reference.contains(&format!("[--{flag}")) || reference.contains(&format!(" --{flag} ")),
            "docs/dra.md's synopsis lacks --{flag}"
        );
        let arg = command
            .get_arguments()
            .find(|a| a.get_long() == Some(flag.as_str()))
            .unwrap();
        if let Some(env) = arg.get_env() {
            let env = env.to_str().unwrap();
            assert!(
                row.contains(&format!("`{env}`")),
                "--{flag}: {env} not in {row}"
            );
        }
        for default in arg.get_default_values() {
            let default = default.to_str().unwrap();
            assert!(
                row.contains(&format!("`{default}`")),
                "--{flag}: default {default} not in {row}"
            );
        }
    }
}

#[test]
fn docs_dra_lists_every_probe_endpoint_and_every_metric_the_driver_registers() {
    use nodefabric::kubelet::probes::{Probes, ENDPOINTS};
    let reference = dra_reference();
    for path in ENDPOINTS {
        assert!(
            reference.contains(&format!("| `{path}`")),
            "docs/dra.md has no row for {path}"
        );
    }
    let observed = nodefabric::dra::metrics::Observed::new();
    // A labelled family is printed once it has a sample: one of each.
    observed.prepared(true, std::time::Duration::ZERO);
    observed.unprepared(true);
    observed.dropped_fields(&[]);
    let text = observed.metrics();
    // `# TYPE nodefabric_dra_<name> <type>`; a counter's samples end `_total`.
    let mut metrics = 0;
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut words = line.split_whitespace().skip(2);
        let (name, kind) = (words.next().unwrap(), words.next().unwrap());
        let short = name.strip_prefix("nodefabric_dra_").unwrap();
        let shown = match kind {
            "counter" => format!("{short}_total"),
            _ => short.to_string(),
        };
        let row = reference
            .lines()
            .find(|l| l.starts_with(&format!("| `{shown}` |")))
            .unwrap_or_else(|| panic!("docs/dra.md has no row for the metric {name} ({shown})"));
        assert!(row.contains(kind), "{shown} is a {kind}: {row}");
        metrics += 1;
    }
    assert!(
        metrics >= 13,
        "the driver registers {metrics} metrics:\n{text}"
    );
}
