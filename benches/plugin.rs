//! Benchmark: the device plugin at 512 endpoints. Idle RSS, Allocate latency
//! over the Unix socket, and the time from a CDI spec change to the updated
//! ListAndWatch message. Writes docs/benchmarks.md's device-plugin section.
//! Run with `cargo bench --bench plugin`.

#[path = "../tests/support/fixtures.rs"]
mod fixtures;
#[path = "../tests/support/kubelet.rs"]
mod kubelet;
#[path = "support/report.rs"]
mod report;

use kubelet::{within, Kubelet};
use nodefabric::plugin::api::{self, device_plugin_client::DevicePluginClient};
use nodefabric::plugin::uds;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ALLOCATIONS: usize = 2000;
const UPDATES: usize = 30;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Writes `spec` as `nodefabric` does: a dot-file temp, then rename.
fn replace(dir: &Path, name: &str, spec: &serde_json::Value) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(spec).unwrap()).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let tmp = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).unwrap();
    let (root, cdi, kdir) = (tmp.path().join("sys"), tmp.path().join("cdi"), tmp.path().join("kubelet"));
    std::fs::create_dir_all(&kdir).unwrap();
    fixtures::large(&root, 512);
    let out = Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .args(["cdi", "--sysfs-root"])
        .arg(&root)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // `nodefabric cdi` prints the specs keyed by file name; large(512) is 504
    // VFs under 8 PFs. The heaviest catalog 512 endpoints can make is 512
    // whole interfaces (512 exclusive + 32,768 shared tokens), so the VF
    // devices, topped up to 512 with renamed copies, become the
    // whole-interface spec; the partitioned family is left empty.
    let specs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut whole = specs["nodefabric-rdma-vf.json"].clone();
    whole["kind"] = "gpustack.ai/rdma".into();
    let devices = whole["devices"].as_array_mut().unwrap();
    for i in 0..512 - devices.len() {
        let mut extra = devices[i].clone();
        extra["name"] = format!("extra_{i}").into();
        devices.push(extra);
    }
    std::fs::create_dir_all(&cdi).unwrap();
    replace(&cdi, "nodefabric-rdma.json", &whole);
    let endpoints = whole["devices"].as_array().unwrap().len();

    let mut kubelet = Kubelet::start(&kdir);
    let mut child = Command::new(env!("CARGO_BIN_EXE_nodefabric-device-plugin"))
        .args(["--log-level", "warn", "--poll-interval", "1h", "--kubelet-dir"])
        .arg(&kdir)
        .arg("--cdi-dir")
        .arg(&cdi)
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    kubelet.registrations(3).await;
    let client = |sock: &'static str| {
        let path = kdir.join(sock);
        async move { DevicePluginClient::new(uds::connect(&path).await.unwrap()) }
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let registered_rss = rss_kib(child.id(), "VmRSS:");
    // As kubelet does: one ListAndWatch stream per resource, held open.
    let mut streams = Vec::new();
    let mut tokens = 0;
    for sock in ["nodefabric-rdma.sock", "nodefabric-rdma-shared.sock", "nodefabric-rdma-partitioned.sock"] {
        let mut s = client(sock).await.list_and_watch(api::Empty {}).await.unwrap().into_inner();
        tokens += within("first list", s.message()).await.unwrap().unwrap().devices.len();
        streams.push(s);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle_rss = rss_kib(child.id(), "VmRSS:");

    // Allocate: one container, one exclusive token, over one connection as kubelet keeps it.
    let mut excl = client("nodefabric-rdma.sock").await;
    let names: Vec<String> = whole["devices"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap().to_string()).collect();
    let mut lat = Vec::with_capacity(ALLOCATIONS);
    for i in 0..ALLOCATIONS {
        let req = api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest { devices_ids: vec![names[i % names.len()].clone()] }],
        };
        let t = Instant::now();
        excl.allocate(req).await.unwrap();
        lat.push(t.elapsed());
    }
    lat.sort();
    let (p50, p99) = (percentile(&lat, 0.5), percentile(&lat, 0.99));

    // Spec change → updated list on the exclusive stream: flip one link each time.
    let stream = &mut streams[0];
    let mut upd = Vec::with_capacity(UPDATES);
    for i in 0..UPDATES {
        let link = if i % 2 == 0 { "Failed" } else { "OK" };
        whole["devices"][0]["annotations"]["rdma.gpustack.ai/link"] = link.into();
        let t = Instant::now();
        replace(&cdi, "nodefabric-rdma.json", &whole);
        let msg = within("the updated list", stream.message()).await.unwrap().unwrap();
        upd.push(t.elapsed());
        let want = if link == "Failed" { "Unhealthy" } else { "Healthy" };
        assert!(msg.devices.iter().any(|d| d.id == names[0] && d.health == want));
    }
    upd.sort();
    let peak_rss = rss_kib(child.id(), "VmHWM:");
    child.kill().unwrap();
    child.wait().unwrap();

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{endpoints} endpoints, {tokens} tokens: registered RSS {registered_rss} KiB, idle RSS {idle_rss} KiB (peak {peak_rss}), Allocate p50 {p50:?} p99 {p99:?}, update p50 {:?} max {:?}",
        percentile(&upd, 0.5),
        upd.last().unwrap()
    );
    let section = format!(
        "## Device plugin: `nodefabric-device-plugin`\n\n\
         {endpoints} whole-interface endpoints (the 504 VF devices of `fixtures::large(512)` as written by \
         `nodefabric cdi`, topped up with 8 renamed copies, under the whole-interface kind: the heaviest catalog), \
         {tokens} advertised tokens (exclusive + 64 shared each), release binary, a kubelet stand-in \
         holding one ListAndWatch stream per resource. RSS from /proc/PID/status three seconds after the first lists. \
         Allocate: {ALLOCATIONS} calls of one exclusive token over one Unix-socket connection. Update: {UPDATES} \
         spec rewrites (dot-file temp + rename, one link flipped), timed to the matching ListAndWatch message, \
         delivered by the folder watch (poll interval 1 h). Targets: idle RSS ≤ 10 MiB, Allocate p99 ≤ 1 ms, update ≤ 1 s.\n\n\
         | measure | value | target |\n|---|---|---|\n\
         | RSS registered, before any ListAndWatch | {:.1} MiB | |\n\
         | idle RSS, streams open | {:.1} MiB | ≤ 10 MiB |\n\
         | peak RSS (whole run) | {:.1} MiB | |\n\
         | Allocate p50 | {:.3} ms | |\n\
         | Allocate p99 | {:.3} ms | ≤ 1 ms |\n\
         | spec change → ListAndWatch, p50 | {:.1} ms | |\n\
         | spec change → ListAndWatch, max | {:.1} ms | ≤ 1 s |\n",
        registered_rss as f64 / 1024.0,
        idle_rss as f64 / 1024.0,
        peak_rss as f64 / 1024.0,
        ms(p50),
        ms(p99),
        ms(percentile(&upd, 0.5)),
        ms(*upd.last().unwrap()),
    );
    report::write_section("Device plugin", &section);
    drop(kubelet);
}
