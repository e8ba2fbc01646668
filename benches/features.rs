//! Benchmark: wall time and peak RSS of `nodefabric features` on generated
//! trees of 8, 512 and 4096 RDMA endpoints, beside a plain reader: a C
//! program that reads once each link and file a capture of the tree records
//! (what one pass reads), by path, with no checks; and beside the tools an
//! operator would run for the same view, `lstopo` (hwloc, reading the tree
//! through `HWLOC_FSROOT`) and `lspci -tv` (pciutils, through its sysfs
//! access method), when they are on PATH. Writes `docs/benchmarks.md`'s
//! discovery section. Run with `cargo bench --bench features`;
//! `-- --tree DIR N` only writes the N-endpoint tree, for profiling;
//! `-- --publish` measures the publisher's peak RSS at 10,000 endpoints
//! instead (see [`publish_memory`]); `-- --strace` counts both programs'
//! syscalls and compares the paths they open (see [`strace_counts`]).

#[path = "../tests/support/fixtures.rs"]
mod fixtures;
#[path = "support/proc.rs"]
mod proc_status;
#[path = "support/report.rs"]
mod report;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs per size below 1000 endpoints: a run at 8 endpoints lasts about
/// 2 ms on a machine whose load moves it by 10-30%, so the median needs many.
const RUNS: usize = 101;

/// One run of a command: wall time, peak RSS in KiB, what it printed.
struct Run {
    wall: Duration,
    rss_kib: i64,
    stdout: Vec<u8>,
}

/// `--measure PROG ARGS...`: runs PROG once as a child of this small
/// process, then prints `NANOS KIB` (its wall time and peak RSS) on stderr.
/// A child's ru_maxrss counts the memory of the process it was started
/// from (the kernel carries it over at exec), so a command started straight
/// from the bench would be charged the bench's own trees and manifests.
// The child is reaped by wait4(2) below, which clippy cannot see.
#[allow(clippy::zombie_processes)]
fn measure(args: &[String]) {
    let start = Instant::now();
    let child = Command::new(&args[0])
        .args(&args[1..])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: plain wait4 on our own child; rusage is a zeroed out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let wall = start.elapsed();
    assert_eq!(pid, child.id() as i32);
    eprintln!("{} {}", wall.as_nanos(), usage.ru_maxrss);
    std::process::exit(if status == 0 { 0 } else { 1 });
}

/// Runs `cmd` once through `--measure`; it must succeed.
fn measured(cmd: &Command) -> Run {
    let mut m = Command::new(std::env::current_exe().unwrap());
    m.arg("--measure")
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            m.env(k, v);
        }
    }
    let out = m.output().unwrap();
    assert!(out.status.success(), "{cmd:?} failed");
    let report = String::from_utf8(out.stderr).unwrap();
    let (nanos, kib) = report
        .trim()
        .rsplit_once('\n')
        .map_or(report.trim(), |(_, l)| l)
        .split_once(' ')
        .expect("NANOS KIB");
    Run {
        wall: Duration::from_nanos(nanos.parse().unwrap()),
        rss_kib: kib.parse().unwrap(),
        stdout: out.stdout,
    }
}

/// Runs `nodefabric features` once on `root`.
fn run_once(root: &Path) -> Run {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nodefabric"));
    c.args(["features", "--sysfs-root", root.to_str().unwrap()]);
    measured(&c)
}

/// What the plain reader touches: every link (read once) and every file
/// (opened and read once) that a capture of the tree records, which is
/// exactly what one discovery pass reads. Folders are not listed: the
/// plain reader knows its paths, discovery has to find them.
fn manifest(root: &Path) -> Vec<(String, bool)> {
    let o = Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .args([
            "capture",
            "--out",
            "-",
            "--sysfs-root",
            root.to_str().unwrap(),
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "capture failed");
    let mut out = Vec::new();
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(o.stdout.as_slice()));
    for e in tar.entries().unwrap() {
        let e = e.unwrap();
        let path = e.path().unwrap().to_string_lossy().into_owned();
        let Some(rel) = path.strip_prefix("sysfs/") else {
            continue;
        };
        match e.header().entry_type() {
            tar::EntryType::Symlink => out.push((rel.to_string(), true)),
            tar::EntryType::Regular => out.push((rel.to_string(), false)),
            _ => {}
        }
    }
    out
}

/// The plain reader: a C program that reads each path of a manifest once
/// (`L` a link's text, `F` a file's bytes), joined to a root, with nothing
/// else: what a hand-written reader of exactly those files costs. Built by
/// the bench with the system C compiler as anyone would build it (`cc -O2`,
/// dynamic), so it pays one ordinary process start as nodefabric does.
const PLAIN_C: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    FILE *list = fopen(argv[1], "r");
    if (!list) return 1;
    char line[4096], path[8192], buf[65536];
    size_t total = 0;
    while (fgets(line, sizeof line, list)) {
        line[strcspn(line, "\n")] = 0;
        snprintf(path, sizeof path, "%s/%s", argv[2], line + 1);
        if (line[0] == 'L') {
            ssize_t n = readlink(path, buf, sizeof buf);
            if (n > 0) total += n;
        } else {
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0) continue;
            ssize_t n;
            while ((n = read(fd, buf, sizeof buf)) > 0) total += n;
            close(fd);
        }
    }
    fclose(list);
    return total == (size_t)-1;
}
"#;

/// Compiles [`PLAIN_C`] into `dir`; the path of the program.
fn build_plain(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("plain.c");
    let bin = dir.join("plain");
    fs::write(&src, PLAIN_C).unwrap();
    let status = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("cc (the plain reader is C)");
    assert!(status.success(), "cc failed on the plain reader");
    bin
}

/// The manifest as the plain reader gets it, after checking that it is
/// honest: every path once, each one there and of the kind listed (a link
/// read as a link, a file read as a file).
fn checked_manifest(root: &Path, list: &[(String, bool)]) -> String {
    let mut seen = std::collections::HashSet::new();
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

/// The files `lspci -tv` opens for each PCI function on a real node (seen
/// with strace on a live /sys), in its order.
const LSPCI_READS: [&str; 7] = [
    "config",
    "vendor",
    "device",
    "class",
    "revision",
    "subsystem_vendor",
    "subsystem_device",
];

/// Checks that every PCI function of the tree has each file `lspci -tv`
/// reads on a real node: where one is missing, lspci skips what follows it
/// and is timed doing less than it would on any real node.
fn check_lspci_reads(root: &Path) {
    for entry in fs::read_dir(root.join("bus/pci/devices")).unwrap() {
        let dir = entry.unwrap().path();
        for name in LSPCI_READS {
            assert!(
                dir.join(name).is_file(),
                "{}: no {name}, which lspci -tv reads on a real node",
                dir.display()
            );
        }
    }
}

/// An operator's tool that shows the same tree: how to run it on `dir`
/// (which holds `sys/`), or `None` when it is not on PATH.
struct Tool {
    name: &'static str,
    run: fn(&Path) -> Option<Command>,
}

/// The first of `names` found on PATH.
fn on_path(names: &[&str]) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|n| {
        std::env::split_paths(&path)
            .map(|d| d.join(n))
            .find(|p| p.is_file())
    })
}

const TOOLS: [Tool; 2] = [
    Tool {
        name: "lstopo",
        run: |dir| {
            let mut c = Command::new(on_path(&["lstopo-no-graphics", "lstopo"])?);
            c.args(["--of", "console"]).env("HWLOC_FSROOT", dir);
            Some(c)
        },
    },
    Tool {
        name: "lspci -tv",
        run: |dir| {
            let mut c = Command::new(on_path(&["lspci"])?);
            c.arg("-tv")
                .args(["-A", "linux-sysfs", "-O"])
                .arg(format!("sysfs.path={}", dir.join("sys/bus/pci").display()));
            Some(c)
        },
    },
];

/// Runs a tool once; its wall time. It must succeed and print something,
/// or it did not read the tree.
fn tool_once(cmd: Command) -> Duration {
    let run = measured(&cmd);
    assert!(!run.stdout.is_empty(), "{cmd:?} printed nothing");
    run.wall
}

/// Runs the plain reader once.
fn plain_once(plain: &Path, manifest: &Path, root: &Path) -> Run {
    let mut c = Command::new(plain);
    c.arg(manifest).arg(root);
    measured(&c)
}

/// The tree sizes measured, in RDMA endpoints.
const SIZES: [u32; 3] = [8, 512, 4096];

/// Runs at the largest size, where each takes long enough to be steady.
const BIG_RUNS: usize = 9;

/// Start-up and size: `--version` of both binaries (parsing the command
/// line and printing one line: what every call pays before reading a file)
/// beside the C reader on an empty manifest (a process start and nothing
/// else), interleaved; and the size of each binary on disk.
fn startup(plain: &Path, dir: &Path) -> String {
    let empty = dir.join("empty");
    fs::write(&empty, "").unwrap();
    let lean = Path::new(env!("CARGO_BIN_EXE_nodefabric"));
    let full = Path::new(env!("CARGO_BIN_EXE_nodefabric-full"));
    let (mut l, mut f, mut p) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        l.push(measured(Command::new(lean).arg("--version")).wall);
        f.push(measured(Command::new(full).arg("--version")).wall);
        p.push(measured(Command::new(plain).arg(&empty).arg(dir)).wall);
    }
    let (l, f, p) = (median(l), median(f), median(p));
    let size = |b: &Path| fs::metadata(b).unwrap().len() as f64 / (1024.0 * 1024.0);
    println!("start-up: nodefabric {l:?}, nodefabric-full {f:?}, C reader {p:?}");
    format!(
        "Start-up, median of {RUNS} interleaved runs: `nodefabric --version` {:.2} ms ({:.2}x the C reader on an empty list, {:.2} ms), \
         `nodefabric-full --version` {:.2} ms ({:.2}x). Release binaries: `nodefabric` {:.1} MiB (static, non-PIE), `nodefabric-full` {:.1} MiB (dynamic, PIE); both unstripped.\n",
        l.as_secs_f64() * 1e3,
        l.as_secs_f64() / p.as_secs_f64(),
        p.as_secs_f64() * 1e3,
        f.as_secs_f64() * 1e3,
        f.as_secs_f64() / p.as_secs_f64(),
        size(lean),
        size(full),
    )
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The endpoints of the publisher's memory measurement.
const PUBLISH_ENDPOINTS: u32 = 10_000;
/// Passes of the long-running publisher measured: the first writes into
/// empty folders, each later one reads the record the one before it wrote.
const PUBLISH_PASSES: usize = 3;
/// The share of the memory limit a pass may peak at: the rest is the
/// margin for what the tree's shape or the allocator adds on a real node.
const PUBLISH_HEADROOM: f64 = 0.9;

/// The publisher's memory limit in MiB as `file` gives it: the first
/// `memory:` line under a `limits:` line, at or after the first line that
/// starts with `after` (`publisher:` in the chart's values, which lists
/// other components' limits too). Panics when there is none: a bench that
/// compared against a guessed limit would prove nothing.
fn memory_limit_mib(file: &str, after: &str) -> f64 {
    let text = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
    let mut lines = text.lines().skip_while(|l| !l.starts_with(after));
    lines.find(|l| l.trim() == "limits:");
    let value = lines
        .find_map(|l| l.trim().strip_prefix("memory:"))
        .unwrap_or_else(|| panic!("{file}: no memory limit after {after:?}"))
        .trim();
    if let Some(mi) = value.strip_suffix("Mi") {
        mi.parse().unwrap()
    } else if let Some(gi) = value.strip_suffix("Gi") {
        gi.parse::<f64>().unwrap() * 1024.0
    } else {
        panic!("{file}: memory limit {value:?} is not in Mi or Gi")
    }
}

/// `--publish`: `nodefabric-full publish --interval 1s` (the DaemonSet's
/// command, release binary) on the [`PUBLISH_ENDPOINTS`]-endpoint tree for
/// [`PUBLISH_PASSES`] passes, its peak RSS (VmHWM in /proc/PID/status, which
/// starts afresh at exec, so none of the bench's memory is in it) read as
/// each pass ends (the publisher logs `publish pass N finished` at debug
/// level), beside the memory limit that `deploy/nodefabric.yaml` and the
/// Helm chart give it. Prints `OVER LIMIT` when a pass peaks above
/// [`PUBLISH_HEADROOM`] of the lower limit. Writes the "Publisher at
/// 10,000 endpoints" section.
fn publish_memory() {
    use std::io::BufRead;
    let deploy = memory_limit_mib("deploy/nodefabric.yaml", "apiVersion: apps/v1");
    let chart = memory_limit_mib("charts/nodefabric/values.yaml", "publisher:");
    let limit = deploy.min(chart);
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let tree = dir.path().join("sys");
    fixtures::large(&tree, PUBLISH_ENDPOINTS);
    let out = |name: &str| dir.path().join(name);
    let mut child = Command::new(env!("CARGO_BIN_EXE_nodefabric-full"))
        .arg("--sysfs-root")
        .arg(&tree)
        .args(["--log-level", "debug", "publish", "--interval", "1s"])
        .arg("--features-dir")
        .arg(out("features.d"))
        .arg("--cdi-dir")
        .arg(out("cdi"))
        .arg("--state-dir")
        .arg(out("state"))
        .args(["--health-addr", "127.0.0.1:0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let started = Instant::now();
    let mut peaks = Vec::new();
    let mut failed = Vec::new();
    for line in std::io::BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.contains("publish pass failed") {
            failed.push(line.clone());
        }
        if line.contains("publish pass") && line.ends_with("finished") {
            peaks.push((proc_status::rss_kib(pid, "VmHWM:"), started.elapsed()));
            if peaks.len() == PUBLISH_PASSES {
                break;
            }
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(failed.is_empty(), "publisher passes failed: {failed:?}");
    assert_eq!(peaks.len(), PUBLISH_PASSES, "the publisher stopped early");
    // Other builds share this machine's cores: the load is stated, though
    // RSS depends only on what the process holds.
    let load = fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into());
    let size = |rel: &str| fs::metadata(out(rel)).unwrap().len();
    let (record, spec) = (
        size("state/record.json"),
        size("cdi/nodefabric-rdma-vf.json"),
    );
    let mib = |kib: u64| kib as f64 / 1024.0;
    let peak = mib(peaks.iter().map(|(kib, _)| *kib).max().unwrap());
    let budget = limit * PUBLISH_HEADROOM;
    for (i, (kib, at)) in peaks.iter().enumerate() {
        println!(
            "publish --interval 1s, after pass {}: peak RSS {:.1} MiB ({:.0}% of the {limit:.0}Mi limit), {at:.2?} after start",
            i + 1,
            mib(*kib),
            100.0 * mib(*kib) / limit
        );
    }
    let verdict = if peak > budget {
        let loud = format!(
            "OVER LIMIT: the publisher peaks at {peak:.1} MiB, over {:.0}% of its {limit:.0}Mi limit ({budget:.1} MiB)",
            PUBLISH_HEADROOM * 100.0
        );
        println!(
            "\n{}\n{loud}\n{}\n",
            "!".repeat(loud.len()),
            "!".repeat(loud.len())
        );
        loud
    } else {
        let ok = format!(
            "within the limit: peak {peak:.1} MiB, {:.0}% of {limit:.0}Mi (the bench's bound: {:.0}%, {budget:.1} MiB)",
            100.0 * peak / limit,
            PUBLISH_HEADROOM * 100.0
        );
        println!("{ok}");
        ok
    };
    let rows: String = peaks
        .iter()
        .enumerate()
        .map(|(i, (kib, _))| {
            format!(
                "| after pass {} | {:.1} MiB | {:.0}% |\n",
                i + 1,
                mib(*kib),
                100.0 * mib(*kib) / limit
            )
        })
        .collect();
    let section = format!(
        "## Publisher at 10,000 endpoints: memory and output sizes\n\n\
         `cargo bench --bench features -- --publish`: `nodefabric-full publish --interval 1s` (the DaemonSet's command, release binary) \
         on the generated tree `fixtures::large({PUBLISH_ENDPOINTS})` (8 PFs, {} VFs, on /dev/shm) for {PUBLISH_PASSES} passes: \
         the first into empty folders, each later one over what the one before wrote (reading and parsing its record). \
         Peak RSS is the process's VmHWM (/proc/PID/status, fresh at exec, so none of the bench's memory), read as each pass ends \
         (the publisher logs `publish pass N finished` at debug level). Load average during the run: {load}, on 2 cores shared with \
         other builds; RSS does not depend on the load, only on what the process holds. Memory limit: {deploy:.0}Mi in `deploy/nodefabric.yaml`, {chart:.0}Mi in the chart's \
         `publisher.resources`; the bench's bound is {:.0}% of the lower, {budget:.1} MiB.\n\n\
         | VmHWM | MiB | share of the {limit:.0}Mi limit |\n|---|---|---|\n{rows}\n\
         Result: {verdict}. State record (`record.json`): {:.1} MiB ({record} bytes); partitioned CDI spec: {:.1} MiB ({spec} bytes). \
         The previous-record cap ({} MiB) is {:.1}x the record at {PUBLISH_ENDPOINTS} endpoints.\n",
        PUBLISH_ENDPOINTS - 8,
        PUBLISH_HEADROOM * 100.0,
        record as f64 / (1 << 20) as f64,
        spec as f64 / (1 << 20) as f64,
        nodefabric::publish::MAX_RECORD >> 20,
        nodefabric::publish::MAX_RECORD as f64 / record as f64,
    );
    report::write_section("Publisher at 10,000 endpoints", &section);
}

/// The syscalls `--strace` traces: every call that names a path (`%file`:
/// opens, `openat2`, stats, readlinks, exec), the stats of an fd
/// (`%fstat`), and the reads and directory listings, which name an fd.
const STRACE_SET: &str = "trace=%file,%fstat,read,readlink,readlinkat,openat,getdents64";

/// What one program did under strace, split by whether the path (or the
/// fd's path) is under the tree: outside it is start-up (the loader,
/// /proc, /etc, the plain reader's manifest).
#[derive(Default)]
struct Trace {
    total: usize,
    startup: usize,
    file_opens: usize,
    dir_opens: usize,
    /// `O_PATH` opens: a path resolved (checked), nothing read through it.
    path_opens: usize,
    failed_opens: usize,
    readlinks: usize,
    /// readlinks of what is not a link (EINVAL) or not there.
    failed_readlinks: usize,
    listings: usize,
    reads: usize,
    /// Other calls on paths or fds under the tree (stat, fstat, access).
    other: usize,
    /// Files (not folders) opened under the tree, as the path under the
    /// tree with every link resolved: one file reached by two names (a
    /// `class/` link and its `devices/` target) is one entry.
    opened: std::collections::BTreeSet<String>,
    /// Links read under the tree, by the link's own path with the links
    /// above it resolved.
    linked: std::collections::BTreeSet<String>,
    /// Paths of failed opens and readlinks, as named.
    failed: std::collections::BTreeSet<String>,
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
            "read" | "getdents64" | "fstat" => fd_path(args).map(str::to_string),
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
                }
            }
            "readlink" | "readlinkat" => {
                t.readlinks += 1;
                if failed {
                    t.failed_readlinks += 1;
                    t.failed.insert(rel);
                } else {
                    t.linked.insert(physical(Path::new(root), &rel, false));
                }
            }
            "getdents64" => t.listings += 1,
            "read" => t.reads += 1,
            _ => t.other += 1,
        }
    }
    t
}

/// Runs `cmd` under strace ([`STRACE_SET`], following threads, fds shown
/// with their paths), its log in `log`; the counts against `root`.
fn traced(cmd: &Command, log: &Path, root: &Path) -> Trace {
    let status = Command::new("strace")
        .args(["-f", "-y", "-e", STRACE_SET, "-o"])
        .arg(log)
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("strace (on PATH)");
    assert!(status.success(), "{cmd:?} under strace failed");
    count_trace(&fs::read_to_string(log).unwrap(), root)
}

/// The shape of a path: each PCI address `BDF`, each run of digits `N`.
fn shape(path: &str) -> String {
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
fn only_in(
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

/// `--strace`: `nodefabric features` (release) and the plain reader with
/// its manifest, once each under strace at 8 and 512 endpoints; their
/// syscall counts, and the paths under the tree one opens or readlinks
/// that the other does not. Writes the "Discovery under strace" section.
fn strace_counts() {
    let work = tempfile::tempdir().unwrap();
    let plain = build_plain(work.path());
    let mut rows = Vec::new();
    let mut diffs = Vec::new();
    for endpoints in [8, 512] {
        let dir = tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .unwrap();
        let tree = dir.path().canonicalize().unwrap().join("sys");
        fixtures::large(&tree, endpoints);
        let list = manifest(&tree);
        let manifest_file = dir.path().join("manifest");
        fs::write(&manifest_file, checked_manifest(&tree, &list)).unwrap();
        let mut ours = Command::new(env!("CARGO_BIN_EXE_nodefabric"));
        ours.args(["features", "--sysfs-root", tree.to_str().unwrap()]);
        let mut floor = Command::new(&plain);
        floor.arg(&manifest_file).arg(&tree);
        let a = traced(&ours, &dir.path().join("nodefabric.strace"), &tree);
        let b = traced(&floor, &dir.path().join("plain.strace"), &tree);
        for (name, t) in [("nodefabric features", &a), ("plain reader", &b)] {
            let row = format!(
                "| {endpoints} | {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                t.total,
                t.startup,
                t.file_opens,
                t.opened.len(),
                t.dir_opens,
                t.path_opens,
                t.failed_opens,
                t.readlinks,
                t.failed_readlinks,
                t.listings,
                t.reads,
                t.other
            );
            println!("{row}");
            rows.push(row);
        }
        let diff = format!(
            "- {endpoints} endpoints ({} paths in the manifest): files opened by nodefabric only: {}; by the plain reader only: {}. \
             Links read by nodefabric only: {}; by the plain reader only: {}. \
             Failed opens and readlinks: nodefabric {}; the plain reader {}.",
            list.len(),
            only_in(&a.opened, &b.opened),
            only_in(&b.opened, &a.opened),
            only_in(&a.linked, &b.linked),
            only_in(&b.linked, &a.linked),
            only_in(&a.failed, &Default::default()),
            only_in(&b.failed, &Default::default()),
        );
        println!("{diff}");
        diffs.push(diff);
    }
    let section = format!(
        "## Discovery under strace: `nodefabric features` and the plain reader, call by call\n\n\
         `cargo bench --bench features -- --strace`: each program once under `strace -f -y -e {STRACE_SET}` on the generated trees \
         (`fixtures::large`, tmpfs) at 8 and 512 endpoints: the release `nodefabric features --sysfs-root TREE` and the plain reader \
         with the manifest the timing bench gives it (a capture's files and links). A call whose path, or whose fd's path, is outside \
         the tree (the loader, /proc, /etc, and for the plain reader the reads of its manifest) counts as start-up; the rest are counted by kind. Opens are split into files, \
         folders (a folder is opened to list it) and `O_PATH` opens (a path resolved and checked, nothing read through it), failed opens apart from all three; \"distinct\" is the number of different files opened. Reads count `read` calls \
         on fds under the tree, end-of-file reads included. Files are compared as the file they reach, every link resolved \
         (nodefabric opens `class/infiniband_verbs/uverbs0/dev` through the link where the capture names the `devices/` path); \
         links by their own path, the links above them resolved. A failed readlink is EINVAL (a folder, not a link) or ENOENT \
         (absent); a failed open is ENOENT. The counts do not depend on load; one run of each is exact.\n\n\
         | endpoints | program | syscalls traced | start-up (outside the tree) | file opens | distinct files | folder opens | `O_PATH` opens | failed opens | readlinks (failed ones included) | failed readlinks | listings (getdents64) | reads | other calls in the tree |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n{}\n\n\
         Paths under the tree opened (as files) or readlinked by one and not the other:\n\n{}\n",
        rows.join("\n"),
        diffs.join("\n")
    );
    report::write_section("Discovery under strace", &section);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--publish") {
        return publish_memory();
    }
    if args.get(1).map(String::as_str) == Some("--strace") {
        return strace_counts();
    }
    if args.get(1).map(String::as_str) == Some("--measure") {
        return measure(&args[2..]);
    }
    // `--tree DIR N`: only write the N-endpoint tree, for profiling by hand
    // (`strace -c -f nodefabric features --sysfs-root DIR`).
    if args.get(1).map(String::as_str) == Some("--tree") {
        fixtures::large(
            Path::new(&args[2]),
            args[3].parse().expect("endpoint count"),
        );
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let plain = build_plain(work.path());
    let startup = startup(&plain, work.path());
    let mut rows = Vec::new();
    let mut medians = Vec::new();
    let mut absent: Vec<&str> = Vec::new();
    for endpoints in SIZES {
        let runs = if endpoints > 1000 { BIG_RUNS } else { RUNS };
        // sysfs lives in memory, so the tree does too (tmpfs) where available
        let dir = tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .unwrap();
        let tree = dir.path().join("sys");
        fixtures::large(&tree, endpoints);
        check_lspci_reads(&tree);
        let list = manifest(&tree);
        let manifest_file = dir.path().join("manifest");
        fs::write(&manifest_file, checked_manifest(&tree, &list)).unwrap();
        run_once(&tree); // warm the page cache
                         // Interleaved, so a change in machine load hits every side alike.
        let (mut times, mut floors, mut rss, mut plain_rss) = (Vec::new(), Vec::new(), 0, 0);
        let mut tool_times: Vec<Option<Vec<Duration>>> = TOOLS
            .iter()
            .map(|t| (t.run)(dir.path()).map(|_| Vec::new()))
            .collect();
        for round in 0..runs {
            // Which of the two goes first alternates: the one started right
            // after the tools (or after the other) pays for the caches they
            // left cold, and it must not always be the same one.
            let (ours, floor) = if round % 2 == 0 {
                let ours = run_once(&tree);
                (ours, plain_once(&plain, &manifest_file, &tree))
            } else {
                let floor = plain_once(&plain, &manifest_file, &tree);
                (run_once(&tree), floor)
            };
            times.push(ours.wall);
            rss = rss.max(ours.rss_kib);
            floors.push(floor.wall);
            plain_rss = plain_rss.max(floor.rss_kib);
            for (tool, acc) in TOOLS.iter().zip(&mut tool_times) {
                if let (Some(acc), Some(cmd)) = (acc, (tool.run)(dir.path())) {
                    acc.push(tool_once(cmd));
                }
            }
        }
        let (t, f) = (median(times), median(floors));
        medians.push((endpoints, t));
        let mut cells = Vec::new();
        for (tool, acc) in TOOLS.iter().zip(tool_times) {
            match acc {
                Some(v) => {
                    let m = median(v);
                    println!("{endpoints:>5} endpoints: {} {m:?}", tool.name);
                    cells.push(format!(
                        "{:.2} ({:.2}x)",
                        m.as_secs_f64() * 1e3,
                        t.as_secs_f64() / m.as_secs_f64()
                    ));
                }
                None => {
                    if !absent.contains(&tool.name) {
                        absent.push(tool.name);
                    }
                    cells.push("not on PATH".into());
                }
            }
        }
        println!("{endpoints:>5} endpoints: {t:?} (plain reader {f:?}, {} paths), peak RSS {rss} KiB (plain reader {plain_rss} KiB)", list.len());
        rows.push(format!(
            "| {endpoints} | {} | {:.2} | {:.2} | {:.2}x | {} | {:.1} ({:.1}) |",
            list.len(),
            t.as_secs_f64() * 1e3,
            f.as_secs_f64() * 1e3,
            t.as_secs_f64() / f.as_secs_f64(),
            cells.join(" | "),
            rss as f64 / 1024.0,
            plain_rss as f64 / 1024.0
        ));
    }
    let growth = |(a, ta): (u32, Duration), (b, tb): (u32, Duration)| {
        (tb.as_secs_f64() / ta.as_secs_f64()).ln() / (f64::from(b) / f64::from(a)).ln()
    };
    let missing = if absent.is_empty() {
        String::new()
    } else {
        format!(" Not on PATH on this run, so not measured: {} (see docs/benchmarking.md to install them).", absent.join(", "))
    };
    let section = format!(
        "## Discovery: `nodefabric features`\n\n\
         Generated trees (`tests/support/fixtures.rs::large`): 8 GPUs, 8 PFs, the rest VFs, on tmpfs (/dev/shm) as sysfs is in memory. \
         Each PCI function has, as on a real node, a `config` file and the `revision`, `subsystem_vendor` and `subsystem_device` attributes: the seven files `lspci -tv` opens per function (without these three, it read four: two opens failed and the third was not tried). \
         Median of {RUNS} runs ({BIG_RUNS} at 4096 endpoints) of the release binary, interleaved with the plain reader (which of the two goes first alternates from run to run) and the tools, each started and timed by a small measuring process (the bench binary again), so that its peak RSS from wait4(2) is its own: a process started straight from the bench would be charged the bench's own memory. \
         The plain reader is a C program (built by the bench with `cc -O2`, dynamic, as one would build it) that reads each link and each file a capture of the same tree records, once each, \
         by its path: no canonicalisation, no containment check, no listing of folders (the bench checks that list: each path once, of the kind read). \
         `lstopo` is hwloc's `lstopo-no-graphics --of console` with `HWLOC_FSROOT` at the tree; `lspci -tv` reads it with `-A linux-sysfs -O sysfs.path=TREE/bus/pci`; \
         each tool cell is its median and, in brackets, `features` time over the tool's (below 1 is faster).{missing} \
         The machine is shared with other builds, so figures move by 10-30% between runs; the ratios, taken from interleaved runs, move less. \
         Growth exponent of `features` from 8 to 4096 endpoints: {:.2}; from 512 to 4096: {:.2}.\n\n\
         | endpoints | paths read | wall ms | plain reader ms | ratio | lstopo ms | lspci -tv ms | peak RSS MiB (plain reader's) |\n|---|---|---|---|---|---|---|---|\n{}\n\n{startup}",
        growth(medians[0], medians[2]),
        growth(medians[1], medians[2]),
        rows.join("\n")
    );
    report::write_section("Discovery", &section);
}
