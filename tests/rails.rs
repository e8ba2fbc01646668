//! The GPU-to-NIC rail record: `nvidia-smi` parsers on outputs written in the
//! tool's exact format, lldpctl JSON shapes, and selection end to end through
//! the real binary on a fixture tree whose NICs are named like rail ports.

#[path = "support/fixtures.rs"]
mod fixtures;
#[path = "support/snapshots.rs"]
mod snapshots;

use snapshots::settings;

use nodefabric::rails::{lldp, nvsmi};
use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(rel)
}

fn text(rel: &str) -> String {
    fs::read_to_string(data(rel)).unwrap()
}

// ---- nvidia-smi parsers ----------------------------------------------------

#[test]
fn topo_eight_gpus_ten_nics_with_legend_and_affinity_columns() {
    let t = nvsmi::parse_topo(&text("nvsmi/topo-8gpu-10nic.txt")).unwrap();
    assert_eq!(t.gpu_to_nic.len(), 8);
    let g0 = &t.gpu_to_nic[&0];
    assert_eq!(g0.len(), 10, "GPU columns and affinity columns are not NICs");
    assert_eq!(g0["mlx5_0"], "PIX");
    assert_eq!(g0["mlx5_1"], "NODE");
    assert_eq!(g0["mlx5_4"], "SYS");
    assert_eq!(g0["mlx5_8"], "PHB");
    assert_eq!(t.gpu_to_nic[&5]["mlx5_5"], "PIX");
}

#[test]
fn topo_four_gpus_without_nics_and_an_older_layout_named_by_device() {
    let t = nvsmi::parse_topo(&text("nvsmi/topo-4gpu-nonic.txt")).unwrap();
    assert_eq!(t.gpu_to_nic.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert!(t.gpu_to_nic.values().all(|m| m.is_empty()));

    let t = nvsmi::parse_topo(&text("nvsmi/topo-4gpu-oldnames.txt")).unwrap();
    assert_eq!(t.gpu_to_nic[&0]["mlx5_0"], "PXB");
    assert_eq!(t.gpu_to_nic[&2]["mlx5_1"], "PHB");
    assert_eq!(t.gpu_to_nic[&3]["mlx5_0"], "SYS");
}

#[test]
fn topo_with_terminal_escapes_parses_the_same() {
    let plain = text("nvsmi/topo-8gpu-10nic.txt");
    let (hdr, rest) = plain.split_once('\n').unwrap();
    let tty = format!("\u{1b}[4m{hdr}\u{1b}[0m\n{rest}");
    assert_eq!(nvsmi::parse_topo(&tty).unwrap(), nvsmi::parse_topo(&plain).unwrap());
}

#[test]
fn malformed_topo_is_an_error_naming_the_line() {
    let plain = text("nvsmi/topo-8gpu-10nic.txt");
    // A truncated GPU row.
    let mut lines: Vec<String> = plain.lines().map(str::to_string).collect();
    lines[3] = lines[3].split('\t').take(5).collect::<Vec<_>>().join("\t");
    let e = nvsmi::parse_topo(&lines.join("\n")).unwrap_err();
    assert_eq!(e.line, 4, "{e}");
    assert!(e.to_string().contains("GPU2"), "{e}");
    // NIC columns but no NIC Legend.
    let cut = &plain[..plain.find("NIC Legend:").unwrap()];
    let e = nvsmi::parse_topo(cut).unwrap_err();
    assert!(e.to_string().contains("NIC0 is not in the NIC Legend"), "{e}");
    // A legend line that is not `NICn: name`.
    let e = nvsmi::parse_topo(&format!("{plain}  garbage\n")).unwrap_err();
    assert!(e.to_string().contains("garbage"), "{e}");
    // No matrix at all.
    let e = nvsmi::parse_topo("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n").unwrap_err();
    assert!(e.to_string().contains("no header row"), "{e}");
    // An empty cell under a device column.
    let blanked = plain.replacen("\tPIX\t", "\t\t", 1);
    assert!(nvsmi::parse_topo(&blanked).unwrap_err().to_string().contains("empty cell under NIC0"));
}

#[test]
fn query_normalises_bus_ids_and_rejects_bad_lines() {
    let ids = nvsmi::parse_query(&text("nvsmi/query-8gpu.csv")).unwrap();
    assert_eq!(ids.len(), 8);
    assert_eq!(ids[0].pci_bus_id, "0000:12:00.0", "8-digit domain, uppercase hex → kernel form");
    assert_eq!(ids[4].pci_bus_id, "0000:92:00.0");
    assert!(ids[7].uuid.starts_with("GPU-00000007"));
    for (bad, why) in [
        ("0, GPU-1, 00000000:12:00.0, extra\n", "3 comma-separated"),
        ("x, GPU-1, 00000000:12:00.0\n", "not a number"),
        ("0, 1234, 00000000:12:00.0\n", "GPU-"),
        ("0, GPU-1, 12:00\n", "not a PCI address"),
        ("0, GPU-1, 00000000:12:00.0\n0, GPU-2, 00000000:22:00.0\n", "twice"),
    ] {
        let e = nvsmi::parse_query(bad).unwrap_err();
        assert!(e.to_string().contains(why), "{bad:?}: {e}");
    }
}

// ---- lldpctl JSON shapes ---------------------------------------------------

#[test]
fn lldpctl_shapes_object_list_empty_and_json0() {
    let names = |f: &str| {
        let v: Value = serde_json::from_str(&text(&format!("lldp/{f}"))).unwrap();
        lldp::interfaces(&v).unwrap().into_iter().collect::<Vec<_>>()
    };
    assert_eq!(names("puppet-lldpd-single-nosysname.json"), ["enp3s0"]);
    assert_eq!(names("puppet-lldpd-multi-trimmed.json"), ["eno1"]);
    assert!(names("puppet-lldpd-empty.json").is_empty());
    assert_eq!(names("lldpd-testexpect-show-neighbors-details.json"), ["eth0"]);
    assert_eq!(names("lldpd-testexpect-show-neighbors-details.json0.json"), ["eth0"]);
    // Two neighbours on one port: one interface.
    let twice = json!({"lldp": {"interface": [{"eth1": {}}, {"eth1": {}}, {"eth0": {}}]}});
    assert_eq!(lldp::interfaces(&twice).unwrap().into_iter().collect::<Vec<_>>(), ["eth0", "eth1"]);
    assert!(lldp::interfaces(&json!({"interfaces": []})).is_err());
    assert!(lldp::interfaces(&json!({"lldp": {"interface": "eth0"}})).is_err());
}

// ---- selection through the binary -----------------------------------------

/// A node for rail tests: gpu8 with GPU i's NIC named `eth_r{i/2}_p{i%2}`, so
/// rail r holds NICs 2r and 2r+1 (both on one NUMA node).
struct Node {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    dir: PathBuf,
}

impl Node {
    fn new() -> Node {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("sys");
        fixtures::gpu8_named(&root, |i, _| format!("eth_r{}_p{}", i / 2, i % 2));
        let dir = tmp.path().to_path_buf();
        Node { _tmp: tmp, root, dir }
    }

    /// Writes an lldpctl-shaped neighbour table listing `ifaces`.
    fn lldp(&self, ifaces: &[&str]) -> PathBuf {
        let list: Vec<Value> = ifaces.iter().map(|i| json!({ *i: {"via": "LLDP", "rid": "1"} })).collect();
        let v = if list.len() == 1 { json!({"lldp": {"interface": list[0]}}) } else { json!({"lldp": {"interface": list}}) };
        let p = self.dir.join("lldp.json");
        fs::write(&p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
        p
    }

    fn write(&self, name: &str, content: &str) -> PathBuf {
        let p = self.dir.join(name);
        fs::write(&p, content).unwrap();
        p
    }

    fn rails(&self, extra: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_nodefabric"))
            .args(["rails", "--sysfs-root"])
            .arg(&self.root)
            .args(extra)
            .env("NODEFABRIC_NOW", "2026-03-01T12:00:00Z")
            .env("PATH", "/nonexistent")
            .output()
            .unwrap()
    }
}

const ALL_RAIL_PORTS: [&str; 8] = ["eth_r0_p0", "eth_r0_p1", "eth_r1_p0", "eth_r1_p1", "eth_r2_p0", "eth_r2_p1", "eth_r3_p0", "eth_r3_p1"];

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn flags(lldp: &Path) -> Vec<String> {
    vec![
        "--lldp-json".into(),
        lldp.display().to_string(),
        "--interface-regex".into(),
        "^eth_r([0-9]+)_p[0-9]+$".into(),
        "--rail-id".into(),
        "rail$1".into(),
    ]
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn sysfs_paths_keep_every_tied_nic_and_name_the_source() {
    let n = Node::new();
    let mut ports = ALL_RAIL_PORTS.to_vec();
    ports.extend(["eno1", "enp112s0np0"]); // neighbours that are no rail port
    let f = flags(&n.lldp(&ports));
    let mut a = args(&f);
    a.push("--sysfs-paths");
    let out = ok(n.rails(&a));
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["version"], "rails.nodefabric.gpustack.ai/v1");
    assert_eq!(r["railSource"], "host-lldp");
    assert_eq!(r["nics"].as_object().unwrap().len(), 8, "only rail ports: {out}");
    assert_eq!(r["nics"]["0000:13:00.0"], json!(["rail0"]));
    let g0 = &r["gpus"][0];
    assert_eq!(g0["pciBusId"], "0000:12:00.0");
    assert_eq!(g0["source"], "sysfs");
    assert!(g0.get("uuid").is_none());
    assert_eq!(g0["rails"]["rail0"], json!({"pathClass": "PIX", "nics": ["0000:13:00.0"]}));
    // rail1's two NICs sit on GPU0's NUMA node behind other switches: a tie, both kept.
    assert_eq!(g0["rails"]["rail1"], json!({"pathClass": "NODE", "nics": ["0000:33:00.0", "0000:43:00.0"]}));
    assert_eq!(g0["rails"]["rail2"]["pathClass"], "SYS");
    settings().bind(|| insta::assert_snapshot!("rails_gpu8.sysfs", out));
}

#[test]
fn nvidia_smi_outputs_give_uuids_and_classes_and_extra_nics_are_ignored() {
    let n = Node::new();
    let f = flags(&n.lldp(&ALL_RAIL_PORTS));
    let mut a = args(&f);
    let (q, t) = (data("nvsmi/query-8gpu.csv"), data("nvsmi/topo-8gpu-10nic.txt"));
    a.extend(["--gpu-query-file", q.to_str().unwrap(), "--topo-file", t.to_str().unwrap()]);
    let out = ok(n.rails(&a));
    let r: Value = serde_json::from_str(&out).unwrap();
    let g5 = &r["gpus"][5];
    assert_eq!(g5["pciBusId"], "0000:a2:00.0");
    assert_eq!(g5["source"], "nvidia-smi");
    assert_eq!(g5["uuid"], "GPU-00000005-1b2c-4d5e-8f90-a1b2c3d4e5f5");
    assert_eq!(g5["rails"]["rail2"], json!({"pathClass": "PIX", "nics": ["0000:a3:00.0"]}));
    assert_eq!(g5["rails"]["rail3"], json!({"pathClass": "NODE", "nics": ["0000:b3:00.0", "0000:c3:00.0"]}));
    // mlx5_8/9 are in the matrix but on no rail.
    assert!(!out.contains("0000:70:00.0") && !out.contains("0000:f0:00.0"), "{out}");
    settings().bind(|| insta::assert_snapshot!("rails_gpu8.nvidia_smi", out));
}

#[test]
fn absent_nvidia_smi_falls_back_to_sysfs() {
    let n = Node::new();
    let f = flags(&n.lldp(&ALL_RAIL_PORTS));
    let mut a = args(&f);
    a.extend(["--nvidia-smi", "/nonexistent/nvidia-smi"]);
    let r: Value = serde_json::from_str(&ok(n.rails(&a))).unwrap();
    assert!(r["gpus"].as_array().unwrap().iter().all(|g| g["source"] == "sysfs"));
    assert_eq!(r["gpus"].as_array().unwrap().len(), 8);
}

#[test]
fn an_unknown_class_or_an_unqualified_rail_fails_naming_rail_and_gpu() {
    let n = Node::new();
    let f = flags(&n.lldp(&ALL_RAIL_PORTS));
    let q = data("nvsmi/query-8gpu.csv");
    let topo = text("nvsmi/topo-8gpu-10nic.txt");
    // GPU0 → NIC0 printed as an old-driver "SOC".
    let unknown = n.write("topo-unknown.txt", &topo.replacen("\tPIX\t", "\tSOC\t", 1));
    let mut a = args(&f);
    a.extend(["--gpu-query-file", q.to_str().unwrap(), "--topo-file", unknown.to_str().unwrap()]);
    let o = n.rails(&a);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("rail rail0") && err.contains("GPU 0000:12:00.0") && err.contains("\"SOC\""), "{err}");
    assert!(o.stdout.is_empty(), "no partial record on failure");

    // rail3's NICs are named in the legend by devices this node does not have.
    let unqualified = n.write("topo-unq.txt", &topo.replace("NIC6: mlx5_6", "NIC6: mlx5_66").replace("NIC7: mlx5_7", "NIC7: mlx5_77"));
    let mut a = args(&f);
    a.extend(["--gpu-query-file", q.to_str().unwrap(), "--topo-file", unqualified.to_str().unwrap()]);
    let o = n.rails(&a);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("rail rail3") && err.contains("GPU 0000:12:00.0") && err.contains("no qualified NIC"), "{err}");
}

#[test]
fn no_neighbours_is_a_valid_empty_record() {
    let n = Node::new();
    let empty = n.write("empty.json", "{\"lldp\": {}}");
    let f = flags(&empty);
    let mut a = args(&f);
    a.push("--sysfs-paths");
    let out = ok(n.rails(&a));
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["nics"], json!({}));
    assert_eq!(r["gpus"], json!([]));
}

#[test]
fn a_rail_port_without_a_pci_device_fails_naming_it() {
    let n = Node::new();
    let t = fixtures::Tree::new(&n.root);
    t.virtual_netdev("eth_r9_p0");
    let f = flags(&n.lldp(&["eth_r0_p0", "eth_r9_p0"]));
    let mut a = args(&f);
    a.push("--sysfs-paths");
    let o = n.rails(&a);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("rail9") && err.contains("eth_r9_p0"), "{err}");
}

#[test]
fn the_helm_values_block_configures_the_same_record_and_flags_win() {
    let n = Node::new();
    let lldp_file = n.lldp(&ALL_RAIL_PORTS);
    let values = n.write(
        "values.yaml",
        "nodeMetadata:\n  plugins:\n    gpuNicRailMapping:\n      enabled: true\n      configMapName: topograph-nic-rails\n      railSource:\n        name: host-lldp\n        hostLLDP:\n          interfaceRegex: '^eth_r([0-9]+)_p[0-9]+$'\n          railID: 'rail$1'\n      gpuSource:\n        gpuOperatorNamespace: gpu-operator\n        daemonSet: nvidia-device-plugin-daemonset\n",
    );
    let from_cfg = ok(n.rails(&["--rails-config", values.to_str().unwrap(), "--lldp-json", lldp_file.to_str().unwrap(), "--sysfs-paths"]));
    let f = flags(&lldp_file);
    let mut a = args(&f);
    a.push("--sysfs-paths");
    assert_eq!(from_cfg, ok(n.rails(&a)));
    // A flag overrides the file: every port on one rail named "all".
    let one = ok(n.rails(&[
        "--rails-config",
        values.to_str().unwrap(),
        "--lldp-json",
        lldp_file.to_str().unwrap(),
        "--sysfs-paths",
        "--rail-id",
        "all",
    ]));
    let r: Value = serde_json::from_str(&one).unwrap();
    assert_eq!(r["gpus"][0]["rails"].as_object().unwrap().keys().collect::<Vec<_>>(), ["all"]);
    assert_eq!(r["gpus"][0]["rails"]["all"]["nics"], json!(["0000:13:00.0"]));

    for (yaml, why) in [
        ("railSource:\n  name: xplane\n", "xplane is not supported"),
        ("railSource:\n  name: host-lldp\n  hostLLDP:\n    interfaceRegex: x\n    railId: y\n", "railId"),
        ("enabled: false\nrailSource:\n  name: host-lldp\n", "disabled"),
    ] {
        let p = n.write("bad.yaml", yaml);
        let o = n.rails(&["--rails-config", p.to_str().unwrap(), "--lldp-json", lldp_file.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(why) && err.contains("bad.yaml"), "{yaml}: {err}");
    }
}

#[test]
fn publish_writes_the_rail_file_and_keeps_it_when_a_pass_fails() {
    let n = Node::new();
    let good = n.lldp(&ALL_RAIL_PORTS);
    let rails_file = n.dir.join("out/rails.json");
    let publish = |lldp: &Path, extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_nodefabric"))
            .args(["publish", "--sysfs-root"])
            .arg(&n.root)
            .arg("--features-dir")
            .arg(n.dir.join("f"))
            .arg("--state-dir")
            .arg(n.dir.join("s"))
            .arg("--cdi-dir")
            .arg(n.dir.join("cdi"))
            .arg("--rails-file")
            .arg(&rails_file)
            .arg("--lldp-json")
            .arg(lldp)
            .args(["--interface-regex", "^eth_r([0-9]+)_p[0-9]+$", "--rail-id", "rail$1", "--sysfs-paths"])
            .args(extra)
            .env("PATH", "/nonexistent")
            .output()
            .unwrap()
    };
    let o = publish(&good, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let first = fs::read_to_string(&rails_file).unwrap();
    let printed = ok(n.rails(&args(&[flags(&good), vec!["--sysfs-paths".into()]].concat())));
    assert_eq!(first, printed, "publish writes exactly what `rails` prints");

    let broken = n.write("broken.json", "{\"lldp\": ");
    fs::remove_file(n.dir.join("f/nodefabric")).unwrap();
    let o = publish(&broken, &[]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("previous"), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(fs::read_to_string(&rails_file).unwrap(), first, "previous rail record kept");
    assert!(n.dir.join("f/nodefabric").exists(), "labels and CDI do not depend on rails");
    let leftovers: Vec<_> = fs::read_dir(rails_file.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers, ["rails.json"], "no temp file left behind");
}

// ---- nodeUID ------------------------------------------------------------------
// Read from the Node object through the cluster client: tests/cluster.rs.

#[test]
fn node_uid_given_on_the_command_line_is_recorded_without_a_cluster() {
    let n = Node::new();
    let f = flags(&n.lldp(&ALL_RAIL_PORTS));
    let mut a = args(&f);
    a.extend(["--sysfs-paths", "--node-uid", "given", "--node-name", "node-a"]);
    let r: Value = serde_json::from_str(&ok(n.rails(&a))).unwrap();
    assert_eq!(r["nodeUID"], "given");
}
