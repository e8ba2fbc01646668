//! `cargo bench --bench features -- --publish`: the long-running
//! publisher's peak memory at 10,000 endpoints beside the limit the
//! project's manifests give it.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::{fixtures, proc_status, report};

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

/// Rewrites every file under `dir` for which `text` gives new contents.
fn rewrite(dir: &Path, text: &dyn Fn(&Path) -> Option<String>) {
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let ft = entry.file_type().unwrap();
        if ft.is_dir() {
            rewrite(&path, text);
        } else if let Some(new) = ft.is_file().then(|| text(&path)).flatten() {
            fs::write(&path, new).unwrap();
        }
    }
}

/// For [`rewrite`]: every RDMA port's `state` and `phys_state` as `state`.
fn port_state(path: &Path, state: (&str, &str)) -> Option<String> {
    let in_port = path
        .parent()
        .and_then(Path::parent)
        .and_then(Path::file_name);
    if in_port != Some("ports".as_ref()) {
        return None;
    }
    match path.file_name()?.to_str()? {
        "state" => Some(format!("{}\n", state.0)),
        "phys_state" => Some(format!("{}\n", state.1)),
        _ => None,
    }
}

/// Runs the publisher on `tree` for [`PUBLISH_PASSES`] passes writing under
/// `out`; its VmHWM after each pass, and the record and spec it wrote.
fn passes(tree: &Path, out: &Path) -> (Vec<u64>, u64, u64) {
    use std::io::BufRead;
    let at = |name: &str| out.join(name);
    let mut child = Command::new(env!("CARGO_BIN_EXE_nodefabric-full"))
        .arg("--sysfs-root")
        .arg(tree)
        .args(["--log-level", "debug", "publish", "--interval", "1s"])
        .arg("--features-dir")
        .arg(at("features.d"))
        .arg("--cdi-dir")
        .arg(at("cdi"))
        .arg("--state-dir")
        .arg(at("state"))
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
            let kib = proc_status::rss_kib(pid, "VmHWM:");
            println!(
                "{}: after pass {}: peak RSS {:.1} MiB, {:.2?} after start",
                tree.display(),
                peaks.len() + 1,
                kib as f64 / 1024.0,
                started.elapsed()
            );
            peaks.push(kib);
            if peaks.len() == PUBLISH_PASSES {
                break;
            }
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(failed.is_empty(), "publisher passes failed: {failed:?}");
    assert_eq!(peaks.len(), PUBLISH_PASSES, "the publisher stopped early");
    let size = |rel: &str| fs::metadata(at(rel)).unwrap().len();
    (
        peaks,
        size("state/record.json"),
        size("cdi/nodefabric-rdma-vf.json"),
    )
}

/// `--publish`: `nodefabric-full publish --interval 1s` (the DaemonSet's
/// command, release binary) on the [`PUBLISH_ENDPOINTS`]-endpoint tree for
/// [`PUBLISH_PASSES`] passes, its peak RSS (VmHWM in /proc/PID/status, which
/// starts afresh at exec, so none of the bench's memory is in it) read as
/// each pass ends (the publisher logs `publish pass N finished` at debug
/// level), beside the memory limit that `deploy/nodefabric.yaml` and the
/// Helm chart give it; twice: every link up, then every link down (the
/// worst case: each pass then parses the previous record for the failed
/// links' `firstSeen`). Prints `OVER LIMIT` when a pass peaks above
/// [`PUBLISH_HEADROOM`] of the lower limit. Writes the "Publisher at
/// 10,000 endpoints" section.
pub fn publish_memory() {
    let deploy = memory_limit_mib("deploy/nodefabric.yaml", "apiVersion: apps/v1");
    let chart = memory_limit_mib("charts/nodefabric/values.yaml", "publisher:");
    let limit = deploy.min(chart);
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let tree = dir.path().join("sys");
    fixtures::large(&tree, PUBLISH_ENDPOINTS);
    let (up, record, spec) = passes(&tree, &dir.path().join("up"));
    // Every interface's MTU unreadable (not a number): each pass after the
    // first keeps it from the previous record, parsed whole.
    let devices = tree.join("devices");
    rewrite(&devices, &|p| {
        (p.file_name()? == "mtu").then(|| "not a number\n".into())
    });
    let (unreadable, _, _) = passes(&tree, &dir.path().join("unreadable"));
    rewrite(&devices, &|p| {
        (p.file_name()? == "mtu").then(|| "9000\n".into())
    });
    rewrite(&devices, &|p| port_state(p, fixtures::DOWN));
    let (down, _, _) = passes(&tree, &dir.path().join("down"));
    // Other builds share this machine's cores: the load is stated, though
    // RSS depends only on what the process holds.
    let load = fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into());
    let mib = |kib: u64| kib as f64 / 1024.0;
    let peak = mib(*up.iter().chain(&down).chain(&unreadable).max().unwrap());
    let budget = limit * PUBLISH_HEADROOM;
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
    let cell = |kib: u64| format!("{:.1} MiB ({:.0}%)", mib(kib), 100.0 * mib(kib) / limit);
    let rows: String = (0..PUBLISH_PASSES)
        .map(|i| {
            format!(
                "| after pass {} | {} | {} | {} |\n",
                i + 1,
                cell(up[i]),
                cell(down[i]),
                cell(unreadable[i])
            )
        })
        .collect();
    let section = format!(
        "## Publisher at 10,000 endpoints: memory and output sizes\n\n\
         `cargo bench --bench features -- --publish`: `nodefabric-full publish --interval 1s` (the DaemonSet's command, release binary) \
         on the generated tree `fixtures::large({PUBLISH_ENDPOINTS})` (8 PFs, {} VFs, on /dev/shm) for {PUBLISH_PASSES} passes: \
         the first into empty folders, each later one over what the one before wrote; three times, into fresh folders each: every link up; every port DOWN, \
         so that every pass after the first needs the failed links' `firstSeen` from the previous record; and every link up with every interface's `mtu` not a number, \
         so that every pass after the first keeps that fact from the previous record, parsed whole. \
         Peak RSS is the process's VmHWM (/proc/PID/status, fresh at exec, so none of the bench's memory), read as each pass ends \
         (the publisher logs `publish pass N finished` at debug level). Load average during the run: {load}, on 2 cores shared with \
         other builds; RSS does not depend on the load, only on what the process holds. Memory limit: {deploy:.0}Mi in `deploy/nodefabric.yaml`, {chart:.0}Mi in the chart's \
         `publisher.resources`; the bench's bound is {:.0}% of the lower, {budget:.1} MiB.\n\n\
         | VmHWM (share of the {limit:.0}Mi limit) | every link up | every link down | every MTU unreadable |\n|---|---|---|---|\n{rows}\n\
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
