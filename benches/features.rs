//! Benchmark: wall time and peak RSS of `nodefabric features` on generated
//! trees of 8, 512 and 8192 RDMA endpoints, beside a plain reader: a process
//! that reads once each link and file a capture of the tree records (what
//! one pass reads), by path, with no checks; and beside the tools an
//! operator would run for the same view, `lstopo` (hwloc, reading the tree
//! through `HWLOC_FSROOT`) and `lspci -tv` (pciutils, through its sysfs
//! access method), when they are on PATH. Writes `docs/benchmarks.md`'s
//! discovery section. Run with `cargo bench --bench features`;
//! `-- --tree DIR N` only writes the N-endpoint tree, for profiling.

#[path = "../tests/support/fixtures.rs"]
mod fixtures;
#[path = "support/report.rs"]
mod report;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const RUNS: usize = 30;

/// Runs the binary once; returns (wall time, peak RSS in KiB) via wait4(2).
// The child is reaped by wait4(2) below, which clippy cannot see.
#[allow(clippy::zombie_processes)]
fn run_once(root: &Path) -> (Duration, i64) {
    let start = Instant::now();
    let child = Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .args(["features", "--sysfs-root", root.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: plain wait4 on our own child; rusage is a zeroed out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    assert_eq!(status, 0, "nodefabric features failed");
    (start.elapsed(), usage.ru_maxrss)
}

/// What the plain reader touches: every link (read once) and every file
/// (opened and read once) that a capture of the tree records, which is
/// exactly what one discovery pass reads. Folders are not listed: the
/// plain reader knows its paths, discovery has to find them.
fn manifest(root: &Path) -> Vec<(String, bool)> {
    let o = Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .args(["capture", "--out", "-", "--sysfs-root", root.to_str().unwrap()])
        .stderr(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "capture failed");
    let mut out = Vec::new();
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(o.stdout.as_slice()));
    for e in tar.entries().unwrap() {
        let e = e.unwrap();
        let path = e.path().unwrap().to_string_lossy().into_owned();
        let Some(rel) = path.strip_prefix("sysfs/") else { continue };
        match e.header().entry_type() {
            tar::EntryType::Symlink => out.push((rel.to_string(), true)),
            tar::EntryType::Regular => out.push((rel.to_string(), false)),
            _ => {}
        }
    }
    out
}

/// The plain reader's main: `--plain MANIFEST ROOT` (this bench binary
/// re-executed, so it pays one process start like nodefabric does).
fn plain(manifest: &Path, root: &Path) {
    let list = fs::read_to_string(manifest).unwrap();
    let mut bytes = 0usize;
    for line in list.lines() {
        let (kind, rel) = line.split_at(1);
        let p = root.join(rel);
        if kind == "L" {
            bytes += fs::read_link(&p).map(|t| t.as_os_str().len()).unwrap_or(0);
        } else {
            bytes += fs::read(&p).map(|b| b.len()).unwrap_or(0);
        }
    }
    std::hint::black_box(bytes);
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
    list.iter().map(|(p, link)| format!("{}{p}\n", if *link { "L" } else { "F" })).collect()
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
    names.iter().find_map(|n| std::env::split_paths(&path).map(|d| d.join(n)).find(|p| p.is_file()))
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
            c.arg("-tv").args(["-A", "linux-sysfs", "-O"]).arg(format!("sysfs.path={}", dir.join("sys/bus/pci").display()));
            Some(c)
        },
    },
];

/// Runs a tool once; its wall time. It must succeed and print something,
/// or it did not read the tree.
fn tool_once(mut cmd: Command) -> Duration {
    let start = Instant::now();
    let out = cmd.stderr(std::process::Stdio::null()).output().unwrap();
    let t = start.elapsed();
    assert!(out.status.success() && !out.stdout.is_empty(), "{cmd:?} failed");
    t
}

/// Runs the plain reader once as a process; its wall time.
fn plain_once(manifest: &Path, root: &Path) -> Duration {
    let start = Instant::now();
    let status = Command::new(std::env::current_exe().unwrap()).arg("--plain").arg(manifest).arg(root).status().unwrap();
    assert!(status.success());
    start.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--plain") {
        return plain(Path::new(&args[2]), Path::new(&args[3]));
    }
    // `--tree DIR N`: only write the N-endpoint tree, for profiling by hand
    // (`strace -c -f nodefabric features --sysfs-root DIR`).
    if args.get(1).map(String::as_str) == Some("--tree") {
        fixtures::large(Path::new(&args[2]), args[3].parse().expect("endpoint count"));
        return;
    }
    let mut rows = Vec::new();
    let mut medians = Vec::new();
    let mut absent: Vec<&str> = Vec::new();
    for endpoints in [8u32, 512, 8192] {
        let runs = if endpoints > 1000 { 7 } else { RUNS };
        // sysfs lives in memory, so the tree does too (tmpfs) where available
        let dir = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).unwrap();
        let tree = dir.path().join("sys");
        fixtures::large(&tree, endpoints);
        let list = manifest(&tree);
        let manifest_file = dir.path().join("manifest");
        fs::write(&manifest_file, checked_manifest(&tree, &list)).unwrap();
        run_once(&tree); // warm the page cache
        // Interleaved, so a change in machine load hits every side alike.
        let (mut times, mut floors, mut rss) = (Vec::new(), Vec::new(), 0);
        let mut tool_times: Vec<Option<Vec<Duration>>> = TOOLS.iter().map(|t| (t.run)(dir.path()).map(|_| Vec::new())).collect();
        for _ in 0..runs {
            let (t, r) = run_once(&tree);
            times.push(t);
            rss = rss.max(r);
            floors.push(plain_once(&manifest_file, &tree));
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
                    cells.push(format!("{:.2} ({:.2}x)", m.as_secs_f64() * 1e3, t.as_secs_f64() / m.as_secs_f64()));
                }
                None => {
                    if !absent.contains(&tool.name) {
                        absent.push(tool.name);
                    }
                    cells.push("not on PATH".into());
                }
            }
        }
        println!("{endpoints:>5} endpoints: {t:?} (plain reader {f:?}, {} paths), peak RSS {rss} KiB", list.len());
        rows.push(format!(
            "| {endpoints} | {} | {:.2} | {:.2} | {:.2}x | {} | {:.1} |",
            list.len(),
            t.as_secs_f64() * 1e3,
            f.as_secs_f64() * 1e3,
            t.as_secs_f64() / f.as_secs_f64(),
            cells.join(" | "),
            rss as f64 / 1024.0
        ));
    }
    let growth = |(a, ta): (u32, Duration), (b, tb): (u32, Duration)| (tb.as_secs_f64() / ta.as_secs_f64()).ln() / (f64::from(b) / f64::from(a)).ln();
    let missing = if absent.is_empty() {
        String::new()
    } else {
        format!(" Not on PATH on this run, so not measured: {} (see README, \"Benchmarks\", to install them).", absent.join(", "))
    };
    let section = format!(
        "## Discovery: `nodefabric features`\n\n\
         Generated trees (`tests/support/fixtures.rs::large`): 8 GPUs, 8 PFs, the rest VFs, a `config` file per PCI function, on tmpfs (/dev/shm) as sysfs is in memory. \
         Median of {RUNS} runs (7 at 8192 endpoints) of the release binary, interleaved with the plain reader and the tools; peak RSS from wait4(2). \
         The plain reader is a process that reads each link and each file a capture of the same tree records, once each, \
         by its path: no canonicalisation, no containment check, no listing of folders (the bench checks that list: each path once, of the kind read). \
         `lstopo` is hwloc's `lstopo-no-graphics --of console` with `HWLOC_FSROOT` at the tree; `lspci -tv` reads it with `-A linux-sysfs -O sysfs.path=TREE/bus/pci`; \
         each tool cell is its median and, in brackets, `features` time over the tool's (below 1 is faster).{missing} \
         The machine is shared with other builds, so figures move by 10-30% between runs; the ratios, taken from interleaved runs, move less. \
         Growth exponent of `features` from 8 to 8192 endpoints: {:.2}; from 512 to 8192: {:.2}.\n\n\
         | endpoints | paths read | wall ms | plain reader ms | ratio | lstopo ms | lspci -tv ms | peak RSS MiB |\n|---|---|---|---|---|---|---|---|\n{}\n",
        growth(medians[0], medians[2]),
        growth(medians[1], medians[2]),
        rows.join("\n")
    );
    report::write_section("Discovery", &section);
}
