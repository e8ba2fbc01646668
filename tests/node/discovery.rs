//! End-to-end tests of `nodefabric inventory|features|preflight|publish`:
//! the built binary run on fixture sysfs trees, outputs snapshotted.

use crate::support::{fixtures, snapshots};
use snapshots::settings as snapshot_settings;

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

const NOW: &str = "2026-03-01T12:00:00Z";

/// Runs the real binary with a pinned clock.
fn nodefabric(args: &[&str], now: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .args(args)
        .env("NODEFABRIC_NOW", now)
        .env_remove("NODEFABRIC_SYSFS_ROOT")
        .output()
        .expect("run nodefabric")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn run_ok(args: &[&str]) -> String {
    let o = nodefabric(args, NOW);
    assert!(
        o.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    stdout(&o)
}

/// The seed's jq recipe for "every RDMA endpoint and its link state".
const RECIPE: &str = "[.spec.interfaces[] | (., (.virtualFunctions // [])[])] | map(select(.rdma or .link)) | map({name, pciBusId, rdmaDevice, link: .link.state})";

fn jq(input: &str) -> String {
    use std::io::Write;
    let mut child = Command::new("jq")
        .args(["-c", RECIPE])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("jq is installed by .ci/run");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// Snapshots inventory, features, preflight (with its exit status) and the
/// jq recipe's answer for one fixture; returns the preflight status.
fn snapshot_fixture(name: &str, build: impl FnOnce(&Path)) -> i32 {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let root = dir.path().to_str().unwrap();
    let inventory = run_ok(&["inventory", "--sysfs-root", root]);
    let features = run_ok(&["features", "--sysfs-root", root]);
    let pre = nodefabric(&["preflight", "--sysfs-root", root], NOW);
    let code = pre.status.code().unwrap();
    let endpoints = jq(&inventory);
    snapshot_settings().bind(|| {
        insta::assert_snapshot!(format!("{name}.inventory"), inventory);
        insta::assert_snapshot!(format!("{name}.features"), features);
        insta::assert_snapshot!(
            format!("{name}.preflight"),
            format!("exit {code}\n{}", stdout(&pre))
        );
        insta::assert_snapshot!(format!("{name}.endpoints"), endpoints);
    });
    code
}

fn label_value(features: &str, key: &str) -> Option<String> {
    features.lines().find_map(|l| {
        l.strip_prefix(&format!("feature.gpustack.ai/{key}="))
            .map(str::to_string)
    })
}

fn features_of(build: impl FnOnce(&Path)) -> String {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    run_ok(&["features", "--sysfs-root", dir.path().to_str().unwrap()])
}

#[test]
fn gpu8_switch_paired() {
    assert_eq!(
        snapshot_fixture("gpu8", |d| drop(fixtures::gpu8_switch_paired(d))),
        0
    );
    let f = features_of(|d| drop(fixtures::gpu8_switch_paired(d)));
    assert_eq!(label_value(&f, "rdma.capable").as_deref(), Some("true"));
    assert_eq!(label_value(&f, "rdma.distance").as_deref(), Some("PIX"));
    assert_eq!(label_value(&f, "rdma.numa").as_deref(), Some("0_1"));
}

#[test]
fn gpu8_record_shape() {
    let dir = tempfile::tempdir().unwrap();
    fixtures::gpu8_switch_paired(dir.path());
    let out = run_ok(&["inventory", "--sysfs-root", dir.path().to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ifaces = v["spec"]["interfaces"].as_array().unwrap();
    let names: Vec<&str> = ifaces.iter().map(|i| i["name"].as_str().unwrap()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "interfaces are sorted by name");
    assert_eq!(ifaces.len(), 12, "10 RDMA NICs, eno1, lo");
    // the storage NIC on its own root port: the root port is both its pciRootId and its only switch
    let storage = ifaces.iter().find(|i| i["rdmaDevice"] == "mlx5_8").unwrap();
    assert_eq!(storage["topology"]["pciRootId"], "0000:00:05.0");
    assert_eq!(
        storage["topology"]["pciSwitches"],
        serde_json::json!(["0000:00:05.0"])
    );
    // a GPU and its paired NIC share the whole path above their downstream ports
    let gpu0 = &v["spec"]["groups"][0]["accelerators"][0];
    let nic0 = ifaces.iter().find(|i| i["rdmaDevice"] == "mlx5_0").unwrap();
    assert_eq!(gpu0["topology"]["pciRootId"], nic0["topology"]["pciRootId"]);
    assert_eq!(
        gpu0["topology"]["pciSwitches"][1],
        nic0["topology"]["pciSwitches"][1]
    );
    assert_eq!(
        v["spec"]["groups"][0]["accelerators"]
            .as_array()
            .unwrap()
            .len(),
        8
    );
    let eno1 = ifaces.iter().find(|i| i["name"] == "eno1").unwrap();
    assert_eq!(eno1["topology"]["pciSwitches"], serde_json::json!([]));
    assert!(eno1.get("link").is_none() && eno1["rdma"] == false);
    let lo = ifaces.iter().find(|i| i["name"] == "lo").unwrap();
    assert_eq!(
        (
            lo["virtual"].as_bool(),
            lo["bus"].as_str(),
            lo["up"].as_bool()
        ),
        (Some(true), Some("virtual"), Some(true))
    );
}

#[test]
fn vf_only_node_is_capable_and_vfs_are_nested() {
    assert_eq!(
        snapshot_fixture("vf_only", |d| drop(fixtures::vf_only(d))),
        0
    );
    let dir = tempfile::tempdir().unwrap();
    fixtures::vf_only(dir.path());
    let root = dir.path().to_str().unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&run_ok(&["inventory", "--sysfs-root", root])).unwrap();
    let ifaces = v["spec"]["interfaces"].as_array().unwrap();
    assert_eq!(ifaces.len(), 1, "VF netdevs are not listed at top level");
    let pf = &ifaces[0];
    assert_eq!(pf["physicalFunction"], true);
    assert_eq!(pf["virtualFunctionsConfigured"], 4);
    assert_eq!(pf["rdma"], false);
    let vfs = pf["virtualFunctions"].as_array().unwrap();
    assert_eq!(vfs.len(), 4);
    for vf in vfs {
        assert_eq!(
            vf["topology"], pf["topology"],
            "a VF inherits its PF's bridge path"
        );
        assert_eq!(vf["parent"], pf["pciBusId"]);
    }
    assert!(
        vfs[0].get("numa").is_none(),
        "a VF keeps its own (blank) NUMA in the record"
    );
    assert_eq!(vfs[2]["numa"], 1);
    assert!(
        vfs[3].get("name").is_none(),
        "a VF without a netdev has no name"
    );
    let f = run_ok(&["features", "--sysfs-root", root]);
    assert_eq!(label_value(&f, "rdma.capable").as_deref(), Some("true"));
    assert_eq!(
        label_value(&f, "rdma.numa").as_deref(),
        Some("1"),
        "blank VF NUMA falls back to the PF's"
    );
    assert_eq!(label_value(&f, "rdma.distance").as_deref(), Some("PIX"));
}

#[test]
fn vf_netdev_missing_from_class_net_is_named_from_its_own_folder() {
    let dir = tempfile::tempdir().unwrap();
    let t = fixtures::vf_only(dir.path());
    // VF 1's class/net entry gone (as when its entry cannot be read); VF 0
    // with a second netdev, named after its first as a listing gives it.
    std::fs::remove_file(dir.path().join("class/net/enp4s0f0v1")).unwrap();
    let vf0 = t.pci(
        &[
            &fixtures::addr(0x00, 2, 0),
            &fixtures::addr(0x01, 0, 0),
            &fixtures::addr(0x02, 1, 0),
            &fixtures::addr(0x04, 0, 2),
        ],
        fixtures::MELLANOX,
        0x101e,
        fixtures::CLASS_ETH,
        -1,
    );
    t.netdev(&vf0, "enp4s0f0v0z", 1500, true);
    let root = dir.path().to_str().unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&run_ok(&["inventory", "--sysfs-root", root])).unwrap();
    let vfs = v["spec"]["interfaces"][0]["virtualFunctions"]
        .as_array()
        .unwrap();
    let names: Vec<_> = vfs.iter().map(|vf| vf["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            Some("enp4s0f0v0"),
            Some("enp4s0f0v1"),
            Some("enp4s0f0v2"),
            None
        ]
    );
    assert_eq!(vfs[1]["mtu"], 1500, "read from the VF's own net folder");
}

#[test]
fn active_defer_is_not_active() {
    assert_eq!(
        snapshot_fixture("active_defer", |d| drop(fixtures::single_port(
            d,
            fixtures::DEFER
        ))),
        1
    );
    let f = features_of(|d| drop(fixtures::single_port(d, fixtures::DEFER)));
    assert_eq!(f, "", "a Failed-only node publishes no rdma label");
    let f = features_of(|d| drop(fixtures::single_port(d, fixtures::UP)));
    assert_eq!(label_value(&f, "rdma.capable").as_deref(), Some("true"));
    let f = features_of(|d| {
        drop(fixtures::single_port(
            d,
            ("4: ACTIVE", "4: PortConfigurationTraining"),
        ))
    });
    assert_eq!(f, "", "ACTIVE without LinkUp is not a link");
}

#[test]
fn every_port_down_fails_and_withholds() {
    assert_eq!(
        snapshot_fixture("all_down", |d| drop(fixtures::all_ports_down(d, false))),
        1
    );
    // a broken NIC beside a working one keeps the label
    let f = features_of(|d| drop(fixtures::all_ports_down(d, true)));
    assert_eq!(label_value(&f, "rdma.capable").as_deref(), Some("true"));
    assert_eq!(
        label_value(&f, "rdma.numa").as_deref(),
        Some("1"),
        "only usable endpoints count"
    );
}

#[test]
fn unreadable_port_is_unverified_not_failed() {
    assert_eq!(
        snapshot_fixture("unreadable_port", |d| drop(fixtures::unreadable_port(d))),
        0
    );
    let dir = tempfile::tempdir().unwrap();
    fixtures::unreadable_port(dir.path());
    let v: serde_json::Value = serde_json::from_str(&run_ok(&[
        "inventory",
        "--sysfs-root",
        dir.path().to_str().unwrap(),
    ]))
    .unwrap();
    let link = &v["spec"]["interfaces"][0]["link"];
    assert_eq!(link["state"], "Unverified");
    assert_eq!(
        link["ports"][0]["state"], "1: DOWN",
        "port values are verbatim"
    );
    assert!(link["ports"][1].get("state").is_none());
}

#[test]
fn no_accelerator_omits_distance() {
    assert_eq!(
        snapshot_fixture("no_accelerator", |d| drop(fixtures::no_accelerator(d))),
        0
    );
    let f = features_of(|d| drop(fixtures::no_accelerator(d)));
    assert!(label_value(&f, "rdma.distance").is_none());
    assert_eq!(label_value(&f, "rdma.numa").as_deref(), Some("0_1"));
}

#[test]
fn blank_numa_omits_numa_and_distance_is_unknown() {
    assert_eq!(
        snapshot_fixture("blank_numa", |d| drop(fixtures::blank_numa(d))),
        0
    );
    let f = features_of(|d| drop(fixtures::blank_numa(d)));
    assert!(
        label_value(&f, "rdma.numa").is_none(),
        "never normalised to 0"
    );
    assert_eq!(label_value(&f, "rdma.distance").as_deref(), Some("UNK"));
}

#[test]
fn nested_switches_are_pxb() {
    assert_eq!(
        snapshot_fixture("nested_switches", |d| drop(fixtures::nested_switches(d))),
        0
    );
    let f = features_of(|d| drop(fixtures::nested_switches(d)));
    assert_eq!(label_value(&f, "rdma.distance").as_deref(), Some("PXB"));
}

#[test]
fn non_pci_interface_keeps_its_own_bus() {
    assert_eq!(
        snapshot_fixture("non_pci", |d| drop(fixtures::non_pci(d))),
        0
    );
    let dir = tempfile::tempdir().unwrap();
    fixtures::non_pci(dir.path());
    let v: serde_json::Value = serde_json::from_str(&run_ok(&[
        "inventory",
        "--sysfs-root",
        dir.path().to_str().unwrap(),
    ]))
    .unwrap();
    let eth0 = v["spec"]["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "eth0")
        .unwrap();
    assert_eq!(eth0["bus"], "platform");
    assert_eq!(eth0["virtual"], false);
    assert!(eth0.get("pciBusId").is_none() && eth0.get("topology").is_none());
    assert_eq!(eth0["rdmaDevice"], "hns_0");
    let ens3 = v["spec"]["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "ens3")
        .unwrap();
    assert_eq!(ens3["bus"], "virtio");
    let f = features_of(|d| drop(fixtures::non_pci(d)));
    assert_eq!(
        label_value(&f, "rdma.distance").as_deref(),
        Some("UNK"),
        "no PCI coordinates, no distance"
    );
}

#[test]
fn escaping_link_and_oversized_attribute_are_unreadable_not_fatal() {
    assert_eq!(
        snapshot_fixture("hostile", |d| drop(fixtures::hostile(d))),
        0
    );
    let dir = tempfile::tempdir().unwrap();
    fixtures::hostile(dir.path());
    let o = nodefabric(
        &["inventory", "--sysfs-root", dir.path().to_str().unwrap()],
        NOW,
    );
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("evil") && err.contains("outside the sysfs root"),
        "{err}"
    );
    let out = stdout(&o);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    // The escaping entry is recorded as unreadable, never silently dropped.
    let evil = v["spec"]["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "evil")
        .unwrap();
    assert_eq!(evil["unreadable"][0]["fact"], "interface");
    assert_eq!(evil["unreadable"][0]["kept"], false);
    let big = v["spec"]["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["rdmaDevice"] == "mlx5_9")
        .unwrap();
    assert_eq!(big["link"]["state"], "Unverified");
    assert!(big["link"]["reason"]
        .as_str()
        .unwrap()
        .contains("larger than 65536 bytes"));
}

#[test]
fn first_seen_is_stable_while_the_failure_persists() {
    let sys = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    fixtures::all_ports_down(sys.path(), false);
    let (root, fdir, sdir) = (
        sys.path().to_str().unwrap(),
        out.path().join("features.d"),
        out.path().join("state"),
    );
    let cdir = out.path().join("cdi");
    let publish = |now: &str| {
        let o = nodefabric(
            &[
                "publish",
                "--sysfs-root",
                root,
                "--features-dir",
                fdir.to_str().unwrap(),
                "--state-dir",
                sdir.to_str().unwrap(),
                "--cdi-dir",
                cdir.to_str().unwrap(),
            ],
            now,
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let rec: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(sdir.join("record.json")).unwrap()).unwrap();
        rec["spec"]["interfaces"][0]["link"]["firstSeen"]
            .as_str()
            .map(str::to_string)
    };
    assert_eq!(
        publish("2026-03-01T12:00:00Z").as_deref(),
        Some("2026-03-01T12:00:00Z")
    );
    assert_eq!(
        publish("2026-03-01T13:00:00Z").as_deref(),
        Some("2026-03-01T12:00:00Z")
    );
    // inventory with the same state folder sees the same time
    let inv = nodefabric(
        &[
            "inventory",
            "--sysfs-root",
            root,
            "--state-dir",
            sdir.to_str().unwrap(),
        ],
        "2026-03-02T00:00:00Z",
    );
    assert!(stdout(&inv).contains("\"firstSeen\": \"2026-03-01T12:00:00Z\""));
    // the link heals, then fails again: a new failure gets a new time
    let port = sys
        .path()
        .join("devices/pci0000:00/0000:00:01.0/0000:01:00.0/infiniband/mlx5_0/ports/1");
    fs::write(port.join("state"), "4: ACTIVE\n").unwrap();
    fs::write(port.join("phys_state"), "5: LinkUp\n").unwrap();
    assert_eq!(publish("2026-03-01T14:00:00Z"), None);
    fs::write(port.join("state"), "1: DOWN\n").unwrap();
    assert_eq!(
        publish("2026-03-01T15:00:00Z").as_deref(),
        Some("2026-03-01T15:00:00Z")
    );
}

#[test]
fn publish_writes_atomically_and_only_on_change() {
    use std::os::unix::fs::MetadataExt;
    let sys = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    fixtures::gpu8_switch_paired(sys.path());
    let fdir = out.path().join("features.d");
    let args = |expiry: &str| {
        vec![
            "publish".to_string(),
            "--sysfs-root".into(),
            sys.path().to_str().unwrap().into(),
            "--features-dir".into(),
            fdir.to_str().unwrap().into(),
            "--state-dir".into(),
            out.path().join("state").to_str().unwrap().into(),
            "--expiry".into(),
            expiry.into(),
            "--cdi-dir".into(),
            out.path().join("cdi").to_str().unwrap().into(),
        ]
    };
    let run = |now: &str, expiry: &str| {
        let a = args(expiry);
        let o = nodefabric(&a.iter().map(String::as_str).collect::<Vec<_>>(), now);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let p = fdir.join("nodefabric");
        (
            fs::read_to_string(&p).unwrap(),
            fs::metadata(&p).unwrap().ino(),
        )
    };
    let (first, ino1) = run("2026-03-01T12:00:00Z", "3m");
    snapshot_settings().bind(|| insta::assert_snapshot!("gpu8.feature-file", first));
    assert!(first.contains("# +expiry-time=2026-03-01T12:03:00Z\n"));
    // 30 s later, nothing changed and the expiry is far: the file is not replaced
    let (same, ino2) = run("2026-03-01T12:00:30Z", "3m");
    assert_eq!((same.as_str(), ino2), (first.as_str(), ino1));
    // 2 minutes later the expiry is due for renewal
    let (renewed, ino3) = run("2026-03-01T12:02:00Z", "3m");
    assert_ne!(ino3, ino1);
    assert!(renewed.contains("# +expiry-time=2026-03-01T12:05:00Z\n"));
    // no temp files are left behind; only our file is in the folder
    let names: Vec<_> = fs::read_dir(&fdir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("nodefabric")]);
}

#[test]
fn failed_enumeration_keeps_the_published_file() {
    let sys = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    fixtures::gpu8_switch_paired(sys.path());
    let root = sys.path().to_str().unwrap();
    let fdir = out.path().join("features.d");
    let sdir = out.path().join("state");
    let cdir = out.path().join("cdi");
    let args = [
        "publish",
        "--sysfs-root",
        root,
        "--features-dir",
        fdir.to_str().unwrap(),
        "--state-dir",
        sdir.to_str().unwrap(),
        "--cdi-dir",
        cdir.to_str().unwrap(),
    ];
    assert!(nodefabric(&args, NOW).status.success());
    let before = fs::read(fdir.join("nodefabric")).unwrap();
    let state_before = fs::read(sdir.join("record.json")).unwrap();
    // class/net becomes unreadable (a file where the folder was): enumeration fails
    fs::remove_dir_all(sys.path().join("class/net")).unwrap();
    fs::write(sys.path().join("class/net"), "").unwrap();
    let o = nodefabric(&args, "2026-03-01T13:00:00Z");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("class/net") && err.contains("nothing published"),
        "{err}"
    );
    assert_eq!(fs::read(fdir.join("nodefabric")).unwrap(), before);
    assert_eq!(fs::read(sdir.join("record.json")).unwrap(), state_before);
    // while a tree that enumerates and finds nothing publishes the empty result
    fs::remove_file(sys.path().join("class/net")).unwrap();
    fs::create_dir(sys.path().join("class/net")).unwrap();
    assert!(nodefabric(&args, NOW).status.success());
    let empty = fs::read_to_string(fdir.join("nodefabric")).unwrap();
    assert!(!empty.contains("rdma."), "{empty}");
}

#[test]
fn preflight_exit_status() {
    let o = nodefabric(&["preflight", "--sysfs-root", "/nonexistent/sysfs"], NOW);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/sysfs"));
    let o = nodefabric(&["inventory", "--sysfs-root", "/nonexistent/sysfs"], NOW);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn label_namespace_is_configurable_and_validated() {
    let dir = tempfile::tempdir().unwrap();
    fixtures::single_port(dir.path(), fixtures::UP);
    let root = dir.path().to_str().unwrap();
    let f = run_ok(&[
        "features",
        "--sysfs-root",
        root,
        "--label-namespace",
        "rdma.example.com",
    ]);
    assert!(f.starts_with("rdma.example.com/rdma.capable=true\n"), "{f}");
    let o = nodefabric(
        &[
            "features",
            "--sysfs-root",
            root,
            "--label-namespace",
            "Bad_NS",
        ],
        NOW,
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Bad_NS"));
}

#[test]
fn features_and_preflight_agree() {
    let dir = tempfile::tempdir().unwrap();
    fixtures::gpu8_switch_paired(dir.path());
    let root = dir.path().to_str().unwrap();
    let f = run_ok(&["features", "--sysfs-root", root]);
    let p = run_ok(&["preflight", "--sysfs-root", root]);
    for line in f.lines() {
        assert!(p.contains(&format!("  {line}\n")), "preflight lacks {line}");
    }
}

#[test]
fn output_is_deterministic() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    fixtures::gpu8_switch_paired(a.path());
    fixtures::gpu8_switch_paired(b.path());
    let ra = run_ok(&["inventory", "--sysfs-root", a.path().to_str().unwrap()]);
    let rb = run_ok(&["inventory", "--sysfs-root", b.path().to_str().unwrap()]);
    assert_eq!(ra, rb);
}

#[test]
fn real_sysfs_of_this_machine() {
    // Whatever this machine has, reading it must not fail.
    for cmd in ["inventory", "features"] {
        let o = nodefabric(&[cmd], NOW);
        assert!(
            o.status.success(),
            "{cmd} on /sys: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let o = nodefabric(&["preflight"], NOW);
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&stdout(&nodefabric(&["inventory"], NOW))).unwrap();
    assert!(v["spec"]["interfaces"].is_array());
}

#[test]
fn a_gpu_a_nic_lists_as_its_vf_is_still_an_accelerator() {
    // Only a function known as a VF from both sides (its PF's virtfn link
    // and its own netdev's physfn) takes its PF's vendor unread; a virtfn
    // link alone, even one pointing at a GPU, decides nothing.
    let sys = tempfile::tempdir().unwrap();
    let t = fixtures::vf_only(sys.path());
    let root = sys.path().to_str().unwrap();
    let before = run_ok(&["--sysfs-root", root, "inventory"]);
    let gpu = fs::canonicalize(sys.path().join("bus/pci/devices/0000:03:00.0")).unwrap();
    let pf = fs::canonicalize(sys.path().join("class/net/enp4s0f0np0/device")).unwrap();
    t.link(
        pf.strip_prefix(sys.path())
            .unwrap()
            .join("virtfn9")
            .to_str()
            .unwrap(),
        gpu.strip_prefix(sys.path()).unwrap().to_str().unwrap(),
    );
    let after: serde_json::Value =
        serde_json::from_str(&run_ok(&["--sysfs-root", root, "inventory"])).unwrap();
    let before: serde_json::Value = serde_json::from_str(&before).unwrap();
    assert_eq!(after["spec"]["groups"], before["spec"]["groups"]);
    assert_eq!(
        after["spec"]["groups"][0]["accelerators"][0]["pciBusId"],
        "0000:03:00.0"
    );
}

#[test]
fn an_unreadable_cpu_list_is_not_taken_as_its_nodes_answer() {
    // PCI functions on one NUMA node share its CPU list, read once per node;
    // the first one failing leaves the next on its node to read its own.
    let sys = tempfile::tempdir().unwrap();
    fixtures::vf_only(sys.path());
    let pf = fs::canonicalize(sys.path().join("class/net/enp4s0f0np0/device")).unwrap();
    fs::remove_file(pf.join("local_cpulist")).unwrap();
    fs::create_dir(pf.join("local_cpulist")).unwrap();
    let root = sys.path().to_str().unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&run_ok(&["inventory", "--sysfs-root", root])).unwrap();
    let pf = &v["spec"]["interfaces"][0];
    assert!(pf.get("cpuAffinity").is_none(), "{pf}");
    assert_eq!(pf["unreadable"][0]["fact"], "cpuAffinity", "{pf}");
    let vfs = pf["virtualFunctions"].as_array().unwrap();
    // VFs 0 and 1 print node -1 (every online CPU), 2 and 3 node 1, as the PF.
    assert_eq!(vfs[0]["cpuAffinity"], "0-95");
    assert_eq!(vfs[1]["cpuAffinity"], "0-95");
    assert_eq!(
        vfs[2]["cpuAffinity"], "24-47,72-95",
        "read from its own file"
    );
    assert_eq!(vfs[3]["cpuAffinity"], "24-47,72-95");
}

/// The link record of the one top-level interface of the tree at `dir`.
fn link_of(dir: &Path) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(&run_ok(&[
        "inventory",
        "--sysfs-root",
        dir.to_str().unwrap(),
    ]))
    .unwrap();
    v["spec"]["interfaces"][0]["link"].clone()
}

/// Ports are found by number without listing `ports/` (the kernel numbers
/// a channel adapter's ports from 1 without a gap); what that cannot see is
/// listed: a switch numbers its port 0, and a port 1 without `state` is a
/// damaged port, named, not a device without ports.
#[test]
fn ports_not_numbered_from_one_are_still_read_by_listing() {
    let dir = tempfile::tempdir().unwrap();
    let t = fixtures::single_port(dir.path(), fixtures::DOWN);
    let ports = "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0/infiniband/mlx5_0/ports";
    assert!(dir.path().join(ports).join("1/state").exists());
    // A switch: its one port is 0, and it carries the link.
    fs::rename(
        dir.path().join(ports).join("1"),
        dir.path().join(ports).join("0"),
    )
    .unwrap();
    t.write(&format!("{ports}/0/state"), "4: ACTIVE");
    t.write(&format!("{ports}/0/phys_state"), "5: LinkUp");
    let link = link_of(dir.path());
    assert_eq!(link["state"], "OK", "{link}");
    assert_eq!(link["ports"][0]["port"], "0");
    // Port 1 there without its state, port 0 down: unreadable, not Failed.
    t.write(&format!("{ports}/0/state"), "1: DOWN");
    t.write(&format!("{ports}/1/phys_state"), "3: Disabled");
    let link = link_of(dir.path());
    assert_eq!(link["state"], "Unverified", "{link}");
    assert!(
        link["reason"].as_str().unwrap().contains("ports/1/state"),
        "{link}"
    );
    assert_eq!(link["ports"].as_array().unwrap().len(), 2, "{link}");
}

/// The second port of a dual-port device is found by its number, and a
/// third by the next: each is read, and the verdict sees them all.
#[test]
fn every_numbered_port_counts_in_the_verdict() {
    let dir = tempfile::tempdir().unwrap();
    fixtures::all_ports_down(dir.path(), false);
    let link = link_of(dir.path());
    assert_eq!(link["state"], "Failed", "{link}");
    assert_eq!(link["ports"].as_array().unwrap().len(), 2);
    let ports = dir
        .path()
        .join("devices/pci0000:00/0000:00:01.0/0000:01:00.0/infiniband/mlx5_0/ports");
    fs::create_dir(ports.join("3")).unwrap();
    fs::write(ports.join("3/state"), "4: ACTIVE\n").unwrap();
    fs::write(ports.join("3/phys_state"), "5: LinkUp\n").unwrap();
    let link = link_of(dir.path());
    assert_eq!(link["state"], "OK", "{link}");
    let names: Vec<_> = link["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["port"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["1", "2", "3"]);
    // A folder in `ports` that is no port: the count and the numbers
    // disagree, and the listing reads it as the port it claims to be.
    fs::create_dir(ports.join("extra")).unwrap();
    let link = link_of(dir.path());
    assert_eq!(link["ports"].as_array().unwrap().len(), 4, "{link}");
    assert_eq!(link["ports"][3]["port"], "extra", "{link}");
}

/// The names of the VFs of the one PF of the tree at `dir`, by address.
fn vf_addresses(dir: &Path) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(&run_ok(&[
        "inventory",
        "--sysfs-root",
        dir.to_str().unwrap(),
    ]))
    .unwrap();
    v["spec"]["interfaces"][0]["virtualFunctions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|vf| vf["pciBusId"].as_str().unwrap().to_string())
        .collect()
}

/// A PF's VFs are found from `sriov_numvfs` without listing its folder;
/// where the count and the `virtfnN` links disagree (the count read in
/// the middle of a change, a damaged tree), the links the folder holds
/// decide, as a listing gives them.
#[test]
fn sriov_numvfs_disagreeing_with_the_virtfn_links_is_settled_by_listing() {
    let dir = tempfile::tempdir().unwrap();
    fixtures::vf_only(dir.path());
    let all = vf_addresses(dir.path());
    assert_eq!(all.len(), 4);
    let pf = dir
        .path()
        .join("devices/pci0000:00/0000:00:02.0/0000:01:00.0/0000:02:01.0/0000:04:00.0");
    // Fewer counted than linked: every link is still a VF.
    fs::write(pf.join("sriov_numvfs"), "2\n").unwrap();
    assert_eq!(vf_addresses(dir.path()), all);
    // A count no PCI core writes (TotalVFs is 16 bits): listed, not a
    // name made for each of four billion VFs.
    fs::write(pf.join("sriov_numvfs"), "4294967295\n").unwrap();
    assert_eq!(vf_addresses(dir.path()), all);
    // More counted than linked: the missing link is no VF, the rest are.
    fs::write(pf.join("sriov_numvfs"), "4\n").unwrap();
    fs::remove_file(pf.join("virtfn1")).unwrap();
    let mut want = all.clone();
    want.remove(1);
    assert_eq!(vf_addresses(dir.path()), want);
}

/// A `class/net` link whose text passes through a folder that is itself a
/// link (no kernel writes one; a copied or hostile tree may hold one) is
/// read where it lands: the pass that presumed its text plain is found
/// out and the tree read again with every link target checked.
#[test]
fn a_class_link_through_a_linked_folder_reads_where_it_lands() {
    let dir = tempfile::tempdir().unwrap();
    fixtures::single_port(dir.path(), fixtures::UP);
    let bridge = dir
        .path()
        .join("devices/pci0000:00/0000:00:01.0/0000:01:00.0");
    fs::rename(bridge.join("0000:02:01.0"), bridge.join("0000:02:03.0")).unwrap();
    std::os::unix::fs::symlink("0000:02:03.0", bridge.join("0000:02:01.0")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&run_ok(&[
        "inventory",
        "--sysfs-root",
        dir.path().to_str().unwrap(),
    ]))
    .unwrap();
    let nic = &v["spec"]["interfaces"][0];
    assert_eq!(nic["link"]["state"], "OK", "{nic}");
    let switches = nic["topology"]["pciSwitches"].to_string();
    assert!(switches.contains("0000:02:03.0"), "{switches}");
    assert!(!switches.contains("0000:02:01.0"), "{switches}");
}
