//! Benchmark: the cluster rail record against the in-test API server. How
//! many 8-GPU records fit the 1 MiB ConfigMap, what a broker pass costs
//! over a node-local one, concurrent brokers, and the Node Observer's memory
//! and first-reconciliation time at 5,000 Nodes. Writes docs/benchmarks.md's
//! cluster section. Run with `cargo bench --bench cluster`.

#[path = "../tests/support/apiserver.rs"]
mod apiserver;
#[path = "../tests/support/apiserver_rbac.rs"]
mod apiserver_rbac;
#[path = "../tests/support/fixtures.rs"]
mod fixtures;
#[path = "support/proc.rs"]
mod proc_status;
#[path = "support/report.rs"]
mod report;

use apiserver::{ApiServer, TOKEN};
use proc_status::rss_kib;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NS: &str = "nodefabric";
const CM: &str = "nodefabric-rails";
const RUNS: usize = 20;
const BROKERS: usize = 64;
const NODES: usize = 5000;

fn rails(root: &Path, lldp: &Path, kubeconfig: &Path, node: &str, publish: bool) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nodefabric"));
    c.args(["rails", "-o", "json", "--sysfs-root"])
        .arg(root)
        .arg("--lldp-json")
        .arg(lldp);
    c.args([
        "--interface-regex",
        "^eth_r([0-9]+)_p[0-9]+$",
        "--rail-id",
        "rail$1",
        "--sysfs-paths",
        "--node-name",
        node,
    ]);
    if publish {
        c.args(["--rails-configmap", CM]);
    }
    c.env("KUBECONFIG", kubeconfig)
        .env("PATH", "/nonexistent")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// Runs a command to its end; (wall time, peak RSS KiB) via wait4(2).
fn measure(mut c: Command) -> (Duration, i64) {
    let start = Instant::now();
    // Reaped by wait4 below, which also gives the peak RSS.
    #[allow(clippy::zombie_processes)]
    let child = c.spawn().unwrap();
    let mut status = 0;
    // SAFETY: plain wait4 on our own child; rusage is a zeroed out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!((pid, status), (child.id() as i32, 0));
    (start.elapsed(), usage.ru_maxrss)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    let tmp = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let dir = tmp.path();
    let root = dir.join("sys");
    fixtures::gpu8_named(&root, |i, _| format!("eth_r{}_p{}", i / 2, i % 2));
    let lldp = dir.join("lldp.json");
    let ports: Vec<_> = (0..8)
        .map(|i| json!({ format!("eth_r{}_p{}", i / 2, i % 2): {"via": "LLDP"} }))
        .collect();
    std::fs::write(&lldp, json!({"lldp": {"interface": ports}}).to_string()).unwrap();

    let api = ApiServer::start();
    let kubeconfig: PathBuf = api.kubeconfig(dir, TOKEN, NS);
    let owner = api.add_deployment(NS, "nodefabric-observer");
    let refs = json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "nodefabric-observer", "uid": owner, "controller": true}]);
    api.put_configmap(NS, CM, json!({"metadata": {"ownerReferences": refs}}));
    for i in 0..BROKERS {
        api.add_node(&format!("gpu-{i:04}"));
    }

    eprintln!("measuring broker passes");
    // One broker pass, against a node-local pass of the same record.
    let local = median(
        (0..RUNS)
            .map(|_| measure(rails(&root, &lldp, &kubeconfig, "gpu-0000", false)).0)
            .collect(),
    );
    let runs: Vec<_> = (0..RUNS)
        .map(|_| measure(rails(&root, &lldp, &kubeconfig, "gpu-0000", true)))
        .collect();
    let broker = median(runs.iter().map(|r| r.0).collect());
    let broker_rss = runs.iter().map(|r| r.1).max().unwrap();
    let record = api.data(NS, CM).unwrap()["gpu-0000"].clone();
    let entry = "gpu-0000".len() + record.len();

    eprintln!("concurrent brokers");
    // Concurrent brokers, one per Node.
    let start = Instant::now();
    let children: Vec<_> = (0..BROKERS)
        .map(|i| {
            rails(&root, &lldp, &kubeconfig, &format!("gpu-{i:04}"), true)
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let concurrent = start.elapsed();
    assert_eq!(api.data(NS, CM).unwrap().len(), BROKERS, "every key landed");

    eprintln!("observer");
    // The observer at NODES Nodes, the ConfigMap as full as the limit allows,
    // a quarter of its records for Nodes that are gone.
    let records = apiserver::LIMIT / entry - BROKERS - 1;
    let stale = records / 4;
    let uids: Vec<String> = (BROKERS..NODES)
        .map(|i| api.add_node(&format!("gpu-{i:04}")))
        .collect();
    api.with(|s| {
        for (i, node_uid) in uids.iter().enumerate().take(records) {
            let uid = if i < stale { "gone" } else { node_uid.as_str() };
            let name = if i < stale {
                format!("gone-{i:04}")
            } else {
                format!("gpu-{:04}", BROKERS + i)
            };
            let mut value: serde_json::Value = serde_json::from_str(&record).unwrap();
            value["nodeUID"] = json!(uid);
            s.set_configmap_key(NS, CM, &name, &value.to_string());
        }
    });
    let stale_left = || {
        api.data(NS, CM)
            .unwrap()
            .keys()
            .filter(|k| k.starts_with("gone-"))
            .count()
    };
    assert_eq!(stale_left(), stale);
    let start = Instant::now();
    let log = dir.join("observer.log");
    let mut observer = Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .args([
            "observe",
            "--rails-configmap",
            CM,
            "--owner-deployment",
            "nodefabric-observer",
            "--log-level",
            "info",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    while stale_left() > 0 {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the observer did not finish: {log}"
        );
        assert!(
            observer.try_wait().unwrap().is_none(),
            "the observer exited: {log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let first_pass = start.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    let (idle, peak) = (
        rss_kib(observer.id(), "VmRSS:"),
        rss_kib(observer.id(), "VmHWM:"),
    );
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(observer.id() as i32, libc::SIGTERM) };
    assert!(observer.wait().unwrap().success());

    let mib = |k: f64| format!("{:.1} MiB", k / 1024.0);
    let rows = [
        (
            "8-GPU / 4-rail record, key + value".to_string(),
            format!("{entry} bytes"),
        ),
        (
            "such records per 1 MiB ConfigMap".into(),
            format!("{}", apiserver::LIMIT / entry),
        ),
        (format!("`rails`, node-local, median of {RUNS}"), ms(local)),
        (
            format!("`rails` as broker (Node GET + merge patch), median of {RUNS}"),
            ms(broker),
        ),
        ("broker peak RSS".into(), mib(broker_rss as f64)),
        (
            format!("{BROKERS} brokers at once, all keys landed"),
            ms(concurrent),
        ),
        (
            format!(
                "observer: start to {stale} stale of {} records removed, {NODES} Nodes",
                records + BROKERS
            ),
            ms(first_pass),
        ),
        ("observer RSS after it".into(), mib(idle as f64)),
        ("observer peak RSS".into(), mib(peak as f64)),
    ];
    let table: Vec<String> = rows.iter().map(|(k, v)| format!("| {k} | {v} |")).collect();
    let section = format!(
        "## Cluster rail record: broker and Node Observer\n\n\
         Release binary against the in-test API server (`tests/support/apiserver.rs`, TLS, same process as the \
         harness, so its own work is in the figures), the 8-GPU fixture with four rails of two NICs. The observer \
         lists Node metadata only and keeps names and UIDs; each removal is one field-selector list plus one \
         test-and-remove patch.\n\n\
         | measure | value |\n|---|---|\n{}\n",
        table.join("\n")
    );
    report::write_section("Cluster rail record", &section);
    print!("{section}");
}
