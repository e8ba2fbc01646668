//! Counts what a program does under strace, call by call, split by whether
//! each call touches the tree being read: the measure both of
//! `nodefabric features` and of the floor it is timed against.

use std::fs;
use std::path::Path;
use std::process::Command;

/// The syscalls `--strace` traces: every call that names a path (`%file`:
/// opens, `openat2`, stats, readlinks, exec), the stats of an fd
/// (`%fstat`), and the reads, directory listings and closes, which name
/// an fd.
pub const STRACE_SET: &str = "trace=%file,%fstat,read,readlink,readlinkat,openat,getdents64,close";

/// What one program did under strace, split by whether the path (or the
/// fd's path) is under the tree: outside it is start-up (the loader,
/// /proc, /etc, the plain reader's manifest).
#[derive(Default)]
pub struct Trace {
    pub total: usize,
    pub startup: usize,
    pub file_opens: usize,
    pub dir_opens: usize,
    /// `O_PATH` opens: a path resolved (checked), nothing read through it.
    pub path_opens: usize,
    pub failed_opens: usize,
    pub readlinks: usize,
    /// readlinks of what is not a link (EINVAL) or not there.
    pub failed_readlinks: usize,
    pub listings: usize,
    pub reads: usize,
    pub closes: usize,
    /// Other calls on paths or fds under the tree (stat, statfs, fstat).
    pub other: usize,
    /// What was read, in the order it was read: each successful open of a
    /// file (`false`) and readlink (`true`) under the tree, by the path the
    /// call named (relative to the tree). The floor reads this list.
    pub sequence: Vec<(String, bool)>,
    /// Files (not folders) opened under the tree, as the path under the
    /// tree with every link resolved: one file reached by two names (a
    /// `class/` link and its `devices/` target) is one entry.
    pub opened: std::collections::BTreeSet<String>,
    /// Links read under the tree, by the link's own path with the links
    /// above it resolved.
    pub linked: std::collections::BTreeSet<String>,
    /// Paths of failed opens and readlinks, as named.
    pub failed: std::collections::BTreeSet<String>,
}

/// The first `"..."` of `args`, unescaped only as far as sysfs names need.
fn quoted(args: &str) -> Option<&str> {
    let start = args.find('"')? + 1;
    let len = args[start..].find('"')?;
    Some(&args[start..start + len])
}

/// The path strace `-y` prints for an fd argument: `3</some/path>`.
fn fd_path(arg: &str) -> Option<&str> {
    let start = arg.find('<')? + 1;
    let end = arg[start..].find('>')?;
    Some(&arg[start..start + end])
}

/// The path a `*at` call names: `path` if absolute, else joined to the
/// dirfd's path (`AT_FDCWD` is the bench's own folder, never the tree).
fn at_path(args: &str) -> Option<String> {
    let path = quoted(args)?;
    if path.starts_with('/') {
        return Some(path.to_string());
    }
    let dir = fd_path(args.split(',').next()?).unwrap_or(".");
    Some(format!("{dir}/{path}"))
}

/// `rel` under `root` with every link resolved (`follow`) or those above
/// its last name only; `rel` itself when it cannot be resolved.
fn physical(root: &Path, rel: &str, follow: bool) -> String {
    let full = root.join(rel);
    let resolved = if follow {
        fs::canonicalize(&full).ok()
    } else {
        full.parent()
            .and_then(|p| fs::canonicalize(p).ok())
            .zip(full.file_name())
            .map(|(p, n)| p.join(n))
    };
    resolved
        .and_then(|r| {
            r.strip_prefix(root)
                .ok()
                .map(|r| r.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| rel.to_string())
}

/// Counts an `strace -f -y -o` log of one run against `root`.
fn count_trace(log: &str, root: &Path) -> Trace {
    let root = root.to_str().unwrap();
    let under = |p: &str| {
        p.strip_prefix(root)
            .and_then(|r| r.strip_prefix('/'))
            .map(str::to_string)
    };
    let mut t = Trace::default();
    for line in log.lines() {
        // "PID name(args) = ret"; exits, signals and resumed halves of
        // calls are not calls
        let Some((_, call)) = line.split_once(' ') else {
            continue;
        };
        let call = call.trim_start();
        if call.starts_with("+++") || call.starts_with("---") || call.starts_with("<...") {
            continue;
        }
        let Some((name, args)) = call.split_once('(') else {
            continue;
        };
        t.total += 1;
        let failed = call
            .rsplit_once(" = ")
            .is_some_and(|(_, r)| r.starts_with('-'));
        let path = match name {
            "read" | "getdents64" | "fstat" | "close" => fd_path(args).map(str::to_string),
            "open" | "readlink" | "execve" | "stat" | "lstat" | "access" => {
                quoted(args).map(str::to_string)
            }
            _ => at_path(args),
        };
        let Some(rel) = path.as_deref().and_then(under) else {
            t.startup += 1;
            continue;
        };
        match name {
            "open" | "openat" | "openat2" => {
                if failed {
                    t.failed_opens += 1;
                    t.failed.insert(rel);
                } else if args.contains("O_PATH") {
                    t.path_opens += 1;
                } else if Path::new(root).join(&rel).is_dir() {
                    t.dir_opens += 1;
                } else {
                    t.file_opens += 1;
                    t.opened.insert(physical(Path::new(root), &rel, true));
                    t.sequence.push((rel, false));
                }
            }
            "readlink" | "readlinkat" => {
                t.readlinks += 1;
                if failed {
                    t.failed_readlinks += 1;
                    t.failed.insert(rel);
                } else {
                    t.linked.insert(physical(Path::new(root), &rel, false));
                    t.sequence.push((rel, true));
                }
            }
            "getdents64" => t.listings += 1,
            "read" => t.reads += 1,
            "close" => t.closes += 1,
            _ => t.other += 1,
        }
    }
    t
}

/// Runs `cmd` under strace with `options` (which calls, how shown), its
/// log in `log`, in the environment a hook gets, not cargo's (see
/// `clean_env`); `cmd` must succeed.
pub fn run(cmd: &Command, options: &[&str], log: &Path) {
    let status = Command::new("strace")
        .args(options)
        .arg("-o")
        .arg(log)
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("strace (on PATH)");
    assert!(status.success(), "{cmd:?} under strace failed");
}

/// Runs `cmd` under strace ([`STRACE_SET`], following threads, fds shown
/// with their paths), its log in `log`; the counts against `root`.
pub fn traced(cmd: &Command, log: &Path, root: &Path) -> Trace {
    run(cmd, &["-f", "-y", "-e", STRACE_SET], log);
    count_trace(&fs::read_to_string(log).unwrap(), root)
}

/// The shape of a path: each PCI address `BDF`, each run of digits `N`.
pub fn shape(path: &str) -> String {
    path.split('/')
        .map(|seg| {
            if seg.matches(':').count() >= 2 {
                return "BDF".to_string();
            }
            let mut out = String::new();
            for c in seg.chars() {
                if !c.is_ascii_digit() {
                    out.push(c);
                } else if !out.ends_with('N') {
                    out.push('N');
                }
            }
            out
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// `a` less `b`: how many, how many of each shape, and the first few.
pub fn only_in(
    a: &std::collections::BTreeSet<String>,
    b: &std::collections::BTreeSet<String>,
) -> String {
    let d: Vec<&String> = a.difference(b).collect();
    if d.is_empty() {
        return "none".into();
    }
    let mut shapes = std::collections::BTreeMap::new();
    for p in &d {
        *shapes.entry(shape(p)).or_insert(0) += 1;
    }
    let shapes: Vec<String> = shapes.iter().map(|(s, n)| format!("{n} × `{s}`")).collect();
    let first: Vec<String> = d.iter().take(3).map(|p| format!("`{p}`")).collect();
    format!(
        "{} ({}; first: {})",
        d.len(),
        shapes.join(", "),
        first.join(", ")
    )
}
