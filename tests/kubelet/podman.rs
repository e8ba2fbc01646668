//! End to end with a real CDI consumer: specs written by `nodefabric` on a
//! fixture are injected by podman into a busybox container, and the container
//! itself reports which RDMA device nodes it received.
//!
//! podman 4.3 (Debian 12) embeds a CDI library that reads cdiVersion <= 0.5.0
//! and rejects the 0.6.0 `annotations` fields, so this test copies each spec
//! with its annotations dropped and its version set to 0.5.0 before podman
//! reads it. Everything else (device names, device nodes, the spec-level
//! rdma_cm edit) is fed exactly as generated.
//!
//! Needs root, podman, runc and busybox-static (scripts/test.sh installs
//! them). Without them the test is skipped with a message, except under CI,
//! where it fails. The host's /etc/cdi and /var/run/cdi are never touched: podman
//! runs in a private mount namespace with our folder bound over /etc/cdi.

use crate::support::{fixtures, host};
use std::fs;
use std::path::Path;
use std::process::Command;

const IMAGE: &str = "localhost/nodefabric-busybox:1";

/// `None` when the test can run, or why it cannot.
fn missing() -> Option<String> {
    if !host::is_root() {
        return Some("not root".into());
    }
    let absent: Vec<&str> = ["podman", "runc", "unshare"]
        .into_iter()
        .filter(|c| !host::have(c))
        .collect();
    if !absent.is_empty() {
        return Some(format!("missing {}", absent.join(", ")));
    }
    (!Path::new("/bin/busybox").exists()).then(|| "missing /bin/busybox (busybox-static)".into())
}

fn ensure_image() {
    let exists = Command::new("podman")
        .args(["image", "exists", IMAGE])
        .status()
        .unwrap();
    if exists.success() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    fs::create_dir_all(root.join("bin")).unwrap();
    fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    for applet in ["sh", "ls", "stat", "cat", "env"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    let tar = dir.path().join("root.tar");
    assert!(Command::new("tar")
        .arg("-C")
        .arg(&root)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .unwrap()
        .success());
    let o = Command::new("podman")
        .arg("import")
        .arg("-q")
        .arg(&tar)
        .arg(IMAGE)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "podman import: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Writes the fixture's specs, downgraded for podman 4.3, into `dir`.
fn write_specs(sysfs: &Path, dir: &Path) {
    let o = Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .args(["cdi", "--sysfs-root", sysfs.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let specs: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for (file, spec) in specs.as_object().unwrap() {
        let mut spec = spec.clone();
        spec["cdiVersion"] = "0.5.0".into();
        for d in spec["devices"].as_array_mut().unwrap() {
            d.as_object_mut().unwrap().remove("annotations");
        }
        fs::write(dir.join(file), serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    }
}

/// Runs busybox with the given CDI devices; returns "name major:minor" lines
/// (decimal) for every node under /dev/infiniband inside the container.
fn injected(spec_dir: &Path, devices: &[&str]) -> Vec<String> {
    fs::create_dir_all("/etc/cdi").unwrap();
    fs::create_dir_all("/var/run/cdi").unwrap();
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "--", "sh", "-c"])
        .arg(concat!(
            "mount -t tmpfs none /var/run/cdi && mount --bind \"$1\" /etc/cdi && shift && ",
            "exec podman --runtime runc --cgroup-manager=cgroupfs run --rm --network none ",
            "--ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \"$@\""
        ))
        .arg("_")
        .arg(spec_dir);
    for d in devices {
        cmd.args(["--device", d]);
    }
    cmd.args([
        IMAGE,
        "/bin/sh",
        "-c",
        "for f in /dev/infiniband/*; do stat -c '%n %t %T %F' \"$f\"; done",
    ]);
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "podman run: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.splitn(4, ' ').collect();
            assert_eq!(f[3], "character special file", "{l}");
            let hex = |s: &str| u32::from_str_radix(s, 16).unwrap();
            format!(
                "{} {}:{}",
                f[0].trim_start_matches("/dev/infiniband/"),
                hex(f[1]),
                hex(f[2])
            )
        })
        .collect()
}

#[test]
fn podman_injects_exactly_the_granted_endpoints() {
    if !host::runnable("the podman end-to-end test", missing()) {
        return;
    }
    ensure_image();
    let sys = tempfile::tempdir().unwrap();
    let specs = tempfile::tempdir().unwrap();
    fixtures::gpu8_switch_paired(sys.path());
    write_specs(sys.path(), specs.path());
    assert_eq!(
        injected(
            specs.path(),
            &["gpustack.ai/rdma=mlx5_0", "gpustack.ai/rdma=mlx5_3"]
        ),
        ["rdma_cm 10:58", "uverbs0 231:0", "uverbs3 231:3"],
        "two endpoints, rdma_cm once, nothing else"
    );
    assert_eq!(
        injected(specs.path(), &["gpustack.ai/rdma=mlx5_9"]),
        ["rdma_cm 10:58", "uverbs9 231:9"]
    );

    // partitioned: one VF of the VF-only node (mlx5_2 is its second verbs device)
    let sys = tempfile::tempdir().unwrap();
    let specs = tempfile::tempdir().unwrap();
    fixtures::vf_only(sys.path());
    write_specs(sys.path(), specs.path());
    assert_eq!(
        injected(specs.path(), &["gpustack.ai/rdma-vf=mlx5_2"]),
        ["rdma_cm 10:58", "uverbs1 231:1"]
    );
}
