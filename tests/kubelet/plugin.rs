//! The device plugin driven the way kubelet drives it: a kubelet stand-in
//! serves the real `Registration` gRPC service on `kubelet.sock` in a temp
//! folder, the real `nodefabric-device-plugin` binary registers with it, and
//! the test then calls the plugin over its Unix sockets. The CDI specs are
//! written by the real `nodefabric publish` on fixture trees.

use crate::support::kubelet::Kubelet;
use crate::support::os::{free_addr, http_get, make_fifo};
use crate::support::plugin::Plugin;
use crate::support::published::{publish, Dirs};
use crate::support::wait::{self, within};
use crate::support::{fixtures, mount};
use nodefabric::plugin::api::{self, device_plugin_client::DevicePluginClient};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use tonic::Streaming;

const EXCLUSIVE: &str = "nodefabric-rdma.sock";
const SHARED: &str = "nodefabric-rdma-shared.sock";
const PARTITIONED: &str = "nodefabric-rdma-partitioned.sock";

/// (ID, health, NUMA nodes) of a device list.
fn summary(devices: &[api::Device]) -> Vec<(String, String, Vec<i64>)> {
    devices
        .iter()
        .map(|d| {
            (
                d.id.clone(),
                d.health.clone(),
                d.topology
                    .iter()
                    .flat_map(|t| t.nodes.iter().map(|n| n.id))
                    .collect(),
            )
        })
        .collect()
}

async fn next_list(stream: &mut Streaming<api::ListAndWatchResponse>) -> Vec<api::Device> {
    within("a ListAndWatch message", stream.message())
        .await
        .unwrap()
        .expect("stream open")
        .devices
}

async fn list_once(plugin: &Plugin, socket: &str) -> Vec<api::Device> {
    next_list(&mut plugin.watch(socket).await).await
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn registers_all_three_resources_and_lists_tokens_with_numa_hints() {
    let d = Dirs::published("gpu8", fixtures::gpu8_switch_paired);
    let (mut kubelet, plugin) = Plugin::beside_kubelet(&d, &[]);

    let regs = kubelet.registrations(3).await;
    let seen: Vec<(&str, &str, &str, bool)> = regs
        .iter()
        .map(|r| {
            (
                r.version.as_str(),
                r.endpoint.as_str(),
                r.resource_name.as_str(),
                r.options.unwrap().get_preferred_allocation_available,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("v1beta1", EXCLUSIVE, "device.gpustack.ai/rdma", true),
            (
                "v1beta1",
                PARTITIONED,
                "device.gpustack.ai/rdma.partitioned",
                true
            ),
            ("v1beta1", SHARED, "device.gpustack.ai/rdma.shared", true),
        ]
    );
    let opts = plugin
        .client(EXCLUSIVE)
        .await
        .get_device_plugin_options(api::Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(opts.get_preferred_allocation_available && !opts.pre_start_required);

    let exclusive = summary(&list_once(&plugin, EXCLUSIVE).await);
    let expected: Vec<(String, String, Vec<i64>)> = (0..10)
        .map(|i| {
            (
                format!("mlx5_{i}"),
                "Healthy".into(),
                vec![if i < 4 || i == 8 { 0 } else { 1 }],
            )
        })
        .collect();
    let mut sorted = exclusive.clone();
    sorted.sort_by_key(|(id, _, _)| id[5..].parse::<u32>().unwrap());
    assert_eq!(sorted, expected);

    let shared = summary(&list_once(&plugin, SHARED).await);
    assert_eq!(shared.len(), 640, "64 shared tokens per whole interface");
    assert!(shared.contains(&("mlx5_7-shared-63".into(), "Healthy".into(), vec![1])));
    assert!(shared.contains(&("mlx5_0-shared-00".into(), "Healthy".into(), vec![0])));

    // No VFs configured: the partitioned resource is registered with zero devices.
    assert!(list_once(&plugin, PARTITIONED).await.is_empty());
    drop(plugin);
}

#[tokio::test]
async fn zero_devices_are_registered_and_a_spec_change_is_streamed_including_a_failed_link() {
    let d = Dirs::new();
    // A huge poll interval: only the folder watch can deliver the updates below.
    let (_kubelet, plugin) = Plugin::registered(&d, &["--poll-interval", "1h"]).await;
    let mut stream = plugin.watch(EXCLUSIVE).await;
    assert!(
        next_list(&mut stream).await.is_empty(),
        "no specs yet: zero devices"
    );

    // A driver loads: nodefabric publishes, the plugin streams the tokens with no restart.
    let healthy = d.tree("healthy");
    fixtures::all_ports_down(&healthy, false);
    std::fs::remove_dir_all(&healthy).unwrap();
    fixtures::no_accelerator(&healthy);
    publish(&healthy, &d.cdi());
    let list = summary(&next_list(&mut stream).await);
    assert_eq!(
        list,
        [
            ("mlx5_0".into(), "Healthy".into(), vec![0]),
            ("mlx5_1".into(), "Healthy".into(), vec![1])
        ]
    );

    // mlx5_0's ports go down: its token stays, marked Unhealthy.
    let down = d.tree("down");
    fixtures::all_ports_down(&down, true);
    publish(&down, &d.cdi());
    let list = summary(&next_list(&mut stream).await);
    assert_eq!(
        list,
        [
            ("mlx5_0".into(), "Unhealthy".into(), vec![0]),
            ("mlx5_1".into(), "Healthy".into(), vec![1])
        ]
    );
    // Unhealthy tokens are still allocatable by ID (kubelet decides); the response is recomputed.
    let resp = plugin
        .client(EXCLUSIVE)
        .await
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: ids(&["mlx5_1"]),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.container_responses[0].envs["NCCL_IB_HCA"], "=mlx5_1");
}

#[tokio::test]
async fn virtual_functions_use_their_parents_numa_and_no_numa_means_no_hint() {
    let d = Dirs::published("vf", fixtures::vf_only);
    let (_kubelet, plugin) = Plugin::registered(&d, &[]).await;
    let vfs = summary(&list_once(&plugin, PARTITIONED).await);
    // mlx5_1 and mlx5_2 report NUMA -1 and inherit the PF's node 1.
    let want: Vec<(String, String, Vec<i64>)> = (1..=4)
        .map(|i| (format!("mlx5_{i}"), "Healthy".into(), vec![1]))
        .collect();
    assert_eq!(vfs, want);
    assert!(
        list_once(&plugin, EXCLUSIVE).await.is_empty(),
        "a PF with VFs configured serves only partitioned"
    );
    drop(plugin);

    // Neither the interface nor (for a VF) its parent knows its node: no hint, never node 0.
    let d = Dirs::published("blank", fixtures::blank_numa);
    let (_kubelet, plugin) = Plugin::registered(&d, &[]).await;
    let list = list_once(&plugin, EXCLUSIVE).await;
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].topology, None);
    let vf_blank = d.tree("vfblank");
    let t = fixtures::Tree::new(&vf_blank);
    let pf = t.pci(
        &[&fixtures::addr(0, 2, 0), &fixtures::addr(4, 0, 0)],
        0x15b3,
        0x101d,
        0x020000,
        -1,
    );
    t.netdev(&pf, "enp4s0f0np0", 1500, true);
    let vf = t.pci(
        &[&fixtures::addr(0, 2, 0), &fixtures::addr(4, 0, 2)],
        0x15b3,
        0x101e,
        0x020000,
        -1,
    );
    t.netdev(&vf, "enp4s0f0v0", 1500, true);
    t.rdma(&vf, "mlx5_1", &[("4: ACTIVE", "5: LinkUp")]);
    t.sriov(&pf, 8, &[vf]);
    publish(&vf_blank, &d.cdi());
    let mut stream = plugin.watch(PARTITIONED).await;
    let mut list = next_list(&mut stream).await;
    if list.is_empty() {
        list = next_list(&mut stream).await;
    }
    assert_eq!(
        summary(&list),
        [("mlx5_1".into(), "Healthy".into(), vec![])]
    );
    assert_eq!(list[0].topology, None);
}

#[tokio::test]
async fn preferred_allocation_keeps_one_numa_node_honours_must_include_and_spreads_shares() {
    let d = Dirs::published("gpu8", fixtures::gpu8_switch_paired);
    let (_kubelet, plugin) = Plugin::registered(&d, &[]).await;
    let all: Vec<String> = (0..10).map(|i| format!("mlx5_{i}")).collect();

    let ask = |resource: &'static str, available: Vec<String>, must: Vec<String>, size: i32| {
        let plugin = &plugin;
        async move {
            let req = api::PreferredAllocationRequest {
                container_requests: vec![api::ContainerPreferredAllocationRequest {
                    available_device_i_ds: available,
                    must_include_device_i_ds: must,
                    allocation_size: size,
                }],
            };
            let resp = plugin
                .client(resource)
                .await
                .get_preferred_allocation(req)
                .await
                .unwrap()
                .into_inner();
            resp.container_responses[0].device_i_ds.clone()
        }
    };
    // Node 0 holds mlx5_0-3 and mlx5_8, node 1 mlx5_4-7 and mlx5_9.
    assert_eq!(
        ask(EXCLUSIVE, all.clone(), vec![], 2).await,
        ids(&["mlx5_0", "mlx5_1"])
    );
    // must-include mlx5_5 (node 1) anchors the rest on node 1.
    assert_eq!(
        ask(EXCLUSIVE, all.clone(), ids(&["mlx5_5"]), 3).await,
        ids(&["mlx5_5", "mlx5_4", "mlx5_6"])
    );
    // Best fit: node 1 has only two left, node 0 five; a request for two takes node 1's pair.
    let avail = ids(&[
        "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_8", "mlx5_7", "mlx5_9",
    ]);
    assert_eq!(
        ask(EXCLUSIVE, avail.clone(), vec![], 2).await,
        ids(&["mlx5_7", "mlx5_9"])
    );
    // Too big for either node: the target node first, then the other.
    let got = ask(EXCLUSIVE, avail, vec![], 6).await;
    assert_eq!(
        got[..5],
        ids(&["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_8"])
    );
    assert_eq!(got.len(), 6);

    // Shared: spread over distinct interfaces of one node, least loaded first.
    let mut shared: Vec<String> = (0..10)
        .flat_map(|i| (0..64).map(move |s| format!("mlx5_{i}-shared-{s:02}")))
        .collect();
    // mlx5_0 is busy (only two shares left).
    shared.retain(|id| !id.starts_with("mlx5_0-") || id.ends_with("-62") || id.ends_with("-63"));
    let got = ask(SHARED, shared.clone(), vec![], 3).await;
    assert_eq!(
        got,
        ids(&["mlx5_1-shared-00", "mlx5_2-shared-00", "mlx5_3-shared-00"])
    );
    let got = ask(SHARED, shared, ids(&["mlx5_9-shared-10"]), 2).await;
    assert_eq!(got, ids(&["mlx5_9-shared-10", "mlx5_4-shared-00"]));
}

#[tokio::test]
async fn allocate_hands_over_cdi_devices_and_nccl_ib_hca_and_refuses_unknown_ids() {
    let d = Dirs::published("gpu8", fixtures::gpu8_switch_paired);
    fixtures::vf_only(&d.tree("vf"));
    // Only the partitioned spec of the VF node, beside the gpu8 whole-interface spec.
    let vfcdi = d.tree("vfcdi");
    publish(&d.tree("vf"), &vfcdi);
    std::fs::copy(
        vfcdi.join("nodefabric-rdma-vf.json"),
        d.cdi().join("nodefabric-rdma-vf.json"),
    )
    .unwrap();
    let (_kubelet, plugin) = Plugin::registered(&d, &[]).await;

    let allocate = |socket: &'static str, containers: Vec<Vec<&'static str>>| {
        let plugin = &plugin;
        async move {
            let req = api::AllocateRequest {
                container_requests: containers
                    .into_iter()
                    .map(|c| api::ContainerAllocateRequest {
                        devices_ids: ids(&c),
                    })
                    .collect(),
            };
            plugin
                .client(socket)
                .await
                .allocate(req)
                .await
                .map(|r| r.into_inner())
        }
    };
    let cdi = |r: &api::ContainerAllocateResponse| {
        r.cdi_devices
            .iter()
            .map(|c| c.name.clone())
            .collect::<Vec<_>>()
    };

    // Two containers; names in natural order, NCCL's exact-match form.
    let resp = allocate(EXCLUSIVE, vec![vec!["mlx5_9", "mlx5_1"], vec!["mlx5_2"]])
        .await
        .unwrap();
    assert_eq!(resp.container_responses.len(), 2);
    let c0 = &resp.container_responses[0];
    assert_eq!(
        cdi(c0),
        ["gpustack.ai/rdma=mlx5_1", "gpustack.ai/rdma=mlx5_9"]
    );
    assert_eq!(c0.envs["NCCL_IB_HCA"], "=mlx5_1,mlx5_9");
    assert!(c0.annotations.is_empty() && c0.devices.is_empty() && c0.mounts.is_empty());
    assert_eq!(
        cdi(&resp.container_responses[1]),
        ["gpustack.ai/rdma=mlx5_2"]
    );

    // Two shares of one interface are one device and one HCA.
    let resp = allocate(
        SHARED,
        vec![vec![
            "mlx5_3-shared-00",
            "mlx5_3-shared-41",
            "mlx5_8-shared-63",
        ]],
    )
    .await
    .unwrap();
    let c = &resp.container_responses[0];
    assert_eq!(
        cdi(c),
        ["gpustack.ai/rdma=mlx5_3", "gpustack.ai/rdma=mlx5_8"]
    );
    assert_eq!(c.envs["NCCL_IB_HCA"], "=mlx5_3,mlx5_8");

    // A VF token resolves to the partitioned family's CDI kind.
    let resp = allocate(PARTITIONED, vec![vec!["mlx5_4"]]).await.unwrap();
    let c = &resp.container_responses[0];
    assert_eq!(cdi(c), ["gpustack.ai/rdma-vf=mlx5_4"]);
    assert_eq!(c.envs["NCCL_IB_HCA"], "=mlx5_4");

    // Refusals name the ID: unknown endpoint, share out of range or misspelt,
    // a whole-interface name asked of the partitioned family, and one bad ID
    // in an otherwise good request.
    for (socket, good, id) in [
        (EXCLUSIVE, "mlx5_1", "mlx5_10"),
        (SHARED, "mlx5_1-shared-00", "mlx5_0-shared-64"),
        (SHARED, "mlx5_1-shared-00", "mlx5_0-shared-7"),
        (SHARED, "mlx5_1-shared-00", "mlx5_0"),
        (PARTITIONED, "mlx5_1", "mlx5_0"),
        (EXCLUSIVE, "mlx5_1", "mlx5_0-shared-00"),
    ] {
        allocate(socket, vec![vec![good]]).await.unwrap();
        let err = allocate(socket, vec![vec![good, id]]).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{socket} {id}");
        assert!(
            err.message().contains(&format!("{id:?}")),
            "{}",
            err.message()
        );
    }
}

#[tokio::test]
async fn flags_drop_families_and_switch_to_cdi_annotations() {
    let d = Dirs::published("gpu8", fixtures::gpu8_switch_paired);
    let addr = free_addr();
    let (mut kubelet, plugin) = Plugin::beside_kubelet(
        &d,
        &[
            "--no-shared",
            "--no-partitioned",
            "--cdi-annotations",
            "--resource-prefix",
            "rdma.example.com",
            "--metrics-addr",
            &addr,
        ],
    );
    let regs = kubelet.registrations(1).await;
    assert_eq!(regs[0].resource_name, "rdma.example.com/rdma");
    // Nothing else registers, and no other socket is served: ready means
    // every resource it serves is registered.
    ready(&addr).await;
    assert!(kubelet.registered.try_recv().is_err());
    assert!(!d.kubelet().join(SHARED).exists() && !d.kubelet().join(PARTITIONED).exists());
    let req = api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: ids(&["mlx5_0", "mlx5_4"]),
        }],
    };
    let resp = plugin
        .client(EXCLUSIVE)
        .await
        .allocate(req)
        .await
        .unwrap()
        .into_inner();
    let c = &resp.container_responses[0];
    assert!(c.cdi_devices.is_empty());
    assert_eq!(
        c.annotations["cdi.k8s.io/nodefabric_rdma"],
        "gpustack.ai/rdma=mlx5_0,gpustack.ai/rdma=mlx5_4"
    );
    assert_eq!(c.envs["NCCL_IB_HCA"], "=mlx5_0,mlx5_4");
}

#[tokio::test]
async fn kubelet_restart_is_followed_by_new_sockets_and_a_new_registration_and_sigterm_cleans_up() {
    let d = Dirs::published("n", fixtures::no_accelerator);
    let (kubelet, plugin) = Plugin::registered(&d, &["--poll-interval", "1h"]).await;
    let mut old_stream = plugin.watch(EXCLUSIVE).await;
    assert_eq!(next_list(&mut old_stream).await.len(), 2);

    // kubelet restarts: it stops, wipes the plugin sockets, recreates kubelet.sock.
    kubelet.stop();
    for entry in std::fs::read_dir(d.kubelet()).unwrap() {
        // The plugin may already be replacing a socket it saw vanish: a file
        // listed a moment ago can be gone now, as it can for kubelet.
        match std::fs::remove_file(entry.unwrap().path()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => panic!("{e}"),
            _ => {}
        }
    }
    let mut kubelet = Kubelet::start(&d.kubelet());
    let regs = kubelet.registrations(3).await;
    assert_eq!(
        regs.iter().map(|r| r.endpoint.as_str()).collect::<Vec<_>>(),
        [EXCLUSIVE, PARTITIONED, SHARED]
    );
    // The old stream ends; the new socket serves.
    assert!(within("the old stream to end", old_stream.message())
        .await
        .map_or(true, |m| m.is_none()));
    assert_eq!(list_once(&plugin, EXCLUSIVE).await.len(), 2);

    // Only kubelet.sock recreated (sockets left in place): also a re-registration.
    std::fs::remove_file(d.kubelet().join("kubelet.sock")).unwrap();
    kubelet.stop();
    let mut kubelet = Kubelet::start(&d.kubelet());
    assert_eq!(kubelet.registrations(3).await.len(), 3);

    let (status, log) = plugin.terminate();
    assert!(status.success(), "exit {status}: {log}");
    let left: Vec<String> = std::fs::read_dir(d.kubelet())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        left,
        ["kubelet.sock"],
        "SIGTERM removes the plugin's sockets and nothing else"
    );
    assert!(log.contains("re-registering"), "{log}");
}

#[tokio::test]
async fn a_malformed_spec_is_logged_and_skipped_while_the_other_family_serves() {
    let d = Dirs::published("n", fixtures::no_accelerator);
    std::fs::write(
        d.cdi().join("nodefabric-rdma-vf.json"),
        "{\"cdiVersion\": \"0.6.0\", \"kind\": ",
    )
    .unwrap();
    let (_kubelet, plugin) = Plugin::registered(&d, &["--poll-interval", "100ms"]).await;
    assert_eq!(list_once(&plugin, EXCLUSIVE).await.len(), 2);
    assert!(list_once(&plugin, PARTITIONED).await.is_empty());

    // The whole-interface spec is torn after serving: its tokens stay (kubelet
    // checkpointed them) and allocation still resolves them.
    let whole = d.cdi().join("nodefabric-rdma.json");
    std::fs::write(&whole, "not json").unwrap();
    logged(&plugin, "the torn spec", &whole.display().to_string()).await;
    assert_eq!(list_once(&plugin, EXCLUSIVE).await.len(), 2);
    let req = api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: ids(&["mlx5_1"]),
        }],
    };
    plugin.client(EXCLUSIVE).await.allocate(req).await.unwrap();

    let (_, log) = plugin.terminate();
    let vf = d.cdi().join("nodefabric-rdma-vf.json");
    assert!(log.contains(&vf.display().to_string()), "{log}");
    assert!(log.contains(&whole.display().to_string()), "{log}");
}

#[tokio::test]
async fn an_unverified_link_is_healthy() {
    let d = Dirs::published("u", fixtures::unreadable_port);
    let spec = std::fs::read_to_string(d.cdi().join("nodefabric-rdma.json")).unwrap();
    assert!(
        spec.contains("\"rdma.gpustack.ai/link\": \"Unverified\""),
        "{spec}"
    );
    let (_kubelet, plugin) = Plugin::registered(&d, &[]).await;
    assert_eq!(
        summary(&list_once(&plugin, EXCLUSIVE).await),
        [("mlx5_0".into(), "Healthy".into(), vec![0])]
    );
}

/// Replaces the whole-interface spec by `make`, which creates the new file
/// at the path it is given.
fn swap_spec(cdi: &Path, make: impl FnOnce(&Path)) {
    let path = cdi.join("nodefabric-rdma.json");
    std::fs::remove_file(&path).unwrap();
    make(&path);
}

/// Creates a file of some hostile kind at the path it is given.
type MakeFile = Box<dyn FnOnce(&Path)>;

#[tokio::test]
async fn a_fifo_dev_zero_an_oversized_spec_or_a_dangling_link_neither_stall_nor_grow_the_plugin_and_tokens_stay(
) {
    // mlx5_0's link is Failed: its Unhealthy token must survive too.
    let d = Dirs::published("down", |p| fixtures::all_ports_down(p, true));
    let (_kubelet, plugin) = Plugin::registered(
        &d,
        &["--poll-interval", "100ms", "--max-spec-bytes", "65536"],
    )
    .await;
    let want = vec![
        ("mlx5_0".to_string(), "Unhealthy".to_string(), vec![0]),
        ("mlx5_1".into(), "Healthy".into(), vec![1]),
    ];
    assert_eq!(summary(&list_once(&plugin, EXCLUSIVE).await), want);

    let cdi = d.cdi();
    let hostile: [(&str, MakeFile); 4] = [
        ("FIFO", Box::new(make_fifo)),
        (
            "character device",
            Box::new(|p: &Path| std::os::unix::fs::symlink("/dev/zero", p).unwrap()),
        ),
        (
            "larger than the 65536-byte cap",
            Box::new(|p: &Path| std::fs::write(p, vec![b' '; 1 << 20]).unwrap()),
        ),
        (
            "dangling symbolic link",
            Box::new(|p: &Path| std::os::unix::fs::symlink(p.with_extension("gone"), p).unwrap()),
        ),
    ];
    for (cause, make) in hostile {
        swap_spec(&cdi, make);
        // A look has found it (the warning names the cause).
        logged(&plugin, cause, cause).await;
        // Still serving every call, with every token it had.
        assert_eq!(
            summary(&list_once(&plugin, EXCLUSIVE).await),
            want,
            "{cause}"
        );
        let req = api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: ids(&["mlx5_1"]),
            }],
        };
        plugin.client(EXCLUSIVE).await.allocate(req).await.unwrap();
        let log = plugin.log_lines();
        let said = log.iter().filter(|l| l.contains(cause)).count();
        assert_eq!(
            said, 1,
            "{cause}: one warning per cause, not one per look: {log:#?}"
        );
    }
    let peak = plugin.memory_kib("VmHWM:");
    assert!(
        peak < 64 * 1024,
        "peak RSS {peak} KiB: a hostile file was read into memory"
    );
    drop(plugin);
}

/// How many lines the plugin has logged once a whole second passes with no
/// new one (at most a minute of waiting, then the test fails).
async fn quiet_log(plugin: &Plugin) -> usize {
    let mut seen = plugin.log_lines().len();
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = plugin.log_lines().len();
        if now == seen {
            return now;
        }
        seen = now;
    }
    panic!(
        "the plugin kept logging for a minute: {:#?}",
        plugin.log_lines()
    );
}

#[tokio::test]
async fn an_idle_plugin_neither_reloads_nor_logs_and_waits_for_kubelet_with_one_line() {
    let d = Dirs::published("n", fixtures::no_accelerator);
    // No kubelet yet; debug level, so a wake would show.
    let addr = free_addr();
    let plugin = Plugin::start(
        &d.kubelet(),
        &d.cdi(),
        &["--log-level", "debug", "--metrics-addr", &addr],
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    let waiting = plugin
        .log_lines()
        .iter()
        .filter(|l| l.contains("waiting for kubelet"))
        .count();
    assert_eq!(waiting, 1, "{:#?}", plugin.log_lines());

    // kubelet appears: the plugin registers (the socket's creation wakes it).
    let mut kubelet = Kubelet::start(&d.kubelet());
    kubelet.registrations(3).await;
    let mut stream = plugin.watch(EXCLUSIVE).await;
    assert_eq!(next_list(&mut stream).await.len(), 2);
    let reloads = "nodefabric_plugin_spec_reloads_total{family=\"gpustack.ai/rdma\"} 1";
    wait::until_async(
        "one reload counted",
        || http_get(&addr, "/metrics").1,
        |m| m.lines().any(|l| l == reloads),
    )
    .await;
    // The plugin's side of each registration ends after kubelet has
    // counted it: its line for each resource, kubelet's answer, and at
    // debug level the registration client's connection closing. Settled is
    // all three logged and answered, then a second in which the log did
    // not grow.
    wait::until_async(
        "all three registrations logged and answered",
        || plugin.log_lines(),
        |log| {
            let registered = log
                .iter()
                .filter(|l| l.contains("registered with kubelet resource="))
                .count();
            registered == 3
                && log
                    .iter()
                    .any(|l| l.contains("kubelet answered: registered"))
        },
    )
    .await;
    let settled = quiet_log(&plugin).await;
    // Longer than the default poll interval (10 s): the tick only stats.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let metrics = http_get(&addr, "/metrics").1;
    assert!(
        metrics.lines().any(|l| l == reloads),
        "a reload while idle:\n{metrics}"
    );
    let log = plugin.log_lines();
    assert_eq!(
        log.len(),
        settled,
        "logged while idle: {:#?}",
        &log[settled..]
    );
    assert!(log.iter().any(|l| l.contains("registered")), "{log:#?}");
}

#[tokio::test]
async fn a_cdi_folder_deleted_keeps_its_tokens_and_one_recreated_is_watched_again() {
    let d = Dirs::published("n", fixtures::no_accelerator);
    // Only the folder watch can deliver the change below.
    let (_kubelet, plugin) = Plugin::registered(&d, &["--poll-interval", "1h"]).await;
    let mut stream = plugin.watch(EXCLUSIVE).await;
    assert_eq!(summary(&next_list(&mut stream).await).len(), 2);

    std::fs::remove_dir_all(d.cdi()).unwrap();
    // A missing folder is unreadable, not empty: no list withdrawing the tokens.
    let quiet = tokio::time::timeout(Duration::from_secs(1), stream.message()).await;
    assert!(
        quiet.is_err(),
        "a list was sent for a deleted folder: {quiet:?}"
    );
    assert_eq!(list_once(&plugin, EXCLUSIVE).await.len(), 2);

    std::fs::create_dir(d.cdi()).unwrap();
    fixtures::all_ports_down(&d.tree("down"), true);
    publish(&d.tree("down"), &d.cdi());
    // The folder may be seen back before the spec is in it: an existing
    // folder without a spec is the publisher's "no endpoints" (it removes
    // the file then), so an empty list can come first.
    let mut list = summary(&next_list(&mut stream).await);
    if list.is_empty() {
        list = summary(&next_list(&mut stream).await);
    }
    assert_eq!(
        list,
        [
            ("mlx5_0".into(), "Unhealthy".into(), vec![0]),
            ("mlx5_1".into(), "Healthy".into(), vec![1])
        ]
    );
    let (_, log) = plugin.terminate();
    assert_eq!(
        log.matches("the CDI folder is missing").count(),
        1,
        "one line for both families: {log}"
    );
}

#[tokio::test]
async fn a_cdi_folder_deleted_on_the_host_under_the_mount_fails_liveness_and_keeps_its_tokens() {
    let d = Dirs::published("n", fixtures::no_accelerator);
    let (_held, mounted) = mount::held(&d.cdi());
    let (_kubelet, plugin, addr) = ready_with_probes(&d, &d.kubelet(), &mounted).await;
    assert_eq!(list_once(&plugin, EXCLUSIVE).await.len(), 2);

    // The host replaces the folder; the mount still holds the deleted one.
    std::fs::remove_dir_all(d.cdi()).unwrap();
    std::fs::create_dir(d.cdi()).unwrap();
    wait::until_async(
        "/healthz 503",
        || http_get(&addr, "/healthz"),
        |r| r.0 == 503,
    )
    .await;
    let (_, why) = http_get(&addr, "/healthz");
    assert!(
        why.contains(&mounted.display().to_string()) && why.contains("deleted on the host"),
        "{why}"
    );
    // Until the kubelet restarts it, it serves the tokens it had.
    assert_eq!(list_once(&plugin, EXCLUSIVE).await.len(), 2);
    let metrics = http_get(&addr, "/metrics").1;
    assert!(metrics.contains("cause=\"folder_deleted\"} 1"), "{metrics}");
    let (_, log) = plugin.terminate();
    assert_eq!(
        log.matches("was deleted on the host while mounted here")
            .count(),
        1,
        "one line for both families: {log}"
    );
}

#[tokio::test]
async fn a_kubelet_folder_deleted_on_the_host_under_the_mount_fails_liveness() {
    let d = Dirs::published("n", fixtures::no_accelerator);
    let (_held, mounted) = mount::held(&d.kubelet());
    let (_kubelet, _plugin, addr) = ready_with_probes(&d, &mounted, &d.cdi()).await;
    assert_eq!(http_get(&addr, "/healthz").0, 200);
    // The host's kubelet makes its folder again: its new kubelet.sock is
    // out of the old mount's sight.
    std::fs::remove_dir_all(d.kubelet()).unwrap();
    std::fs::create_dir(d.kubelet()).unwrap();
    wait::until_async(
        "/healthz 503",
        || http_get(&addr, "/healthz"),
        |r| r.0 == 503,
    )
    .await;
    let (_, why) = http_get(&addr, "/healthz");
    assert!(
        why.contains("the kubelet folder") && why.contains(&mounted.display().to_string()),
        "{why}"
    );
    // /livez, the cluster side's name for liveness, gives the same verdict.
    assert_eq!(http_get(&addr, "/livez"), (503, why));
}

#[tokio::test]
async fn a_device_name_outside_the_cdi_grammar_is_skipped_with_one_warning() {
    let d = Dirs::published("n", fixtures::no_accelerator);
    let path = d.cdi().join("nodefabric-rdma.json");
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    spec["devices"][0]["name"] = "mlx5_0,nvidia.com/gpu=all".into();
    std::fs::write(&path, serde_json::to_vec(&spec).unwrap()).unwrap();
    let (_kubelet, plugin) =
        Plugin::registered(&d, &["--poll-interval", "100ms", "--cdi-annotations"]).await;
    let list = summary(&list_once(&plugin, EXCLUSIVE).await);
    assert_eq!(list, [("mlx5_1".into(), "Healthy".into(), vec![1])]);
    let bad = "mlx5_0,nvidia.com/gpu=all";
    let req = api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: ids(&[bad]),
        }],
    };
    let err = plugin
        .client(EXCLUSIVE)
        .await
        .allocate(req)
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    logged(&plugin, "the refused name", "CDI does not allow").await;
    let (_, log) = plugin.terminate();
    assert_eq!(log.matches("CDI does not allow").count(), 1, "{log}");
}

/// A plugin that reaches the kubelet folder and the CDI folder by the paths
/// given (a held mount of either stands in for a hostPath), with its probes
/// on a free port and a 100 ms poll, started beside a kubelet stand-in on
/// `d`'s kubelet folder: once all three resources registered and /readyz
/// said 200. Gives the kubelet, the plugin and the probes' address.
async fn ready_with_probes(
    d: &Dirs,
    kubelet_dir: &Path,
    cdi_dir: &Path,
) -> (Kubelet, Plugin, String) {
    let addr = free_addr();
    let mut kubelet = Kubelet::start(&d.kubelet());
    let plugin = Plugin::start(
        kubelet_dir,
        cdi_dir,
        &["--metrics-addr", &addr, "--poll-interval", "100ms"],
    );
    kubelet.registrations(3).await;
    ready(&addr).await;
    (kubelet, plugin, addr)
}

/// Waits until the probes on `addr` say ready: every resource the plugin
/// serves is registered and every spec readable.
async fn ready(addr: &str) {
    wait::until_async("/readyz 200", || http_get(addr, "/readyz"), |r| r.0 == 200).await;
}

/// Waits until the plugin has logged a line containing `text` (`what`).
async fn logged(plugin: &Plugin, what: &str, text: &str) {
    wait::until_async(
        what,
        || plugin.log_lines(),
        |log| log.iter().any(|l| l.contains(text)),
    )
    .await;
}

#[tokio::test]
async fn probes_and_metrics_follow_registration_spec_health_and_calls() {
    let d = Dirs::published("n", fixtures::no_accelerator);
    let addr = free_addr();
    let plugin = Plugin::start(
        &d.kubelet(),
        &d.cdi(),
        &["--metrics-addr", &addr, "--poll-interval", "100ms"],
    );
    wait::until_async(
        "the HTTP server",
        || std::net::TcpStream::connect(&addr).map(drop),
        Result::is_ok,
    )
    .await
    .unwrap();
    assert_eq!(http_get(&addr, "/healthz").0, 200);
    let (status, body) = http_get(&addr, "/readyz");
    assert_eq!(status, 503, "no kubelet: not ready");
    assert!(
        body.contains("device.gpustack.ai/rdma is not registered with kubelet"),
        "{body}"
    );

    let mut kubelet = Kubelet::start(&d.kubelet());
    kubelet.registrations(3).await;
    ready(&addr).await;
    let _stream = plugin.watch(EXCLUSIVE).await;
    let req = api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: ids(&["mlx5_1"]),
        }],
    };
    plugin.client(EXCLUSIVE).await.allocate(req).await.unwrap();
    let (status, metrics) = http_get(&addr, "/metrics");
    assert_eq!(status, 200);
    for line in [
        "nodefabric_plugin_tokens{resource=\"device.gpustack.ai/rdma\",health=\"Healthy\"} 2",
        "nodefabric_plugin_tokens{resource=\"device.gpustack.ai/rdma.shared\",health=\"Healthy\"} 128",
        "nodefabric_plugin_tokens{resource=\"device.gpustack.ai/rdma.partitioned\",health=\"Healthy\"} 0",
        "nodefabric_plugin_spec_reloads_total{family=\"gpustack.ai/rdma\"} 1",
        "nodefabric_plugin_registrations_total{resource=\"device.gpustack.ai/rdma\"} 1",
        "nodefabric_plugin_registered{resource=\"device.gpustack.ai/rdma.shared\"} 1",
        "nodefabric_plugin_list_and_watch_streams{resource=\"device.gpustack.ai/rdma\"} 1",
        "nodefabric_plugin_allocate_duration_seconds_count{resource=\"device.gpustack.ai/rdma\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "missing {line:?} in\n{metrics}");
    }

    // The spec turns into a FIFO: not ready (naming it), alive, counted once.
    swap_spec(&d.cdi(), make_fifo);
    let spec = d.cdi().join("nodefabric-rdma.json").display().to_string();
    wait::until_async("/readyz 503", || http_get(&addr, "/readyz"), |r| r.0 == 503).await;
    assert!(http_get(&addr, "/readyz").1.contains(&spec));
    assert_eq!(http_get(&addr, "/healthz").0, 200);
    let counted = "nodefabric_plugin_spec_read_errors_total{family=\"gpustack.ai/rdma\",cause=\"not_regular\"} ";
    let kept =
        "nodefabric_plugin_tokens{resource=\"device.gpustack.ai/rdma\",health=\"Healthy\"} 2";
    // One look both counts the error and (after it) settles the tokens.
    let metrics = wait::until_async(
        "the read error counted and the tokens settled",
        || http_get(&addr, "/metrics").1,
        |m| m.lines().any(|l| l.starts_with(counted)) && m.lines().any(|l| l == kept),
    )
    .await;
    let errors = format!("{counted}1");
    assert!(metrics.lines().any(|l| l == errors), "{metrics}");
    assert!(
        metrics
            .lines()
            .any(|l| l == "nodefabric_plugin_spec_readable{family=\"gpustack.ai/rdma\"} 0"),
        "{metrics}"
    );
    // The tokens it had are still counted (and served).
    assert!(metrics.contains(kept));
}

#[tokio::test]
async fn a_client_that_stops_reading_is_hung_up_while_a_slow_one_keeps_its_stream() {
    let d = Dirs::new();
    let (up, down) = (d.tree("up"), d.tree("down"));
    fixtures::no_accelerator(&up);
    fixtures::all_ports_down(&down, true);
    publish(&up, &d.cdi());
    let (_kubelet, plugin) =
        Plugin::registered(&d, &["--drain-timeout", "1s", "--poll-interval", "1h"]).await;

    // A client with a 1 KiB window that never reads: the 128-token shared
    // list (about 4 KiB) cannot all be sent, so the plugin's buffers fill.
    let path = d.kubelet().join(SHARED);
    let channel = tonic::transport::Endpoint::try_from("http://localhost")
        .unwrap()
        .initial_stream_window_size(1024)
        .initial_connection_window_size(1024)
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .unwrap();
    let mut stuck = DevicePluginClient::new(channel)
        .list_and_watch(api::Empty {})
        .await
        .unwrap()
        .into_inner();
    // A slow client that does read, a little late each time.
    let mut slow = plugin.watch(SHARED).await;
    let mut lists = vec![next_list(&mut slow).await];
    for tree in [&down, &up, &down] {
        publish(tree, &d.cdi());
        tokio::time::sleep(Duration::from_millis(300)).await;
        lists.push(next_list(&mut slow).await);
    }
    let unhealthy: Vec<usize> = lists
        .iter()
        .map(|l| l.iter().filter(|t| t.health == "Unhealthy").count())
        .collect();
    assert_eq!(
        unhealthy,
        [0, 64, 0, 64],
        "the slow reader saw every change"
    );

    logged(
        &plugin,
        "the stuck client's connection to be closed",
        "closing its connection",
    )
    .await;
    // Reading now finds the connection gone, not a list.
    let ended = within("the stuck stream to fail", async {
        loop {
            match stuck.message().await {
                Ok(Some(_)) => continue,
                other => break other,
            }
        }
    })
    .await;
    assert!(ended.is_err(), "{ended:?}");

    // No cap on streams: eight more (nine with the slow one) all get their list.
    for _ in 0..8 {
        let mut more = plugin.watch(SHARED).await;
        assert_eq!(next_list(&mut more).await.len(), 128);
    }
}

#[test]
fn out_of_range_flags_are_usage_errors_naming_the_flag_and_every_flag_has_an_environment_variable()
{
    let bin = env!("CARGO_BIN_EXE_nodefabric-device-plugin");
    for (args, env, flag) in [
        (vec!["--poll-interval", "0s"], None, "--poll-interval"),
        (
            vec![],
            Some(("NODEFABRIC_POLL_INTERVAL", "0s")),
            "--poll-interval",
        ),
        (vec!["--drain-timeout", "10000h"], None, "--drain-timeout"),
        (vec!["--max-spec-bytes", "0"], None, "--max-spec-bytes"),
        (
            vec![],
            Some(("NODEFABRIC_METRICS_ADDR", "localhost")),
            "--metrics-addr",
        ),
    ] {
        let mut cmd = Command::new(bin);
        cmd.args(&args)
            .env("NODEFABRIC_KUBELET_DIR", "/nonexistent");
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}: {err}");
        assert!(err.contains(flag), "{args:?} {env:?}: {err}");
    }
    let help = String::from_utf8(Command::new(bin).arg("--help").output().unwrap().stdout).unwrap();
    let flags = help
        .lines()
        .filter(|l| {
            l.trim_start().starts_with("--") && !l.contains("--help") && !l.contains("--version")
        })
        .count();
    assert_eq!(help.matches("[env: NODEFABRIC_").count(), flags, "{help}");
    let version =
        String::from_utf8(Command::new(bin).arg("--version").output().unwrap().stdout).unwrap();
    let commit = version
        .split("(commit ")
        .nth(1)
        .unwrap_or_default()
        .trim_end()
        .trim_end_matches(')');
    assert!(
        !commit.is_empty() && commit.chars().all(|c| c.is_ascii_hexdigit()) || commit == "unknown",
        "{version}"
    );
}

#[tokio::test]
async fn flags_from_the_environment_are_taken_and_the_command_line_wins() {
    let d = Dirs::published("n", fixtures::no_accelerator);
    let addr = free_addr();
    let mut kubelet = Kubelet::start(&d.kubelet());
    let child = Command::new(env!("CARGO_BIN_EXE_nodefabric-device-plugin"))
        .env("NODEFABRIC_KUBELET_DIR", d.kubelet())
        .env("NODEFABRIC_CDI_DIR", d.cdi())
        .env("NODEFABRIC_NO_SHARED", "true")
        .env("NODEFABRIC_NO_PARTITIONED", "1")
        .env("NODEFABRIC_RESOURCE_PREFIX", "env.example.com")
        .args(["--resource-prefix", "flag.example.com"])
        .args(["--metrics-addr", &addr])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let plugin = Plugin {
        child,
        kubelet_dir: d.kubelet(),
        log: Default::default(),
        reader: None,
    };
    let regs = kubelet.registrations(1).await;
    assert_eq!(regs[0].resource_name, "flag.example.com/rdma");
    ready(&addr).await;
    assert!(
        kubelet.registered.try_recv().is_err(),
        "shared and partitioned are off"
    );
    drop(plugin);
}

#[tokio::test]
async fn get_preferred_allocation_returns_only_offered_ids_and_never_more_than_asked() {
    let d = Dirs::published("gpu8", fixtures::gpu8_switch_paired);
    let (_kubelet, plugin) = Plugin::registered(&d, &[]).await;
    let ask = |resource: &'static str, available: &[&str], must: &[&str], size: i32| {
        let plugin = &plugin;
        let req = api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: ids(available),
                must_include_device_i_ds: ids(must),
                allocation_size: size,
            }],
        };
        async move {
            plugin
                .client(resource)
                .await
                .get_preferred_allocation(req)
                .await
                .unwrap()
                .into_inner()
                .container_responses[0]
                .device_i_ds
                .clone()
        }
    };
    let avail = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_4"];
    // A must-include ID that was not offered is not handed back.
    let got = ask(EXCLUSIVE, &avail, &["mlx5_5"], 2).await;
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got.iter().all(|id| avail.contains(&id.as_str())), "{got:?}");
    // More must-include IDs than asked for: never more than the size.
    let got = ask(EXCLUSIVE, &avail, &["mlx5_0", "mlx5_1", "mlx5_2"], 2).await;
    assert_eq!(got, ids(&["mlx5_0", "mlx5_1"]));
    assert!(ask(EXCLUSIVE, &avail, &["mlx5_0"], 0).await.is_empty());
    assert!(ask(EXCLUSIVE, &avail, &["mlx5_0"], -3).await.is_empty());
    // Exactly the size when the offer allows it, the must-include ID first.
    assert_eq!(
        ask(EXCLUSIVE, &avail, &["mlx5_4"], 3).await.len(),
        3,
        "exactly the size asked"
    );
    assert_eq!(ask(EXCLUSIVE, &avail, &["mlx5_4"], 3).await[0], "mlx5_4");
    // Shared: the same rules, and an ID of another resource is never picked.
    let shared = [
        "mlx5_0-shared-00",
        "mlx5_0-shared-01",
        "mlx5_1-shared-00",
        "mlx5_2",
    ];
    let got = ask(SHARED, &shared, &["mlx5_9-shared-00"], 8).await;
    assert_eq!(
        got.iter().collect::<std::collections::BTreeSet<_>>(),
        shared[..3]
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .iter()
            .collect(),
        "{got:?}"
    );
    let got = ask(SHARED, &shared, &shared[..3], 1).await;
    assert_eq!(got, ids(&["mlx5_0-shared-00"]));
}

#[tokio::test]
async fn a_kubelet_restart_that_reuses_the_inode_of_kubelet_sock_is_followed_by_a_new_registration()
{
    use std::os::unix::fs::MetadataExt;
    let d = Dirs::published("n", fixtures::no_accelerator);
    // Only the folder watch (or the socket's own change) can tell.
    let (kubelet, plugin) = Plugin::registered(&d, &["--poll-interval", "1h"]).await;
    let sock = d.kubelet().join("kubelet.sock");
    let before = std::fs::metadata(&sock).unwrap().ino();

    // kubelet stops and its socket's inode is freed; the new kubelet binds
    // at once, and on ext4 the freed inode is usually handed out again. The
    // plugin's sockets stay where they are.
    kubelet.stopped().await;
    std::fs::remove_file(&sock).unwrap();
    let mut kubelet = Kubelet::start(&d.kubelet());
    let after = std::fs::metadata(&sock).unwrap().ino();
    if before != after {
        // tmpfs never reuses an inode number; the restart must be seen all the same.
        eprintln!("this file system gave kubelet.sock a new inode ({before} -> {after})");
    }
    let regs = kubelet.registrations(3).await;
    assert_eq!(
        regs.iter().map(|r| r.endpoint.as_str()).collect::<Vec<_>>(),
        [EXCLUSIVE, PARTITIONED, SHARED]
    );
    assert_eq!(list_once(&plugin, EXCLUSIVE).await.len(), 2);
    let (_, log) = plugin.terminate();
    assert!(log.contains("re-registering"), "{log}");
}

#[tokio::test]
async fn eight_idle_list_and_watch_streams_do_not_lock_kubelet_out() {
    let d = Dirs::published("n", fixtures::no_accelerator);
    let (_kubelet, plugin) = Plugin::registered(&d, &["--poll-interval", "1h"]).await;
    // Idle streams, each on its own connection, each with its list taken,
    // twice as many as once locked kubelet out.
    let mut idle = Vec::new();
    for _ in 0..16 {
        let mut stream = plugin.watch(EXCLUSIVE).await;
        assert_eq!(next_list(&mut stream).await.len(), 2);
        idle.push(stream);
    }
    // kubelet (re)opens its stream and calls: all answered.
    let mut kubelet_stream = within(
        "kubelet's ListAndWatch",
        plugin.client(EXCLUSIVE).await.list_and_watch(api::Empty {}),
    )
    .await
    .expect("kubelet's stream is accepted")
    .into_inner();
    assert_eq!(next_list(&mut kubelet_stream).await.len(), 2);
    let req = api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: ids(&["mlx5_1"]),
        }],
    };
    within("Allocate", plugin.client(EXCLUSIVE).await.allocate(req))
        .await
        .unwrap();
    within(
        "GetDevicePluginOptions",
        plugin
            .client(EXCLUSIVE)
            .await
            .get_device_plugin_options(api::Empty {}),
    )
    .await
    .unwrap();
    // Every stream, idle or not, still gets a change.
    fixtures::all_ports_down(&d.tree("down"), true);
    publish(&d.tree("down"), &d.cdi());
    let list = summary(&next_list(&mut kubelet_stream).await);
    assert_eq!(list[0].1, "Unhealthy");
    for stream in &mut idle {
        assert_eq!(summary(&next_list(stream).await)[0].1, "Unhealthy");
    }
}

/// The whole-interface spec of `cdi` grown to `n` devices, copies of its
/// first renamed `mlx5_<i>`; written as the publisher does (temp, rename).
/// Gives the file's size.
fn grow_spec(cdi: &Path, n: usize) -> usize {
    let path = cdi.join("nodefabric-rdma.json");
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let first = spec["devices"][0].clone();
    let name = first["name"].as_str().unwrap().to_string();
    let text = serde_json::to_string(&first).unwrap();
    spec["devices"] = (0..n)
        .map(|i| {
            serde_json::from_str::<serde_json::Value>(&text.replace(&name, &format!("mlx5_{i}")))
                .unwrap()
        })
        .collect();
    let bytes = serde_json::to_vec(&spec).unwrap();
    let tmp = cdi.join(".nodefabric-rdma.json.tmp");
    std::fs::write(&tmp, &bytes).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    bytes.len()
}

#[tokio::test]
async fn a_spec_whose_shared_list_exceeds_kubelets_4_mib_message_limit_is_refused_once_and_the_tokens_kept(
) {
    let d = Dirs::published("n", fixtures::no_accelerator);
    let (_kubelet, plugin) = Plugin::registered(&d, &["--poll-interval", "100ms"]).await;
    let mut shared = plugin.watch(SHARED).await;
    assert_eq!(next_list(&mut shared).await.len(), 128);

    // 2500 interfaces: 160,000 shared tokens, a list of about 6 MB, which
    // kubelet (4 MiB per message by default) would reject.
    let size = grow_spec(&d.cdi(), 2500);
    assert!(size < 2 << 20, "{size} bytes: under the default spec cap");
    logged(
        &plugin,
        "the oversized list refused",
        "bytes kubelet accepts in one message",
    )
    .await;
    let quiet = tokio::time::timeout(Duration::from_millis(200), shared.message()).await;
    assert!(
        quiet.is_err(),
        "an oversized list was sent: {:?}",
        quiet.map(|m| m.map(|m| m.map(|l| l.devices.len())))
    );
    assert_eq!(list_once(&plugin, SHARED).await.len(), 128);
    assert_eq!(list_once(&plugin, EXCLUSIVE).await.len(), 2);
    let peak = plugin.memory_kib("VmHWM:");
    assert!(peak < 48 * 1024, "peak RSS {peak} KiB");

    // Over the default cap (2 MiB, sized to the 64 MiB memory limit): refused
    // the same way, once.
    let size = grow_spec(&d.cdi(), 6000);
    assert!(size > 2 << 20, "{size}");
    logged(
        &plugin,
        "the spec refused for its size",
        "larger than the 2097152-byte cap",
    )
    .await;
    assert_eq!(list_once(&plugin, SHARED).await.len(), 128);
    let peak = plugin.memory_kib("VmHWM:");
    assert!(peak < 48 * 1024, "peak RSS {peak} KiB");

    // A spec that fits again is taken.
    grow_spec(&d.cdi(), 3);
    assert_eq!(next_list(&mut shared).await.len(), 3 * 64);
    let (_, log) = plugin.terminate();
    assert_eq!(
        log.matches("bytes kubelet accepts in one message").count(),
        1,
        "one line while refused: {log}"
    );
    assert_eq!(
        log.matches("larger than the 2097152-byte cap").count(),
        1,
        "{log}"
    );
}

/// A kubelet that accepts the connection and reads the Register call but
/// never answers once held the plugin's loop for good: no retry, and no
/// spec reload either, until the plugin was restarted. The call is bounded
/// and retried like any failed registration.
#[tokio::test]
async fn a_kubelet_that_never_answers_register_is_given_up_on_named_and_tried_again() {
    use std::io::Read;
    let d = Dirs::published("n", fixtures::no_accelerator);
    let listener =
        std::os::unix::net::UnixListener::bind(d.kubelet().join("kubelet.sock")).unwrap();
    let (called, heard) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        // Every connection is read and never answered; each is counted.
        for conn in listener.incoming() {
            let mut conn = conn.unwrap();
            let mut buf = [0u8; 4096];
            let n = conn.read(&mut buf).unwrap_or(0);
            held.push(conn);
            if called.send(n).is_err() {
                return;
            }
        }
    });
    let plugin = Plugin::start(&d.kubelet(), &d.cdi(), &["--poll-interval", "1h"]);
    logged(
        &plugin,
        "the unanswered Register named",
        "no answer within 10s",
    )
    .await;
    let attempts = tokio::task::spawn_blocking(move || {
        (0..2)
            .map(|_| {
                heard
                    .recv_timeout(wait::WAIT)
                    .expect("a connection to kubelet.sock")
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert!(attempts.iter().all(|&n| n > 0), "{attempts:?}");
    let (status, log) = plugin.terminate();
    assert!(status.success(), "{log}");
}
