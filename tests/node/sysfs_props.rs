//! Property tests of root-confined resolution (`SysRoot`) against the
//! kernel's own: a tree of folders and files with relative links added at
//! random (links in the middle of paths, links climbing out of the root,
//! links to nothing, links to links, loops), asked random paths in random
//! order, twice each. Every
//! answer must match `fs::canonicalize` with a containment check: the same
//! canonical path inside the root, an escape refused, a missing path or a
//! dangling link an error. The fast paths (the pass's resolution cache, one
//! `openat2` for a target of several names, link texts parsed in place) may
//! only ever agree with that reference.
//!
//! Two of the names are not text as they are (a name may be any bytes but
//! `/` and NUL): `SysRoot` is asked by their escaped text, and answers in it.

use nodefabric::escape::{escape, path_text};
use nodefabric::sysfs::{SysError, SysRoot};
use proptest::prelude::*;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Names the generated paths are made of: folders `a`, `b`, `c<0xff>`
/// (every one of them to depth three, each holding a file `f`), and links
/// `l`, `m\` placed at random, so most asked paths exist and many pass links.
const NAMES: [&[u8]; 6] = [b"a", b"b", b"c\xff", b"f", b"l", b"m\\"];

/// The path on disk, relative.
fn disk_path_of(ix: &[usize]) -> PathBuf {
    ix.iter().map(|&i| OsStr::from_bytes(NAMES[i])).collect()
}

/// The path as `SysRoot` takes it: each name's text.
fn path_of(ix: &[usize]) -> String {
    ix.iter()
        .map(|&i| escape(NAMES[i]))
        .collect::<Vec<_>>()
        .join("/")
}

/// A link named `l` or `m` in the folder `at`, whose text climbs `up`
/// folders and then names `rest`.
#[derive(Debug, Clone)]
struct Link {
    at: Vec<usize>,
    name: usize,
    up: usize,
    rest: Vec<usize>,
}

fn link() -> impl Strategy<Value = Link> {
    (
        prop::collection::vec(0usize..3, 0..3),
        4usize..6,
        0usize..5,
        prop::collection::vec(0usize..3, 0..3),
        prop::option::weighted(0.4, 3usize..6),
    )
        .prop_map(|(at, name, up, mut rest, last)| {
            rest.extend(last);
            if rest.is_empty() {
                rest.push(0);
            }
            Link { at, name, up, rest }
        })
}

/// An asked path: folders, then (mostly) a link, more folders, and the file.
fn query() -> impl Strategy<Value = Vec<usize>> {
    (
        prop::collection::vec(0usize..3, 0..3),
        prop::option::weighted(0.8, 4usize..6),
        prop::collection::vec(0usize..3, 0..3),
        any::<bool>(),
    )
        .prop_map(|(mut q, link, more, file)| {
            q.extend(link);
            q.extend(more);
            if file || q.is_empty() {
                q.push(3);
            }
            q
        })
}

/// Builds the tree: the full folder tree first, then the links; a link
/// whose place is taken already (or whose folder is itself a link) is left
/// out, as the order of creation decides.
fn build(root: &Path, links: &[Link]) {
    for d1 in 0..3 {
        for d2 in 0..3 {
            for d3 in 0..3 {
                fs::create_dir_all(root.join(disk_path_of(&[d1, d2, d3]))).unwrap();
                for p in [vec![d1], vec![d1, d2], vec![d1, d2, d3]] {
                    fs::write(root.join(disk_path_of(&p)).join("f"), "7\n").unwrap();
                }
            }
        }
    }
    for l in links {
        let folder = root.join(disk_path_of(&l.at));
        let at = folder.join(OsStr::from_bytes(NAMES[l.name]));
        if fs::symlink_metadata(&at).is_err() {
            let mut text: PathBuf = std::iter::repeat_n("..", l.up).collect();
            text.push(disk_path_of(&l.rest));
            let _ = std::os::unix::fs::symlink(text, at);
        }
    }
}

/// The tree of [`build`] one folder down in a temporary folder, so that a
/// climb out of it lands somewhere real (a folder and a file outside);
/// the folder (removed on drop) and the tree's canonical root.
fn tree(links: &[Link]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root: PathBuf = fs::canonicalize(dir.path()).unwrap().join("sys");
    fs::create_dir(&root).unwrap();
    fs::create_dir_all(dir.path().join("a/b")).unwrap();
    fs::write(dir.path().join("a/f"), "outside\n").unwrap();
    build(&root, links);
    (dir, root)
}

/// What the kernel says `rel` resolves to, in `SysRoot`'s terms.
#[derive(Debug, PartialEq)]
enum Answer {
    Inside(String),
    Escapes,
    Missing,
}

fn reference(root: &Path, rel: &Path) -> Answer {
    match fs::canonicalize(root.join(rel)) {
        Ok(p) => match p.strip_prefix(root) {
            Ok(r) => Answer::Inside(path_text(r).into_owned()),
            Err(_) => Answer::Escapes,
        },
        Err(_) => Answer::Missing,
    }
}

fn ours(sys: &SysRoot, rel: &str) -> Answer {
    match sys.resolve(rel) {
        Ok(p) => Answer::Inside(p),
        Err(SysError::Escapes { .. }) => Answer::Escapes,
        Err(_) => Answer::Missing,
    }
}

proptest! {
    // Failures are kept beside this file: proptest's default looks for the
    // folder above the nearest main.rs (tests/proptest-regressions/).
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(
            prop::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn resolution_agrees_with_the_kernel(
        links in prop::collection::vec(link(), 4..32),
        queries in prop::collection::vec(query(), 1..32),
    ) {
        let (_dir, root) = tree(&links);
        let sys = SysRoot::new(&root).unwrap();
        // Twice over: the second round answers from what the first cached.
        for round in 0..2 {
            for q in &queries {
                let rel = path_of(q);
                let want = reference(&root, &disk_path_of(q));
                prop_assert_eq!(&ours(&sys, &rel), &want, "round {}: resolve {}", round, rel);
                // A read lands where resolution does, or fails as it does.
                let read = sys.read(&rel);
                match &want {
                    Answer::Inside(_) if root.join(disk_path_of(q)).is_file() => prop_assert_eq!(read.ok(), Some("7\n".to_string()), "read {}", rel),
                    Answer::Escapes => prop_assert!(matches!(read, Err(SysError::Escapes { .. })), "read {} escaped: {:?}", rel, read),
                    _ => prop_assert!(read.is_err(), "read {}: {:?}", rel, read),
                }
                prop_assert_eq!(sys.exists(&rel), matches!(want, Answer::Inside(_)), "exists {}", rel);
            }
        }
    }

    /// While a tree presumes link targets plain (see `sysfs::trust`), an
    /// answer may be wrong only if settling then says a presumption failed:
    /// discovery reads the tree again whenever it does, so no wrong answer
    /// is ever kept. Asked the same way, a tree that settles answered as
    /// the kernel does.
    #[test]
    fn a_presumed_answer_is_right_or_settling_says_it_may_not_be(
        links in prop::collection::vec(link(), 4..32),
        queries in prop::collection::vec(query(), 1..32),
    ) {
        let (_dir, root) = tree(&links);
        let sys = SysRoot::new(&root).unwrap();
        sys.presume();
        let mut wrong = Vec::new();
        for round in 0..2 {
            for q in &queries {
                let rel = path_of(q);
                let want = reference(&root, &disk_path_of(q));
                let got = ours(&sys, &rel);
                // The first read beneath an answer proves it, as discovery reads.
                if let Answer::Inside(at) = &got {
                    if let Some((folder, name)) = at.rsplit_once('/') {
                        let _ = sys.read_trimmed_proving(folder, name);
                    }
                }
                if got != want {
                    wrong.push(format!("round {round}: {rel}: {got:?}, the kernel {want:?}"));
                }
            }
        }
        let held = sys.settle();
        prop_assert!(wrong.is_empty() || !held, "settled though wrong: {:#?}", wrong);
    }
}
