//! The floor `nodefabric features` is timed against: a C program that reads
//! exactly what one discovery pass reads, taken from an strace of
//! nodefabric itself, each file and link once, and nothing else.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::strace::{self, Trace};

/// The floor's source, after [`READ_LIST`]. Its manifest holds one path a
/// line under the root given second, `F` (open, read, close) or `L`
/// (readlink) before it, and is read by `read_list` (four calls); each file
/// is read until a short read (sysfs attributes and tmpfs files return all
/// they hold at once, as nodefabric also assumes), and any path that cannot
/// be read stops it with status 1, so a floor that exits 0 read every path.
/// Dynamic, so it pays one ordinary process start as nodefabric does.
const SOURCE: &str = r#"
#include <string.h>
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    char *list = read_list(argv[1]);
    if (!list) return 1;
    size_t root = strlen(argv[2]);
    static char path[8192], buf[65536];
    if (root + 2 >= sizeof path) return 1;
    memcpy(path, argv[2], root);
    path[root] = '/';
    size_t total = 0;
    for (char *line = list; *line;) {
        char *end = strchr(line, '\n');
        if (!end) end = line + strlen(line);
        size_t len = end - line - 1;
        if (root + 1 + len >= sizeof path) return 1;
        memcpy(path + root + 1, line + 1, len);
        path[root + 1 + len] = 0;
        if (line[0] == 'L') {
            ssize_t n = readlink(path, buf, sizeof buf);
            if (n <= 0) return 1;
            total += n;
        } else {
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0) return 1;
            ssize_t n;
            while ((n = read(fd, buf, sizeof buf)) == sizeof buf) total += n;
            if (n < 0) return 1;
            total += n;
            close(fd);
        }
        line = *end ? end + 1 : end;
    }
    return total == (size_t)-1;
}
"#;

/// What every C program of these benches starts with: `_GNU_SOURCE` (the
/// replayer's `openat2` needs it) and `read_list`, which reads a list file
/// whole with one `read`: open, fstat, read, close, the program's whole
/// bookkeeping.
const READ_LIST: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
static char *read_list(const char *path) {
    int m = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (m < 0 || fstat(m, &st) != 0) return 0;
    char *list = malloc(st.st_size + 1);
    if (!list || read(m, list, st.st_size) != st.st_size) return 0;
    close(m);
    list[st.st_size] = 0;
    return list;
}
"#;

/// Compiles [`READ_LIST`] and `body` into `dir/name` with the system C
/// compiler as anyone would build it (`cc -O2`, dynamic); the program's path.
pub fn compile(dir: &Path, name: &str, body: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    let bin = dir.join(name);
    fs::write(&src, format!("{READ_LIST}{body}")).unwrap();
    let status = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("cc (the benches' helper programs are C)");
    assert!(status.success(), "cc failed on {name}.c");
    bin
}

/// Compiles the floor into `dir`; the path of the program.
pub fn build(dir: &Path) -> PathBuf {
    compile(dir, "floor", SOURCE)
}

/// A generated tree, what `nodefabric features` read on it, and the
/// floor's list of that, written for it.
pub struct Site {
    /// Holds `sys/` (the tree), the list and the traces; removed on drop.
    pub dir: tempfile::TempDir,
    /// The tree, by its canonical path (as strace prints it).
    pub tree: PathBuf,
    /// nodefabric's run under strace.
    pub trace: Trace,
    /// What it read, each once, in its order (see [`reads_of_nodefabric`]).
    pub list: Vec<(String, bool)>,
    /// The list as the floor takes it.
    pub manifest: PathBuf,
}

/// [`Site`] for `fixtures::large(endpoints)`, on tmpfs (sysfs lives in
/// memory) where there is one.
pub fn site(endpoints: u32) -> Site {
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let tree = dir.path().canonicalize().unwrap().join("sys");
    crate::fixtures::large(&tree, endpoints);
    let (trace, list) = reads_of_nodefabric(&tree, &dir.path().join("nodefabric.strace"));
    let manifest = dir.path().join("manifest");
    fs::write(&manifest, manifest_text(&tree, &list)).unwrap();
    Site {
        dir,
        tree,
        trace,
        list,
        manifest,
    }
}

/// What `nodefabric features --sysfs-root root` read, from one run of it
/// under strace (`log` keeps the trace): each file it opened and each link
/// it read, by the path it named, in its order, each once. Panics when
/// strace is absent: a floor guessed from anything else is what this
/// replaced (a capture's list, which read 1,009 links nodefabric does not).
pub fn reads_of_nodefabric(root: &Path, log: &Path) -> (Trace, Vec<(String, bool)>) {
    let mut ours = Command::new(env!("CARGO_BIN_EXE_nodefabric"));
    ours.args(["features", "--sysfs-root", root.to_str().unwrap()]);
    let trace = strace::traced(&ours, log, root);
    let mut seen = HashSet::new();
    let list = trace
        .sequence
        .iter()
        .filter(|(p, link)| seen.insert((p.clone(), *link)))
        .cloned()
        .collect();
    (trace, list)
}

/// The manifest as the floor gets it, after checking that it is honest:
/// every path once, each one there and of the kind listed (a link read as
/// a link, a file read as a file).
pub fn manifest_text(root: &Path, list: &[(String, bool)]) -> String {
    let mut seen = HashSet::new();
    for (rel, link) in list {
        assert!(seen.insert(rel), "{rel} listed twice");
        let meta = fs::symlink_metadata(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        assert_eq!(meta.file_type().is_symlink(), *link, "{rel}: kind");
        assert!(*link || meta.is_file(), "{rel}: not a file");
    }
    list.iter()
        .map(|(p, link)| format!("{}{p}\n", if *link { "L" } else { "F" }))
        .collect()
}

/// How many times each path was read (opened as a file, or readlinked).
fn counts(t: &Trace) -> BTreeMap<(String, bool), usize> {
    let mut c = BTreeMap::new();
    for p in &t.sequence {
        *c.entry(p.clone()).or_insert(0) += 1;
    }
    c
}

/// One row per path shape: how many such paths, and how many opens (or
/// readlinks) of them each program made.
pub struct ShapeRow {
    pub shape: String,
    pub link: bool,
    pub paths: usize,
    pub ours: usize,
    pub floor: usize,
}

/// Compares the two traces path by path: the floor must have read each
/// path nodefabric read, as many times, and nothing else. Panics naming
/// the first path that differs; the per-shape counts when all agree.
pub fn same_reads(ours: &Trace, floor: &Trace) -> Vec<ShapeRow> {
    let (a, b) = (counts(ours), counts(floor));
    for (path, n) in &a {
        let m = b.get(path).copied().unwrap_or(0);
        assert_eq!(
            *n, m,
            "{path:?}: nodefabric read it {n} times, the floor {m}"
        );
    }
    for (path, m) in &b {
        assert!(
            a.contains_key(path),
            "{path:?}: the floor read it {m} times, nodefabric never"
        );
    }
    let mut rows: BTreeMap<(String, bool), ShapeRow> = BTreeMap::new();
    for ((path, link), n) in &a {
        let key = (strace::shape(path), *link);
        let row = rows.entry(key.clone()).or_insert(ShapeRow {
            shape: key.0,
            link: *link,
            paths: 0,
            ours: 0,
            floor: 0,
        });
        row.paths += 1;
        row.ours += n;
        row.floor += b[&(path.clone(), *link)];
    }
    rows.into_values().collect()
}
