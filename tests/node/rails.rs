//! The GPU-to-NIC rail record: `nvidia-smi` parsers on outputs written in the
//! tool's exact format, lldpctl JSON shapes, and selection end to end through
//! the real binary on a fixture tree whose NICs are named like rail ports.

use crate::support::os::make_fifo;
use crate::support::{fixtures, snapshots};
use snapshots::settings;

use nodefabric::rails::{lldp, nvsmi, topo};
use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel)
}

fn text(rel: &str) -> String {
    fs::read_to_string(data(rel)).unwrap()
}

// ---- nvidia-smi parsers ----------------------------------------------------

#[test]
fn topo_eight_gpus_ten_nics_with_legend_and_affinity_columns() {
    let t = topo::parse_topo(&text("nvsmi/topo-8gpu-10nic.txt"), "t").unwrap();
    assert_eq!(t.gpu_to_nic.len(), 8);
    let g0 = &t.gpu_to_nic[&0];
    assert_eq!(
        g0.len(),
        10,
        "GPU columns and affinity columns are not NICs"
    );
    assert_eq!(g0["mlx5_0"], "PIX");
    assert_eq!(g0["mlx5_1"], "NODE");
    assert_eq!(g0["mlx5_4"], "SYS");
    assert_eq!(g0["mlx5_8"], "PHB");
    assert_eq!(t.gpu_to_nic[&5]["mlx5_5"], "PIX");
}

#[test]
fn topo_four_gpus_without_nics_and_an_older_layout_named_by_device() {
    let t = topo::parse_topo(&text("nvsmi/topo-4gpu-nonic.txt"), "t").unwrap();
    assert_eq!(
        t.gpu_to_nic.keys().copied().collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    assert!(t.gpu_to_nic.values().all(|m| m.is_empty()));

    let t = topo::parse_topo(&text("nvsmi/topo-4gpu-oldnames.txt"), "t").unwrap();
    assert_eq!(t.gpu_to_nic[&0]["mlx5_0"], "PXB");
    assert_eq!(t.gpu_to_nic[&2]["mlx5_1"], "PHB");
    assert_eq!(t.gpu_to_nic[&3]["mlx5_0"], "SYS");
}

#[test]
fn topo_with_terminal_escapes_parses_the_same() {
    let plain = text("nvsmi/topo-8gpu-10nic.txt");
    let (hdr, rest) = plain.split_once('\n').unwrap();
    let tty = format!("\u{1b}[4m{hdr}\u{1b}[0m\n{rest}");
    assert_eq!(
        topo::parse_topo(&tty, "t").unwrap(),
        topo::parse_topo(&plain, "t").unwrap()
    );
}

#[test]
fn malformed_topo_is_an_error_naming_the_file_and_line_once() {
    let plain = text("nvsmi/topo-8gpu-10nic.txt");
    let parse = |t: &str| topo::parse_topo(t, "saved.txt").unwrap_err();
    // A truncated GPU row.
    let mut lines: Vec<String> = plain.lines().map(str::to_string).collect();
    lines[3] = lines[3].split('\t').take(5).collect::<Vec<_>>().join("\t");
    let e = parse(&lines.join("\n"));
    assert_eq!(e.line, Some(4), "{e}");
    assert!(
        e.to_string().starts_with("saved.txt line 4: GPU2: 4 cells"),
        "{e}"
    );
    // NIC columns but no NIC Legend: the whole text is at fault, no line 0.
    let e = parse(&plain[..plain.find("NIC Legend:").unwrap()]);
    assert_eq!(
        e.to_string(),
        "saved.txt: column NIC0 is not in the NIC Legend"
    );
    // A damaged legend entry; other text after the legend (a prompt) is not one.
    let e = parse(&plain.replace("NIC9: mlx5_9", "NIC9 mlx5_9"));
    assert!(
        e.to_string()
            .contains("line 42: NIC Legend entry \"NIC9 mlx5_9\""),
        "{e}"
    );
    assert!(topo::parse_topo(&format!("{plain}root@dgx:~# "), "t").is_ok());
    // No matrix at all.
    let e =
        parse("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n");
    assert_eq!(e.to_string(), "saved.txt: no header row with GPU columns");
    // An empty cell under a device column.
    let blanked = plain.replacen("\tPIX\t", "\t\t", 1);
    assert!(parse(&blanked)
        .to_string()
        .contains("line 2: GPU0: empty cell under NIC0"));
}

#[test]
fn query_normalises_bus_ids_and_rejects_bad_lines() {
    let ids = nvsmi::parse_query(&text("nvsmi/query-8gpu.csv"), "q").unwrap();
    assert_eq!(ids.len(), 8);
    assert_eq!(
        ids[0].pci_bus_id, "0000:12:00.0",
        "8-digit domain, uppercase hex → kernel form"
    );
    assert_eq!(ids[4].pci_bus_id, "0000:92:00.0");
    assert!(ids[7].uuid.starts_with("GPU-00000007"));
    for (bad, why) in [
        ("0, GPU-1, 00000000:12:00.0, extra\n", "3 comma-separated"),
        ("x, GPU-1, 00000000:12:00.0\n", "not a number"),
        ("0, 1234, 00000000:12:00.0\n", "GPU-"),
        ("0, GPU-1, 12:00\n", "not a PCI address"),
        (
            "0, GPU-1, 00000000:12:00.0\n0, GPU-2, 00000000:22:00.0\n",
            "twice",
        ),
    ] {
        let e = nvsmi::parse_query(bad, "q").unwrap_err();
        assert!(e.to_string().contains(why), "{bad:?}: {e}");
    }
}

// ---- lldpctl JSON shapes ---------------------------------------------------

#[test]
fn lldpctl_shapes_object_list_empty_and_json0() {
    let names = |f: &str| {
        let v: Value = serde_json::from_str(&text(&format!("lldp/{f}"))).unwrap();
        lldp::interfaces(&v)
            .unwrap()
            .into_iter()
            .collect::<Vec<_>>()
    };
    assert_eq!(names("puppet-lldpd-single-nosysname.json"), ["enp3s0"]);
    assert_eq!(names("puppet-lldpd-multi-trimmed.json"), ["eno1"]);
    assert!(names("puppet-lldpd-empty.json").is_empty());
    assert_eq!(
        names("lldpd-testexpect-show-neighbors-details.json"),
        ["eth0"]
    );
    assert_eq!(
        names("lldpd-testexpect-show-neighbors-details.json0.json"),
        ["eth0"]
    );
    // Two neighbours on one port: one interface.
    let twice = json!({"lldp": {"interface": [{"eth1": {}}, {"eth1": {}}, {"eth0": {}}]}});
    assert_eq!(
        lldp::interfaces(&twice)
            .unwrap()
            .into_iter()
            .collect::<Vec<_>>(),
        ["eth0", "eth1"]
    );
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
        Node {
            _tmp: tmp,
            root,
            dir,
        }
    }

    /// Writes an lldpctl-shaped neighbour table listing `ifaces`.
    fn lldp(&self, ifaces: &[&str]) -> PathBuf {
        let list: Vec<Value> = ifaces
            .iter()
            .map(|i| json!({ *i: {"via": "LLDP", "rid": "1"} }))
            .collect();
        let v = if list.len() == 1 {
            json!({"lldp": {"interface": list[0]}})
        } else {
            json!({"lldp": {"interface": list}})
        };
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
            .args(["rails", "-o", "json", "--sysfs-root"])
            .arg(&self.root)
            .args(extra)
            .env("NODEFABRIC_NOW", "2026-03-01T12:00:00Z")
            .env("PATH", "/nonexistent")
            .output()
            .unwrap()
    }
}

const ALL_RAIL_PORTS: [&str; 8] = [
    "eth_r0_p0",
    "eth_r0_p1",
    "eth_r1_p0",
    "eth_r1_p1",
    "eth_r2_p0",
    "eth_r2_p1",
    "eth_r3_p0",
    "eth_r3_p1",
];

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
    assert_eq!(
        r["nics"].as_object().unwrap().len(),
        8,
        "only rail ports: {out}"
    );
    assert_eq!(r["nics"]["0000:13:00.0"], json!(["rail0"]));
    let g0 = &r["gpus"][0];
    assert_eq!(g0["pciBusId"], "0000:12:00.0");
    assert_eq!(g0["source"], "sysfs");
    assert!(g0.get("uuid").is_none());
    assert_eq!(
        g0["rails"]["rail0"],
        json!({"pathClass": "PIX", "nics": ["0000:13:00.0"]})
    );
    // rail1's two NICs sit on GPU0's NUMA node behind other switches: a tie, both kept.
    assert_eq!(
        g0["rails"]["rail1"],
        json!({"pathClass": "NODE", "nics": ["0000:33:00.0", "0000:43:00.0"]})
    );
    assert_eq!(g0["rails"]["rail2"]["pathClass"], "SYS");
    settings().bind(|| insta::assert_snapshot!("rails_gpu8.sysfs", out));
}

/// lldpctl prints an interface's own name; one holding a backslash (which
/// the kernel allows) is still looked up in sysfs by that name, although
/// the sysfs reader takes names as escaped text.
#[test]
fn an_lldp_interface_whose_name_holds_a_backslash_is_found_in_sysfs() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sys");
    let name = |i: u32| format!("eth\\r{}_p{}", i / 2, i % 2);
    fixtures::gpu8_named(&root, |i, _| name(i));
    let n = Node {
        root,
        dir: tmp.path().to_path_buf(),
        _tmp: tmp,
    };
    let names: Vec<String> = (0..8).map(name).collect();
    let lldp = n.lldp(&names.iter().map(String::as_str).collect::<Vec<_>>());
    let out = ok(n.rails(&[
        "--lldp-json",
        lldp.to_str().unwrap(),
        "--interface-regex",
        r"^eth\\r([0-9]+)_p[0-9]+$",
        "--rail-id",
        "rail$1",
        "--sysfs-paths",
    ]));
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["nics"].as_object().unwrap().len(), 8, "{out}");
    assert_eq!(r["nics"]["0000:13:00.0"], json!(["rail0"]), "{out}");
}

#[test]
fn nvidia_smi_outputs_give_uuids_and_classes_and_extra_nics_are_ignored() {
    let n = Node::new();
    let f = flags(&n.lldp(&ALL_RAIL_PORTS));
    let mut a = args(&f);
    let (q, t) = (
        data("nvsmi/query-8gpu.csv"),
        data("nvsmi/topo-8gpu-10nic.txt"),
    );
    a.extend([
        "--gpu-query-file",
        q.to_str().unwrap(),
        "--topo-file",
        t.to_str().unwrap(),
    ]);
    let out = ok(n.rails(&a));
    let r: Value = serde_json::from_str(&out).unwrap();
    let g5 = &r["gpus"][5];
    assert_eq!(g5["pciBusId"], "0000:a2:00.0");
    assert_eq!(g5["source"], "nvidia-smi");
    assert_eq!(g5["uuid"], "GPU-00000005-1b2c-4d5e-8f90-a1b2c3d4e5f5");
    assert_eq!(
        g5["rails"]["rail2"],
        json!({"pathClass": "PIX", "nics": ["0000:a3:00.0"]})
    );
    assert_eq!(
        g5["rails"]["rail3"],
        json!({"pathClass": "NODE", "nics": ["0000:b3:00.0", "0000:c3:00.0"]})
    );
    // mlx5_8/9 are in the matrix but on no rail.
    assert!(
        !out.contains("0000:70:00.0") && !out.contains("0000:f0:00.0"),
        "{out}"
    );
    settings().bind(|| insta::assert_snapshot!("rails_gpu8.nvidia_smi", out));
}

#[test]
fn absent_nvidia_smi_falls_back_to_sysfs() {
    let n = Node::new();
    let f = flags(&n.lldp(&ALL_RAIL_PORTS));
    let mut a = args(&f);
    a.extend(["--nvidia-smi", "/nonexistent/nvidia-smi"]);
    let r: Value = serde_json::from_str(&ok(n.rails(&a))).unwrap();
    assert!(r["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .all(|g| g["source"] == "sysfs"));
    assert_eq!(r["gpus"].as_array().unwrap().len(), 8);
}

#[test]
fn an_unknown_class_or_an_unqualified_rail_fails_naming_rail_and_gpu() {
    let n = Node::new();
    let f = flags(&n.lldp(&ALL_RAIL_PORTS));
    let q = data("nvsmi/query-8gpu.csv");
    let topo = text("nvsmi/topo-8gpu-10nic.txt");
    // GPU0 → NIC0 printed as a class this version does not rank.
    let unknown = n.write("topo-unknown.txt", &topo.replacen("\tPIX\t", "\tC2C\t", 1));
    let mut a = args(&f);
    a.extend([
        "--gpu-query-file",
        q.to_str().unwrap(),
        "--topo-file",
        unknown.to_str().unwrap(),
    ]);
    let o = n.rails(&a);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("rail rail0") && err.contains("GPU 0000:12:00.0") && err.contains("\"C2C\""),
        "{err}"
    );
    assert!(o.stdout.is_empty(), "no partial record on failure");

    // rail3's NICs are named in the legend by devices this node does not have.
    let unqualified = n.write(
        "topo-unq.txt",
        &topo
            .replace("NIC6: mlx5_6", "NIC6: mlx5_66")
            .replace("NIC7: mlx5_7", "NIC7: mlx5_77"),
    );
    let mut a = args(&f);
    a.extend([
        "--gpu-query-file",
        q.to_str().unwrap(),
        "--topo-file",
        unqualified.to_str().unwrap(),
    ]);
    let o = n.rails(&a);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("rail rail3")
            && err.contains("GPU 0000:12:00.0")
            && err.contains("no qualified NIC"),
        "{err}"
    );
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
    let from_cfg = ok(n.rails(&[
        "--rails-config",
        values.to_str().unwrap(),
        "--lldp-json",
        lldp_file.to_str().unwrap(),
        "--sysfs-paths",
    ]));
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
    assert_eq!(
        r["gpus"][0]["rails"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["all"]
    );
    assert_eq!(
        r["gpus"][0]["rails"]["all"]["nics"],
        json!(["0000:13:00.0"])
    );

    for (yaml, why) in [
        ("railSource:\n  name: xplane\n", "xplane is not supported"),
        (
            "railSource:\n  name: host-lldp\n  hostLLDP:\n    interfaceRegex: x\n    railId: y\n",
            "railId",
        ),
        (
            "enabled: false\nrailSource:\n  name: host-lldp\n",
            "disabled",
        ),
    ] {
        let p = n.write("bad.yaml", yaml);
        let o = n.rails(&[
            "--rails-config",
            p.to_str().unwrap(),
            "--lldp-json",
            lldp_file.to_str().unwrap(),
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains(why) && err.contains("bad.yaml"),
            "{yaml}: {err}"
        );
    }
}

#[test]
fn a_values_file_larger_than_a_configmap_is_refused_naming_it() {
    let n = Node::new();
    let lldp_file = n.lldp(&ALL_RAIL_PORTS);
    // Valid YAML up front, then a comment running past 1 MiB: refused
    // before it is parsed, and never read whole.
    let big = format!("enabled: true\n#{}\n", "x".repeat(1 << 20));
    let p = n.write("huge.yaml", &big);
    let o = n.rails(&[
        "--rails-config",
        p.to_str().unwrap(),
        "--lldp-json",
        lldp_file.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("huge.yaml")
            && err.contains("larger than 1048576 bytes"),
        "{err}"
    );
}

#[test]
fn a_fifo_nobody_writes_to_fails_the_pass_within_the_tool_timeout_instead_of_hanging_it() {
    let n = Node::new();
    let lldp_file = n.lldp(&ALL_RAIL_PORTS);
    let fifo = n.root.parent().unwrap().join("stalled.fifo");
    make_fifo(&fifo);
    let (fifo_s, lldp_s) = (fifo.to_str().unwrap(), lldp_file.to_str().unwrap());
    // As the values file, and as the saved LLDP table: each given up on
    // after --tool-timeout, naming the path, where the open used to block.
    let rails = [
        "--interface-regex",
        "^eth_r([0-9]+)_p[0-9]+$",
        "--rail-id",
        "rail$1",
    ];
    for given in [
        vec!["--rails-config", fifo_s, "--lldp-json", lldp_s],
        [&rails[..], &["--lldp-json", fifo_s]].concat(),
    ] {
        let start = std::time::Instant::now();
        let mut a = vec!["--tool-timeout", "1s"];
        a.extend(&given);
        let o = n.rails(&a);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success()
                && err.contains("stalled.fifo")
                && err.contains("not written to its end within 1s"),
            "{given:?}: {err}"
        );
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "{given:?}"
        );
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
            .args([
                "--interface-regex",
                "^eth_r([0-9]+)_p[0-9]+$",
                "--rail-id",
                "rail$1",
                "--sysfs-paths",
            ])
            .args(extra)
            .env("PATH", "/nonexistent")
            .output()
            .unwrap()
    };
    let o = publish(&good, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let first = fs::read_to_string(&rails_file).unwrap();
    let printed = ok(n.rails(&args(
        &[flags(&good), vec!["--sysfs-paths".into()]].concat(),
    )));
    assert_eq!(first, printed, "publish writes exactly what `rails` prints");

    let broken = n.write("broken.json", "{\"lldp\": ");
    fs::remove_file(n.dir.join("f/nodefabric")).unwrap();
    let o = publish(&broken, &[]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("previous"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        fs::read_to_string(&rails_file).unwrap(),
        first,
        "previous rail record kept"
    );
    assert!(
        n.dir.join("f/nodefabric").exists(),
        "labels and CDI do not depend on rails"
    );
    let leftovers: Vec<_> = fs::read_dir(rails_file.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, ["rails.json"], "no temp file left behind");
}

// ---- nodeUID ------------------------------------------------------------------
// Read from the Node object through the cluster client: tests/cluster/.

#[test]
fn node_uid_given_on_the_command_line_is_recorded_without_a_cluster() {
    let n = Node::new();
    let f = flags(&n.lldp(&ALL_RAIL_PORTS));
    let mut a = args(&f);
    a.extend([
        "--sysfs-paths",
        "--node-uid",
        "given",
        "--node-name",
        "node-a",
    ]);
    let r: Value = serde_json::from_str(&ok(n.rails(&a))).unwrap();
    assert_eq!(r["nodeUID"], "given");
}

// ---- the topo -m corpus ------------------------------------------------------

/// One corpus case: `tests/data/topo/<name>.txt` and its `<name>.nics` table
/// (`gpus N`, then `nic RDMA-name numa-node rail up|down`).
struct Case {
    topo: PathBuf,
    gpus: u32,
    nics: Vec<(String, Option<u32>, u32, bool)>,
}

impl Case {
    fn read(name: &str) -> Case {
        Case::parse(
            data(&format!("topo/{name}.txt")),
            &text(&format!("topo/{name}.nics")),
        )
    }

    /// A case from a `.nics` table's text, for the dump at `topo`.
    fn parse(topo: PathBuf, table: &str) -> Case {
        let name = topo.display().to_string();
        let mut case = Case {
            topo,
            gpus: 0,
            nics: Vec::new(),
        };
        for line in table.lines().filter(|l| !l.starts_with('#')) {
            match line.split_whitespace().collect::<Vec<_>>()[..] {
                ["gpus", n] => case.gpus = n.parse().unwrap(),
                ["nic", dev, numa, rail, link] => case.nics.push((
                    dev.to_string(),
                    numa.parse().ok(),
                    rail.parse().unwrap(),
                    link == "up",
                )),
                _ => panic!("{name}.nics: bad line {line:?}"),
            }
        }
        case
    }

    /// A sysfs tree holding the case's rail NICs (netdev `rail<r>p<k>`, the
    /// RDMA device named as in the dump, its port up or down) and the query
    /// CSV for its GPUs; then the rail record through the binary with the
    /// interface-name source.
    fn run(&self) -> Output {
        self.run_with(&[], |_, _| {})
    }

    /// [`Case::run`] with extra flags, after `more(tree, dir)` has added to
    /// the tree (GPUs, other ports).
    fn run_with(&self, extra: &[&str], more: impl FnOnce(&fixtures::Tree, &Path)) -> Output {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("sys");
        let t = fixtures::Tree::new(&root);
        for (k, (dev, numa, rail, up)) in self.nics.iter().enumerate() {
            let numa = numa.map_or(-1, |n| n as i32);
            let pci = t.pci(
                &[&fixtures::addr(0x20 + k as u32, 0, 0)],
                fixtures::MELLANOX,
                0x1021,
                fixtures::CLASS_IB,
                numa,
            );
            t.netdev(&pci, &format!("rail{rail}p{k}"), 4092, true);
            t.rdma(
                &pci,
                dev,
                &[if *up { fixtures::UP } else { fixtures::DOWN }],
            );
        }
        let query: String = (0..self.gpus)
            .map(|i| {
                format!(
                    "{i}, GPU-{:08x}-0000-4000-8000-{i:012}, 00000000:{:02X}:00.0\n",
                    self.gpus,
                    0x80 + i
                )
            })
            .collect();
        let q = tmp.path().join("query.csv");
        fs::write(&q, query).unwrap();
        more(&t, tmp.path());
        Command::new(env!("CARGO_BIN_EXE_nodefabric"))
            .args(["rails", "-o", "json", "--sysfs-root"])
            .arg(&root)
            .args([
                "--rail-source",
                "interface-name",
                "--interface-regex",
                "^rail([0-9]+)p[0-9]+$",
                "--rail-id",
                "rail$1",
            ])
            .arg("--topo-file")
            .arg(&self.topo)
            .arg("--gpu-query-file")
            .arg(&q)
            .args(extra)
            .env("PATH", "/nonexistent")
            .env("NO_COLOR", "1")
            .output()
            .unwrap()
    }
}

fn corpus() -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(data("topo"))
        .unwrap()
        .filter_map(|e| {
            e.unwrap()
                .file_name()
                .to_str()?
                .strip_suffix(".txt")
                .map(str::to_string)
        })
        .collect();
    names.sort();
    names
}

/// The damaged dumps of the corpus: each must be refused.
const DAMAGED: [&str; 3] = [
    "dgx-a100-truncated",
    "hgx-h100-extra-cell",
    "hgx-h100-lost-tab",
];

#[test]
fn every_corpus_dump_gives_its_snapshotted_record_or_refusal() {
    let names = corpus();
    assert!(names.len() >= 15, "{names:?}");
    let dir = data("topo").display().to_string();
    for name in &names {
        let o = Case::read(name).run();
        let shown = if DAMAGED.contains(&name.as_str()) {
            assert!(
                !o.status.success() && o.stdout.is_empty(),
                "{name}: a damaged dump was accepted"
            );
            let err = String::from_utf8_lossy(&o.stderr);
            let line = err
                .lines()
                .find(|l| l.starts_with("nodefabric: error:"))
                .unwrap_or_else(|| panic!("{name}: {err}"));
            assert_eq!(
                err.matches(&format!("{name}.txt")).count(),
                1,
                "{name}: the error is printed once and names the file once: {err}"
            );
            line.replace(&dir, "tests/data/topo")
        } else {
            ok(o)
        };
        settings().bind(|| {
            insta::assert_snapshot!(format!("rails_topo_{}", name.replace('-', "_")), shown)
        });
    }
}

fn record(o: Output) -> Value {
    serde_json::from_str(&ok(o)).unwrap()
}

// ---- numaLocal, down ports, the interface-name source ------------------------

#[test]
fn numa_local_narrows_an_all_sys_tie_on_a_two_socket_tray() {
    let r = record(Case::read("gb200-tray-all-sys").run());
    // GPU0's NUMA Affinity 0,2-9 holds NIC 0000:20 (node 0), not 0000:22 (node 1).
    let g0 = &r["gpus"][0]["rails"]["rail0"];
    assert_eq!(g0["pathClass"], "SYS");
    assert_eq!(
        g0["nics"],
        json!(["0000:20:00.0", "0000:22:00.0"]),
        "the seed's rule keeps the whole tie"
    );
    assert_eq!(g0["numaLocal"], json!(["0000:20:00.0"]));
    assert_eq!(
        r["gpus"][3]["rails"]["rail1"]["numaLocal"],
        json!(["0000:23:00.0"])
    );

    // Without a NUMA Affinity column the GPU's own numa_node decides.
    let dir = tempfile::tempdir().unwrap();
    let topo = dir.path().join("topo.txt");
    let mut lines: Vec<String> = text("topo/gb200-tray-all-sys.txt")
        .lines()
        .map(|l| l.split('\t').take(12).collect::<Vec<_>>().join("\t"))
        .collect();
    lines[0] = lines[0].replace("\tNUMA Affinity", "");
    fs::write(&topo, lines.join("\n")).unwrap();
    let case = Case::parse(topo, &text("topo/gb200-tray-all-sys.nics"));
    let r = record(case.run_with(&[], |t, _| {
        for i in 0..4u32 {
            t.pci(
                &[&fixtures::addr(0x80 + i, 0, 0)],
                fixtures::NVIDIA,
                0x2941,
                fixtures::CLASS_3D,
                (i / 2) as i32,
            );
        }
    }));
    assert_eq!(
        r["gpus"][1]["rails"]["rail0"]["numaLocal"],
        json!(["0000:20:00.0"])
    );
    assert_eq!(
        r["gpus"][2]["rails"]["rail0"]["numaLocal"],
        json!(["0000:22:00.0"])
    );

    // No GPU NUMA at all (a KVM guest): nothing to narrow by, no numaLocal.
    let r = record(Case::read("kvm-guest-numa-na").run());
    assert!(
        r["gpus"][0]["rails"]["rail0"].get("numaLocal").is_none(),
        "{r}"
    );
}

/// A one-GPU dump with three NICs: `classes` gives GPU0's class to each.
fn three_nic_dump(dir: &Path, classes: [&str; 3]) -> PathBuf {
    let [a, b, c] = classes;
    let dump = format!(
        "\tGPU0\tNIC0\tNIC1\tNIC2\tCPU Affinity\tNUMA Affinity\n\
         GPU0\t X \t{a}\t{b}\t{c}\t0-7\t0\n\
         NIC0\t{a}\t X \tSYS\tSYS\n\
         NIC1\t{b}\tSYS\t X \tSYS\n\
         NIC2\t{c}\tSYS\tSYS\t X \n\n\
         NIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n  NIC2: mlx5_2\n"
    );
    let p = dir.join(format!("topo-{a}-{b}-{c}.txt"));
    fs::write(&p, dump).unwrap();
    p
}

#[test]
fn a_down_port_gives_way_to_an_up_port_it_ties_with_and_is_named() {
    // DGX Spark: two down functions tie with two up ones at NODE.
    let r = record(Case::read("dgx-spark").run());
    let rail = &r["gpus"][0]["rails"]["rail0"];
    assert_eq!(rail["nics"], json!(["0000:21:00.0", "0000:23:00.0"]));
    assert_eq!(rail["down"], json!(["0000:20:00.0", "0000:22:00.0"]));

    let dir = tempfile::tempdir().unwrap();
    let table = "gpus 1\nnic mlx5_0 0 0 down\nnic mlx5_1 0 0 down\nnic mlx5_2 0 0 up\n";
    // Every tied port down: they stay the candidates, and say so.
    let r = record(Case::parse(three_nic_dump(dir.path(), ["NODE", "NODE", "SYS"]), table).run());
    let rail = &r["gpus"][0]["rails"]["rail0"];
    assert_eq!(
        (&rail["pathClass"], &rail["nics"]),
        (&json!("NODE"), &json!(["0000:20:00.0", "0000:21:00.0"]))
    );
    assert_eq!(rail["down"], rail["nics"]);
    // A closer down port keeps the class (the seed's rule); a farther up port does not join it.
    let r = record(Case::parse(three_nic_dump(dir.path(), ["PIX", "NODE", "NODE"]), table).run());
    assert_eq!(
        r["gpus"][0]["rails"]["rail0"],
        json!({"pathClass": "PIX", "nics": ["0000:20:00.0"], "down": ["0000:20:00.0"]})
    );
    // Down ports farther than the chosen up port are not mentioned.
    let r = record(Case::parse(three_nic_dump(dir.path(), ["SYS", "SYS", "PXB"]), table).run());
    assert_eq!(
        r["gpus"][0]["rails"]["rail0"],
        json!({"pathClass": "PXB", "nics": ["0000:22:00.0"]})
    );
}

#[test]
fn a_port_whose_link_cannot_be_read_is_not_called_down() {
    let dir = tempfile::tempdir().unwrap();
    let table = "gpus 1\nnic mlx5_0 0 0 up\nnic mlx5_1 0 0 up\nnic mlx5_2 0 1 up\n";
    let o = Case::parse(three_nic_dump(dir.path(), ["NODE", "NODE", "SYS"]), table).run_with(
        &[],
        |t, _| {
            // mlx5_1's port state becomes a dangling link: Unverified, not Failed.
            let state = "devices/pci0000:21/0000:21:00.0/infiniband/mlx5_1/ports/1/state";
            fs::remove_file(t.root.join(state)).unwrap();
            t.raw_link(state, "../../../../nonexistent");
        },
    );
    let r = record(o);
    assert_eq!(
        r["gpus"][0]["rails"]["rail0"]["nics"],
        json!(["0000:20:00.0", "0000:21:00.0"])
    );
    assert!(r["gpus"][0]["rails"]["rail0"].get("down").is_none(), "{r}");
}

/// An InfiniBand node: four IB ports (`ibp<bus>s0` on `mlx5_<n>`), two per
/// NUMA node, 8 GPUs from the gpu8 layout around them, and no lldpd at all.
fn ib_node(dir: &Path) -> PathBuf {
    let root = dir.join("sys");
    let t = fixtures::Tree::new(&root);
    for i in 0..4u32 {
        let gpu = fixtures::addr(0x40 * i + 0x11, 0, 0);
        let nic = fixtures::addr(0x40 * i + 0x12, 0, 0);
        let rp = fixtures::addr(0x40 * i, 1, 0);
        t.pci(
            &[&rp, &fixtures::addr(0x40 * i + 0x10, 0, 0), &gpu],
            fixtures::NVIDIA,
            0x2330,
            fixtures::CLASS_3D,
            (i / 2) as i32,
        );
        let dev = t.pci(
            &[&rp, &fixtures::addr(0x40 * i + 0x10, 0, 0), &nic],
            fixtures::MELLANOX,
            0x1021,
            fixtures::CLASS_IB,
            (i / 2) as i32,
        );
        t.netdev(&dev, &format!("ibp{}s0", 0x40 * i + 0x12), 4092, true);
        t.rdma(&dev, &format!("mlx5_{i}"), &[fixtures::UP]);
    }
    // A management port whose name also fits a loose regex, on a platform bus.
    let plat = t.platform_device("mgmt0", 0);
    t.netdev(&plat, "ibmgmt", 1500, true);
    root
}

#[test]
fn interface_name_source_maps_an_infiniband_node_without_lldp() {
    let dir = tempfile::tempdir().unwrap();
    let root = ib_node(dir.path());
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_nodefabric"))
            .args(["rails", "-o", "json", "--sysfs-root"])
            .arg(&root)
            .args(["--sysfs-paths"])
            .args(extra)
            .env("PATH", "/nonexistent") // no lldpctl: any attempt to run it fails the pass
            .output()
            .unwrap()
    };
    // By RDMA device name.
    let by_rdma = ok(run(&[
        "--rail-source",
        "interface-name",
        "--interface-regex",
        "^mlx5_([0-9]+)$",
        "--rail-id",
        "rail$1",
    ]));
    let r: Value = serde_json::from_str(&by_rdma).unwrap();
    assert_eq!(r["railSource"], "interface-name");
    assert_eq!(r["nics"].as_object().unwrap().len(), 4, "{by_rdma}");
    assert_eq!(r["nics"]["0000:52:00.0"], json!(["rail1"]));
    assert_eq!(
        r["gpus"][0]["rails"]["rail0"],
        json!({"pathClass": "PIX", "nics": ["0000:12:00.0"]})
    );
    // By netdev name, every port on one rail: GPU0 reaches its own NIC at PIX.
    let r = record(run(&[
        "--rail-source",
        "interface-name",
        "--interface-regex",
        "^ibp[0-9]+s0$",
        "--rail-id",
        "ib",
    ]));
    assert_eq!(
        r["gpus"][0]["rails"]["ib"],
        json!({"pathClass": "PIX", "nics": ["0000:12:00.0"]})
    );
    // The same settings from a values file.
    let values = dir.path().join("values.yaml");
    fs::write(&values, "railSource:\n  name: interface-name\n  interfaceName:\n    interfaceRegex: '^mlx5_([0-9]+)$'\n    railID: 'rail$1'\n").unwrap();
    assert_eq!(
        ok(run(&["--rails-config", values.to_str().unwrap()])),
        by_rdma
    );
    // A matching port with no PCI device is named; LLDP flags are refused.
    let o = run(&[
        "--rail-source",
        "interface-name",
        "--interface-regex",
        "^ib",
        "--rail-id",
        "ib",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("port ibmgmt has no PCI device"),
        "{err}"
    );
    let o = run(&[
        "--rail-source",
        "interface-name",
        "--interface-regex",
        "^mlx5",
        "--rail-id",
        "r",
        "--lldp-json",
        "x.json",
    ]);
    assert!(String::from_utf8_lossy(&o.stderr)
        .contains("--lldp-json and --lldp-socket are for the host-lldp"));
    // host-lldp stays the default, and on this node it needs lldpctl.
    let o = run(&[
        "--interface-regex",
        "^mlx5_([0-9]+)$",
        "--rail-id",
        "rail$1",
    ]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("lldpctl"));
}

// ---- hostile --topo-file inputs -----------------------------------------------

#[test]
fn topo_file_missing_huge_binary_or_a_folder_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let case = |topo: PathBuf| Case::parse(topo, "gpus 1\nnic mlx5_0 0 0 up\n");
    let huge = dir.path().join("huge.txt");
    let f = fs::File::create(&huge).unwrap();
    f.set_len(nodefabric::rails::MAX_SAVED_OUTPUT + 1).unwrap(); // sparse: costs no disk
    let binary = dir.path().join("binary.txt");
    fs::write(&binary, b"\tGPU0\n\xff\xfe").unwrap();
    for (path, why) in [
        (dir.path().join("missing.txt"), "No such file"),
        (huge, "larger than"),
        (binary, "not UTF-8"),
        (dir.path().to_path_buf(), "is a folder, not a regular file"),
    ] {
        let o = case(path.clone()).run();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains(&path.display().to_string()) && err.contains(why),
            "{why}: {err}"
        );
    }
}

#[test]
fn topo_file_from_a_slow_pipe_reads_the_same_as_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("topo.fifo");
    make_fifo(&fifo);
    let dump = text("topo/dgx-spark.txt");
    let writer = {
        let (fifo, dump) = (fifo.clone(), dump.clone());
        std::thread::spawn(move || {
            use std::io::Write;
            let mut f = fs::OpenOptions::new().write(true).open(&fifo).unwrap();
            for chunk in dump.as_bytes().chunks(7) {
                f.write_all(chunk).unwrap();
                f.flush().unwrap();
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        })
    };
    let table = text("topo/dgx-spark.nics");
    let piped = ok(Case::parse(fifo, &table).run());
    writer.join().unwrap();
    assert_eq!(piped, ok(Case::read("dgx-spark").run()));
}

#[test]
fn host_lldp_ports_take_their_link_state_from_the_node_record() {
    let n = Node::new();
    // eth_r1_p0 (mlx5_2, 0000:33:00.0) has its neighbour but its RDMA port is down.
    let port = "devices/pci0000:00/0000:00:03.0/0000:30:00.0/0000:31:01.0/0000:33:00.0/infiniband/mlx5_2/ports/1";
    fs::write(n.root.join(port).join("state"), "1: DOWN\n").unwrap();
    fs::write(n.root.join(port).join("phys_state"), "3: Disabled\n").unwrap();
    let f = flags(&n.lldp(&ALL_RAIL_PORTS));
    let mut a = args(&f);
    a.push("--sysfs-paths");
    let r = record(n.rails(&a));
    assert_eq!(r["railSource"], "host-lldp");
    // GPU0 ties rail1's two NICs at NODE; the down one gives way and is named.
    assert_eq!(
        r["gpus"][0]["rails"]["rail1"],
        json!({"pathClass": "NODE", "nics": ["0000:43:00.0"], "down": ["0000:33:00.0"]})
    );
    // GPU2 reaches it alone at PIX: still its candidate, marked down.
    assert_eq!(
        r["gpus"][2]["rails"]["rail1"],
        json!({"pathClass": "PIX", "nics": ["0000:33:00.0"], "down": ["0000:33:00.0"]})
    );
}

// ---- capture and replay -------------------------------------------------------
// A capture stores the rail answers (vendor/rails.json) beside the sysfs
// entries the rail read resolved, so `rails` on its replay builds the same
// record with no lldpd, GPU, nvidia-smi or saved file in reach.

/// `nodefabric --sysfs-root ROOT ARGS` with `PATH` set to `path`.
fn at(root: &Path, path: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .arg("--sysfs-root")
        .arg(root)
        .args(args)
        .env("NODEFABRIC_NOW", "2026-03-01T12:00:00Z")
        .env("PATH", path)
        .output()
        .unwrap()
}

/// A folder holding an `lldpctl` that prints `lldp` and an `nvidia-smi`
/// that prints the 8-GPU query and `topo`, as the tools would.
fn fake_tools(dir: &Path, lldp: &Path, topo: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).unwrap();
    let script = |name: &str, body: String| {
        let p = bin.join(name);
        fs::write(&p, format!("#!/bin/sh\n{body}")).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    };
    script("lldpctl", format!("exec /bin/cat '{}'\n", lldp.display()));
    let query = data("nvsmi/query-8gpu.csv");
    script(
        "nvidia-smi",
        format!(
            "case \"$1\" in topo) exec /bin/cat '{}';; *) exec /bin/cat '{}';; esac\n",
            topo.display(),
            query.display()
        ),
    );
    bin
}

/// The member names of a capture.
fn archive_members(archive: &Path) -> Vec<String> {
    let gz = flate2::read::GzDecoder::new(fs::File::open(archive).unwrap());
    tar::Archive::new(gz)
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
        .collect()
}

/// The archive again without `vendor/rails.json`: one from before captures held it.
fn without_rail_answers(archive: &Path, out: &Path) {
    let gz = flate2::read::GzDecoder::new(fs::File::open(archive).unwrap());
    let mut input = tar::Archive::new(gz);
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    for e in input.entries().unwrap() {
        let mut e = e.unwrap();
        if e.path().unwrap().as_os_str() == "vendor/rails.json" {
            continue;
        }
        let mut h = e.header().clone();
        let path = e.path().unwrap().into_owned();
        match e.header().entry_type() {
            tar::EntryType::Symlink => {
                let target = e.link_name().unwrap().unwrap().into_owned();
                tar.append_link(&mut h, &path, &target).unwrap();
            }
            _ => tar.append_data(&mut h, &path, &mut e).unwrap(),
        }
    }
    fs::write(out, tar.into_inner().unwrap().finish().unwrap()).unwrap();
}

#[test]
fn a_capture_replays_the_rail_record_byte_for_byte_from_every_input() {
    let n = Node::new();
    let lldp = n.lldp(&ALL_RAIL_PORTS);
    let topo = data("nvsmi/topo-8gpu-10nic.txt");
    let q = data("nvsmi/query-8gpu.csv");
    let tools = fake_tools(&n.dir, &lldp, &topo);
    let none = Path::new("/nonexistent");
    let (lldp_s, q_s, topo_s) = (
        lldp.to_str().unwrap(),
        q.to_str().unwrap(),
        topo.to_str().unwrap(),
    );
    let rails = [
        "rails",
        "-o",
        "json",
        "--interface-regex",
        "^eth_r([0-9]+)_p[0-9]+$",
        "--rail-id",
        "rail$1",
    ];
    let by_rdma = [
        "rails",
        "-o",
        "json",
        "--rail-source",
        "interface-name",
        "--interface-regex",
        "^mlx5_([0-9]+)$",
        "--rail-id",
        "rail$1",
    ];
    // (name, the rail inputs named live and at capture, PATH, the rail flags).
    let cases: [(&str, Vec<&str>, &Path, &[&str]); 5] = [
        (
            "lldp file, sysfs paths",
            vec!["--lldp-json", lldp_s, "--sysfs-paths"],
            none,
            &rails,
        ),
        (
            "lldp file, nvidia-smi files",
            vec![
                "--lldp-json",
                lldp_s,
                "--gpu-query-file",
                q_s,
                "--topo-file",
                topo_s,
            ],
            none,
            &rails,
        ),
        ("lldpctl, nvidia-smi run", vec![], &tools, &rails),
        (
            "lldpctl, sysfs paths",
            vec!["--sysfs-paths"],
            &tools,
            &rails,
        ),
        ("interface names, nvidia-smi run", vec![], &tools, &by_rdma),
    ];
    let mut seen = Vec::new();
    for (i, (name, inputs, path, flags)) in cases.iter().enumerate() {
        let live = ok(at(&n.root, path, &[&flags[..], inputs].concat()));
        seen.push(live.clone());
        let archive = n.dir.join(format!("node{i}.tar.gz"));
        let o = at(
            &n.root,
            path,
            &[&["capture", "--out", archive.to_str().unwrap()][..], inputs].concat(),
        );
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            archive_members(&archive).contains(&"vendor/rails.json".to_string()),
            "{name}"
        );
        // No tool, no saved file: the captured answers speak.
        let replayed = ok(at(&archive, none, flags));
        assert_eq!(replayed, live, "{name}: the replay's record differs");
        // Capturing the replay stores the same answers and entries.
        let again = n.dir.join(format!("again{i}.tar.gz"));
        let o = at(
            &archive,
            none,
            &["capture", "--out", again.to_str().unwrap()],
        );
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(
            fs::read(&archive).unwrap(),
            fs::read(&again).unwrap(),
            "{name}: capture of the replay differs"
        );
    }
    // Each input gave its own view: the files hold what that nvidia-smi
    // prints, and lldpctl prints the saved table.
    assert!(seen[0].contains("\"source\": \"sysfs\""), "{}", seen[0]);
    assert!(
        seen[1].contains("\"source\": \"nvidia-smi\""),
        "{}",
        seen[1]
    );
    assert_eq!((&seen[2], &seen[3]), (&seen[1], &seen[0]));
    assert!(
        seen[4].contains("\"railSource\": \"interface-name\"")
            && seen[4].contains("\"source\": \"nvidia-smi\""),
        "{}",
        seen[4]
    );

    // A rail input named on the replay's command line wins over the captured one.
    let files = n.dir.join("node1.tar.gz");
    assert_eq!(
        ok(at(&files, none, &[&rails[..], &["--sysfs-paths"]].concat())),
        seen[0]
    );
    let two = n.lldp(&["eth_r0_p0", "eth_r0_p1"]);
    let narrowed = ok(at(
        &files,
        none,
        &[&rails[..], &["--lldp-json", two.to_str().unwrap()]].concat(),
    ));
    let r: Value = serde_json::from_str(&narrowed).unwrap();
    assert_eq!(r["nics"].as_object().unwrap().len(), 2, "{narrowed}");
    assert_eq!(r["gpus"][0]["source"], "nvidia-smi", "{narrowed}");

    // An archive without vendor/rails.json replays as before: the rail
    // inputs are read afresh, here with no lldpctl to run.
    let old = n.dir.join("old.tar.gz");
    without_rail_answers(&files, &old);
    let o = at(&old, none, &rails);
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("running lldpctl"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let n2 = Node::new();
    let lldp2 = n2.lldp(&ALL_RAIL_PORTS);
    let given = ["--lldp-json", lldp2.to_str().unwrap(), "--sysfs-paths"];
    assert_eq!(ok(at(&old, none, &[&rails[..], &given].concat())), seen[0]);
}

#[test]
fn a_captured_refusal_replays_as_the_same_error() {
    let n = Node::new();
    let lldp = n.lldp(&ALL_RAIL_PORTS);
    let q = data("nvsmi/query-8gpu.csv");
    // GPU0 → NIC0 printed as a class this version does not rank.
    let topo = n.write(
        "topo-unknown.txt",
        &text("nvsmi/topo-8gpu-10nic.txt").replacen("\tPIX\t", "\tC2C\t", 1),
    );
    let inputs = [
        "--lldp-json",
        lldp.to_str().unwrap(),
        "--gpu-query-file",
        q.to_str().unwrap(),
        "--topo-file",
        topo.to_str().unwrap(),
    ];
    let flags = flags(&lldp);
    let rails = args(&flags[2..]);
    let none = Path::new("/nonexistent");
    let live = at(
        &n.root,
        none,
        &[&["rails", "-o", "json"][..], &inputs, &rails].concat(),
    );
    let archive = n.dir.join("node.tar.gz");
    let o = at(
        &n.root,
        none,
        &[
            &["capture", "--out", archive.to_str().unwrap()][..],
            &inputs,
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    fs::remove_file(&topo).unwrap();
    let replayed = at(
        &archive,
        none,
        &[&["rails", "-o", "json"][..], &rails].concat(),
    );
    assert_eq!(live.status.code(), Some(1));
    assert_eq!(replayed.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&live.stderr).contains("\"C2C\""));
    assert_eq!(
        String::from_utf8_lossy(&replayed.stderr),
        String::from_utf8_lossy(&live.stderr)
    );
}

#[test]
fn a_rail_answer_file_that_is_not_one_is_refused_naming_it() {
    let n = Node::new();
    let archive = n.dir.join("node.tar.gz");
    let none = Path::new("/nonexistent");
    let o = at(
        &n.root,
        none,
        &["capture", "--out", archive.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The same archive with a stranger's vendor/rails.json.
    let unpacked = n.dir.join("unpacked");
    let gz = flate2::read::GzDecoder::new(fs::File::open(&archive).unwrap());
    tar::Archive::new(gz).unpack(&unpacked).unwrap();
    let rails_json = unpacked.join("vendor/rails.json");
    let mut perms = fs::metadata(&rails_json).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    fs::set_permissions(&rails_json, perms).unwrap();
    fs::write(
        &rails_json,
        "{\"lldp\": {\"origin\": {\"command\": \"lldpctl\"}, \"output\": 7}}",
    )
    .unwrap();
    let bad = n.dir.join("bad.tar.gz");
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    tar.follow_symlinks(false);
    tar.append_dir_all("sysfs", unpacked.join("sysfs")).unwrap();
    tar.append_dir_all("vendor", unpacked.join("vendor"))
        .unwrap();
    fs::write(&bad, tar.into_inner().unwrap().finish().unwrap()).unwrap();
    let o = at(&bad, none, &["inventory"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.code() == Some(1)
            && err.contains("vendor/rails.json")
            && err.contains("bad.tar.gz"),
        "{err}"
    );
}
