//! The GPU source (`gpuSource`): the real `nodefabric` broker asking the
//! GPU Operator's pod on its node for nvidia-smi's two answers through the
//! stand-in's exec subresource (a real websocket upgrade, the channel
//! protocol v5 or v4), under deploy/'s RBAC and its gpu-exec component.
//! The pod answers with the real nvidia-smi outputs of tests/data/nvsmi.

use super::{failed, ok, World, CM, NS};
use crate::support::apiserver::exec::{Reply, PROTOCOLS};
use crate::support::apiserver::ApiServer;
use crate::support::apiserver_rbac::Rbac;
use crate::support::cluster::Cluster;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;

const GPU_NS: &str = "gpu-operator";
const DS: &str = "nvidia-device-plugin-daemonset";
const POD: &str = "nvidia-device-plugin-daemonset-x7k2p";
const QUERY: &str = "nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader";
const TOPO: &str = "nvidia-smi topo -m";

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel)
}

fn labels() -> Value {
    json!({"app": DS})
}

/// A world whose node-a runs the GPU Operator's device-plugin pod (two
/// containers, as the operator's with its config manager), answering with
/// the real 8-GPU outputs.
fn gpu_world() -> World {
    gpu_world_on(ApiServer::start())
}

fn gpu_world_on(api: ApiServer) -> World {
    let w = World::with_cluster(|dir| Cluster::start_with(dir, api));
    w.api.add_node("node-a");
    w.api.add_daemonset(GPU_NS, DS, labels());
    w.api.add_pod(
        GPU_NS,
        POD,
        "node-a",
        labels(),
        "Running",
        &["nvidia-device-plugin", "config-manager"],
    );
    let text = |f: &str| std::fs::read(data(f)).unwrap();
    w.api
        .script_exec(GPU_NS, POD, QUERY, Reply::ok(text("nvsmi/query-8gpu.csv")));
    w.api.script_exec(
        GPU_NS,
        POD,
        TOPO,
        Reply::ok(text("nvsmi/topo-8gpu-10nic.txt")),
    );
    w
}

/// `nodefabric rails` for node-a under the broker's account, with the rail
/// flags of the fixture and `extra`.
fn rails(w: &World, extra: &[&str]) -> Command {
    let mut c = w.nodefabric_as(&w.broker_kubeconfig);
    c.args(["rails", "-o", "json", "--sysfs-root"])
        .arg(&w.root)
        .arg("--lldp-json")
        .arg(w.dir.join("lldp.json"))
        .args([
            "--interface-regex",
            "^eth_r([0-9]+)_p[0-9]+$",
            "--rail-id",
            "rail$1",
            "--node-name",
            "node-a",
        ])
        .args(extra);
    c
}

/// The flags naming the GPU Operator's DaemonSet.
const FROM_POD: [&str; 4] = [
    "--gpu-operator-namespace",
    GPU_NS,
    "--gpu-operator-daemonset",
    DS,
];

/// The record the same outputs give when read from files on the node.
fn local_record(w: &World) -> String {
    let (q, t) = (
        data("nvsmi/query-8gpu.csv"),
        data("nvsmi/topo-8gpu-10nic.txt"),
    );
    ok(rails(w, &[])
        .arg("--gpu-query-file")
        .arg(q)
        .arg("--topo-file")
        .arg(t)
        .output()
        .unwrap())
}

/// node-a's record published by its broker from the pod's answers, as the
/// "previous" record the failure tests keep.
fn published(w: &World) -> String {
    w.owned_configmap(json!({}));
    ok(rails(w, &FROM_POD)
        .args(["--rails-configmap", &format!("{NS}/{CM}")])
        .output()
        .unwrap());
    w.data()["node-a"].clone()
}

/// A broker pass that must fail, leaving node-a's record as `before`; its stderr.
fn fails_keeping(w: &World, before: &str, extra: &[&str]) -> String {
    let err = failed(
        rails(w, &FROM_POD)
            .args(["--rails-configmap", &format!("{NS}/{CM}")])
            .args(extra)
            .output()
            .unwrap(),
    );
    assert_eq!(w.data()["node-a"], before, "the previous record is kept");
    err
}

#[test]
fn one_pod_gives_the_record_the_same_outputs_give_locally_over_channel_v5() {
    let w = gpu_world();
    let from_pod = ok(rails(&w, &FROM_POD).output().unwrap());
    assert_eq!(from_pod, local_record(&w));
    let r: Value = serde_json::from_str(&from_pod).unwrap();
    assert_eq!(
        r["gpus"][5]["uuid"],
        "GPU-00000005-1b2c-4d5e-8f90-a1b2c3d4e5f5"
    );
    assert_eq!(r["gpus"][5]["source"], "nvidia-smi");
    let served = w.api.served_execs();
    assert_eq!(served.len(), 2, "{served:?}");
    for (s, cmd) in served.iter().zip([QUERY, TOPO]) {
        assert_eq!(s.pod, format!("{GPU_NS}/{POD}"));
        assert_eq!(s.container, "nvidia-device-plugin", "the first container");
        assert_eq!(s.command.join(" "), cmd);
        assert_eq!(s.protocol, PROTOCOLS[0]);
    }
}

#[test]
fn a_server_with_only_channel_v4_is_asked_over_v4_with_the_same_record() {
    let w = gpu_world();
    w.api.allow_exec_protocols(&["v4.channel.k8s.io"]);
    let from_pod = ok(rails(&w, &FROM_POD).output().unwrap());
    assert_eq!(from_pod, local_record(&w));
    let served = w.api.served_execs();
    assert!(
        served.len() == 2 && served.iter().all(|s| s.protocol == "v4.channel.k8s.io"),
        "{served:?}"
    );
}

#[test]
fn the_values_files_gpu_source_is_used_where_a_cluster_is_configured() {
    let w = gpu_world();
    let config = w.dir.join("values.yaml");
    std::fs::write(
        &config,
        format!("railSource:\n  name: host-lldp\ngpuSource:\n  gpuOperatorNamespace: {GPU_NS}\n  daemonSet: {DS}\n"),
    )
    .unwrap();
    let from_file = ok(rails(&w, &["--rails-config", config.to_str().unwrap()])
        .output()
        .unwrap());
    assert_eq!(from_file, local_record(&w));
    assert_eq!(w.api.served_execs().len(), 2);
}

#[test]
fn no_running_pod_on_the_node_fails_the_pass_naming_what_was_found_and_keeps_the_record() {
    let w = gpu_world();
    let before = published(&w);
    w.api.add_pod(
        GPU_NS,
        POD,
        "node-a",
        labels(),
        "Pending",
        &["nvidia-device-plugin"],
    );
    let err = fails_keeping(&w, &before, &[]);
    assert!(
        err.contains(&format!(
            "DaemonSet {GPU_NS}/{DS} has no Running pod on node node-a: found {POD} (Pending)"
        )),
        "{err}"
    );
    w.api.with(|s| s.exec.served.clear());
    // No pod at all.
    w.api
        .add_pod(GPU_NS, POD, "node-b", labels(), "Running", &["c"]);
    let err = fails_keeping(&w, &before, &[]);
    assert!(
        err.contains("has no Running pod on node node-a: none found"),
        "{err}"
    );
    assert!(w.api.served_execs().is_empty(), "nothing was run");
}

#[test]
fn two_running_pods_on_the_node_fail_the_pass_naming_both() {
    let w = gpu_world();
    let before = published(&w);
    w.api.add_pod(
        GPU_NS,
        "nvidia-device-plugin-daemonset-9qz4w",
        "node-a",
        labels(),
        "Running",
        &["c"],
    );
    let err = fails_keeping(&w, &before, &[]);
    assert!(
        err.contains(&format!("has 2 Running pods on node node-a: found nvidia-device-plugin-daemonset-9qz4w (Running), {POD} (Running)")),
        "{err}"
    );
}

#[test]
fn a_pod_on_another_node_or_of_another_daemonset_is_ignored() {
    let w = gpu_world();
    w.api.add_pod(
        GPU_NS,
        "nvidia-device-plugin-daemonset-b",
        "node-b",
        labels(),
        "Running",
        &["c"],
    );
    w.api.add_pod(
        GPU_NS,
        "gpu-feature-discovery-a",
        "node-a",
        json!({"app": "gpu-feature-discovery"}),
        "Running",
        &["c"],
    );
    assert_eq!(ok(rails(&w, &FROM_POD).output().unwrap()), local_record(&w));
    assert!(w
        .api
        .served_execs()
        .iter()
        .all(|s| s.pod == format!("{GPU_NS}/{POD}")));
}

#[test]
fn a_non_zero_exit_fails_the_pass_with_the_commands_stderr_and_keeps_the_record() {
    let w = gpu_world();
    let before = published(&w);
    w.api.script_exec(
        GPU_NS,
        POD,
        TOPO,
        Reply::Exit {
            stdout: Vec::new(),
            stderr: b"Unable to determine the device handle for GPU0000:12:00.0: Unknown Error\n"
                .to_vec(),
            code: 15,
        },
    );
    let err = fails_keeping(&w, &before, &[]);
    assert!(
        err.contains(&format!("pod {GPU_NS}/{POD} (container nvidia-device-plugin): {TOPO}: exited with exit code 15: Unable to determine the device handle for GPU0000:12:00.0: Unknown Error")),
        "{err}"
    );
}

#[test]
fn a_hung_command_is_abandoned_at_the_tool_timeout_and_the_record_kept() {
    let w = gpu_world();
    let before = published(&w);
    w.api.script_exec(GPU_NS, POD, TOPO, Reply::Hang);
    let err = fails_keeping(&w, &before, &["--tool-timeout", "1s"]);
    assert!(
        err.contains(&format!(
            "{TOPO}: not done within 1s (--tool-timeout, both commands together)"
        )),
        "{err}"
    );
}

#[test]
fn a_huge_output_is_refused_at_the_cap_not_cut_and_parsed() {
    let w = gpu_world();
    let before = published(&w);
    // Real rows, repeated past the 4 MiB cap.
    let rows = std::fs::read_to_string(data("nvsmi/query-8gpu.csv")).unwrap();
    let huge = rows.repeat((4 << 20) / rows.len() + 2);
    w.api.script_exec(GPU_NS, POD, QUERY, Reply::ok(huge));
    let err = fails_keeping(&w, &before, &[]);
    assert!(
        err.contains(&format!(
            "{QUERY}: printed more than 4194304 bytes on stdout (the cap); refused, not parsed"
        )),
        "{err}"
    );
}

#[test]
fn exec_forbidden_names_the_missing_permission_and_keeps_the_record() {
    // deploy/ applied, but the component's pods/exec rule left out.
    let rbac = Rbac::from_deploy_edited(|doc| {
        if doc["kind"] == "Role" && doc["metadata"]["name"] == "nodefabric-gpu-exec" {
            let rules = doc["rules"].as_array_mut().unwrap();
            rules.retain(|r| r["resources"][0] != "pods/exec");
            assert_eq!(rules.len(), 2);
        }
    });
    let w = gpu_world_on(ApiServer::start_with(rbac));
    w.owned_configmap(json!({"node-a": "{\"previous\":true}"}));
    let err = fails_keeping(&w, "{\"previous\":true}", &[]);
    assert!(
        err.contains(&format!("exec: forbidden: the service account needs `create` on pods/exec in namespace {GPU_NS}")),
        "{err}"
    );
    assert!(
        err.contains(&format!("pods \"{POD}\" is forbidden: User \"system:serviceaccount:nodefabric:nodefabric\" cannot create resource \"pods/exec\" in API group \"\" in the namespace \"{GPU_NS}\"")),
        "{err}"
    );
}

#[test]
fn a_connection_dropped_mid_stream_fails_the_pass_and_keeps_the_record() {
    let w = gpu_world();
    let before = published(&w);
    let rows = std::fs::read(data("nvsmi/query-8gpu.csv")).unwrap();
    w.api.script_exec(
        GPU_NS,
        POD,
        QUERY,
        Reply::Drop(rows[..rows.len() / 2].to_vec()),
    );
    let err = fails_keeping(&w, &before, &[]);
    assert!(
        err.contains(&format!(
            "{QUERY}: the exec connection closed before the command's exit status"
        )),
        "{err}"
    );
}

#[test]
fn a_capture_with_the_exec_source_holds_the_answers_and_replays_without_the_api_server() {
    let w = gpu_world();
    let archive = w.dir.join("node.tar.gz");
    let mut capture = w.nodefabric_as(&w.broker_kubeconfig);
    capture
        .arg("--sysfs-root")
        .arg(&w.root)
        .args(["capture", "--out"])
        .arg(&archive)
        .arg("--lldp-json")
        .arg(w.dir.join("lldp.json"))
        .args(FROM_POD)
        .args(["--node-name", "node-a"]);
    ok(capture.output().unwrap());
    assert_eq!(w.api.served_execs().len(), 2);
    let expected = local_record(&w);
    // The replay has no cluster: no KUBECONFIG, no node name.
    let mut replay = Command::new(env!("CARGO_BIN_EXE_nodefabric"));
    replay
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("NODE_NAME")
        .env("PATH", "/nonexistent")
        .arg("--sysfs-root")
        .arg(&archive)
        .args([
            "rails",
            "-o",
            "json",
            "--interface-regex",
            "^eth_r([0-9]+)_p[0-9]+$",
            "--rail-id",
            "rail$1",
        ]);
    let replayed = ok(replay.output().unwrap());
    let strip = |s: &str| {
        let mut v: Value = serde_json::from_str(s).unwrap();
        v.as_object_mut().unwrap().remove("nodeUID");
        v
    };
    assert_eq!(strip(&replayed), strip(&expected));
    assert_eq!(w.api.served_execs().len(), 2, "the replay asked no pod");
}
