//! Benchmark: wall time and peak RSS of `nodefabric features` on generated
//! trees of 8, 64 and 512 RDMA endpoints, beside the floor (a minimal loop that
//! reads the same files with no checks). Writes `docs/benchmarks.md`'s
//! discovery section. Run with `cargo bench --bench features`.

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

/// The floor: read every attribute discovery reads, in the simplest loop.
fn floor(root: &Path) -> usize {
    let mut bytes = 0;
    let mut read = |p: &Path| bytes += fs::read(p).map(|b| b.len()).unwrap_or(0);
    let mut devices = Vec::new();
    for e in fs::read_dir(root.join("class/net")).unwrap() {
        let net = fs::canonicalize(e.unwrap().path()).unwrap();
        for a in ["mtu", "operstate", "flags"] {
            read(&net.join(a));
        }
        if let Ok(dev) = fs::canonicalize(net.join("device")) {
            devices.push(dev.clone());
            for e in fs::read_dir(&dev).unwrap().flatten() {
                if e.file_name().to_string_lossy().starts_with("virtfn") {
                    let vf = fs::canonicalize(e.path()).unwrap();
                    for e in fs::read_dir(vf.join("net")).into_iter().flatten().flatten() {
                        for a in ["mtu", "operstate", "flags"] {
                            read(&e.path().join(a));
                        }
                    }
                    devices.push(vf);
                }
            }
        }
    }
    for dev in devices {
        for a in ["numa_node", "local_cpulist", "sriov_totalvfs", "sriov_numvfs"] {
            read(&dev.join(a));
        }
        for ib in fs::read_dir(dev.join("infiniband")).into_iter().flatten().flatten() {
            for port in fs::read_dir(ib.path().join("ports")).into_iter().flatten().flatten() {
                read(&port.path().join("state"));
                read(&port.path().join("phys_state"));
            }
        }
    }
    for e in fs::read_dir(root.join("bus/pci/devices")).unwrap() {
        let dev = fs::canonicalize(e.unwrap().path()).unwrap();
        for a in ["vendor", "class", "device", "numa_node"] {
            read(&dev.join(a));
        }
    }
    bytes
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let mut rows = Vec::new();
    for endpoints in [8u32, 64, 512] {
        // sysfs lives in memory, so the tree does too (tmpfs) where available
        let dir = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).unwrap();
        fixtures::large(dir.path(), endpoints);
        run_once(dir.path()); // warm the page cache
        let mut times = Vec::new();
        let mut rss = 0;
        for _ in 0..RUNS {
            let (t, r) = run_once(dir.path());
            times.push(t);
            rss = rss.max(r);
        }
        // The floor runs in-process, so add the cost of starting a process
        // (measured with `true`) to compare like with like.
        let mut floors = Vec::new();
        for _ in 0..RUNS {
            let start = Instant::now();
            assert!(Command::new("true").status().unwrap().success());
            std::hint::black_box(floor(dir.path()));
            floors.push(start.elapsed());
        }
        let (t, f) = (median(times), median(floors));
        println!("{endpoints:>4} endpoints: {t:?} (floor {f:?}), peak RSS {rss} KiB");
        rows.push(format!(
            "| {endpoints} | {:.2} | {:.2} | {:.1}x | {:.1} |",
            t.as_secs_f64() * 1e3,
            f.as_secs_f64() * 1e3,
            t.as_secs_f64() / f.as_secs_f64(),
            rss as f64 / 1024.0
        ));
    }
    let section = format!(
        "## Discovery: `nodefabric features`\n\n\
         Generated trees (`tests/support/fixtures.rs::large`): 8 GPUs, 8 PFs, the rest VFs. \
         Trees on tmpfs (/dev/shm), as sysfs is in memory. Median of {RUNS} runs of the release binary; peak RSS from wait4(2). \
         The floor is a bare loop reading the same attributes with no checks, plus one process start \
         (`true`), so the ratio compares like with like. Targets: < 20 ms and < 10 MiB at 512 endpoints, \
         within 2x of the floor, linear growth.\n\n\
         | endpoints | wall ms | floor ms | ratio | peak RSS MiB |\n|---|---|---|---|---|\n{}\n",
        rows.join("\n")
    );
    report::write_section("Discovery", &section);
}
