//! Benchmark: the DRA driver (`nodefabric-dra`, release binary) against the
//! in-test API server: time from start to the pool's slices on the server,
//! slice writes per link change (one slice, updated in place, is the goal),
//! requests while idle, idle RSS, and Prepare/Unprepare latency of one
//! claim over the driver's Unix socket (one claim GET each). Writes
//! docs/benchmarks.md's DRA section. Run with `cargo bench --bench dra`;
//! `-- --shares` measures only Prepare of 64 claims sharing one NIC
//! (`--shares 64`) and writes its own section.

#[path = "../tests/support/apiserver.rs"]
mod apiserver;
#[path = "../tests/support/apiserver_rbac.rs"]
mod apiserver_rbac;
#[path = "../tests/support/fixtures.rs"]
mod fixtures;
#[path = "support/proc.rs"]
mod proc_status;
#[path = "../tests/support/published.rs"]
#[allow(dead_code)]
mod published;
#[path = "support/report.rs"]
mod report;

use apiserver::{ApiServer, TOKEN};
use nodefabric::dra::api::v1;
use nodefabric::kubelet::socket;
use proc_status::rss_kib;
use published::publish;
use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const NODE: &str = "node-a";
const DRIVER: &str = "rdma.gpustack.ai";
const CLAIMS: usize = 500;
const CHANGES: usize = 10;

fn devices_published(cdi: &Path) -> usize {
    ["nodefabric-rdma.json", "nodefabric-rdma-vf.json"]
        .iter()
        .filter_map(|f| std::fs::read(cdi.join(f)).ok())
        .map(|b| {
            serde_json::from_slice::<Value>(&b).unwrap()["devices"]
                .as_array()
                .unwrap()
                .len()
        })
        .sum()
}

fn devices_on_server(api: &ApiServer) -> usize {
    api.with(|s| {
        s.resource_slices()
            .iter()
            .map(|x| x["spec"]["devices"].as_array().map_or(0, Vec::len))
            .sum()
    })
}

fn slice_writes(api: &ApiServer) -> usize {
    api.log()
        .iter()
        .filter(|l| l.path.contains("/resourceslices") && l.method != "GET")
        .count()
}

fn start(root: &Path, cdi: &Path, kubeconfig: &Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_nodefabric-dra"))
        .args(["--node-name", NODE, "--interval", "1h"])
        .args(extra)
        .arg("--kubelet-root-dir")
        .arg(root.join("kubelet"))
        .arg("--cdi-dir")
        .arg(cdi)
        .arg("--state-dir")
        .arg(root.join("dra-state"))
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Flips the link annotation of the first device of the whole-interface
/// spec (the VF spec where there is none), written as the publisher writes:
/// a dot-file and a rename.
fn flip(cdi: &Path, round: usize) -> (String, &'static str) {
    let name = ["nodefabric-rdma.json", "nodefabric-rdma-vf.json"]
        .into_iter()
        .find(|f| cdi.join(f).exists())
        .expect("a published spec");
    let path = cdi.join(name);
    let mut spec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let link = if round.is_multiple_of(2) {
        "Failed"
    } else {
        "OK"
    };
    spec["devices"][0]["annotations"]["rdma.gpustack.ai/link"] = Value::from(link);
    let rdma = spec["devices"][0]["name"].as_str().unwrap().to_string();
    let tmp = cdi.join(format!(".{name}.bench"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    std::fs::rename(tmp, path).unwrap();
    (rdma, link)
}

/// The `linkState` the server holds for the device of RDMA device `rdma`.
fn link_on_server(api: &ApiServer, rdma: &str) -> Option<String> {
    api.with(|s| {
        s.resource_slices()
            .iter()
            .flat_map(|x| x["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .find(|d| d["attributes"]["rdmaDevice"]["string"] == rdma)
            .and_then(|d| {
                d["attributes"]["linkState"]["string"]
                    .as_str()
                    .map(str::to_string)
            })
    })
}

/// One pool size: start to slices, writes per change, idle.
struct PoolRun {
    name: &'static str,
    devices: usize,
    slices: usize,
    start_to_slices: Duration,
    writes_per_change: f64,
    idle_requests: usize,
    idle_rss_kib: u64,
}

fn pool_run(name: &'static str, tmp: &Path, fixture: impl FnOnce(&Path)) -> PoolRun {
    let dir = tmp.join(name);
    let (tree, cdi) = (dir.join("sys"), dir.join("cdi"));
    fixture(&tree);
    publish(&tree, &cdi);
    let devices = devices_published(&cdi);
    let api = ApiServer::start();
    api.add_node(NODE);
    let kubeconfig = api.kubeconfig(&dir, TOKEN, "default");
    let started = Instant::now();
    let mut child = start(&dir, &cdi, &kubeconfig, &[]);
    wait_until("the slices", || devices_on_server(&api) == devices);
    let start_to_slices = started.elapsed();
    let slices = api.with(|s| s.resource_slices().len());

    let before = slice_writes(&api);
    for round in 0..CHANGES {
        let (rdma, link) = flip(&cdi, round);
        wait_until("the link change on the server", || {
            link_on_server(&api, &rdma).as_deref() == Some(link)
        });
    }
    let writes_per_change = (slice_writes(&api) - before) as f64 / CHANGES as f64;

    std::thread::sleep(Duration::from_secs(3));
    let requests = api.log().len();
    std::thread::sleep(Duration::from_secs(20));
    let idle_requests = api.log().len() - requests;
    let idle_rss_kib = rss_kib(child.id(), "VmRSS:");
    let _ = child.kill();
    let _ = child.wait();
    PoolRun {
        name,
        devices,
        slices,
        start_to_slices,
        writes_per_change,
        idle_requests,
        idle_rss_kib,
    }
}

/// The driver's DRA service on `dir`'s kubelet root, as kubelet calls it.
type Client = v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>;

/// Prepares `claim` alone; the answer for it and the time at the client.
async fn prepare_one(
    client: &mut Client,
    claim: &v1::Claim,
) -> (v1::NodePrepareResourceResponse, Duration) {
    let t = Instant::now();
    let mut answer = client
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![claim.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    let took = t.elapsed();
    (answer.claims.remove(&claim.uid).unwrap(), took)
}

/// Prepare then Unprepare of one claim at a time, each a new claim.
async fn claims(tmp: &Path) -> (Vec<Duration>, Vec<Duration>, u64) {
    let dir = tmp.join("claims");
    let (tree, cdi) = (dir.join("sys"), dir.join("cdi"));
    fixtures::gpu8_switch_paired(&tree);
    publish(&tree, &cdi);
    let api = ApiServer::start();
    api.add_node(NODE);
    let kubeconfig = api.kubeconfig(&dir, TOKEN, "default");
    let mut child = start(&dir, &cdi, &kubeconfig, &[]);
    wait_until("the slices", || devices_on_server(&api) > 0);
    let device = api.with(|s| {
        s.resource_slices()[0]["spec"]["devices"][0]["name"]
            .as_str()
            .unwrap()
            .to_string()
    });
    let service = dir.join("kubelet/plugins").join(DRIVER).join("dra.sock");
    let mut client =
        v1::dra_plugin_client::DraPluginClient::new(socket::connect(&service).await.unwrap());
    let (mut prepare, mut unprepare) = (Vec::new(), Vec::new());
    for i in 0..CLAIMS {
        let name = format!("claim-{i}");
        let uid = api.with(|s| s.put_claim("bench", &name, &[(DRIVER, NODE, &device, "nic")]));
        let claim = v1::Claim {
            namespace: "bench".into(),
            name,
            uid: uid.clone(),
        };
        let (answer, took) = prepare_one(&mut client, &claim).await;
        prepare.push(took);
        assert_eq!(answer.error, "");
        let t = Instant::now();
        let answer = client
            .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
                claims: vec![claim],
            })
            .await
            .unwrap()
            .into_inner();
        unprepare.push(t.elapsed());
        assert_eq!(answer.claims[&uid].error, "");
    }
    let peak = rss_kib(child.id(), "VmHWM:");
    let _ = child.kill();
    let _ = child.wait();
    (prepare, unprepare, peak)
}

/// How many claims share the NIC: the device plugin's `rdma.shared` count.
const SHARES: usize = 64;
/// Rounds of [`SHARES`] claims, for enough samples that p99 is not max.
const SHARE_ROUNDS: usize = 10;

/// `--shares 64`: each round prepares 64 claims, each a share of the same
/// NIC, one call each, all held until the last (so each Prepare checks its
/// share against every one prepared before it), then unprepares them.
/// The Prepare times, at the client.
async fn shared(tmp: &Path) -> Vec<Duration> {
    let dir = tmp.join("shares");
    let (tree, cdi) = (dir.join("sys"), dir.join("cdi"));
    fixtures::gpu8_switch_paired(&tree);
    publish(&tree, &cdi);
    let api = ApiServer::start();
    api.add_node(NODE);
    let kubeconfig = api.kubeconfig(&dir, TOKEN, "default");
    let shares = SHARES.to_string();
    let mut child = start(&dir, &cdi, &kubeconfig, &["--shares", &shares]);
    let shareable = |api: &ApiServer| {
        api.with(|s| {
            s.resource_slices()
                .iter()
                .flat_map(|x| x["spec"]["devices"].as_array().cloned().unwrap_or_default())
                .find(|d| d["allowMultipleAllocations"] == true)
                .map(|d| d["name"].as_str().unwrap().to_string())
        })
    };
    wait_until("a shareable NIC", || shareable(&api).is_some());
    let device = shareable(&api).unwrap();
    let service = dir.join("kubelet/plugins").join(DRIVER).join("dra.sock");
    let mut client =
        v1::dra_plugin_client::DraPluginClient::new(socket::connect(&service).await.unwrap());
    let mut prepare = Vec::new();
    for round in 0..SHARE_ROUNDS {
        let mut held = Vec::new();
        for i in 0..SHARES {
            let name = format!("share-{round}-{i}");
            let share = format!("5f0c0a1e-0000-4000-8000-{:012x}", round * SHARES + i);
            let result = serde_json::json!({"driver": DRIVER, "pool": NODE, "device": device,
                "request": "nic", "shareID": share, "consumedCapacity": {"shares": "1"}});
            let uid = api.with(|s| {
                let uid = s.new_uid();
                s.put_claim_results("bench", &name, &uid, vec![result]);
                uid
            });
            let claim = v1::Claim {
                namespace: "bench".into(),
                name,
                uid: uid.clone(),
            };
            let (answer, took) = prepare_one(&mut client, &claim).await;
            prepare.push(took);
            assert_eq!(answer.error, "");
            assert_eq!(answer.devices[0].share_id.as_deref(), Some(share.as_str()));
            held.push(claim);
        }
        let answer = client
            .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: held })
            .await
            .unwrap()
            .into_inner();
        assert!(answer.claims.values().all(|c| c.error.is_empty()));
    }
    let _ = child.kill();
    let _ = child.wait();
    prepare
}

/// The shared-NIC section of docs/benchmarks.md.
fn shares_section(runtime: &tokio::runtime::Runtime, tmp: &Path) {
    // The machine is shared: say how busy it was rather than assume.
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load
        .split_whitespace()
        .next()
        .unwrap_or("unknown")
        .to_string();
    let mut prepare = runtime.block_on(shared(tmp));
    let section = format!(
        "## Shared NIC (DRA driver): {SHARES} claims on one NIC\n\n\
         `cargo bench --bench dra -- --shares`: the release binary with `--shares {SHARES}` on the \
         8-GPU fixture, against the in-test API server (in the bench's own process). Each of \
         {SHARE_ROUNDS} rounds prepares {SHARES} claims, each allocated a share of the same NIC \
         (its own `shareID`), one NodePrepareResources call each over one connection to the \
         driver's Unix socket, all held until the round's last, so the k-th Prepare checks its \
         share against the k-1 prepared before it; then one Unprepare of the {SHARES}. Each \
         Prepare reads its claim from the API, writes its NCCL_IB_HCA spec and the checkpoint \
         (fsync; format v3, share IDs included), timed at the client: {} samples. The claims \
         name no pod in `status.reservedFor`, so the NCCL union's pod and claim reads are not \
         in these figures (each adds one API read per pod and per other claim). Load average \
         (1 min) when the run started: {load} on 2 cores. Target: Prepare p99 ≤ 5 ms, as for \
         exclusive claims.\n\n\
         | Prepare of one share, {SHARES} claims on one NIC | p50 | p99 | max |\n|---|---|---|---|\n\
         | measured | {} | {} | {} |\n",
        prepare.len(),
        ms(pct(&mut prepare, 0.5)),
        ms(pct(&mut prepare, 0.99)),
        ms(pct(&mut prepare, 1.0)),
    );
    print!("{section}");
    // Not under "DRA driver": that title would take this section along.
    report::write_section("Shared NIC (DRA driver)", &section);
}

fn main() {
    let tmp = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    if std::env::args().any(|a| a == "--shares") {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        shares_section(&runtime, tmp.path());
        return;
    }
    let runs = [
        pool_run("gpu8", tmp.path(), |t| {
            fixtures::gpu8_switch_paired(t);
        }),
        pool_run("large512", tmp.path(), |t| {
            fixtures::large(t, 512);
        }),
    ];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (mut prepare, mut unprepare, peak) = runtime.block_on(claims(tmp.path()));

    let mut section = String::from(
        "## DRA driver: `nodefabric-dra`\n\n\
         `cargo bench --bench dra`: the release binary against the in-test API server \
         (`tests/support/apiserver.rs`, TLS, in the bench's own process, so its work is in the \
         figures), `--interval 1h` and the default 10 s poll, so every write below comes from a \
         spec change. Pools: the 8-GPU fixture and `fixtures::large(512)`, as `nodefabric publish` \
         wrote their specs. Start to slices: from spawning the driver to every device on the \
         server (the API answers at once). A change: the first device's `link` annotation \
         flipped in the whole-interface spec (the VF spec for `large(512)`, which has no other; dot-file and rename, as the publisher writes), \
         waited for until the server holds the new `linkState`; the driver updates in place the \
         one slice that holds the device (its taint and `linkState`), at the same generation, so a \
         change is one slice write whatever the pool's size (goal: 1). Idle: 20 s with nothing changing, after 3 s of \
         rest; RSS from /proc/PID/status. Claims: ",
    );
    section.push_str(&format!(
        "{CLAIMS} claims of one device each on the 8-GPU pool, each prepared (one claim GET, its \
         NCCL_IB_HCA spec written, the checkpoint written with fsync) and then unprepared, over one \
         connection to the driver's Unix socket, timed at the client. Targets: Prepare p99 ≤ 5 ms, \
         one slice write per link change, idle RSS ≤ 15 MiB, start to slices ≤ 1 s.\n\n"
    ));
    section.push_str("| pool | devices | slices (64 devices each) | start → slices | slice writes per link change (goal: 1) | API requests while idle | idle RSS |\n|---|---|---|---|---|---|---|\n");
    for r in &runs {
        section.push_str(&format!(
            "| {} | {} | {} | {} | {:.1} | {} | {:.1} MiB |\n",
            r.name,
            r.devices,
            r.slices,
            ms(r.start_to_slices),
            r.writes_per_change,
            r.idle_requests,
            r.idle_rss_kib as f64 / 1024.0
        ));
    }
    section.push_str(&format!(
        "\n| claims | p50 | p99 | max |\n|---|---|---|---|\n| Prepare (target p99 ≤ 5 ms) | {} | {} | {} |\n| Unprepare | {} | {} | {} |\n\nPeak RSS over the claims run: {:.1} MiB.\n",
        ms(pct(&mut prepare, 0.5)),
        ms(pct(&mut prepare, 0.99)),
        ms(pct(&mut prepare, 1.0)),
        ms(pct(&mut unprepare, 0.5)),
        ms(pct(&mut unprepare, 0.99)),
        ms(pct(&mut unprepare, 1.0)),
        peak as f64 / 1024.0,
    ));
    print!("{section}");
    report::write_section("DRA driver", &section);
    shares_section(&runtime, tmp.path());
}
