//! End to end the way Kubernetes injects RDMA endpoints: `nodefabric publish`
//! writes the CDI specs, the real device plugin answers `Allocate` for a real
//! token, and a real containerd (1.7, CDI enabled) is driven over CRI as
//! kubelet drives it: RunPodSandbox, CreateContainer with the plugin's CDI
//! devices (the typed `CDI_devices` field, then the `cdi.k8s.io/…`
//! annotation form), StartContainer. The container lists its
//! `/dev/infiniband`, which must hold exactly the granted endpoint's verbs
//! device and `rdma_cm`, with the numbers from the spec, and its
//! `NCCL_IB_HCA`. Then the DRA path: the real `nodefabric-dra` prepares two
//! claims (that endpoint, and another) held by one container, and
//! containerd gets only the CDI device IDs Prepare returned, in the
//! container's order of its claims (each endpoint's, and each claim's own
//! spec that sets `NCCL_IB_HCA`): the container sees both endpoints and
//! both NICs in `NCCL_IB_HCA`, whichever claim's spec came last.
//!
//! The specs are the files `publish` wrote, byte for byte (cdiVersion 0.6.0,
//! annotations kept). No image can be pulled here: the sandbox and the test
//! container both run Debian's static busybox, packed into an OCI archive by
//! `support/oci-busybox.sh` and imported with `ctr`. containerd runs with a
//! private root, state, socket and CDI folder under a temp folder, host
//! networking (no CNI), cgroupfs and the native snapshotter, and is stopped
//! at the end.
//!
//! Needs root, containerd ≥ 1.7 with `ctr`, runc and busybox-static
//! (scripts/test.sh installs them). Without them the test is skipped with a
//! message, except under CI, where it fails.

use crate::support::plugin::{Plugin, RESOURCES};
use crate::support::{fixtures, host, kubelet, wait};

/// The CRI runtime API, generated from upstream's
/// `proto/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto`.
#[allow(clippy::all)]
mod cri {
    tonic::include_proto!("runtime.v1");
}

use cri::runtime_service_client::RuntimeServiceClient;
use nodefabric::kubelet::socket;
use nodefabric::plugin::api;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;
use tonic::transport::Channel;

const IMAGE: &str = "docker.io/nodefabric/busybox:1";

/// `None` when the test can run, or why it cannot.
fn missing() -> Option<String> {
    if !host::is_root() {
        return Some("not root".into());
    }
    let absent: Vec<&str> = [
        "containerd",
        "ctr",
        "runc",
        "containerd-shim-runc-v2",
        "sha256sum",
        "tar",
    ]
    .into_iter()
    .filter(|c| !host::have(c))
    .collect();
    if !absent.is_empty() {
        return Some(format!("missing {}", absent.join(", ")));
    }
    (!Path::new("/bin/busybox").exists()).then(|| "missing /bin/busybox (busybox-static)".into())
}

/// A private containerd, stopped (and its folder removed) on drop.
struct Containerd {
    child: Child,
    dir: PathBuf,
}

impl Containerd {
    /// Writes the config, starts containerd and imports the busybox image.
    fn start(dir: &Path, cdi_dir: &Path) -> Containerd {
        let d = dir.display();
        let config = format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{d}/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  # This machine may itself be a container: no lowering of OOM scores, no
  # AppArmor profile to load, no sysctls kubelet would not set either.
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_cdi = true
  cdi_spec_dirs = ["{cdi}"]
  sandbox_image = "{IMAGE}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/cni/bin"
    conf_dir = "{d}/cni/conf"
"#,
            cdi = cdi_dir.display()
        );
        fs::write(dir.join("config.toml"), config).unwrap();
        let log = fs::File::create(dir.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start containerd");
        let c = Containerd {
            child,
            dir: dir.to_path_buf(),
        };
        let image = dir.join("busybox.tar");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/oci-busybox.sh");
        let o = Command::new("bash")
            .arg(script)
            .arg(&image)
            .arg(IMAGE)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "building the image: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        wait::until(
            "containerd's socket",
            || dir.join("containerd.sock").exists(),
            |&there| there,
        );
        let o = c.ctr(&["images", "import", image.to_str().unwrap()]);
        assert!(
            o.status.success(),
            "ctr import: {}\n{}",
            String::from_utf8_lossy(&o.stderr),
            c.log()
        );
        c
    }

    fn ctr(&self, args: &[&str]) -> std::process::Output {
        Command::new("ctr")
            .arg("--address")
            .arg(self.dir.join("containerd.sock"))
            .args(["-n", "k8s.io"])
            .args(args)
            .output()
            .unwrap()
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    async fn client(&self) -> RuntimeServiceClient<Channel> {
        let channel = socket::connect(&self.dir.join("containerd.sock"))
            .await
            .expect("dial containerd");
        RuntimeServiceClient::new(channel)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        // Sandbox /dev/shm mounts live under the state folder until removed.
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "grep -o ' {}[^ ]*' /proc/mounts | sort -r | xargs -r -n1 umount -l",
                self.dir.display()
            ))
            .status();
    }
}

/// The device plugin's Allocate answer for one token, from the real binary
/// serving the CDI folder (with `--cdi-annotations` when `annotations`).
async fn allocate(
    cdi_dir: &Path,
    kubelet_dir: &Path,
    token: &str,
    annotations: bool,
) -> api::ContainerAllocateResponse {
    fs::create_dir_all(kubelet_dir).unwrap();
    let mut kubelet = kubelet::Kubelet::start(kubelet_dir);
    let flags: &[&str] = if annotations {
        &["--cdi-annotations"]
    } else {
        &[]
    };
    let plugin = Plugin::start(kubelet_dir, cdi_dir, flags);
    let regs = kubelet.registrations(RESOURCES).await;
    let exclusive = regs
        .iter()
        .find(|r| r.resource_name == "device.gpustack.ai/rdma")
        .expect("exclusive resource registered");
    let resp = plugin
        .client(&exclusive.endpoint)
        .await
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec![token.into()],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    plugin.terminate();
    kubelet.stop();
    resp.container_responses.into_iter().next().unwrap()
}

/// Claims the DRA driver prepared for one container, and what to undo
/// them with.
struct Prepared {
    /// Prepare's answers in the form kubelet hands them to the runtime: the
    /// CDI devices of each claim, in the container's order of its claims.
    allocation: api::ContainerAllocateResponse,
    driver: crate::support::dra::Driver,
    /// Each claim's name and UID.
    claims: Vec<(String, String)>,
    _cluster: crate::support::cluster::Cluster,
}

impl Prepared {
    /// Unprepares the claims; the claim specs' paths, once the driver exited
    /// cleanly.
    async fn unprepare(self) -> Vec<PathBuf> {
        use nodefabric::dra::api::v1;
        let claims: Vec<v1::Claim> = self
            .claims
            .iter()
            .map(|(name, uid)| v1::Claim {
                namespace: "default".into(),
                name: name.clone(),
                uid: uid.clone(),
            })
            .collect();
        let answer = self
            .driver
            .v1()
            .await
            .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims })
            .await
            .unwrap()
            .into_inner();
        let specs = self
            .claims
            .iter()
            .map(|(_, uid)| {
                assert_eq!(answer.claims[uid].error, "");
                self.driver
                    .place
                    .cdi_dir
                    .join(format!("nodefabric-claim-{uid}.json"))
            })
            .collect();
        let (status, log) = self.driver.terminate();
        assert!(status.success(), "{log}");
        specs
    }
}

/// The real DRA driver on `cdi_dir`, against the API stand-in, prepares
/// one claim per RDMA device of `rdmas`, each allocated that device, all
/// held by one container of one pod (reserved for it, as the scheduler
/// leaves them).
async fn prepare_with_dra(dir: &Path, cdi_dir: &Path, rdmas: &[&str]) -> Prepared {
    use crate::support::dra::{place, Driver, DRIVER};
    use nodefabric::dra::api::v1;
    let cluster = crate::support::cluster::Cluster::start(dir);
    cluster.api.add_node("node-a");
    let place = place(dir, cdi_dir, &cluster.dra_kubeconfig, "node-a");
    let driver = Driver::start(&place, &["--interval", "1h"]);
    let device_of = |rdma: &str| {
        cluster.api.with(|s| {
            s.resource_slices()
                .iter()
                .flat_map(|x| x["spec"]["devices"].as_array().cloned().unwrap_or_default())
                .find(|d| d["attributes"]["rdmaDevice"]["string"] == rdma)
                .map(|d| d["name"].as_str().unwrap().to_string())
        })
    };
    let mut claims = Vec::new();
    for (i, rdma) in rdmas.iter().enumerate() {
        let device = wait::until("the slices", || device_of(rdma), Option::is_some).unwrap();
        let name = format!("nic-{i}");
        let uid = cluster
            .api
            .with(|s| s.put_claim("default", &name, &[(DRIVER, "node-a", &device, "nic")]));
        claims.push((name, uid));
    }
    let names: Vec<&str> = claims.iter().map(|(n, _)| n.as_str()).collect();
    cluster
        .api
        .with(|s| s.put_pod_holding("default", "job", &[("rdma", &names)]));
    let answer = driver
        .v1()
        .await
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: claims
                .iter()
                .map(|(name, uid)| v1::Claim {
                    namespace: "default".into(),
                    name: name.clone(),
                    uid: uid.clone(),
                })
                .collect(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut ids = Vec::new();
    for ((_, uid), rdma) in claims.iter().zip(rdmas) {
        let one = &answer.claims[uid];
        assert_eq!(one.error, "");
        let these: Vec<String> = one
            .devices
            .iter()
            .flat_map(|d| d.cdi_device_ids.clone())
            .collect();
        assert_eq!(
            these,
            [
                format!("gpustack.ai/rdma={rdma}"),
                format!("gpustack.ai/rdma-claim={uid}")
            ]
        );
        ids.extend(these);
    }
    Prepared {
        allocation: api::ContainerAllocateResponse {
            cdi_devices: ids
                .into_iter()
                .map(|name| api::CdiDevice { name })
                .collect(),
            ..Default::default()
        },
        driver,
        claims,
        _cluster: cluster,
    }
}

/// Runs one container in a fresh host-network pod with what `allocation`
/// hands over (as kubelet does: typed CDI devices and annotations), and
/// returns the `name major:minor` lines of its `/dev/infiniband`.
async fn run_with(
    ctd: &Containerd,
    name: &str,
    allocation: &api::ContainerAllocateResponse,
) -> Vec<String> {
    let mut client = ctd.client().await;
    let logs = ctd.dir.join("pods").join(name);
    fs::create_dir_all(&logs).unwrap();
    let host_network = cri::NamespaceOption {
        network: cri::NamespaceMode::Node as i32,
        ..Default::default()
    };
    let sandbox = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        log_directory: logs.to_str().unwrap().into(),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(host_network),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let pod = client
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", ctd.log()))
        .into_inner()
        .pod_sandbox_id;
    let container = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: "rdma".into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: IMAGE.into(),
            ..Default::default()
        }),
        command: vec![
            "/bin/sh".into(),
            "-c".into(),
            "for f in /dev/infiniband/*; do stat -c '%n %t:%T' $f; done; echo \"env NCCL_IB_HCA=$NCCL_IB_HCA\"".into(),
        ],
        annotations: allocation.annotations.clone(),
        envs: allocation
            .envs
            .iter()
            .map(|(k, v)| cri::KeyValue {
                key: k.clone(),
                // `bytes` in runtime.v1 since 1.36 (an environment value
                // need not be UTF-8); containerd takes the bytes as they are.
                value: v.clone().into_bytes(),
            })
            .collect(),
        log_path: "rdma.log".into(),
        cdi_devices: allocation
            .cdi_devices
            .iter()
            .map(|d| cri::CdiDevice {
                name: d.name.clone(),
            })
            .collect(),
        ..Default::default()
    };
    let id = client
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(container),
            sandbox_config: Some(sandbox),
        })
        .await
        .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", ctd.log()))
        .into_inner()
        .container_id;
    client
        .start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("StartContainer: {e}\n{}", ctd.log()));
    let mut status = None;
    for _ in 0..300 {
        let s = client
            .container_status(cri::ContainerStatusRequest {
                container_id: id.clone(),
                verbose: false,
            })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap();
        if s.state == cri::ContainerState::ContainerExited as i32 {
            status = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = status.expect("the container exits within 30 s");
    let log = fs::read_to_string(logs.join("rdma.log")).unwrap_or_default();
    assert_eq!(
        status.exit_code, 0,
        "container failed: {} {}\n{log}",
        status.reason, status.message
    );
    client
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .unwrap();
    client
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: pod,
        })
        .await
        .unwrap();
    // CRI log lines: `<time> <stream> <tag> <text>`.
    let mut lines: Vec<String> = log
        .lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3))
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// What the container must list for a verbs device and rdma_cm, in
/// `stat -c '%n %t:%T'` form (hex numbers), and its `NCCL_IB_HCA`.
fn expected(spec_devices: &[(&str, u32, u32)], nccl_ib_hca: &str) -> Vec<String> {
    let mut v: Vec<String> = spec_devices
        .iter()
        .map(|(p, ma, mi)| format!("{p} {ma:x}:{mi:x}"))
        .collect();
    v.push(format!("env NCCL_IB_HCA={nccl_ib_hca}"));
    v.sort();
    v
}

#[tokio::test]
async fn containerd_injects_the_allocated_endpoint_from_the_published_spec() {
    if !host::runnable(
        "containerd_injects_the_allocated_endpoint_from_the_published_spec",
        missing(),
    ) {
        return;
    }
    let tmp = tempfile::Builder::new()
        .prefix("nodefabric-ctd.")
        .tempdir()
        .unwrap();
    let (sys, cdi, state, features) = (
        tmp.path().join("sys"),
        tmp.path().join("cdi"),
        tmp.path().join("state"),
        tmp.path().join("features.d"),
    );
    fixtures::gpu8_switch_paired(&sys);
    let o = Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .args([
            "publish",
            "--sysfs-root",
            sys.to_str().unwrap(),
            "--nvidia-smi",
            "/nonexistent/nvidia-smi",
        ])
        .arg("--cdi-dir")
        .arg(&cdi)
        .arg("--state-dir")
        .arg(&state)
        .arg("--features-dir")
        .arg(&features)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "publish: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let published: BTreeMap<PathBuf, Vec<u8>> = fs::read_dir(&cdi)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.clone(), fs::read(p).unwrap()))
        .collect();
    let spec: serde_json::Value =
        serde_json::from_slice(&published[&cdi.join("nodefabric-rdma.json")]).unwrap();
    assert_eq!(spec["cdiVersion"], "0.6.0");
    assert!(
        spec["devices"][0]["annotations"].is_object(),
        "the spec is fed with its annotations"
    );

    let ctd_dir = tmp.path().join("containerd");
    fs::create_dir_all(&ctd_dir).unwrap();
    let ctd = Containerd::start(&ctd_dir, &cdi);
    // mlx5_3 is uverbs3 (231:3) in the fixture; rdma_cm is 10:58.
    let want = expected(
        &[
            ("/dev/infiniband/uverbs3", 231, 3),
            ("/dev/infiniband/rdma_cm", 10, 58),
        ],
        "=mlx5_3",
    );

    let typed = allocate(&cdi, &tmp.path().join("kubelet-typed"), "mlx5_3", false).await;
    assert_eq!(
        typed
            .cdi_devices
            .iter()
            .map(|d| d.name.as_str())
            .collect::<Vec<_>>(),
        ["gpustack.ai/rdma=mlx5_3"]
    );
    assert_eq!(
        run_with(&ctd, "typed", &typed).await,
        want,
        "typed CDI devices"
    );

    let annotated = allocate(
        &cdi,
        &tmp.path().join("kubelet-annotations"),
        "mlx5_3",
        true,
    )
    .await;
    assert!(
        annotated.cdi_devices.is_empty() && !annotated.annotations.is_empty(),
        "{annotated:?}"
    );
    assert_eq!(
        run_with(&ctd, "annotated", &annotated).await,
        want,
        "CDI annotations"
    );

    // The DRA path: the driver's Prepare answers, as kubelet hands them
    // over (typed CDI devices only; NCCL_IB_HCA comes from each claim's own
    // spec), for a container holding two claims of one NIC each: containerd
    // applies the second claim's spec last, and it must still name both
    // NICs, each with its port.
    let claims = prepare_with_dra(tmp.path(), &cdi, &["mlx5_3", "mlx5_0"]).await;
    let both = expected(
        &[
            ("/dev/infiniband/uverbs0", 231, 0),
            ("/dev/infiniband/uverbs3", 231, 3),
            ("/dev/infiniband/rdma_cm", 10, 58),
        ],
        "=mlx5_0:1,mlx5_3:1",
    );
    assert_eq!(
        run_with(&ctd, "dra", &claims.allocation).await,
        both,
        "DRA Prepare's CDI devices of two claims"
    );
    for claim_spec in claims.unprepare().await {
        assert!(
            !claim_spec.exists(),
            "Unprepare removes {}",
            claim_spec.display()
        );
    }

    // containerd read the published files as they are and changed none of them.
    for (path, bytes) in &published {
        assert_eq!(
            &fs::read(path).unwrap(),
            bytes,
            "{} changed",
            path.display()
        );
    }
    drop(ctd);
}
