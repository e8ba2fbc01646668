//! The DRA driver after allocation: a link that fails taints its device in
//! place (one slice rewritten, same generation), a server with the taint
//! gate off drops the taints and is told once, and kubelet hears each
//! device's health on the stream it opens.

use crate::support::apiserver::Logged;
use crate::support::dra::{reconciled, reconciles, Driver, Setup};
use crate::support::fixtures;
use crate::support::os::{free_addr, http_get};
use crate::support::published::publish;
use crate::support::wait::{self, within};
use nodefabric::dra::api::health_v1alpha1 as health;
use nodefabric::kubelet::socket;
use serde_json::Value;
use std::path::Path;

const NODE: &str = "node-a";
const TAINT: &str = "rdma.gpustack.ai/link-failed";

fn slices(s: &Setup) -> Vec<Value> {
    s.cluster.api.with(|st| st.resource_slices())
}

/// Whether `all` (the server's slices) are one complete generation of the pool.
fn complete(all: &[Value]) -> bool {
    !all.is_empty()
        && all
            .iter()
            .all(|sl| sl["spec"]["pool"]["resourceSliceCount"].as_u64() == Some(all.len() as u64))
}

/// Devices carrying our taint, with the taint.
fn tainted(s: &Setup) -> Vec<(String, Value)> {
    slices(s)
        .iter()
        .flat_map(|sl| {
            sl["spec"]["devices"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|d| {
            let t = d["taints"]
                .as_array()?
                .iter()
                .find(|t| t["key"] == TAINT)?
                .clone();
            Some((d["name"].as_str().unwrap().to_string(), t))
        })
        .collect()
}

/// The slice writes (create, update, delete) in the server's log.
fn writes(log: &[Logged]) -> Vec<(String, String)> {
    log.iter()
        .filter(|l| l.path.contains("/resourceslices") && l.method != "GET")
        .map(|l| (l.method.clone(), l.path.clone()))
        .collect()
}

/// Sets every port of the tree's first RDMA device (by name) up or down,
/// as the kernel would report it.
fn set_link(tree: &Path, up: bool) -> String {
    let class = tree.join("class/infiniband");
    let mut names: Vec<String> = std::fs::read_dir(&class)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let ports = class.join(&names[0]).join("ports");
    for port in std::fs::read_dir(&ports).unwrap() {
        let port = port.unwrap().path();
        let (state, phys) = if up {
            ("4: ACTIVE", "5: LinkUp")
        } else {
            ("1: DOWN", "3: Disabled")
        };
        std::fs::write(port.join("state"), state).unwrap();
        std::fs::write(port.join("phys_state"), phys).unwrap();
    }
    names[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_link_taints_its_device_by_rewriting_one_slice_at_the_same_generation() {
    let s = Setup::on(NODE, "large", |t| fixtures::large(t, 512));
    let _driver = Driver::start(&s.place, &["--interval", "1s"]);
    wait::until("the pool", || slices(&s), |now| complete(now));
    let before = slices(&s);
    assert!(before.len() > 1, "a pool of several slices");
    assert!(tainted(&s).is_empty());
    let generation = before[0]["spec"]["pool"]["generation"].clone();
    let written = writes(&s.cluster.api.log()).len();

    let tree = s.dirs.tree("large");
    set_link(&tree, false);
    publish(&tree, &s.dirs.cdi());
    wait::until("the taint", || tainted(&s), |now| now.len() == 1);
    let (_, taint) = &tainted(&s)[0];
    assert_eq!(taint["effect"], "NoSchedule");
    assert!(taint["value"].as_str().unwrap().contains("DOWN"), "{taint}");
    assert!(
        taint["timeAdded"].is_string(),
        "the server stamps it: {taint}"
    );
    let log = s.cluster.api.log();
    let change = &writes(&log)[written..];
    assert_eq!(change.len(), 1, "{change:?}");
    assert_eq!(change[0].0, "PUT", "{change:?}");
    assert!(slices(&s)
        .iter()
        .all(|sl| sl["spec"]["pool"]["generation"] == generation));

    // Three more reconciles write nothing: the server's timeAdded is not a
    // change.
    let listed = reconciles(&s.cluster.api);
    reconciled(&s.cluster.api, listed, 3);
    assert_eq!(writes(&s.cluster.api.log()).len(), written + 1);

    // Recovery lifts it, again in place.
    set_link(&tree, true);
    publish(&tree, &s.dirs.cdi());
    wait::until("the taint lifted", || tainted(&s), Vec::is_empty);
    let change = writes(&s.cluster.api.log())[written..].to_vec();
    assert_eq!(change.len(), 2, "{change:?}");
    assert!(change.iter().all(|(m, _)| m == "PUT"), "{change:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_the_taint_gate_off_drops_the_taints_is_told_once_and_not_rewritten() {
    let s = Setup::on(NODE, "ports-down", |d| fixtures::all_ports_down(d, true));
    s.cluster.api.with(|st| st.disable_device_taints());
    let probes = free_addr();
    let driver = Driver::start(&s.place, &["--interval", "1s", "--metrics-addr", &probes]);
    wait::until("the pool", || slices(&s), |now| complete(now));
    let written = writes(&s.cluster.api.log()).len();
    let listed = reconciles(&s.cluster.api);
    reconciled(&s.cluster.api, listed, 3);
    assert_eq!(
        writes(&s.cluster.api.log()).len(),
        written,
        "rewritten in a loop"
    );
    assert!(tainted(&s).is_empty());
    // The Failed device is still published, with its linkState for the
    // DeviceClasses' selector.
    let failed = slices(&s)
        .iter()
        .flat_map(|sl| {
            sl["spec"]["devices"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|d| d["attributes"]["linkState"]["string"] == "Failed")
        .count();
    assert_eq!(failed, 1);
    let said = driver
        .log_lines()
        .iter()
        .filter(|l| l.contains("DRADeviceTaints"))
        .count();
    assert_eq!(said, 1, "{}", driver.log_lines().join("\n"));
    let metrics = within("the metrics", async { http_get(&probes, "/metrics").1 }).await;
    assert!(
        metrics.contains("nodefabric_dra_server_dropped_fields{gate=\"DRADeviceTaints\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_no_execute_effect_is_used_only_when_asked_for() {
    let s = Setup::on(NODE, "ports-down", |d| fixtures::all_ports_down(d, true));
    let _driver = Driver::start(
        &s.place,
        &["--interval", "1h", "--failed-link-taint", "no-execute"],
    );
    wait::until("the taint", || tainted(&s), |now| now.len() == 1);
    assert_eq!(tainted(&s)[0].1["effect"], "NoExecute");
}

/// The next message of the health stream.
async fn next(
    stream: &mut tonic::Streaming<health::NodeWatchResourcesResponse>,
) -> health::NodeWatchResourcesResponse {
    within("a health message", stream.message())
        .await
        .unwrap()
        .expect("the stream stays open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_hears_a_failed_link_on_the_health_stream_and_again_on_recovery() {
    let s = Setup::new(NODE);
    let driver = Driver::start(&s.place, &["--interval", "1h"]);
    wait::until("the pool", || slices(&s), |now| complete(now));
    // As kubelet opens it after registration: authority localhost, no
    // deadline (a stream for the plugin's lifetime).
    let mut client = health::dra_resource_health_client::DraResourceHealthClient::new(
        socket::connect(&s.place.service()).await.unwrap(),
    );
    let mut stream = client
        .node_watch_resources(health::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = next(&mut stream).await;
    let published: usize = slices(&s)
        .iter()
        .map(|sl| sl["spec"]["devices"].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(first.devices.len(), published);
    for d in &first.devices {
        assert_eq!(d.health, health::HealthStatus::Healthy as i32);
        assert_eq!(d.device.as_ref().unwrap().pool_name, NODE);
        assert!(d.health_check_timeout_seconds > 0);
        assert!(d.last_updated_time > 0);
    }

    let tree = s.dirs.tree("gpu8");
    let rdma = set_link(&tree, false);
    publish(&tree, &s.dirs.cdi());
    let changed = next(&mut stream).await;
    assert_eq!(changed.devices.len(), published, "the complete list");
    let sick: Vec<&health::DeviceHealth> = changed
        .devices
        .iter()
        .filter(|d| d.health == health::HealthStatus::Unhealthy as i32)
        .collect();
    assert_eq!(sick.len(), 1);
    assert!(
        sick[0].message.contains(&rdma) && sick[0].message.contains("DOWN"),
        "{}",
        sick[0].message
    );

    set_link(&tree, true);
    publish(&tree, &s.dirs.cdi());
    let healed = next(&mut stream).await;
    assert!(healed
        .devices
        .iter()
        .all(|d| d.health == health::HealthStatus::Healthy as i32));
    drop(driver);
}
