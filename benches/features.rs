//! Benchmark: wall time and peak RSS of `nodefabric features` on generated
//! trees of 8, 512 and 4096 RDMA endpoints, beside its floor: a C program
//! that reads exactly the files and links nodefabric reads (the list taken
//! from an strace of nodefabric on the same tree), each once, by path, and
//! nothing else; and beside the tools an operator would run for the same
//! view, `lstopo` (hwloc, reading the tree through `HWLOC_FSROOT`) and
//! `lspci -tv` (pciutils, through its sysfs access method), when they are
//! on PATH. Writes `docs/benchmarks.md`'s discovery section. Run with
//! `cargo bench --bench features` (needs `strace` and `cc`);
//! `-- --tree DIR N` only writes the N-endpoint tree, for profiling;
//! `-- --publish` measures the publisher's peak RSS at 10,000 endpoints
//! instead (see [`publish_memory`]); `-- --strace` counts both programs'
//! syscalls and compares what they read path by path (see
//! [`strace_counts`]); `-- --replay` splits nodefabric's time over its floor
//! into the system calls it adds and its own work (see [`replay`]).

#[path = "../tests/support/fixtures.rs"]
mod fixtures;
#[path = "support/floor.rs"]
mod floor;
#[path = "support/proc.rs"]
mod proc_status;
#[path = "support/publish_memory.rs"]
mod publish_memory;
#[path = "support/replay.rs"]
mod replay;
#[path = "support/report.rs"]
mod report;
#[path = "support/strace.rs"]
mod strace;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Pairs (one run of each program, the order alternating) per size below
/// 1000 endpoints: a run at 8 endpoints lasts about 2 ms on a machine whose
/// load moves it by 10-30%, so the median needs many.
const RUNS: usize = 201;

/// Pairs at 512 endpoints, where a run lasts about 50 ms.
const MID_RUNS: usize = 61;

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
    clean_env(&mut m);
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

/// Gives `cmd` the environment a hook gets, not cargo's: `cargo bench`
/// sets `LD_LIBRARY_PATH` to a dozen build folders, and a dynamic program
/// started under it (the floor, the tools) searches each of them for libc
/// before finding it: about 250 failed opens, charged to the floor alone.
fn clean_env(cmd: &mut Command) {
    cmd.env_clear().env("PATH", "/usr/local/bin:/usr/bin:/bin");
}

/// The binaries timed, each a copy in `dir` beside the floor's: run from
/// `target/release`, as the linker wrote it, the same hook took 0.24 ms
/// longer at 8 endpoints (102 page faults a run against 86 for a copy),
/// which no installed hook pays: `install-hook` copies it into NFD's
/// `source.d`, and an image layer is written whole.
fn installed(dir: &Path) -> (PathBuf, PathBuf) {
    let copy = |built: &str, name: &str| {
        let to = dir.join(name);
        fs::copy(built, &to).unwrap();
        to
    };
    (
        copy(env!("CARGO_BIN_EXE_nodefabric"), "nodefabric"),
        copy(env!("CARGO_BIN_EXE_nodefabric-full"), "nodefabric-full"),
    )
}

/// Runs the hook binary `ours` (see [`installed`]) as `features` once on `root`.
fn run_once(ours: &Path, root: &Path) -> Run {
    let mut c = Command::new(ours);
    c.args(["features", "--sysfs-root", root.to_str().unwrap()]);
    measured(&c)
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

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Runs the floor once on `manifest` under `root`.
fn floor_once(floor: &Path, manifest: &Path, root: &Path) -> Run {
    let mut c = Command::new(floor);
    c.arg(manifest).arg(root);
    measured(&c)
}

/// The tree sizes measured, in RDMA endpoints.
const SIZES: [u32; 3] = [8, 512, 4096];

/// Pairs at the largest size, where each run takes long enough to be steady.
const BIG_RUNS: usize = 9;

/// The targets of issue #43: `features` over its floor, by size.
fn target(endpoints: u32) -> Option<f64> {
    match endpoints {
        8 => Some(1.4),
        512 => Some(1.3),
        _ => None,
    }
}

/// The machine's 1-minute load average, as /proc/loadavg gives it.
fn load() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

/// A program that does nothing, built static (`cc -O2 -static`): timing it
/// through the harness measures the harness itself (the measuring process's
/// spawn, exec and wait4), which every figure here includes.
fn build_empty(dir: &Path) -> PathBuf {
    let src = dir.join("empty.c");
    let bin = dir.join("empty");
    fs::write(&src, "int main(void) { return 0; }\n").unwrap();
    let status = Command::new("cc")
        .args(["-O2", "-static", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(
        status.success(),
        "cc -static failed (libc.a is in libc6-dev)"
    );
    bin
}

/// Start-up and size: `--version` of both binaries (parsing the command
/// line and printing one line: what every call pays before reading a file)
/// beside the floor on an empty manifest (a dynamic C program's start and
/// nothing else) and the empty static program (the harness alone),
/// interleaved; and the size of each binary on disk.
fn startup(floor: &Path, empty_prog: &Path, lean: &Path, full: &Path, dir: &Path) -> String {
    let empty = dir.join("empty-manifest");
    fs::write(&empty, "").unwrap();
    let (mut l, mut f, mut p, mut h) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        l.push(measured(Command::new(lean).arg("--version")).wall);
        f.push(measured(Command::new(full).arg("--version")).wall);
        p.push(measured(Command::new(floor).arg(&empty).arg(dir)).wall);
        h.push(measured(&Command::new(empty_prog)).wall);
    }
    let (l, f, p, h) = (median(l), median(f), median(p), median(h));
    let size = |b: &Path| fs::metadata(b).unwrap().len() as f64 / (1024.0 * 1024.0);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("start-up: nodefabric {l:?}, nodefabric-full {f:?}, floor {p:?}, harness {h:?}");
    format!(
        "Start-up, median of {RUNS} interleaved runs: the harness alone (an empty static C program) {:.2} ms; \
         the floor on an empty manifest {:.2} ms; `nodefabric --version` {:.2} ms ({:.2}x the floor's start), \
         `nodefabric-full --version` {:.2} ms ({:.2}x). Release binaries: `nodefabric` {:.1} MiB (static, non-PIE), \
         `nodefabric-full` {:.1} MiB (dynamic, PIE); both unstripped.\n",
        ms(h),
        ms(p),
        ms(l),
        l.as_secs_f64() / p.as_secs_f64(),
        ms(f),
        f.as_secs_f64() / p.as_secs_f64(),
        size(lean),
        size(full),
    )
}

/// The value at quantile `q` of `v` (sorted here).
fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// The timing table: at each size, the floor made from nodefabric's own
/// strace, then pairs of runs in alternating order; each pair's ratio, and
/// the median of those ratios, so that load which hits one pair hits both
/// of its programs.
fn timing() {
    let work = tempfile::tempdir().unwrap();
    let floor = floor::build(work.path());
    let empty_prog = build_empty(work.path());
    let (hook, full) = installed(work.path());
    let startup = startup(&floor, &empty_prog, &hook, &full, work.path());
    let mut rows = Vec::new();
    let mut medians = Vec::new();
    let mut absent: Vec<&str> = Vec::new();
    let mut loads = vec![load()];
    for endpoints in SIZES {
        let runs = match endpoints {
            e if e > 1000 => BIG_RUNS,
            e if e > 100 => MID_RUNS,
            _ => RUNS,
        };
        let site = floor::site(endpoints);
        let (dir, tree, list, manifest) = (&site.dir, &site.tree, &site.list, &site.manifest);
        check_lspci_reads(tree);
        // warm the page cache and both programs' pages
        run_once(&hook, tree);
        floor_once(&floor, manifest, tree);
        let (mut times, mut floors, mut ratios, mut rss, mut floor_rss) =
            (Vec::new(), Vec::new(), Vec::new(), 0, 0);
        let mut tool_times: Vec<Option<Vec<Duration>>> = TOOLS
            .iter()
            .map(|t| (t.run)(dir.path()).map(|_| Vec::new()))
            .collect();
        for round in 0..runs {
            // Which of the two goes first alternates: the one started right
            // after the tools (or after the other) pays for the caches they
            // left cold, and it must not always be the same one.
            let (ours, base) = if round % 2 == 0 {
                let ours = run_once(&hook, tree);
                (ours, floor_once(&floor, manifest, tree))
            } else {
                let base = floor_once(&floor, manifest, tree);
                (run_once(&hook, tree), base)
            };
            ratios.push(ours.wall.as_secs_f64() / base.wall.as_secs_f64());
            times.push(ours.wall);
            rss = rss.max(ours.rss_kib);
            floors.push(base.wall);
            floor_rss = floor_rss.max(base.rss_kib);
            for (tool, acc) in TOOLS.iter().zip(&mut tool_times) {
                if let (Some(acc), Some(cmd)) = (acc, (tool.run)(dir.path())) {
                    acc.push(tool_once(cmd));
                }
            }
        }
        loads.push(load());
        let (t, f) = (median(times), median(floors));
        let (q1, ratio, q3) = (
            quantile(ratios.clone(), 0.25),
            quantile(ratios.clone(), 0.5),
            quantile(ratios, 0.75),
        );
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
        let verdict = match target(endpoints) {
            Some(goal) if ratio <= goal => format!("≤ {goal}x: met"),
            Some(goal) => format!("≤ {goal}x: **MISSED**"),
            None => "-".into(),
        };
        let (files, links) = (
            list.iter().filter(|(_, l)| !l).count(),
            list.iter().filter(|(_, l)| *l).count(),
        );
        println!(
            "{endpoints:>5} endpoints: {t:?} (floor {f:?}, {files} files + {links} links), ratio {ratio:.3} [{q1:.3}, {q3:.3}] {verdict}, peak RSS {rss} KiB (floor {floor_rss} KiB)"
        );
        rows.push(format!(
            "| {endpoints} | {runs} | {files} + {links} | {:.2} | {:.2} | {ratio:.2}x ({q1:.2}-{q3:.2}) | {verdict} | {} | {:.1} ({:.1}) |",
            t.as_secs_f64() * 1e3,
            f.as_secs_f64() * 1e3,
            cells.join(" | "),
            rss as f64 / 1024.0,
            floor_rss as f64 / 1024.0
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
         `cargo bench --bench features` (needs `strace` and `cc`). Generated trees (`tests/support/fixtures.rs::large`): 8 GPUs, 8 PFs, the rest VFs, on tmpfs (/dev/shm) as sysfs is in memory. \
         Each PCI function has, as on a real node, a `config` file and the `revision`, `subsystem_vendor` and `subsystem_device` attributes: the seven files `lspci -tv` opens per function. \
         **The floor** is a C program (built by the bench with `cc -O2`, dynamic, as one would build it) that opens and reads each file and readlinks each link that `nodefabric features` itself \
         opened and read on the same tree, taken from an strace of it (`benches/support/floor.rs`), each once, by path, in nodefabric's order, and nothing else: \
         no listing of folders, no check; its own list costs it four calls (open, fstat, read, close). The section below (`-- --strace`) proves it path by path. \
         Both programs are run from one temporary folder, the release `nodefabric` copied there as `install-hook` copies it into NFD's `source.d` \
         (run where the linker wrote it, in `target/release`, the same binary took 0.24 ms longer at 8 endpoints: 102 page faults a run against 86). \
         Each size is timed in pairs, one run of each program, which goes first alternating from pair to pair; each run is started and timed by a small measuring process (the bench binary again), \
         so that its peak RSS from wait4(2) is its own. **The ratio is the median of the per-pair ratios** (in brackets the quartiles), so that load which hits one pair hits both of its programs; \
         wall times are the medians of each side. Load average (1 min) at the start and after each size: {}. \
         `lstopo` is hwloc's `lstopo-no-graphics --of console` with `HWLOC_FSROOT` at the tree; `lspci -tv` reads it with `-A linux-sysfs -O sysfs.path=TREE/bus/pci`; \
         each tool cell is its median and, in brackets, `features` time over the tool's (below 1 is faster).{missing} \
         Growth exponent of `features` from 8 to 4096 endpoints: {:.2}; from 512 to 4096: {:.2}.\n\n\
         | endpoints | pairs | files + links read | `features` ms | floor ms | ratio (quartiles) | target | lstopo ms | lspci -tv ms | peak RSS MiB (floor's) |\n|---|---|---|---|---|---|---|---|---|---|\n{}\n\n{startup}",
        loads.join(", "),
        growth(medians[0], medians[2]),
        growth(medians[1], medians[2]),
        rows.join("\n")
    );
    report::write_section("Discovery", &section);
}

/// `--strace`: `nodefabric features` (release) and the floor made from its
/// own trace, once each under strace at 8 and 512 endpoints; their syscall
/// counts, the reads compared path by path (the bench stops if one path
/// was read a different number of times), and what else nodefabric did.
/// Writes the "Discovery under strace" section.
fn strace_counts() {
    let work = tempfile::tempdir().unwrap();
    let floor = floor::build(work.path());
    let mut rows = Vec::new();
    let mut shapes = Vec::new();
    let mut extras = Vec::new();
    for endpoints in [8, 512] {
        let site = floor::site(endpoints);
        let (dir, tree, a, list, manifest) = (
            &site.dir,
            &site.tree,
            &site.trace,
            &site.list,
            &site.manifest,
        );
        let mut base = Command::new(&floor);
        base.arg(manifest).arg(tree);
        let b = strace::traced(&base, &dir.path().join("floor.strace"), tree);
        let by_shape = floor::same_reads(a, &b);
        for (name, t) in [("nodefabric features", a), ("floor", &b)] {
            let row = format!(
                "| {endpoints} | {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
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
                t.closes,
                t.other
            );
            println!("{row}");
            rows.push(row);
        }
        for r in by_shape {
            shapes.push(format!(
                "| {endpoints} | `{}` | {} | {} | {} | {} |",
                r.shape,
                if r.link { "readlink" } else { "open + read" },
                r.paths,
                r.ours,
                r.floor
            ));
        }
        let extra = format!(
            "- {endpoints} endpoints ({} files and {} links read by each): failed opens and readlinks of nodefabric: {}; of the floor: {}.",
            list.iter().filter(|(_, l)| !l).count(),
            list.iter().filter(|(_, l)| *l).count(),
            strace::only_in(&a.failed, &Default::default()),
            strace::only_in(&b.failed, &Default::default()),
        );
        println!("{extra}");
        extras.push(extra);
    }
    let section = format!(
        "## Discovery under strace: `nodefabric features` and its floor, call by call\n\n\
         `cargo bench --bench features -- --strace`: the release `nodefabric features --sysfs-root TREE` once under `strace -f -y -e {}` on the generated trees \
         (`fixtures::large`, tmpfs) at 8 and 512 endpoints; from that trace, the floor's list (each file nodefabric opened and read, each link it read, by the path \
         it named, in its order); then the floor once under the same strace. The bench compares the two traces path by path and stops if any path was opened \
         or readlinked a different number of times by the two, or by one only: the floor does exactly nodefabric's reads. A call whose path, or whose fd's path, is outside \
         the tree (the loader, /proc, /etc, and for the floor its list) counts as start-up; the rest are counted by kind. Opens are split into files, \
         folders (a folder is opened to list it) and `O_PATH` opens (a path resolved and checked, nothing read through it), failed opens apart from all three; \"distinct\" is the number of different files opened, every link resolved. \
         A failed readlink is EINVAL (a folder, not a link) or ENOENT (absent); a failed open is ENOENT. The counts do not depend on load; one run of each is exact.\n\n\
         | endpoints | program | syscalls traced | start-up (outside the tree) | file opens | distinct files | folder opens | `O_PATH` opens | failed opens | readlinks (failed ones included) | failed readlinks | listings (getdents64) | reads | closes | other calls in the tree |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n{}\n\n\
         What each read, path by path, grouped by the path's shape (each PCI address `BDF`, each run of digits `N`): how many paths, and how many times each program \
         opened (or readlinked) them in all; the bench checked every path on its own.\n\n\
         | endpoints | path | call | paths | nodefabric | floor |\n|---|---|---|---|---|---|\n{}\n\n\
         What nodefabric does beyond the reads:\n\n{}\n",
        strace::STRACE_SET,
        rows.join("\n"),
        shapes.join("\n"),
        extras.join("\n")
    );
    report::write_section("Discovery under strace", &section);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("--publish") => publish_memory::publish_memory(),
        Some("--strace") => strace_counts(),
        Some("--replay") => replay::replay(),
        Some("--measure") => measure(&args[2..]),
        // `--tree DIR N`: only write the N-endpoint tree, for profiling by
        // hand (`strace -c -f nodefabric features --sysfs-root DIR`).
        Some("--tree") => {
            fixtures::large(
                Path::new(&args[2]),
                args[3].parse().expect("endpoint count"),
            );
        }
        // `--site N`: the N-endpoint tree, the floor's list of what
        // nodefabric read on it and the floor itself, kept for timing by
        // hand (`FLOOR MANIFEST TREE` against `nodefabric features
        // --sysfs-root TREE`); prints where they are.
        Some("--site") => {
            let site = floor::site(args[2].parse().expect("endpoint count"));
            let floor = floor::build(site.dir.path());
            let (tree, manifest) = (site.tree.clone(), site.manifest.clone());
            let kept = site.dir.keep();
            println!(
                "{}\nfloor: {} {} {}",
                kept.display(),
                floor.display(),
                manifest.display(),
                tree.display()
            );
        }
        _ => timing(),
    }
}
