//! Benchmark: the two forms of the cluster rail record at scale, against
//! the in-test API server.
//!
//! 1. What a watcher receives when each of N nodes republishes its record
//!    once (a link went down, say): a watch of the shared ConfigMap gets the
//!    whole ConfigMap on every change, a watch of NodeRailRecords gets the
//!    one object that changed. Bytes are counted on the wire of a real watch
//!    (chunked HTTP over TLS); the writes are the broker's own requests
//!    (`cluster::broker`), so the ConfigMap's 1 MiB limit refuses for real.
//! 2. The Node Observer's first full pass over 10,000 Nodes and 10,000
//!    NodeRailRecords (the release binary, `--rails-record custom-resource`):
//!    time to ready, API requests by kind, peak RSS, for a few counts of
//!    stale records, to show the requests follow the stale records.
//!
//! Writes docs/benchmarks.md's "Cluster rail record at scale" section. Run
//! with `cargo bench --bench cluster_scale`.

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
use futures::AsyncBufReadExt;
use kube::api::WatchParams;
use nodefabric::cluster::broker::{self, Publication};
use nodefabric::cluster::ConfigMapRef;
use nodefabric::rails::RailRecord;
use proc_status::rss_kib;
use serde_json::json;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NS: &str = "nodefabric";
const CM: &str = "nodefabric-rails";
const SIZES: [usize; 3] = [100, 1_000, 10_000];
const OBSERVED: usize = 10_000;
const STALE: [usize; 3] = [0, 100, 1_000];

/// One 8-GPU, 4-rail record, as a real `nodefabric rails` prints it.
fn real_record(dir: &Path) -> RailRecord {
    let root = dir.join("sys");
    fixtures::gpu8_named(&root, |i, _| format!("eth_r{}_p{}", i / 2, i % 2));
    let lldp = dir.join("lldp.json");
    let ports: Vec<_> = (0..8)
        .map(|i| json!({ format!("eth_r{}_p{}", i / 2, i % 2): {"via": "LLDP"} }))
        .collect();
    std::fs::write(&lldp, json!({"lldp": {"interface": ports}}).to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .args(["rails", "-o", "json", "--sysfs-root"])
        .arg(&root)
        .arg("--lldp-json")
        .arg(&lldp)
        .args([
            "--interface-regex",
            "^eth_r([0-9]+)_p[0-9]+$",
            "--rail-id",
            "rail$1",
            "--sysfs-paths",
            "--node-uid",
            "x",
        ])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Node `uid`'s record; `changed` marks one NIC down, the change a republish carries.
fn record_for(base: &RailRecord, uid: &str, changed: bool) -> RailRecord {
    let mut r = base.clone();
    r.node_uid = uid.to_string();
    if changed {
        let choice = r.gpus[0].rails.values_mut().next().unwrap();
        choice.down = vec![choice.nics[0].clone()];
    }
    r
}

fn compact(r: &RailRecord) -> String {
    serde_json::to_string(&serde_json::to_value(r).unwrap()).unwrap()
}

/// Counts the bytes and events a watch of `path` (from now) receives until
/// `events` have arrived; runs beside the writes.
async fn watch_bytes(
    client: kube::Client,
    path: String,
    params: WatchParams,
    rv: String,
    events: usize,
) -> (usize, usize) {
    let req = kube::core::Request::new(path)
        .watch(&params.timeout(290), &rv)
        .unwrap();
    let mut stream = client.request_stream(req).await.unwrap();
    let (mut bytes, mut seen) = (0, 0);
    let mut line = String::new();
    while seen < events {
        line.clear();
        let n = stream.read_line(&mut line).await.unwrap();
        assert!(n > 0, "the watch ended after {seen} events");
        bytes += n;
        seen += 1;
    }
    (bytes, seen)
}

/// The watch traffic of one republish round at `n` nodes, both forms.
struct Traffic {
    n: usize,
    /// ConfigMap form: Ok(bytes) or Err(how many records it held).
    configmap: Result<usize, usize>,
    records: usize,
    record_object: usize,
}

fn traffic(rt: &tokio::runtime::Runtime, base: &RailRecord, n: usize, dir: &Path) -> Traffic {
    let api = ApiServer::start();
    api.install_crd();
    let kubeconfig = api.kubeconfig(dir, TOKEN, NS);
    std::env::set_var("KUBECONFIG", &kubeconfig);
    let owner = api.add_deployment(NS, "nodefabric-observer");
    let refs = json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "nodefabric-observer", "uid": owner, "controller": true}]);
    api.put_configmap(NS, CM, json!({"metadata": {"ownerReferences": refs}}));
    let uids: Vec<String> = (0..n)
        .map(|i| api.add_node(&format!("gpu-{i:05}")))
        .collect();
    let cm = ConfigMapRef::parse(&format!("{NS}/{CM}")).unwrap();

    rt.block_on(async {
        let client = nodefabric::cluster::client::connect(&nodefabric::cluster::client::Settings {
            service_account_dir: "/nonexistent".into(),
            timeout: Some(Duration::from_secs(60)),
        })
        .await
        .unwrap();
        // The ConfigMap form: every node publishes (as brokers do on start) until the ConfigMap is full.
        let mut held = n;
        for (i, uid) in uids.iter().enumerate() {
            let text = compact(&record_for(base, uid, false));
            if let Err(e) = broker::publish(
                &client,
                &cm,
                &format!("gpu-{i:05}"),
                Publication::Record(&text),
            )
            .await
            {
                assert!(e.to_string().contains("1 MiB"), "{e}");
                held = i;
                break;
            }
        }
        let configmap = if held < n {
            Err(held)
        } else {
            // Each node republishes once; one watcher of the ConfigMap counts what it is sent.
            let rv = api.with(|s| s.resource_version());
            let path = format!("/api/v1/namespaces/{NS}/configmaps");
            let params = WatchParams::default().fields(&format!("metadata.name={CM}"));
            let watcher = tokio::spawn(watch_bytes(client.clone(), path, params, rv, n));
            for (i, uid) in uids.iter().enumerate() {
                let text = compact(&record_for(base, uid, true));
                broker::publish(
                    &client,
                    &cm,
                    &format!("gpu-{i:05}"),
                    Publication::Record(&text),
                )
                .await
                .unwrap();
            }
            Ok(watcher.await.unwrap().0)
        };

        // The per-node form: every node applies its record, then republishes once.
        for (i, uid) in uids.iter().enumerate() {
            broker::apply_record(
                &client,
                &format!("gpu-{i:05}"),
                &record_for(base, uid, false),
            )
            .await
            .unwrap();
        }
        let rv = api.with(|s| s.resource_version());
        let path = apiserver::RECORDS_PATH.to_string();
        let watcher = tokio::spawn(watch_bytes(
            client.clone(),
            path,
            WatchParams::default(),
            rv,
            n,
        ));
        for (i, uid) in uids.iter().enumerate() {
            broker::apply_record(
                &client,
                &format!("gpu-{i:05}"),
                &record_for(base, uid, true),
            )
            .await
            .unwrap();
        }
        let (records, _) = watcher.await.unwrap();
        let record_object = api.with(|s| {
            serde_json::to_vec(s.record("gpu-00000").unwrap())
                .unwrap()
                .len()
        });
        Traffic {
            n,
            configmap,
            records,
            record_object,
        }
    })
}

/// One observer run over `OBSERVED` Nodes and records, `stale` of them left
/// by Nodes that are gone.
struct Resync {
    stale: usize,
    ready: Duration,
    requests: std::collections::BTreeMap<String, usize>,
    peak_kib: u64,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn ready(port: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.1 200")
}

fn resync(base: &RailRecord, stale: usize, dir: &Path) -> Resync {
    let api = ApiServer::start();
    api.install_crd();
    let kubeconfig = api.kubeconfig(dir, TOKEN, NS);
    let uids: Vec<String> = (0..OBSERVED)
        .map(|i| api.add_node(&format!("gpu-{i:05}")))
        .collect();
    api.with(|s| {
        for (i, uid) in uids.iter().enumerate() {
            // The first `stale` records belong to an earlier Node of the same name.
            let owner = if i < stale {
                format!("gone-{i}")
            } else {
                uid.clone()
            };
            let spec = serde_json::to_value(record_for(base, &owner, false)).unwrap();
            s.put_record(&format!("gpu-{i:05}"), &owner, spec);
        }
    });
    let before = api.log().len();
    let port = free_port();
    let start = Instant::now();
    let mut observer = Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .args([
            "observe",
            "--rails-record",
            "custom-resource",
            "--health-addr",
            &format!("127.0.0.1:{port}"),
        ])
        .env("KUBECONFIG", &kubeconfig)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    while !ready(port) {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "the observer did not become ready"
        );
        assert!(
            observer.try_wait().unwrap().is_none(),
            "the observer exited"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let ready_after = start.elapsed();
    let left = api.with(|s| {
        (0..stale)
            .filter(|i| s.record(&format!("gpu-{i:05}")).is_some())
            .count()
    });
    assert_eq!(
        left, 0,
        "every stale record is gone once the observer is ready"
    );
    let peak_kib = rss_kib(observer.id(), "VmHWM:");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(observer.id() as i32, libc::SIGTERM) };
    assert!(observer.wait().unwrap().success());
    let mut requests = std::collections::BTreeMap::new();
    for l in &api.log()[before..] {
        let what = match (
            l.method.as_str(),
            l.path.starts_with(apiserver::RECORDS_PATH),
            l.query.contains("watch=true"),
            l.query.contains("fieldSelector"),
        ) {
            ("GET", false, false, true) => "fresh read of one Node (LIST by name)",
            ("GET", false, false, false) => "LIST Nodes (pages)",
            ("GET", false, true, _) => "WATCH Nodes",
            ("GET", true, false, false) => "LIST NodeRailRecords metadata (pages)",
            ("GET", true, false, true) => "LIST one NodeRailRecord by name",
            ("DELETE", true, _, _) => "DELETE NodeRailRecord (preconditions)",
            _ => "other",
        };
        *requests.entry(what.to_string()).or_insert(0) += 1;
    }
    Resync {
        stale,
        ready: ready_after,
        requests,
        peak_kib,
    }
}

fn main() {
    let tmp = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let dir = tmp.path();
    let base = real_record(dir);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    let mut rows = Vec::new();
    for n in SIZES {
        eprintln!("watch traffic at {n} nodes");
        let t = traffic(&rt, &base, n, dir);
        let mib = |b: usize| format!("{:.2} MiB", b as f64 / 1048576.0);
        let (cm, ratio) = match t.configmap {
            Ok(b) => (mib(b), format!("{:.0}x", b as f64 / t.records as f64)),
            Err(held) => (
                format!("refused: the ConfigMap is full at {held} records (1 MiB)"),
                "-".into(),
            ),
        };
        rows.push(format!(
            "| {} | {cm} | {} | {ratio} | {} bytes |",
            t.n,
            mib(t.records),
            t.record_object
        ));
    }

    let mut resyncs = Vec::new();
    for stale in STALE {
        eprintln!("observer resync, {stale} stale of {OBSERVED}");
        // The median of three runs by time (requests are the same each run).
        let mut runs: Vec<Resync> = (0..3).map(|_| resync(&base, stale, dir)).collect();
        runs.sort_by_key(|r| r.ready);
        resyncs.push(runs.swap_remove(1));
    }
    let kinds: std::collections::BTreeSet<String> = resyncs
        .iter()
        .flat_map(|r| r.requests.keys().cloned())
        .collect();
    let mut resync_rows = vec![format!(
        "| stale records | {} |",
        resyncs
            .iter()
            .map(|r| r.stale.to_string())
            .collect::<Vec<_>>()
            .join(" | ")
    )];
    resync_rows.push(format!("|---|{}", "---|".repeat(resyncs.len())));
    resync_rows.push(format!(
        "| start to ready (first full pass done) | {} |",
        resyncs
            .iter()
            .map(|r| format!("{:.0} ms", r.ready.as_secs_f64() * 1000.0))
            .collect::<Vec<_>>()
            .join(" | ")
    ));
    for k in &kinds {
        resync_rows.push(format!(
            "| {k} | {} |",
            resyncs
                .iter()
                .map(|r| r.requests.get(k).copied().unwrap_or(0).to_string())
                .collect::<Vec<_>>()
                .join(" | ")
        ));
    }
    resync_rows.push(format!(
        "| API requests in all | {} |",
        resyncs
            .iter()
            .map(|r| r.requests.values().sum::<usize>().to_string())
            .collect::<Vec<_>>()
            .join(" | ")
    ));
    resync_rows.push(format!(
        "| observer peak RSS | {} |",
        resyncs
            .iter()
            .map(|r| format!("{:.1} MiB", r.peak_kib as f64 / 1024.0))
            .collect::<Vec<_>>()
            .join(" | ")
    ));

    let section = format!(
        "## Cluster rail record at scale: ConfigMap or NodeRailRecords\n\n\
         The in-test API server (`tests/support/apiserver.rs`, TLS, in the harness's process), the 8-GPU / 4-rail \
         record a real `nodefabric rails` prints. Writes are the broker's own requests (`cluster::broker`): a merge \
         patch of the node's ConfigMap key, or a server-side apply of its NodeRailRecord. A republish marks one NIC \
         down, so every write is a change and every watcher is sent an event.\n\n\
         What one watcher receives (bytes on the wire of its watch stream) when each of N nodes republishes once, \
         every node's record already published. The ConfigMap watcher is sent the whole ConfigMap on every change \
         (N events of up to 1 MiB each), the NodeRailRecord watcher one object per change:\n\n\
         | nodes | watch of the shared ConfigMap | watch of NodeRailRecords | ratio | one NodeRailRecord |\n|---|---|---|---|---|\n{}\n\n\
         The Node Observer (`observe --rails-record custom-resource`, release binary) from start to ready (its \
         first full pass over {OBSERVED} Nodes and {OBSERVED} NodeRailRecords done; median of three runs), by how \
         many records are stale (owned by an earlier Node of the same name). Record lists are paged (500 a page) and of metadata only \
         (the in-test server answers the Node list in one page; a real one in 500-Node pages); each \
         record the Node cache finds stale is judged again by a fresh read of its Node before its delete:\n\n{}\n",
        rows.join("\n"),
        resync_rows.join("\n")
    );
    report::write_section("Cluster rail record at scale", &section);
    print!("{section}");
}
