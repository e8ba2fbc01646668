//! Every gRPC path kubelet calls on our sockets, called on the running
//! binaries as literal strings by a client that is not generated from our
//! files (`support::grpcgo` writes grpc-go's HTTP/2 frames by hand), and
//! answered for real: never UNIMPLEMENTED.
//!
//! The strings are the method names of upstream's generated Go code
//! (k8s.io/kubelet v0.36.3, `api_grpc.pb.go` / `api.pb.go` of each package;
//! docs/conformance.md names the files). A server generated from an edited
//! proto once served `/v1.DRAPlugin/NodePrepareResources` instead, and a
//! kubelet stand-in generated from the same edit agreed with it; these
//! literals cannot.

use crate::support::dra::{Driver, Setup, DRIVER, KUBELET_DRA_DEADLINE};
use crate::support::fixtures;
use crate::support::grpcgo::{encode_authority, Answer, GoConn};
use crate::support::plugin::Plugin;
use crate::support::published::Dirs;
use crate::support::wait::within;
use nodefabric::dra::api::{v1, v1beta1};
use nodefabric::kubelet::registration_api::registration_server;
use nodefabric::plugin::api as dp;
use prost::Message;
use std::path::Path;
use std::time::Duration;

/// kubelet's DRA calls: `k8s.io/kubelet/pkg/apis/dra/v1/api_grpc.pb.go`.
const DRA_V1_PREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
const DRA_V1_UNPREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources";
/// The same for kubelet 1.32 and 1.33: `pkg/apis/dra/v1beta1/api_grpc.pb.go`.
const DRA_V1BETA1_PREPARE: &str =
    "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources";
const DRA_V1BETA1_UNPREPARE: &str =
    "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources";
/// kubelet's health stream: `pkg/apis/dra-health/v1alpha1/api_grpc.pb.go`.
const DRA_HEALTH: &str = "/v1alpha1.DRAResourceHealth/NodeWatchResources";
/// kubelet's plugin watcher: `pkg/apis/pluginregistration/v1/api.pb.go`.
const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";
const NOTIFY: &str = "/pluginregistration.Registration/NotifyRegistrationStatus";
/// kubelet's device manager: `pkg/apis/deviceplugin/v1beta1/api.pb.go`.
const DP_OPTIONS: &str = "/v1beta1.DevicePlugin/GetDevicePluginOptions";
const DP_LIST_AND_WATCH: &str = "/v1beta1.DevicePlugin/ListAndWatch";
const DP_PREFERRED: &str = "/v1beta1.DevicePlugin/GetPreferredAllocation";
const DP_ALLOCATE: &str = "/v1beta1.DevicePlugin/Allocate";
const DP_PRE_START: &str = "/v1beta1.DevicePlugin/PreStartContainer";
/// What the device plugin calls on kubelet.sock.
const DP_REGISTER: &str = "/v1beta1.Registration/Register";

/// gRPC's UNIMPLEMENTED: what a path nobody serves is answered with.
const UNIMPLEMENTED: &str = "12";

/// Waits for a server on `socket` and dials it as grpc-go does, with the
/// `:authority` kubelet sends there.
async fn dial(socket: &Path, authority: &str) -> GoConn {
    within("the socket", async {
        loop {
            if let Ok(c) = GoConn::dial_as(socket, authority).await {
                break c;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// The status and message of a unary answer; anything but an answer fails.
fn answered(path: &str, answer: Answer) -> (String, Vec<u8>) {
    match answer {
        Answer::Done { status, message } => {
            assert_ne!(status, UNIMPLEMENTED, "{path} is not served");
            (status, message)
        }
        other => panic!("{path} was not answered: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelets_dra_paths_are_answered_on_the_driver_sockets_never_unimplemented() {
    let s = Setup::new("node-a");
    let driver = Driver::start(&s.place, &["--interval", "1h"]);
    let uid = s.cluster.api.with(|st| {
        st.put_claim(
            "team",
            "gone-device",
            &[(DRIVER, "node-a", "pci-0000-ff-00-0", "nic")],
        )
    });

    // The registration socket, as the plugin watcher dials it by path.
    let registration = s.place.registration();
    let mut conn = dial(
        &registration,
        &encode_authority(&registration.to_string_lossy()),
    )
    .await;
    let (status, info) = answered(GET_INFO, conn.call(GET_INFO, &[]).await.unwrap());
    assert_eq!(status, "0");
    let info = nodefabric::kubelet::registration_api::PluginInfo::decode(info.as_slice()).unwrap();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(
        info.supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1alpha1.DRAResourceHealth"
        ]
    );
    let verdict = nodefabric::kubelet::registration_api::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    };
    conn.set_deadline(Some(Duration::from_secs(5)));
    let (status, _) = answered(
        NOTIFY,
        conn.call(NOTIFY, &verdict.encode_to_vec()).await.unwrap(),
    );
    assert_eq!(status, "0");

    // The service socket, as kubelet ≥ 1.34 dials it, with its deadline.
    let mut conn = dial(&s.place.service(), "localhost")
        .await
        .with_deadline(Some(KUBELET_DRA_DEADLINE));
    let claim = v1::Claim {
        namespace: "team".into(),
        name: "gone-device".into(),
        uid: uid.clone(),
    };
    let prepare = v1::NodePrepareResourcesRequest {
        claims: vec![claim.clone()],
    };
    let (status, message) = answered(
        DRA_V1_PREPARE,
        conn.call(DRA_V1_PREPARE, &prepare.encode_to_vec())
            .await
            .unwrap(),
    );
    assert_eq!(status, "0");
    let answer = v1::NodePrepareResourcesResponse::decode(message.as_slice()).unwrap();
    // A real per-claim answer: the allocated device is not in this pool.
    assert!(
        answer.claims[&uid].error.contains("pci-0000-ff-00-0"),
        "{answer:?}"
    );
    let unprepare = v1::NodeUnprepareResourcesRequest {
        claims: vec![claim],
    };
    let (status, message) = answered(
        DRA_V1_UNPREPARE,
        conn.call(DRA_V1_UNPREPARE, &unprepare.encode_to_vec())
            .await
            .unwrap(),
    );
    assert_eq!(status, "0");
    let answer = v1::NodeUnprepareResourcesResponse::decode(message.as_slice()).unwrap();
    assert_eq!(answer.claims[&uid].error, "");

    let claim = v1beta1::Claim {
        namespace: "team".into(),
        name: "gone-device".into(),
        uid: uid.clone(),
    };
    let prepare = v1beta1::NodePrepareResourcesRequest {
        claims: vec![claim.clone()],
    };
    let (status, message) = answered(
        DRA_V1BETA1_PREPARE,
        conn.call(DRA_V1BETA1_PREPARE, &prepare.encode_to_vec())
            .await
            .unwrap(),
    );
    assert_eq!(status, "0");
    let answer = v1beta1::NodePrepareResourcesResponse::decode(message.as_slice()).unwrap();
    assert!(answer.claims[&uid].error.contains("pci-0000-ff-00-0"));
    let unprepare = v1beta1::NodeUnprepareResourcesRequest {
        claims: vec![claim],
    };
    let (status, _) = answered(
        DRA_V1BETA1_UNPREPARE,
        conn.call(DRA_V1BETA1_UNPREPARE, &unprepare.encode_to_vec())
            .await
            .unwrap(),
    );
    assert_eq!(status, "0");

    // The health stream, which kubelet opens with no deadline.
    let mut stream = dial(&s.place.service(), "localhost")
        .await
        .with_deadline(None);
    let (status, first) = answered(
        DRA_HEALTH,
        stream.first_of_stream(DRA_HEALTH, &[]).await.unwrap(),
    );
    assert_eq!(status, "", "the health stream ended");
    let health =
        nodefabric::dra::api::health_v1alpha1::NodeWatchResourcesResponse::decode(first.as_slice())
            .unwrap();
    assert!(!health.devices.is_empty());

    // The fault this test is named after: the bare-package path the edited
    // proto once served is not served, so nothing can drift back to it.
    for wrong in [
        "/v1.DRAPlugin/NodePrepareResources",
        "/v1beta1.DRAPlugin/NodePrepareResources",
    ] {
        match conn.call(wrong, &[]).await.unwrap() {
            Answer::Done { status, .. } => assert_eq!(status, UNIMPLEMENTED, "{wrong}"),
            other => panic!("{wrong}: {other:?}"),
        }
    }
    drop(driver);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelets_device_plugin_paths_are_answered_never_unimplemented() {
    let dirs = Dirs::published("gpu8", fixtures::gpu8_switch_paired);
    let (mut kubelet, plugin) = Plugin::beside_kubelet(&dirs, &[]);
    let registered = kubelet
        .registrations(crate::support::plugin::RESOURCES)
        .await;
    let mut allocated_on = 0;
    for r in &registered {
        let socket = dirs.kubelet().join(&r.endpoint);
        // kubelet's device manager dials with no deadline on the stream.
        let mut conn = dial(&socket, "localhost").await.with_deadline(None);
        let (status, options) = answered(
            DP_OPTIONS,
            conn.call(DP_OPTIONS, &dp::Empty {}.encode_to_vec())
                .await
                .unwrap(),
        );
        assert_eq!(status, "0");
        let options = dp::DevicePluginOptions::decode(options.as_slice()).unwrap();
        assert_eq!(
            options.get_preferred_allocation_available,
            r.options
                .as_ref()
                .unwrap()
                .get_preferred_allocation_available
        );

        let mut stream = dial(&socket, "localhost").await.with_deadline(None);
        let (status, first) = answered(
            DP_LIST_AND_WATCH,
            stream
                .first_of_stream(DP_LIST_AND_WATCH, &dp::Empty {}.encode_to_vec())
                .await
                .unwrap(),
        );
        assert_eq!(status, "", "{}: the stream ended", r.resource_name);
        let devices = dp::ListAndWatchResponse::decode(first.as_slice())
            .unwrap()
            .devices;
        if devices.is_empty() {
            // No VF on this fixture: the partitioned resource lists none.
            continue;
        }
        allocated_on += 1;
        let ids: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();

        let preferred = dp::PreferredAllocationRequest {
            container_requests: vec![dp::ContainerPreferredAllocationRequest {
                available_device_i_ds: ids.clone(),
                must_include_device_i_ds: Vec::new(),
                allocation_size: 1,
            }],
        };
        let (status, message) = answered(
            DP_PREFERRED,
            conn.call(DP_PREFERRED, &preferred.encode_to_vec())
                .await
                .unwrap(),
        );
        assert_eq!(status, "0");
        let preferred = dp::PreferredAllocationResponse::decode(message.as_slice()).unwrap();
        assert_eq!(preferred.container_responses[0].device_i_ds.len(), 1);

        let allocate = dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest {
                devices_ids: vec![ids[0].clone()],
            }],
        };
        let (status, message) = answered(
            DP_ALLOCATE,
            conn.call(DP_ALLOCATE, &allocate.encode_to_vec())
                .await
                .unwrap(),
        );
        assert_eq!(status, "0", "{}", r.resource_name);
        let allocated = dp::AllocateResponse::decode(message.as_slice()).unwrap();
        assert!(
            !allocated.container_responses[0].cdi_devices.is_empty()
                || !allocated.container_responses[0].annotations.is_empty(),
            "{allocated:?}"
        );

        let pre_start = dp::PreStartContainerRequest {
            devices_ids: vec![ids[0].clone()],
        };
        let (status, _) = answered(
            DP_PRE_START,
            conn.call(DP_PRE_START, &pre_start.encode_to_vec())
                .await
                .unwrap(),
        );
        assert_eq!(status, "0");
    }
    assert_eq!(allocated_on, 2, "the exclusive and shared resources");
    drop(plugin);
}

#[test]
fn the_generated_services_carry_upstreams_names() {
    // Each generated server and client names its service once; every path
    // above must sit under it, the device plugin's Register call included
    // (the kubelet stand-in serves it from the same upstream file).
    let named = [
        (v1::dra_plugin_server::SERVICE_NAME, DRA_V1_PREPARE),
        (v1::dra_plugin_server::SERVICE_NAME, DRA_V1_UNPREPARE),
        (
            v1beta1::dra_plugin_server::SERVICE_NAME,
            DRA_V1BETA1_PREPARE,
        ),
        (
            v1beta1::dra_plugin_server::SERVICE_NAME,
            DRA_V1BETA1_UNPREPARE,
        ),
        (
            nodefabric::dra::api::health_v1alpha1::dra_resource_health_server::SERVICE_NAME,
            DRA_HEALTH,
        ),
        (registration_server::SERVICE_NAME, GET_INFO),
        (registration_server::SERVICE_NAME, NOTIFY),
        (dp::device_plugin_server::SERVICE_NAME, DP_OPTIONS),
        (dp::device_plugin_server::SERVICE_NAME, DP_LIST_AND_WATCH),
        (dp::device_plugin_server::SERVICE_NAME, DP_PREFERRED),
        (dp::device_plugin_server::SERVICE_NAME, DP_ALLOCATE),
        (dp::device_plugin_server::SERVICE_NAME, DP_PRE_START),
        (dp::registration_server::SERVICE_NAME, DP_REGISTER),
    ];
    for (service, path) in named {
        assert!(
            path.starts_with(&format!("/{service}/")),
            "{service} does not serve {path}"
        );
    }
}
