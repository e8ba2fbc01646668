//! Scale-up fabric per accelerator and the fabric.* labels, per manufacturer
//! and state, through the real binary.

use crate::support::{fixtures, snapshots};
use snapshots::settings;

use std::fs;
use std::process::{Command, Output};

const UUID: &str = "5b0e1122-3344-5566-7788-99aabbccddef";
const ZERO: &str = "00000000-0000-0000-0000-000000000000";

fn nodefabric(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .args(args)
        .env("NODEFABRIC_NOW", "2026-03-01T12:00:00Z")
        .env("PATH", "/nonexistent") // no nvidia-smi on PATH: only the given inputs count
        .output()
        .unwrap()
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn label(features: &str, key: &str) -> Option<String> {
    features.lines().find_map(|l| {
        l.strip_prefix(&format!("feature.gpustack.ai/{key}="))
            .map(str::to_string)
    })
}

/// The gpu8 fixture with an `nvidia-smi -q` text; returns (features, inventory, preflight).
fn nvidia(
    fabric: impl Fn(u32) -> (&'static str, &'static str, &'static str, &'static str),
) -> (String, String, String) {
    let dir = tempfile::tempdir().unwrap();
    fixtures::gpu8_switch_paired(dir.path());
    let q = dir.path().join("nvsmi-q.txt");
    fs::write(&q, fixtures::nvsmi_q(fabric)).unwrap();
    let args = |cmd: &'static str| {
        vec![
            cmd,
            "--sysfs-root",
            dir.path().to_str().unwrap(),
            "--nvidia-smi-q",
            q.to_str().unwrap(),
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>()
    };
    let run = |cmd| {
        let a = args(cmd);
        nodefabric(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    (
        ok(run("features")),
        ok(run("inventory")),
        String::from_utf8(run("preflight").stdout).unwrap(),
    )
}

#[test]
fn nvidia_completed_publishes_domain_with_clique() {
    let (f, inv, pre) = nvidia(|_| ("Completed", "Success", "1", UUID));
    assert_eq!(
        label(&f, "fabric.domain").as_deref(),
        Some("nvlink-5b0e112233445566778899aabbccddef-1")
    );
    assert!(
        label(&f, "fabric.members").is_none(),
        "NVIDIA reports no member count"
    );
    assert!(pre.contains("fabric.members: accelerators do not all report one nonzero member count"));
    settings().bind(|| {
        insta::assert_snapshot!("nvidia_completed.inventory", inv);
        insta::assert_snapshot!("nvidia_completed.features", f);
        insta::assert_snapshot!("nvidia_completed.preflight", pre);
    });
}

#[test]
fn nvidia_unregistered_states_publish_nothing() {
    for (state, status, uuid, why) in [
        ("Not Started", "N/A", ZERO, "not Completed"),
        ("In Progress", "N/A", ZERO, "not Completed"),
        ("Not Supported", "N/A", ZERO, "not Completed"),
        ("Completed", "Failure", UUID, "completed with status"),
        ("Completed", "Success", ZERO, "all zeros"),
    ] {
        let (f, inv, pre) = nvidia(move |_| (state, status, "0", uuid));
        assert!(
            label(&f, "fabric.domain").is_none(),
            "{state}/{status}/{uuid}"
        );
        assert!(
            !inv.contains("\"fabric\""),
            "{state}: no fabric in the record"
        );
        assert!(pre.contains(why), "{state}: preflight says why: {pre}");
    }
}

#[test]
fn nvidia_two_cliques_withhold_the_domain() {
    let (f, inv, pre) = nvidia(|i| ("Completed", "Success", if i < 4 { "1" } else { "2" }, UUID));
    assert!(label(&f, "fabric.domain").is_none());
    assert_eq!(
        inv.matches("\"kind\": \"nvlink\"").count(),
        8,
        "each GPU keeps its own clique"
    );
    assert!(pre.contains("different domains: nvlink-5b0e112233445566778899aabbccddef-1, nvlink-5b0e112233445566778899aabbccddef-2"));
}

#[test]
fn nvidia_unreadable_keeps_previous_fabric() {
    let sys = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    fixtures::gpu8_switch_paired(sys.path());
    let q = out.path().join("q.txt");
    fs::write(
        &q,
        fixtures::nvsmi_q(|_| ("Completed", "Success", "1", UUID)),
    )
    .unwrap();
    let (fd, sd, cd) = (
        out.path().join("f"),
        out.path().join("s"),
        out.path().join("c"),
    );
    let publish = |src: &[&str]| {
        let mut args = vec![
            "publish",
            "--sysfs-root",
            sys.path().to_str().unwrap(),
            "--features-dir",
            fd.to_str().unwrap(),
            "--state-dir",
            sd.to_str().unwrap(),
            "--cdi-dir",
            cd.to_str().unwrap(),
        ];
        args.extend_from_slice(src);
        let o = nodefabric(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        fs::read_to_string(out.path().join("f/nodefabric")).unwrap()
    };
    let first = publish(&["--nvidia-smi-q", q.to_str().unwrap()]);
    assert!(first.contains("fabric.domain=nvlink-"));
    // nvidia-smi cannot run: the domain label stays
    let again = publish(&["--nvidia-smi", "/nonexistent/nvidia-smi"]);
    assert_eq!(
        label(&again, "fabric.domain"),
        label(&first, "fabric.domain")
    );
    // NVML asked for and absent (no driver on this machine): the domain label stays too,
    // and the inventory says why.
    let again = publish(&["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"]);
    assert_eq!(
        label(&again, "fabric.domain"),
        label(&first, "fabric.domain")
    );
    let inv = ok(nodefabric(&[
        "inventory",
        "--sysfs-root",
        sys.path().to_str().unwrap(),
        "--state-dir",
        sd.to_str().unwrap(),
        "--nvml-lib",
        "/nonexistent/libnvidia-ml.so.1",
    ]));
    assert!(
        inv.contains("NVML unavailable (/nonexistent/libnvidia-ml.so.1)")
            && inv.contains("kept from the previous pass"),
        "{inv}"
    );
    // A library that loads but is not NVML (no nvmlInit symbol): the same, never a crash.
    if let Some(libm) = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/lib/aarch64-linux-gnu/libm.so.6",
        "/usr/lib64/libm.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    {
        let again = publish(&["--nvml-lib", libm]);
        assert_eq!(
            label(&again, "fabric.domain"),
            label(&first, "fabric.domain")
        );
    }
    // a readable answer that says "not registered" removes it
    fs::write(&q, fixtures::nvsmi_q(|_| ("In Progress", "N/A", "0", ZERO))).unwrap();
    let gone = publish(&["--nvidia-smi-q", q.to_str().unwrap()]);
    assert!(label(&gone, "fabric.domain").is_none());
}

#[test]
fn nvidia_smi_q_parse_errors_name_the_line() {
    let dir = tempfile::tempdir().unwrap();
    fixtures::gpu8_switch_paired(dir.path());
    let q = dir.path().join("bad.txt");
    fs::write(&q, "GPU 0000:zz:00.0\n    Fabric\n").unwrap();
    let o = nodefabric(&[
        "preflight",
        "--sysfs-root",
        dir.path().to_str().unwrap(),
        "--nvidia-smi-q",
        q.to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("nvidia-smi -q line 1"));
}

fn amd(hives: &[Option<&str>]) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    fixtures::amd_hives(dir.path(), hives);
    let root = dir.path().to_str().unwrap();
    (
        ok(nodefabric(&["features", "--sysfs-root", root])),
        ok(nodefabric(&["inventory", "--sysfs-root", root])),
    )
}

#[test]
fn amd_xgmi_hives() {
    let (f, inv) = amd(&[Some("1234567890123"), Some("1234567890123")]);
    assert_eq!(
        label(&f, "fabric.domain").as_deref(),
        Some("xgmi-1234567890123")
    );
    settings().bind(|| insta::assert_snapshot!("amd_one_hive.inventory", inv));
    let (f, _) = amd(&[Some("11"), Some("22")]);
    assert!(
        label(&f, "fabric.domain").is_none(),
        "two hives: no single answer"
    );
    let (f, inv) = amd(&[Some("0"), Some("0")]);
    assert!(
        label(&f, "fabric.domain").is_none() && !inv.contains("\"kind\": \"xgmi\""),
        "hive 0 is no hive"
    );
    let (f, _) = amd(&[Some("11"), None]);
    assert!(
        label(&f, "fabric.domain").is_none(),
        "one GPU without a hive"
    );
}

/// An independent FNV-1a 64 (written apart from the library's).
fn fnv1a64(s: &str) -> String {
    let h = s.bytes().fold(14695981039346656037u64, |h, b| {
        (h ^ b as u64).wrapping_mul(1099511628211)
    });
    format!("x{h:016x}")
}

#[test]
fn long_domain_is_hashed() {
    let long = "9".repeat(70);
    let (f, _) = amd(&[Some(&long), Some(&long)]);
    let value = label(&f, "fabric.domain").unwrap();
    assert_eq!(value, fnv1a64(&format!("xgmi-{long}")));
    settings().bind(|| insta::assert_snapshot!("amd_long_hive.features", f));
}

fn ascend(json: &str) -> (String, String, String) {
    let dir = tempfile::tempdir().unwrap();
    fixtures::non_pci(dir.path());
    let file = dir.path().join("ascend.json");
    fs::write(&file, json).unwrap();
    let root = dir.path().to_str().unwrap();
    let a = [
        "--sysfs-root",
        root,
        "--ascend-fabric",
        file.to_str().unwrap(),
    ];
    let run = |cmd: &str| nodefabric(&[&[cmd][..], &a[..]].concat());
    (
        ok(run("features")),
        ok(run("inventory")),
        String::from_utf8(run("preflight").stdout).unwrap(),
    )
}

fn npu(shape: &str, id: u64, size: u64, index: u64, rack: u64) -> String {
    format!(
        r#"{{"npus": [{{"pciBusId": "0000:01:00.0", "superPodType": "{shape}", "superPodId": {id}, "superPodSize": {size}, "serverIndex": {index}, "rackId": {rack}, "endpoints": ["000102030405060708090a0b0c0d0e0f"]}}]}}"#
    )
}

#[test]
fn ascend_super_pod_shapes() {
    const BAD: u64 = 0xFFFF_FFFF;
    let (f, inv, _) = ascend(&npu("pod-1d", 7, 64, 3, 1));
    assert_eq!(label(&f, "fabric.domain").as_deref(), Some("ub-7"));
    assert_eq!(label(&f, "fabric.members").as_deref(), Some("64"));
    settings().bind(|| insta::assert_snapshot!("ascend_pod.inventory", inv));
    let (f, _, _) = ascend(&npu("server-8p", 7, 64, 3, BAD));
    assert_eq!(
        label(&f, "fabric.domain").as_deref(),
        Some("ub-7"),
        "a super server"
    );
    let (f, inv, pre) = ascend(&npu("server-8p", BAD, BAD, BAD, BAD));
    assert!(label(&f, "fabric.domain").is_none() && label(&f, "fabric.members").is_none());
    assert!(
        inv.contains("\"type\": \"server-8p\"") && inv.contains("000102030405060708090a0b0c0d0e0f"),
        "kind, type, endpoints travel"
    );
    assert!(pre.contains("is in no super pod"));
    let (f, _, _) = ascend(&npu("card-4p", 7, BAD, 0, 0));
    assert!(label(&f, "fabric.domain").is_none());
    let (f, _, _) = ascend(&npu("server-16p", 7, 64, 0, 0));
    assert!(
        label(&f, "fabric.domain").is_none(),
        "server-16p is never in a super pod"
    );
    let (f, inv, _) = ascend(&npu("pod-2d", 9, BAD, BAD, 2));
    assert_eq!(label(&f, "fabric.domain").as_deref(), Some("ub-9"));
    assert!(
        label(&f, "fabric.members").is_none()
            && !inv.contains("nodeIndex")
            && inv.contains("\"rackId\": 2")
    );
}

#[test]
fn ascend_input_is_parsed_strictly() {
    let dir = tempfile::tempdir().unwrap();
    fixtures::non_pci(dir.path());
    let file = dir.path().join("ascend.json");
    fs::write(
        &file,
        npu("pod-1d", 7, 64, 3, 1).replace("000102030405060708090a0b0c0d0e0f", "0001020304050607"),
    )
    .unwrap();
    let o = nodefabric(&[
        "preflight",
        "--sysfs-root",
        dir.path().to_str().unwrap(),
        "--ascend-fabric",
        file.to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("is not 32 lowercase hex characters"));
}

#[test]
fn mixed_vendor_node_has_no_single_domain() {
    let dir = tempfile::tempdir().unwrap();
    let t = fixtures::gpu8_switch_paired(dir.path());
    let amd = t.pci(
        &[&fixtures::addr(0x00, 9, 0), &fixtures::addr(0x09, 0, 0)],
        fixtures::AMD,
        0x74a1,
        fixtures::CLASS_ACCEL,
        0,
    );
    t.write(&format!("{amd}/xgmi_hive_info/xgmi_hive_id"), "77");
    let q = dir.path().join("q.txt");
    fs::write(
        &q,
        fixtures::nvsmi_q(|_| ("Completed", "Success", "1", UUID)),
    )
    .unwrap();
    let f = ok(nodefabric(&[
        "features",
        "--sysfs-root",
        dir.path().to_str().unwrap(),
        "--nvidia-smi-q",
        q.to_str().unwrap(),
    ]));
    assert!(label(&f, "fabric.domain").is_none());
    assert_eq!(label(&f, "rdma.capable").as_deref(), Some("true"));
}

#[test]
fn cambricon_has_no_domain() {
    let dir = tempfile::tempdir().unwrap();
    let t = fixtures::Tree::new(dir.path());
    t.pci(
        &[&fixtures::addr(0x00, 1, 0), &fixtures::addr(0x01, 0, 0)],
        0xcabc,
        0x0590,
        fixtures::CLASS_ACCEL,
        0,
    );
    let o = nodefabric(&["preflight", "--sysfs-root", dir.path().to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("cambricon") && out.contains("reports no domain identity"),
        "{out}"
    );
}

/// A `--nvidia-smi` given as a bare name is looked up on PATH, as a shell
/// would.
#[test]
fn a_bare_nvidia_smi_name_is_found_on_path() {
    let (o, ran) = with_fake_nvidia_smi_on_path(&["features", "--nvidia-smi", "nvidia-smi"]);
    let f = ok(o);
    assert!(ran);
    assert_eq!(
        label(&f, "fabric.domain").as_deref(),
        Some("nvlink-5b0e112233445566778899aabbccddef-3")
    );
}

/// A tree that is not a mounted sysfs is another machine's (a copy, a test
/// tree): the nvidia-smi on this host's PATH would answer for this host's
/// GPUs, so it is not run unless named, and the record says how to give
/// the tree's own answer.
#[test]
fn a_copied_tree_does_not_ask_this_hosts_nvidia_smi() {
    let (o, ran) = with_fake_nvidia_smi_on_path(&["inventory"]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let record: serde_json::Value = serde_json::from_slice(&ok(o).into_bytes()).unwrap();
    assert!(!ran, "this host's nvidia-smi was run for a copied tree");
    let note = record["spec"]["groups"][0]["accelerators"][0]["fabricNote"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        note.contains("is not a mounted sysfs") && note.contains("--nvidia-smi-q"),
        "{note}"
    );
    assert!(err.contains("--nvidia-smi-q"), "{err}");
}

/// Runs nodefabric with `args` on an 8-GPU tree copied into a temp folder,
/// with only a folder on PATH whose `nvidia-smi -q` prints a registered
/// fabric for those GPUs; its output, and whether that nvidia-smi ran.
fn with_fake_nvidia_smi_on_path(args: &[&str]) -> (Output, bool) {
    let dir = tempfile::tempdir().unwrap();
    let sys = dir.path().join("sys");
    fixtures::gpu8_switch_paired(&sys);
    let bin = dir.path().join("bin");
    fs::create_dir(&bin).unwrap();
    let q = dir.path().join("q.txt");
    fs::write(
        &q,
        fixtures::nvsmi_q(|_| ("Completed", "Success", "3", UUID)),
    )
    .unwrap();
    let ran = dir.path().join("ran");
    let fake = bin.join("nvidia-smi");
    fs::write(
        &fake,
        format!(
            "#!/bin/sh\n: > {}\n[ \"$1\" = -q ] && exec /bin/cat {}\nexit 9\n",
            ran.display(),
            q.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .args(args)
        .arg("--sysfs-root")
        .arg(&sys)
        .env("PATH", &bin)
        .output()
        .unwrap();
    (o, ran.exists())
}
