//! The fault table: for each fact a real node can fail to answer, and for each
//! way it can fail (a folder where a file belongs, a dangling link, a FIFO, a
//! file over 64 KiB, text that is not a value), a publish before the fault
//! and one after it, with one state folder. Nothing published may disappear:
//! no label, no CDI device (and so no kubelet token, which the device plugin
//! derives one-to-one from the CDI devices), and preflight names the kept fact.

use crate::support::os::{free_port, make_fifo};
use crate::support::{fixtures, host, mount, wait};
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const NOW: &str = "2026-03-01T12:00:00Z";

/// Starts nodefabric with `args` in the background, its output discarded.
fn spawn_quiet(args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .args(args)
        .env("NODEFABRIC_NOW", NOW)
        .env_remove("NODEFABRIC_SYSFS_ROOT")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

fn nodefabric(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .args(args)
        .env("NODEFABRIC_NOW", NOW)
        .env_remove("NODEFABRIC_SYSFS_ROOT")
        .output()
        .expect("run nodefabric")
}

/// How an attribute or folder is broken.
#[derive(Debug, Clone, Copy)]
enum Form {
    /// A folder where a file belongs.
    Folder,
    /// A symlink whose target does not exist.
    Dangling,
    /// A FIFO: a blocking read would hang the pass.
    Fifo,
    /// A file past the 64 KiB attribute cap.
    Huge,
    /// A regular file where a folder belongs.
    File,
    /// Text that is not the value the kernel prints.
    Garbage,
}

/// The forms that make a file attribute unreadable.
const FILE_FORMS: [Form; 5] = [
    Form::Folder,
    Form::Dangling,
    Form::Fifo,
    Form::Huge,
    Form::Garbage,
];
/// The forms that make a folder unreadable.
const FOLDER_FORMS: [Form; 3] = [Form::Dangling, Form::Fifo, Form::File];

/// Replaces whatever is at `path` with `form`.
fn break_path(path: &Path, form: Form) {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path).unwrap(),
        Ok(_) => fs::remove_file(path).unwrap(),
        Err(_) => {}
    }
    match form {
        Form::Folder => fs::create_dir(path).unwrap(),
        Form::Dangling => std::os::unix::fs::symlink("gone.by.now", path).unwrap(),
        Form::Fifo => make_fifo(path),
        Form::Huge => fs::write(path, "1".repeat(70 * 1024)).unwrap(),
        Form::File => fs::write(path, "not a folder\n").unwrap(),
        Form::Garbage => fs::write(path, "\u{fffd}garbage\n").unwrap(),
    }
}

/// Everything one publish left for its consumers.
#[derive(Debug, PartialEq)]
struct Published {
    /// `key=value` lines of the feature file.
    labels: BTreeSet<String>,
    /// `file: device` for every CDI device of every spec.
    devices: BTreeSet<String>,
}

/// A fixture tree and the folders `publish` writes, all in one temp folder.
struct Node {
    _dir: tempfile::TempDir,
    sys: PathBuf,
    out: PathBuf,
}

impl Node {
    fn new(build: impl FnOnce(&Path)) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys");
        fs::create_dir(&sys).unwrap();
        build(&sys);
        let out = dir.path().join("out");
        Node {
            sys,
            out,
            _dir: dir,
        }
    }

    fn dir(&self, name: &str) -> String {
        self.out.join(name).to_str().unwrap().to_string()
    }

    fn args<'a>(
        &'a self,
        cmd: &'a str,
        dirs: &'a [String; 3],
        extra: &'a [&'a str],
    ) -> Vec<&'a str> {
        let mut a = vec![
            cmd,
            "--sysfs-root",
            self.sys.to_str().unwrap(),
            "--state-dir",
            &dirs[2],
        ];
        if cmd == "publish" {
            a.extend(["--features-dir", &dirs[0], "--cdi-dir", &dirs[1]]);
        }
        a.extend_from_slice(extra);
        a
    }

    fn dirs(&self) -> [String; 3] {
        [self.dir("features.d"), self.dir("cdi"), self.dir("state")]
    }

    /// Publishes once; the pass must succeed.
    fn publish(&self, extra: &[&str]) -> Published {
        let dirs = self.dirs();
        let o = nodefabric(&self.args("publish", &dirs, extra));
        assert!(
            o.status.success(),
            "publish failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let features = fs::read_to_string(self.out.join("features.d/nodefabric")).unwrap();
        let labels = features
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_string)
            .collect();
        let mut devices = BTreeSet::new();
        for entry in fs::read_dir(self.out.join("cdi")).unwrap() {
            let path = entry.unwrap().path();
            let spec: serde_json::Value =
                serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
            for d in spec["devices"].as_array().unwrap() {
                devices.insert(format!(
                    "{}: {}",
                    path.file_name().unwrap().to_string_lossy(),
                    d["name"].as_str().unwrap()
                ));
            }
        }
        Published { labels, devices }
    }

    /// Preflight's report with the same state folder.
    fn preflight(&self, extra: &[&str]) -> String {
        let dirs = self.dirs();
        let o = nodefabric(&self.args("preflight", &dirs, extra));
        assert!(
            o.status.code().is_some_and(|c| c < 2),
            "preflight errored: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    }

    /// The canonical device folder of interface `name`.
    fn device_of(&self, name: &str) -> PathBuf {
        fs::canonicalize(self.sys.join("class/net").join(name).join("device")).unwrap()
    }
}

/// Runs one row of the table: publish, break `target(node)` with `form`,
/// publish again, and hold the rule.
fn row(
    fault: &str,
    build: fn(&Path) -> fixtures::Tree,
    target: impl Fn(&Node) -> PathBuf,
    form: Form,
    fact: &str,
) {
    let node = Node::new(|d| drop(build(d)));
    let before = node.publish(&[]);
    assert!(
        !before.devices.is_empty(),
        "{fault}: the fixture publishes CDI devices"
    );
    break_path(&target(&node), form);
    let after = node.publish(&[]);
    let lost_labels: Vec<_> = before.labels.difference(&after.labels).collect();
    let lost_devices: Vec<_> = before.devices.difference(&after.devices).collect();
    assert!(
        lost_labels.is_empty(),
        "{fault} as {form:?}: labels lost: {lost_labels:?}"
    );
    assert!(
        lost_devices.is_empty(),
        "{fault} as {form:?}: CDI devices (tokens) lost: {lost_devices:?}"
    );
    let report = node.preflight(&[]);
    assert!(
        report.contains(&format!("{fact}: kept from the previous pass:")),
        "{fault} as {form:?}: preflight does not name the kept fact {fact}:\n{report}"
    );
}

#[test]
fn fifos_planted_where_publish_reads_its_own_files_are_replaced_not_waited_on() {
    let node = Node::new(|d| drop(fixtures::vf_only(d)));
    let before = node.publish(&[]);
    let spec = fs::read_dir(node.out.join("cdi"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    // The previous record, the feature file and a spec: each read back by
    // the next pass, which used to open them blocking.
    for planted in [
        node.out.join("state/record.json"),
        node.out.join("features.d/nodefabric"),
        spec,
    ] {
        break_path(&planted, Form::Fifo);
    }
    let dirs = node.dirs();
    let mut child = spawn_quiet(&node.args("publish", &dirs, &[]));
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > std::time::Duration::from_secs(30) {
            child.kill().unwrap();
            panic!("publish blocked on a FIFO in its own folders");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success());
    // Everything is published again, as regular files.
    assert_eq!(node.publish(&[]), before);
    assert!(fs::metadata(node.out.join("features.d/nodefabric"))
        .unwrap()
        .is_file());
}

#[test]
fn unreadable_sriov_numvfs_keeps_partitioned_tokens() {
    for form in FILE_FORMS {
        row(
            "sriov_numvfs",
            fixtures::vf_only,
            |n| n.device_of("enp4s0f0np0").join("sriov_numvfs"),
            form,
            "virtualFunctionsConfigured",
        );
    }
}

#[test]
fn unreadable_sriov_totalvfs_keeps_partitioned_tokens() {
    for form in FILE_FORMS {
        row(
            "sriov_totalvfs",
            fixtures::vf_only,
            |n| n.device_of("enp4s0f0np0").join("sriov_totalvfs"),
            form,
            "physicalFunction",
        );
    }
}

#[test]
fn unreadable_infiniband_folder_keeps_the_rdma_device() {
    for form in FOLDER_FORMS {
        row(
            "device/infiniband",
            fixtures::gpu8_switch_paired,
            |n| n.device_of("enp19s0np0").join("infiniband"),
            form,
            "rdmaDevice",
        );
    }
}

/// `class/infiniband` is only an index of what each device's own
/// `infiniband/` folder says: damaged (a dangling link, a FIFO, a file), or
/// holding a link that does not end in `<device>/infiniband/<name>`, the
/// pass lists each device's folder instead and publishes the same record,
/// with nothing marked as kept.
#[test]
fn unreadable_infiniband_class_index_falls_back_to_each_device_folder() {
    let odd_link = |n: &Node| {
        let class = n.sys.join("class/infiniband");
        let first = fs::read_dir(&class)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .min()
            .unwrap();
        let entry = class.join(first);
        let device = fs::canonicalize(&entry).unwrap();
        // The device folder itself, not the RDMA device beneath it.
        let device = device.parent().unwrap().parent().unwrap().to_path_buf();
        fs::remove_file(&entry).unwrap();
        std::os::unix::fs::symlink(device, &entry).unwrap();
    };
    type Damage = Box<dyn Fn(&Node)>;
    let forms: Vec<(String, Damage)> = FOLDER_FORMS
        .into_iter()
        .map(|form| {
            let f: Damage =
                Box::new(move |n: &Node| break_path(&n.sys.join("class/infiniband"), form));
            (format!("{form:?}"), f)
        })
        .chain([(
            "a link outside <device>/infiniband".to_string(),
            Box::new(odd_link) as _,
        )])
        .collect();
    for (what, damage) in forms {
        let node = Node::new(|d| drop(fixtures::gpu8_switch_paired(d)));
        let before = node.publish(&[]);
        let record_before = fs::read(node.out.join("state/record.json")).unwrap();
        damage(&node);
        assert_eq!(node.publish(&[]), before, "class/infiniband as {what}");
        assert_eq!(
            fs::read(node.out.join("state/record.json")).unwrap(),
            record_before,
            "class/infiniband as {what}: the record changed"
        );
        let report = node.preflight(&[]);
        assert!(
            !report.contains("kept from the previous pass"),
            "class/infiniband as {what}: a fact was taken as unreadable:\n{report}"
        );
    }
}

#[test]
fn unreadable_numa_node_keeps_the_numa_label() {
    for form in FILE_FORMS {
        row(
            "numa_node",
            fixtures::no_accelerator,
            |n| n.device_of("enp1s0np0").join("numa_node"),
            form,
            "numa",
        );
    }
}

#[test]
fn unreadable_local_cpulist_keeps_the_cpu_affinity() {
    // The PF reads node 1's list first (the other functions on its node
    // take it from there), so the fault is met where it is read.
    for form in FILE_FORMS {
        row(
            "local_cpulist",
            fixtures::vf_only,
            |n| n.device_of("enp4s0f0np0").join("local_cpulist"),
            form,
            "cpuAffinity",
        );
    }
}

#[test]
fn unreadable_operstate_keeps_up() {
    for form in FILE_FORMS {
        row(
            "operstate",
            fixtures::gpu8_switch_paired,
            |n| n.sys.join("class/net/enp19s0np0/operstate"),
            form,
            "up",
        );
    }
}

#[test]
fn unreadable_nic_folder_keeps_the_whole_interface() {
    for form in FOLDER_FORMS {
        row(
            "class/net entry",
            fixtures::gpu8_switch_paired,
            |n| n.sys.join("class/net/enp19s0np0"),
            form,
            "interface",
        );
    }
}

#[test]
fn unreadable_nic_device_link_keeps_the_whole_interface() {
    row(
        "device link",
        fixtures::gpu8_switch_paired,
        |n| n.sys.join("class/net/enp19s0np0/device"),
        Form::Dangling,
        "interface",
    );
}

/// One GPU and one NIC whose link is up.
fn single_port_up(d: &Path) -> fixtures::Tree {
    fixtures::single_port(d, fixtures::UP)
}

#[test]
fn unreadable_accelerator_vendor_keeps_the_distance_label() {
    for form in FILE_FORMS {
        row(
            "accelerator vendor",
            single_port_up,
            |n| n.sys.join("bus/pci/devices/0000:03:00.0/vendor"),
            form,
            "accelerator",
        );
    }
}

#[test]
fn unreadable_accelerator_class_keeps_the_distance_label() {
    // The class is read only once the vendor names an accelerator maker.
    for form in FILE_FORMS {
        row(
            "accelerator class",
            single_port_up,
            |n| n.sys.join("bus/pci/devices/0000:03:00.0/class"),
            form,
            "accelerator",
        );
    }
}

#[test]
fn unreadable_accelerator_numa_node_is_kept() {
    // The accelerator's NUMA node feeds no label on its own; the rule still holds.
    for form in FILE_FORMS {
        row(
            "accelerator numa_node",
            single_port_up,
            |n| n.sys.join("bus/pci/devices/0000:03:00.0/numa_node"),
            form,
            "numa",
        );
    }
}

#[test]
fn a_kernel_blank_numa_is_an_answer_not_an_unreadable_fact() {
    let node = Node::new(|d| drop(fixtures::no_accelerator(d)));
    node.publish(&[]);
    fs::write(node.device_of("enp1s0np0").join("numa_node"), "-1\n").unwrap();
    let report = node.preflight(&[]);
    assert!(!report.contains("could not read"), "{report}");
}

#[test]
fn no_previous_record_leaves_an_unreadable_fact_unknown() {
    let node = Node::new(|d| drop(fixtures::vf_only(d)));
    break_path(
        &node.device_of("enp4s0f0np0").join("sriov_numvfs"),
        Form::Fifo,
    );
    let report = node.preflight(&[]);
    assert!(
        report.contains("virtualFunctionsConfigured: unknown (no previous pass to keep it from)"),
        "{report}"
    );
}

/// The previous record is what keeps facts: a state folder's record is read
/// back from disk by the next pass, so the JSON field must round-trip.
#[test]
fn kept_facts_are_marked_in_the_record() {
    let node = Node::new(|d| drop(fixtures::vf_only(d)));
    node.publish(&[]);
    break_path(
        &node.device_of("enp4s0f0np0").join("sriov_numvfs"),
        Form::Dangling,
    );
    node.publish(&[]);
    let record: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(node.out.join("state/record.json")).unwrap())
            .unwrap();
    let pf = &record["spec"]["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "enp4s0f0np0")
        .unwrap()
        .clone();
    assert_eq!(pf["virtualFunctionsConfigured"], 4);
    assert_eq!(pf["unreadable"][0]["fact"], "virtualFunctionsConfigured");
    assert_eq!(pf["unreadable"][0]["kept"], true);
    assert!(
        pf["unreadable"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("dangling link"),
        "{pf}"
    );
}

const UUID: &str = "5b0e1122-3344-5566-7788-99aabbccddef";

/// `nvidia-smi -q -x` for the gpu8 fixture, in the tool's XML layout.
fn nvsmi_xml(gpus: u32) -> String {
    let mut s = String::from("<?xml version=\"1.0\" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM \"nvsmi_device_v12.dtd\">\n<nvidia_smi_log>\n\t<driver_version>570.86.15</driver_version>\n\t<attached_gpus>8</attached_gpus>\n");
    for i in 0..gpus {
        let host = if i < 4 { 0x00 } else { 0x80 };
        let bus = host + 0x10 * (i % 4) + 0x10 + 2;
        s.push_str(&format!(
            "\t<gpu id=\"00000000:{bus:02X}:00.0\">\n\t\t<product_name>NVIDIA H100 80GB HBM3</product_name>\n\t\t<fabric>\n\t\t\t<state>Completed</state>\n\t\t\t<status>Success</status>\n\t\t\t<cliqueId>1</cliqueId>\n\t\t\t<clusterUuid>{UUID}</clusterUuid>\n\t\t\t<health>\n\t\t\t\t<bandwidth>Full</bandwidth>\n\t\t\t</health>\n\t\t</fabric>\n\t</gpu>\n"
        ));
    }
    s.push_str("</nvidia_smi_log>\n");
    s
}

fn domain(p: &Published) -> Option<&String> {
    p.labels.iter().find(|l| l.contains("/fabric.domain="))
}

#[test]
fn nvidia_smi_q_xml_is_a_first_class_answer() {
    let node = Node::new(|d| drop(fixtures::gpu8_switch_paired(d)));
    let xml = node.out.with_file_name("q.xml");
    fs::write(&xml, nvsmi_xml(8)).unwrap();
    let p = node.publish(&["--nvidia-smi-q", xml.to_str().unwrap()]);
    assert_eq!(
        domain(&p).map(String::as_str),
        Some("feature.gpustack.ai/fabric.domain=nvlink-5b0e112233445566778899aabbccddef-1")
    );
}

#[test]
fn nvidia_smi_answer_that_is_not_q_output_keeps_the_domain() {
    let node = Node::new(|d| drop(fixtures::gpu8_switch_paired(d)));
    let q = node.out.with_file_name("q.txt");
    let text = fixtures::nvsmi_q(|_| ("Completed", "Success", "1", UUID));
    fs::write(&q, &text).unwrap();
    let before = node.publish(&["--nvidia-smi-q", q.to_str().unwrap()]);
    assert!(domain(&before).is_some());
    let cut = text.find("GPU 00000000:92").unwrap();
    let bad: [(&str, String); 6] = [
        ("empty", String::new()),
        ("JSON", "{\"gpus\": []}\n".into()),
        ("truncated text", text[..cut].to_string()),
        ("truncated XML", nvsmi_xml(8)[..400].to_string()),
        ("XML announcing more GPUs than it holds", nvsmi_xml(3)),
        (
            "another tool's text",
            "Mon Mar  2 12:00:00 2026\nNo devices were found\n".into(),
        ),
    ];
    for (what, answer) in bad {
        fs::write(&q, answer).unwrap();
        let after = node.publish(&["--nvidia-smi-q", q.to_str().unwrap()]);
        assert_eq!(
            domain(&after),
            domain(&before),
            "{what}: fabric.domain lost"
        );
        let report = node.preflight(&["--nvidia-smi-q", q.to_str().unwrap()]);
        assert!(
            report.contains("fabric unreadable, kept from the previous pass"),
            "{what}:\n{report}"
        );
    }
}

#[test]
fn hung_nvidia_smi_is_killed_after_the_timeout_and_keeps_the_domain() {
    let node = Node::new(|d| drop(fixtures::gpu8_switch_paired(d)));
    let q = node.out.with_file_name("q.txt");
    fs::write(
        &q,
        fixtures::nvsmi_q(|_| ("Completed", "Success", "1", UUID)),
    )
    .unwrap();
    let before = node.publish(&["--nvidia-smi-q", q.to_str().unwrap()]);
    let hang = node.out.with_file_name("nvidia-smi");
    fs::write(&hang, "#!/bin/sh\nexec sleep 600\n").unwrap();
    fs::set_permissions(&hang, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let after = node.publish(&[
        "--nvidia-smi",
        hang.to_str().unwrap(),
        "--tool-timeout",
        "1s",
    ]);
    assert_eq!(domain(&after), domain(&before));
    let report = node.preflight(&[
        "--nvidia-smi",
        hang.to_str().unwrap(),
        "--tool-timeout",
        "1s",
    ]);
    assert!(
        report.contains("did not answer within 1s, killed"),
        "{report}"
    );
}

#[test]
fn fabric_warning_is_printed_once_per_pass_not_per_gpu() {
    let node = Node::new(|d| drop(fixtures::gpu8_switch_paired(d)));
    let dirs = node.dirs();
    let o = nodefabric(&node.args(
        "preflight",
        &dirs,
        &["--nvidia-smi", "/nonexistent/nvidia-smi"],
    ));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("NVIDIA fabric unreadable").count(), 1, "{err}");
    assert!(err.contains("no previous answer to keep"), "{err}");
    // `rails` and `cdi` do not use the fabric: they do not ask for it or warn about it.
    let o = nodefabric(&[
        "cdi",
        "--sysfs-root",
        node.sys.to_str().unwrap(),
        "--nvidia-smi",
        "/nonexistent/nvidia-smi",
    ]);
    assert!(o.status.success());
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("fabric"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn published_files_are_0644_and_readable_by_an_unprivileged_user() {
    if !host::runnable(
        "published_files_are_0644_and_readable_by_an_unprivileged_user",
        (!host::is_root()).then(|| "needs root to switch to uid 65534".to_string()),
    ) {
        return;
    }
    let node = Node::new(|d| drop(fixtures::vf_only(d)));
    // The temp folder is private to its creator; the nodefabric folders below
    // it are created by publish itself, as on a node.
    fs::set_permissions(
        node.out.parent().unwrap(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    node.publish(&[]);
    let mut files = Vec::new();
    for sub in ["features.d", "cdi"] {
        for e in fs::read_dir(node.out.join(sub)).unwrap() {
            files.push(e.unwrap().path());
        }
    }
    assert!(files.len() >= 2, "{files:?}");
    for f in files {
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&fs::metadata(&f).unwrap().permissions())
                & 0o777;
        assert_eq!(mode, 0o644, "{} has mode {mode:o}", f.display());
        let o = std::os::unix::process::CommandExt::gid(
            std::os::unix::process::CommandExt::uid(Command::new("cat").arg(&f), 65534),
            65534,
        )
        .output()
        .unwrap();
        assert!(
            o.status.success(),
            "uid 65534 cannot read {}: {}",
            f.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
fn publish_fails_before_writing_anything_when_a_later_folder_is_unwritable() {
    let node = Node::new(|d| drop(fixtures::vf_only(d)));
    let dirs = node.dirs();
    fs::create_dir_all(node.out.join("state")).unwrap();
    // a file where the CDI folder belongs: create_dir_all fails for every user, root included
    fs::write(node.out.join("cdi"), "").unwrap();
    let o = nodefabric(&node.args("publish", &dirs, &[]));
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cdi"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        !node.out.join("features.d/nodefabric").exists(),
        "the first folder's file was written before the second folder failed"
    );
}

#[test]
fn publish_off_sys_requires_every_folder() {
    let node = Node::new(|d| drop(fixtures::vf_only(d)));
    let o = nodefabric(&[
        "publish",
        "--sysfs-root",
        node.sys.to_str().unwrap(),
        "--features-dir",
        &node.dir("f"),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--cdi-dir, --state-dir"), "{err}");
}

#[test]
fn out_of_range_durations_are_usage_errors_naming_the_flag() {
    for (flag, value) in [
        ("--interval", "0s"),
        ("--interval", "0"),
        ("--expiry", "8000y"),
        ("--tool-timeout", "0s"),
    ] {
        let mut args = vec![
            "publish",
            "--features-dir",
            "/nonexistent/f",
            "--cdi-dir",
            "/nonexistent/c",
            "--state-dir",
            "/nonexistent/s",
        ];
        args.extend([flag, value]);
        let o = nodefabric(&args);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(flag) && !err.contains("panicked"),
            "{flag} {value}: {err}"
        );
    }
}

#[test]
fn broken_pipe_exits_quietly() {
    // Larger than a pipe's buffer, so the writer is still writing when the reader hangs up.
    let node = Node::new(|d| drop(fixtures::large(d, 256)));
    let mut child = Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .args([
            "inventory",
            "--sysfs-root",
            node.sys.to_str().unwrap(),
            "--nvidia-smi",
            "/nonexistent/nvidia-smi",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Read one byte, then hang up, as `| head -c1` does.
    let mut out = child.stdout.take().unwrap();
    let mut one = [0u8; 1];
    std::io::Read::read_exact(&mut out, &mut one).unwrap();
    drop(out);
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("panicked") && !err.contains("error:"),
        "{err}"
    );
    assert!(o.status.success(), "{:?} {err}", o.status);
}

#[test]
fn each_error_is_printed_once_with_its_cause_once() {
    let o = nodefabric(&["inventory", "--sysfs-root", "/nonexistent/tree"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
}

#[test]
fn version_names_the_commit() {
    let o = nodefabric(&["--version"]);
    let v = String::from_utf8_lossy(&o.stdout);
    assert!(
        v.starts_with("nodefabric ") && v.contains("(commit "),
        "{v}"
    );
}

/// The NIC device folder of `single_port`, root-relative (for adding to the fixture).
fn nic_dir(node: &Node, ifname: &str) -> String {
    let sys = fs::canonicalize(&node.sys).unwrap();
    node.device_of(ifname)
        .strip_prefix(sys)
        .unwrap()
        .to_str()
        .unwrap()
        .to_string()
}

#[test]
fn two_netdevs_on_one_rdma_device_give_one_cdi_device() {
    let node = Node::new(|d| drop(single_port_up(d)));
    // The second port of a dual-port HCA exposed on the same PCI function.
    let t = fixtures::Tree::new(&node.sys);
    t.netdev(&nic_dir(&node, "enp4s0np0"), "enp4s0np1", 4200, true);
    let p = node.publish(&[]);
    assert_eq!(
        p.devices.iter().filter(|d| d.ends_with(": mlx5_0")).count(),
        1,
        "{p:?}"
    );
    let spec: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(node.out.join("cdi/nodefabric-rdma.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        spec["devices"][0]["annotations"]["rdma.gpustack.ai/interface"],
        "enp4s0np0+enp4s0np1"
    );
}

#[test]
fn rdma_device_name_outside_the_cdi_grammar_is_refused_and_never_written() {
    let node = Node::new(|d| drop(fixtures::Tree::new(d)));
    let t = fixtures::Tree::new(&node.sys);
    let nic = t.pci(
        &[&fixtures::addr(0, 1, 0), &fixtures::addr(1, 0, 0)],
        fixtures::MELLANOX,
        0x1017,
        fixtures::CLASS_ETH,
        0,
    );
    t.netdev(&nic, "enp1s0np0", 1500, true);
    t.rdma(&nic, "mlx5_0,gpu=all", &[fixtures::UP]);
    let dirs = node.dirs();
    let o = nodefabric(&node.args("publish", &dirs, &[]));
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("\"mlx5_0,gpu=all\" is not a valid CDI device name"),
        "{err}"
    );
    assert_eq!(
        err.matches("mlx5_0,gpu=all").count(),
        1,
        "the error is printed once: {err}"
    );
    assert!(!node.out.join("cdi/nodefabric-rdma.json").exists());
}

#[test]
fn unreadable_vf_keeps_its_partitioned_token() {
    for form in [Form::Dangling, Form::File] {
        // The VF's own folder is gone or replaced; the PF's virtfn link still names it.
        row(
            "VF folder",
            fixtures::vf_only,
            |n| fs::canonicalize(n.device_of("enp4s0f0np0").join("virtfn0")).unwrap(),
            form,
            "interface",
        );
    }
}

/// A stand-in for a vendor tool that never answers, at `dir/name`.
fn hung_tool(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, "#!/bin/sh\nexec sleep 600\n").unwrap();
    fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    p
}

#[test]
fn hung_nvidia_smi_and_lldpctl_fail_the_rail_pass_after_the_timeout_instead_of_hanging_it() {
    let node = Node::new(|d| drop(fixtures::gpu8_switch_paired(d)));
    let bin = node.out.with_file_name("bin");
    fs::create_dir_all(&bin).unwrap();
    let smi = hung_tool(&bin, "nvidia-smi");
    hung_tool(&bin, "lldpctl");
    let rails = |extra: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_nodefabric"));
        c.args([
            "rails",
            "-o",
            "json",
            "--sysfs-root",
            node.sys.to_str().unwrap(),
            "--interface-regex",
            "^enp([0-9]+)s0np0$",
            "--rail-id",
            "r$1",
            "--tool-timeout",
            "1s",
        ])
        .args(extra)
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env_remove("KUBECONFIG");
        c.output().unwrap()
    };
    // lldpctl from PATH hangs.
    let o = rails(&[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("lldpctl -f json did not answer within 1s, killed"),
        "{err}"
    );
    // nvidia-smi hangs while rail ports come from their names.
    let o = rails(&[
        "--rail-source",
        "interface-name",
        "--nvidia-smi",
        smi.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("did not answer within 1s, killed"),
        "{err}"
    );
}

/// `GET path` on 127.0.0.1:`port`: the status and the body, or `None` while
/// nothing answers.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split(' ').nth(1)?.parse().ok()?;
    Some((
        status,
        out.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default(),
    ))
}

#[test]
fn a_folder_deleted_on_the_host_under_the_publishers_mount_fails_liveness_naming_it() {
    let node = Node::new(|d| drop(fixtures::vf_only(d)));
    let host_cdi = node.out.join("cdi");
    fs::create_dir_all(&host_cdi).unwrap();
    let (_held, mounted) = mount::held(&host_cdi);
    let mounted = mounted.to_str().unwrap();
    let port = free_port();
    let dirs = node.dirs();
    let health = format!("127.0.0.1:{port}");
    let mut child = spawn_quiet(&[
        "publish",
        "--sysfs-root",
        node.sys.to_str().unwrap(),
        "--features-dir",
        &dirs[0],
        "--cdi-dir",
        mounted,
        "--state-dir",
        &dirs[2],
        "--interval",
        "1s",
        "--health-addr",
        &health,
    ]);
    wait::until(
        "a pass published",
        || http_get(port, "/readyz"),
        |r| r.as_ref().is_some_and(|(s, _)| *s == 200),
    );
    assert_eq!(http_get(port, "/livez").unwrap().0, 200);
    assert!(
        fs::read_dir(&host_cdi).unwrap().next().is_some(),
        "specs written through the mount"
    );
    // The host replaces the folder: the mount still holds the deleted one.
    fs::remove_dir_all(&host_cdi).unwrap();
    fs::create_dir(&host_cdi).unwrap();
    wait::until(
        "liveness fails",
        || http_get(port, "/livez"),
        |r| r.as_ref().is_some_and(|(s, _)| *s == 503),
    );
    let (_, why) = http_get(port, "/livez").unwrap();
    assert!(
        why.contains(mounted) && why.contains("deleted on the host"),
        "{why}"
    );
    assert_eq!(
        http_get(port, "/readyz").unwrap().0,
        503,
        "no pass can publish"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

/// What `run_measured` hands the re-run test binary: the arguments (one
/// JSON array), the file-size limit and where to write the verdict.
const MEASURE_ARGS: &str = "NODEFABRIC_TEST_MEASURE_ARGS";
const MEASURE_FSIZE: &str = "NODEFABRIC_TEST_MEASURE_FSIZE";
const MEASURE_OUT: &str = "NODEFABRIC_TEST_MEASURE_OUT";

/// Runs nodefabric with `args` (and `NODEFABRIC_NOW` as `now`) to its end,
/// its stderr kept, and returns its exit code, stderr and peak RSS in MiB.
///
/// The peak comes from a parent with a small address space: at exec the
/// kernel counts the old address space's peak into the new program's
/// `ru_maxrss`, and this test binary's own peak is whatever the tests
/// beside it used (a 10k-interface capture test reaches 255 MiB). So this
/// binary is re-run as `measured_child_parent` alone, fresh and small, and
/// that run spawns and measures nodefabric.
fn run_measured(
    args: &[&str],
    now: &str,
    limit_file_size: Option<u64>,
) -> (Option<i32>, String, i64) {
    let tmp = tempfile::tempdir().unwrap();
    let verdict = tmp.path().join("verdict");
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "faults::measured_child_parent",
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(MEASURE_ARGS, serde_json::to_string(args).unwrap())
    .env(MEASURE_OUT, &verdict)
    .env("NODEFABRIC_NOW", now)
    .env_remove("NODEFABRIC_SYSFS_ROOT")
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped());
    match limit_file_size {
        Some(limit) => cmd.env(MEASURE_FSIZE, limit.to_string()),
        None => cmd.env_remove(MEASURE_FSIZE),
    };
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let verdict = fs::read_to_string(&verdict)
        .unwrap_or_else(|e| panic!("the measuring parent wrote no verdict ({e}): {err}"));
    let (code, rss) = verdict.trim().split_once(' ').unwrap();
    (code.parse().ok(), err, rss.parse().unwrap())
}

/// The measuring parent of `run_measured`, run only by it (ignored in a
/// plain run): spawns nodefabric with the arguments it was handed, passes
/// its stderr through, and writes "<exit code or -> <peak RSS MiB>".
/// The child is reaped by wait4(2), which clippy cannot see.
#[test]
#[ignore = "run by run_measured as the parent of the nodefabric it measures"]
#[allow(clippy::zombie_processes)]
fn measured_child_parent() {
    use std::os::unix::process::CommandExt;
    let (Ok(args), Ok(out)) = (std::env::var(MEASURE_ARGS), std::env::var(MEASURE_OUT)) else {
        // Run by hand (`--include-ignored`): there is nothing to measure.
        eprintln!("run by run_measured, which sets {MEASURE_ARGS} and {MEASURE_OUT}");
        return;
    };
    let args: Vec<String> = serde_json::from_str(&args).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nodefabric"));
    // The parent's stderr is run_measured's pipe; stdout is not wanted.
    cmd.args(&args).stdout(std::process::Stdio::null());
    if let Ok(limit) = std::env::var(MEASURE_FSIZE) {
        let limit: u64 = limit.parse().unwrap();
        // A disk that takes a small file but not a larger one, without root:
        // a write past RLIMIT_FSIZE fails (EFBIG) as one past a full disk
        // does (ENOSPC), and the signal that would kill the writer is ignored.
        // SAFETY: setrlimit and signal are async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: limit,
                    rlim_max: limit,
                };
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let child = cmd.spawn().unwrap();
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the pid is our own unreaped child.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status).to_string()
    } else {
        "-".to_string()
    };
    fs::write(out, format!("{code} {}\n", usage.ru_maxrss / 1024)).unwrap();
}

#[test]
fn failing_nvidia_smis_stderr_is_capped_in_every_note() {
    let node = Node::new(|d| drop(fixtures::gpu8_switch_paired(d)));
    let tool = node.out.with_file_name("nvidia-smi");
    // 20,000,000 bytes of two-byte characters after one one-byte one, so a
    // cut at an even byte count falls inside a character.
    fs::write(
        &tool,
        "#!/bin/sh\nprintf x >&2\nyes 'éééé' | head -c 19999999 >&2\nexit 9\n",
    )
    .unwrap();
    fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let dirs = node.dirs();
    let (code, err, rss_mib) = run_measured(
        &node.args("publish", &dirs, &["--nvidia-smi", tool.to_str().unwrap()]),
        NOW,
        None,
    );
    assert_eq!(code, Some(0), "{err}");
    let state = node.out.join("state/record.json");
    let size = fs::metadata(&state).unwrap().len();
    assert!(size < 64 * 1024, "the record is {size} bytes");
    let record: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&state).unwrap()).unwrap();
    let mut notes = 0;
    for group in record["spec"]["groups"].as_array().unwrap() {
        for acc in group["accelerators"].as_array().unwrap() {
            let note = acc["fabricNote"].as_str().unwrap();
            notes += 1;
            assert!(note.len() < 1024, "a {}-byte note", note.len());
            assert!(
                note.contains("exited with exit status: 9")
                    && note.contains("(truncated, 20000000 bytes in all)"),
                "{note}"
            );
            assert!(!note.contains('\u{fffd}'), "cut inside a character: {note}");
        }
    }
    assert_eq!(notes, 8);
    assert!(err.len() < 8 * 1024, "the warning is {} bytes", err.len());
    assert!(rss_mib < 64, "peak RSS {rss_mib} MiB, over the 64Mi limit");
}

#[test]
fn a_full_disk_mid_pass_writes_no_labels_that_disagree_with_the_cdi_specs() {
    let node = Node::new(|d| drop(fixtures::vf_only(d)));
    let dirs = node.dirs();
    node.publish(&[]);
    let features = node.out.join("features.d/nodefabric");
    let before = fs::read(&features).unwrap();
    // The node changes: more endpoints, so the labels, the specs and the
    // record all change. What they would be is learnt on a scratch copy.
    let bigger = tempfile::tempdir().unwrap();
    drop(fixtures::large(bigger.path(), 16));
    let sys = bigger.path().to_str().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let s = |n: &str| scratch.path().join(n).to_str().unwrap().to_string();
    let o = nodefabric(&[
        "publish",
        "--sysfs-root",
        sys,
        "--features-dir",
        &s("f"),
        "--cdi-dir",
        &s("c"),
        "--state-dir",
        &s("s"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let new_labels = fs::read(scratch.path().join("f/nodefabric")).unwrap();
    assert_ne!(new_labels, before, "the change changes the labels");
    let limit = new_labels.len() as u64 + 1;
    let mut bigger_files = vec!["state/record.json".to_string()];
    for spec in fs::read_dir(scratch.path().join("c")).unwrap() {
        let name = spec.unwrap().file_name().into_string().unwrap();
        bigger_files.push(format!("cdi/{name}"));
    }
    assert!(bigger_files.len() > 1, "the change writes CDI specs");
    for big in &bigger_files {
        let scratch_path = big.replace("cdi/", "c/").replace("state/", "s/");
        let len = fs::metadata(scratch.path().join(&scratch_path))
            .unwrap()
            .len();
        assert!(len > limit, "{big} ({len} bytes) fits under {limit}");
    }
    let args = [
        "publish",
        "--sysfs-root",
        sys,
        "--features-dir",
        &dirs[0],
        "--cdi-dir",
        &dirs[1],
        "--state-dir",
        &dirs[2],
    ];
    let (code, err, _) = run_measured(&args, NOW, Some(limit));
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(
        fs::read(&features).unwrap(),
        before,
        "labels replaced while the CDI specs were not: {err}"
    );
    let errors: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("nodefabric: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{err}");
    for failed in &bigger_files {
        assert!(
            errors[0].contains(failed.as_str()),
            "the error does not name {failed}: {err}"
        );
    }
    // Room again: the next pass publishes everything.
    let (code, err, _) = run_measured(&args, NOW, None);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(fs::read(&features).unwrap(), new_labels);
}

#[test]
fn a_200_mb_previous_record_is_not_read_whole() {
    let node = Node::new(|d| drop(fixtures::vf_only(d)));
    let dirs = node.dirs();
    let state = node.out.join("state");
    fs::create_dir_all(&state).unwrap();
    let planted = fs::File::create(state.join("record.json")).unwrap();
    planted.set_len(200_000_000).unwrap();
    drop(planted);
    let (code, err, rss_mib) = run_measured(&node.args("publish", &dirs, &[]), NOW, None);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("record.json") && err.contains("larger than"),
        "no warning naming the oversized record: {err}"
    );
    assert!(
        rss_mib < 64,
        "peak RSS {rss_mib} MiB: the record was read whole"
    );
    let len = fs::metadata(state.join("record.json")).unwrap().len();
    assert!(len < 1 << 20, "the record was not replaced: {len} bytes");
}

#[test]
fn stale_temp_files_of_our_own_names_are_removed_at_the_next_pass() {
    let node = Node::new(|d| drop(fixtures::vf_only(d)));
    node.publish(&[]);
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(120);
    let plant = |rel: &str, stale: bool| {
        let p = node.out.join(rel);
        // What `publish` above reads back from the CDI folder: a spec.
        fs::write(&p, "{\"devices\": []}").unwrap();
        if stale {
            fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        p
    };
    let gone = [
        plant("features.d/.nodefabric.Ab12Cd", true),
        plant("features.d/.nodefabric-check.Xy34Zw", true),
        plant("cdi/.nodefabric-rdma.json.Ab12Cd", true),
        plant("cdi/.nodefabric-rdma-vf.json.Q1w2E3", true),
        plant("state/.record.json.Ab12Cd", true),
    ];
    let kept = [
        // a write that may still be going on
        plant("features.d/.nodefabric.Fresh1", false),
        // another tool's files, and names that only look like ours
        plant("features.d/.othertool.Ab12Cd", true),
        plant("cdi/.vendor.json.Ab12Cd", true),
        plant("cdi/.nodefabric-rdma.json.Ab12Cd.bak", true),
        plant("features.d/nodefabric.Ab12Cd", true),
    ];
    let dirs = node.dirs();
    let o = nodefabric(&node.args("publish", &dirs, &[]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for p in gone {
        assert!(!p.exists(), "{} left behind", p.display());
    }
    for p in kept {
        assert!(p.exists(), "{} removed", p.display());
    }
}

#[test]
fn an_expiry_past_year_9999_is_a_one_line_error_naming_it() {
    let node = Node::new(|d| drop(fixtures::vf_only(d)));
    let dirs = node.dirs();
    let (code, err, _) = run_measured(
        &node.args("publish", &dirs, &["--expiry", "48h"]),
        "9999-12-31T00:00:00Z",
        None,
    );
    assert!(matches!(code, Some(1 | 2)), "exit {code:?}: {err}");
    let errors: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("nodefabric: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        errors[0].starts_with("nodefabric: error:")
            && errors[0].contains("9999-12-31T00:00:00Z")
            && errors[0].contains("2days"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// A netdev name is any bytes but `/` and NUL: `eth<0xff>0` is one the
/// kernel accepts and that is not UTF-8; beside it, a NIC named with the
/// text `eth\xff0`. Both NICs are kept, with every fact read and their RDMA
/// devices in the CDI spec, on the first pass and on the next.
#[test]
fn a_netdev_name_that_is_not_utf8_keeps_its_nic() {
    let node = Node::new(|d| drop(fixtures::byte_names(d)));
    // The names as text: each byte that is not UTF-8 as `\xNN`, a backslash doubled.
    let want = [("mlx5_0", r"eth\xff0"), ("mlx5_1", r"eth\\xff0")];
    for pass in 1..=2 {
        let p = node.publish(&[]);
        assert!(
            p.labels.iter().any(|l| l.ends_with("/rdma.capable=true")),
            "pass {pass}: {p:?}"
        );
        let spec: serde_json::Value = serde_json::from_str(
            &fs::read_to_string(node.out.join("cdi/nodefabric-rdma.json")).unwrap(),
        )
        .unwrap();
        let devices = spec["devices"].as_array().unwrap();
        for (ibdev, name) in want {
            let d = devices
                .iter()
                .find(|d| d["name"] == ibdev)
                .unwrap_or_else(|| panic!("pass {pass}: no CDI device {ibdev}: {spec}"));
            assert_eq!(
                d["annotations"]["rdma.gpustack.ai/interface"], name,
                "pass {pass}"
            );
        }
        let record: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(node.out.join("state/record.json")).unwrap())
                .unwrap();
        let ifaces = record["spec"]["interfaces"].as_array().unwrap();
        assert_eq!(ifaces.len(), 2, "pass {pass}: {record}");
        for (ibdev, name) in want {
            let i = ifaces
                .iter()
                .find(|i| i["name"] == name)
                .unwrap_or_else(|| panic!("pass {pass}: no interface {name}: {record}"));
            assert_eq!(i["rdmaDevice"], ibdev, "pass {pass}: {i}");
            assert_eq!(i["mtu"], 9000, "pass {pass}: {i}");
            assert_eq!(i["up"], true, "pass {pass}: {i}");
            assert!(i.get("unreadable").is_none(), "pass {pass}: {i}");
        }
        let report = node.preflight(&[]);
        assert!(!report.contains("could not read"), "pass {pass}: {report}");
    }
}
