//! The DRA driver as kubelet and the API server meet it: the real
//! `nodefabric-dra` binary on a kubelet root folder, registered the way
//! kubelet's plugin watcher dials (grpc-go's escaped socket path as
//! `:authority`), publishing ResourceSlices to the API stand-in and
//! preparing claims over real gRPC on its Unix socket.

use crate::support::apiserver::Logged;
use crate::support::cluster::Cluster;
use crate::support::dra::{place, reconciled, reconciles, Driver, Place, Setup, DRIVER};
use crate::support::fixtures;
use crate::support::grpcgo::{Answer, GoConn};
use crate::support::os::http_get;
use crate::support::published::{publish, Dirs};
use crate::support::wait::{self, within};
use nodefabric::dra::api::{v1, v1beta1};
use nodefabric::kubelet::registration_api::{InfoRequest, PluginInfo, RegistrationStatus};
use prost::Message;
use serde_json::Value;
use std::path::Path;

const NODE: &str = "node-a";
const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";
const NOTIFY: &str = "/pluginregistration.Registration/NotifyRegistrationStatus";

fn setup() -> Setup {
    Setup::new(NODE)
}

/// The CDI devices the publisher wrote, as `kind=name`.
fn published_cdi_ids(cdi: &Path) -> Vec<String> {
    let mut ids = Vec::new();
    for file in ["nodefabric-rdma.json", "nodefabric-rdma-vf.json"] {
        let Ok(text) = std::fs::read_to_string(cdi.join(file)) else {
            continue;
        };
        let spec: Value = serde_json::from_str(&text).unwrap();
        for d in spec["devices"].as_array().unwrap() {
            ids.push(format!(
                "{}={}",
                spec["kind"].as_str().unwrap(),
                d["name"].as_str().unwrap()
            ));
        }
    }
    ids
}

fn slices(c: &Cluster) -> Vec<Value> {
    c.api.with(|s| s.resource_slices())
}

/// How many devices `slices` carry together.
fn device_count(slices: &[Value]) -> usize {
    slices
        .iter()
        .map(|x| x["spec"]["devices"].as_array().map_or(0, Vec::len))
        .sum()
}

fn slice_writes(log: &[Logged]) -> Vec<&Logged> {
    log.iter()
        .filter(|l| l.path.contains("/resourceslices") && l.method != "GET")
        .collect()
}

/// Registers as kubelet does: GetInfo twice on one connection (the second
/// sends the authority as a table index), then the verdict.
async fn register(p: &Place) -> PluginInfo {
    let mut conn = within("the registration socket", async {
        loop {
            if let Ok(c) = GoConn::dial(&p.registration()).await {
                break c;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(conn.authority().starts_with("%2F"), "{}", conn.authority());
    let mut info = None;
    for _ in 0..2 {
        match conn
            .call(GET_INFO, &InfoRequest {}.encode_to_vec())
            .await
            .unwrap()
        {
            Answer::Done { status, message } => {
                assert_eq!(status, "0");
                info = Some(PluginInfo::decode(message.as_slice()).unwrap());
            }
            other => panic!("GetInfo was not answered: {other:?}"),
        }
    }
    let verdict = RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    };
    // kubelet's plugin watcher gives the verdict 5 s (GetInfo had 1 s).
    conn.set_deadline(Some(std::time::Duration::from_secs(5)));
    match conn.call(NOTIFY, &verdict.encode_to_vec()).await.unwrap() {
        Answer::Done { status, .. } => assert_eq!(status, "0"),
        other => panic!("NotifyRegistrationStatus was not answered: {other:?}"),
    }
    info.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_registers_as_kubelet_dials_it_and_publishes_its_pool_without_churn() {
    let s = setup();
    let probes = crate::support::os::free_addr();
    let _driver = Driver::start(&s.place, &["--interval", "1s", "--metrics-addr", &probes]);
    wait::until(
        "the probes",
        || std::net::TcpStream::connect(&probes).map(drop),
        Result::is_ok,
    )
    .unwrap();
    let (code, why) = http_get(&probes, "/readyz");
    assert_eq!(code, 503);
    assert!(why.contains("not registered with kubelet"), "{why}");
    let info = register(&s.place).await;
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.endpoint, s.place.service().display().to_string());
    assert_eq!(
        info.supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1alpha1.DRAResourceHealth"
        ]
    );

    let cdi_ids = published_cdi_ids(&s.dirs.cdi());
    wait::until(
        "the slices",
        || slices(&s.cluster),
        |now| device_count(now) == cdi_ids.len(),
    );
    let published = slices(&s.cluster);
    assert_eq!(published.len(), 1);
    let slice = &published[0];
    assert_eq!(slice["spec"]["driver"], DRIVER);
    assert_eq!(slice["spec"]["nodeName"], NODE);
    assert_eq!(slice["spec"]["pool"]["name"], NODE);
    assert_eq!(slice["spec"]["pool"]["resourceSliceCount"], 1);
    assert_eq!(slice["metadata"]["ownerReferences"][0]["kind"], "Node");
    for d in slice["spec"]["devices"].as_array().unwrap() {
        let name = d["name"].as_str().unwrap();
        assert!(name.starts_with("pci-"), "{name}");
        let a = &d["attributes"];
        assert!(a["resource.kubernetes.io/pcieRoot"]["string"]
            .as_str()
            .unwrap()
            .starts_with("pci0000:"));
        assert!(a["resource.kubernetes.io/pciBusID"]["string"].is_string());
        // The NUMA node under the standard name other drivers publish,
        // and under the driver's own, equal.
        assert!(a["resource.kubernetes.io/numaNode"]["int"].is_i64(), "{a}");
        assert_eq!(a["resource.kubernetes.io/numaNode"], a["numaNode"]);
        assert!(a["rdmaDevice"]["string"]
            .as_str()
            .unwrap()
            .starts_with("mlx5_"));
        assert_eq!(a["linkState"]["string"], "OK");
        assert_eq!(a["virtualFunction"]["bool"], false);
    }

    // Three more reconciles (one an interval): no write at all.
    let listed = reconciles(&s.cluster.api);
    let writes = slice_writes(&s.cluster.api.log()).len();
    reconciled(&s.cluster.api, listed, 3);
    let log = s.cluster.api.log();
    assert_eq!(
        slice_writes(&log).len(),
        writes,
        "{:#?}",
        slice_writes(&log)
    );
    assert!(
        log.iter()
            .filter(|l| l.path.ends_with("/resourceslices") && l.method == "GET")
            .all(|l| l
                .query
                .contains("fieldSelector=spec.nodeName%3Dnode-a%2Cspec.driver%3Drdma.gpustack.ai")
                || l.query
                    .contains("fieldSelector=spec.nodeName=node-a,spec.driver=rdma.gpustack.ai")),
        "{:#?}",
        log.iter()
            .filter(|l| l.path.ends_with("/resourceslices"))
            .collect::<Vec<_>>()
    );

    // kubelet's wipe: restored within an interval, at a later generation.
    let generation = slice["spec"]["pool"]["generation"].as_i64().unwrap();
    wipe(&s.cluster).await;
    wait::until(
        "the slices restored",
        || slices(&s.cluster),
        |now| now.len() == 1,
    );
    let restored = slices(&s.cluster);
    assert!(restored[0]["spec"]["pool"]["generation"].as_i64().unwrap() > generation);
    wait::until(
        "/readyz 200",
        || http_get(&probes, "/readyz"),
        |r| r.0 == 200,
    );
    let (_, metrics) = http_get(&probes, "/metrics");
    assert!(metrics.contains("nodefabric_dra_registered 1"), "{metrics}");

    // A kubelet restart that cleaned its folders: both sockets come back and
    // kubelet's plugin watcher registers the driver again.
    std::fs::remove_file(s.place.registration()).unwrap();
    std::fs::remove_file(s.place.service()).unwrap();
    wait::until(
        "the sockets served again",
        || (s.place.registration().exists(), s.place.service().exists()),
        |both| *both == (true, true),
    );
    assert_eq!(register(&s.place).await.name, DRIVER);
    wait::until(
        "/readyz 200 again",
        || http_get(&probes, "/readyz"),
        |r| r.0 == 200,
    );
}

/// Deletes every ResourceSlice of the node as kubelet does when it starts:
/// one DELETE of the collection with a field selector.
async fn wipe(c: &Cluster) {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    use kube::api::{DeleteParams, ListParams};
    let kubeconfig = kube::config::Kubeconfig::read_from(&c.kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let api: kube::Api<ResourceSlice> = kube::Api::all(kube::Client::try_from(config).unwrap());
    let selector = format!("spec.nodeName={NODE},spec.driver={DRIVER}");
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().fields(&selector),
    )
    .await
    .unwrap();
    assert!(slices(c).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_change_creates_the_new_generation_before_deleting_the_old() {
    let s = setup();
    let _driver = Driver::start(&s.place, &["--interval", "1h"]);
    wait::until(
        "the first slices",
        || slices(&s.cluster),
        |now| now.len() == 1,
    );
    let old_uid = slices(&s.cluster)[0]["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let old_generation = slices(&s.cluster)[0]["spec"]["pool"]["generation"]
        .as_i64()
        .unwrap();
    let before = s.cluster.api.log().len();

    // The publisher now sees a node with VFs: its specs change.
    let vf = s.dirs.tree("vf");
    fixtures::vf_only(&vf);
    publish(&vf, &s.dirs.cdi());
    wait::until(
        "the new generation",
        || slices(&s.cluster),
        |now| now.len() == 1 && now[0]["metadata"]["uid"] != old_uid.as_str(),
    );
    let now = slices(&s.cluster);
    assert_eq!(
        now[0]["spec"]["pool"]["generation"].as_i64().unwrap(),
        old_generation + 1
    );
    let vfs = now[0]["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["attributes"]["virtualFunction"]["bool"] == true)
        .count();
    assert!(vfs > 0, "{:#}", now[0]);
    let log = s.cluster.api.log();
    let writes: Vec<(&str, u16)> = log[before..]
        .iter()
        .filter(|l| l.path.contains("/resourceslices") && l.method != "GET")
        .map(|l| (l.method.as_str(), l.status))
        .collect();
    assert_eq!(
        writes,
        [("POST", 201), ("DELETE", 200)],
        "create first, then delete"
    );
    let delete = log[before..].iter().find(|l| l.method == "DELETE").unwrap();
    assert!(
        delete.body.contains(&old_uid),
        "the delete names the old UID: {}",
        delete.body
    );
}

fn prepare_request(claims: &[(&str, &str, &str)]) -> v1::NodePrepareResourcesRequest {
    v1::NodePrepareResourcesRequest {
        claims: claims
            .iter()
            .map(|(ns, name, uid)| v1::Claim {
                namespace: ns.to_string(),
                name: name.to_string(),
                uid: uid.to_string(),
            })
            .collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_fails_only_its_bad_claims_and_a_killed_driver_still_unprepares() {
    let s = setup();
    let driver = Driver::start(&s.place, &["--interval", "1h"]);
    wait::until("the slices", || slices(&s.cluster), |now| now.len() == 1);
    let devices: Vec<Value> = slices(&s.cluster)[0]["spec"]["devices"]
        .as_array()
        .unwrap()
        .clone();
    let (first, second) = (
        devices[0]["name"].as_str().unwrap().to_string(),
        devices[1]["name"].as_str().unwrap().to_string(),
    );
    let rdma = |d: &Value| {
        d["attributes"]["rdmaDevice"]["string"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (good, gone, _replaced) = s.cluster.api.with(|st| {
        (
            st.put_claim(
                "team",
                "two-nics",
                &[
                    ("gpu.nvidia.com", NODE, "gpu-0", "gpu"),
                    (DRIVER, NODE, &first, "nic"),
                    (DRIVER, NODE, &second, "nic"),
                ],
            ),
            st.put_claim("team", "gone", &[(DRIVER, NODE, "pci-0000-ff-00-0", "nic")]),
            st.put_claim("team", "replaced", &[(DRIVER, NODE, &first, "nic")]),
        )
    });
    let request = prepare_request(&[
        ("team", "two-nics", &good),
        ("team", "gone", &gone),
        ("team", "replaced", "00000000-0000-4000-8000-0000000000aa"),
        ("team", "missing", "00000000-0000-4000-8000-0000000000bb"),
    ]);
    let answer = driver
        .v1()
        .await
        .node_prepare_resources(request.clone())
        .await
        .unwrap()
        .into_inner();
    let ok = &answer.claims[&good];
    assert_eq!(ok.error, "");
    assert_eq!(ok.devices.len(), 2);
    let claim_id = format!("gpustack.ai/rdma-claim={good}");
    let all_ids: Vec<&String> = ok.devices.iter().flat_map(|d| &d.cdi_device_ids).collect();
    assert_eq!(
        all_ids.iter().filter(|i| ***i == claim_id).count(),
        1,
        "{all_ids:?}"
    );
    let cdi_ids = published_cdi_ids(&s.dirs.cdi());
    for d in &ok.devices {
        assert_eq!(d.pool_name, NODE);
        assert_eq!(d.request_names, ["nic"]);
        assert!(
            cdi_ids.contains(&d.cdi_device_ids[0]),
            "{:?}",
            d.cdi_device_ids
        );
    }
    let spec_file = s.dirs.cdi().join(format!("nodefabric-claim-{good}.json"));
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(&spec_file).unwrap()).unwrap();
    assert_eq!(
        spec["devices"][0]["containerEdits"]["env"][0],
        // No pod holds it: its own NICs, each with its port.
        format!(
            "NCCL_IB_HCA=={}:1,{}:1",
            rdma(&devices[0]),
            rdma(&devices[1])
        )
    );
    assert!(
        answer.claims[&gone].error.contains("team/gone"),
        "{}",
        answer.claims[&gone].error
    );
    assert!(answer.claims[&gone].error.contains("pci-0000-ff-00-0"));
    assert!(answer.claims["00000000-0000-4000-8000-0000000000aa"]
        .error
        .contains("team/replaced"));
    assert!(answer.claims["00000000-0000-4000-8000-0000000000bb"]
        .error
        .contains("team/missing"));

    // The same Prepare again: the same answer, from the checkpoint.
    let gets = |log: &[Logged]| {
        log.iter()
            .filter(|l| l.path.ends_with("/resourceclaims/two-nics"))
            .count()
    };
    let before = gets(&s.cluster.api.log());
    let again = driver
        .v1()
        .await
        .node_prepare_resources(prepare_request(&[("team", "two-nics", &good)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.claims[&good], *ok);
    assert_eq!(
        gets(&s.cluster.api.log()),
        before,
        "answered from the checkpoint"
    );

    // kill -9: the sockets stay behind; a new driver replaces them and
    // still knows the claim, through v1beta1 as kubelet 1.33 calls.
    let place = driver.place.clone();
    driver.kill9();
    assert!(place.service().exists() && place.registration().exists());
    std::fs::remove_file(&spec_file).unwrap();
    let driver = Driver::start(&place, &["--interval", "1h"]);
    wait::until(
        "the claim's spec restored",
        || spec_file.exists(),
        |&there| there,
    );
    register(&place).await;
    let request = v1beta1::NodeUnprepareResourcesRequest {
        claims: vec![v1beta1::Claim {
            namespace: "team".into(),
            name: "two-nics".into(),
            uid: good.clone(),
        }],
    };
    for _ in 0..2 {
        let answer = driver
            .v1beta1()
            .await
            .node_unprepare_resources(request.clone())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.claims[&good].error, "");
        assert!(!spec_file.exists());
    }
    let checkpoint = std::fs::read_to_string(place.state_dir.join("dra-checkpoint.json")).unwrap();
    assert!(!checkpoint.contains(&good), "{checkpoint}");
    let (status, log) = driver.terminate();
    assert!(status.success(), "{log}");
    assert!(!place.service().exists() && !place.registration().exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_that_answers_500_once_gets_its_slices_at_the_retry() {
    let s = setup();
    s.cluster.api.fault(
        "POST",
        "/apis/resource.k8s.io/v1/resourceslices",
        crate::support::apiserver::Action::Respond(500),
    );
    let driver = Driver::start(&s.place, &["--interval", "1h"]);
    wait::until("the slices", || slices(&s.cluster), |now| now.len() == 1);
    let log = driver.log_lines().join("\n");
    assert!(log.contains("retrying with backoff"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_drops_an_attribute_is_said_once_and_not_rewritten_every_interval() {
    let s = setup();
    s.cluster
        .api
        .with(|st| st.drop_device_attribute("linkState"));
    let driver = Driver::start(&s.place, &["--interval", "1s"]);
    wait::until("the slices", || slices(&s.cluster), |now| now.len() == 1);
    let listed = reconciles(&s.cluster.api);
    reconciled(&s.cluster.api, listed, 2);
    let posts = slice_writes(&s.cluster.api.log()).len();
    assert_eq!(posts, 1, "{:#?}", slice_writes(&s.cluster.api.log()));
    let said = driver
        .log_lines()
        .iter()
        .filter(|l| l.contains("did not keep every field"))
        .count();
    assert_eq!(said, 1, "{:#?}", driver.log_lines());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_over_128_devices_is_published_in_slices_the_server_validates() {
    let tmp = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(tmp.path());
    cluster.api.add_node(NODE);
    let dirs = Dirs::published("large", |t| {
        fixtures::large(t, 512);
    });
    let p = place(tmp.path(), &dirs.cdi(), &cluster.dra_kubeconfig, NODE);
    let _driver = Driver::start(&p, &["--interval", "1h"]);
    let want = published_cdi_ids(&dirs.cdi()).len();
    assert!(want > 3 * 128, "{want} devices");
    wait::until(
        "every device",
        || slices(&cluster),
        |now| device_count(now) == want,
    );
    let all = slices(&cluster);
    let count = all.len() as i64;
    // 64 a slice: the limit once any device carries a taint, so a link
    // failing never re-cuts the pool.
    assert_eq!(count, want.div_ceil(64) as i64);
    for s in &all {
        assert!(s["spec"]["devices"].as_array().unwrap().len() <= 64);
        assert_eq!(s["spec"]["pool"]["resourceSliceCount"], count);
    }
    assert!(
        cluster.api.log().iter().all(|l| l.status != 422),
        "the server refused a slice: {:#?}",
        cluster
            .api
            .log()
            .iter()
            .filter(|l| l.status == 422)
            .collect::<Vec<_>>()
    );

    // The stand-in's limits are real: one device more is refused.
    let mut over: k8s_openapi::api::resource::v1::ResourceSlice =
        serde_json::from_value(all[0].clone()).unwrap();
    over.metadata = Default::default();
    over.metadata.generate_name = Some("too-big-".into());
    let devices = over.spec.devices.as_mut().unwrap();
    while devices.len() <= 128 {
        let mut d = devices[0].clone();
        d.name = format!("extra-{}", devices.len());
        devices.push(d);
    }
    let kubeconfig = kube::config::Kubeconfig::read_from(&cluster.kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let api: kube::Api<k8s_openapi::api::resource::v1::ResourceSlice> =
        kube::Api::all(kube::Client::try_from(config).unwrap());
    let refused = api.create(&Default::default(), &over).await.unwrap_err();
    assert_eq!(status_code(&refused), Some(422), "{refused}");
}

/// The HTTP status of an API answer inside a kube-rs error.
fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cdi_folder_deleted_on_the_host_under_the_mount_fails_liveness_and_keeps_the_slices() {
    let s = setup();
    let (_held, mounted) = crate::support::mount::held(&s.dirs.cdi());
    let mut p = s.place.clone();
    p.cdi_dir = mounted.clone();
    let probes = crate::support::os::free_addr();
    let driver = Driver::start(&p, &["--interval", "1s", "--metrics-addr", &probes]);
    wait::until("the slices", || slices(&s.cluster), |now| now.len() == 1);
    assert_eq!(http_get(&probes, "/healthz").0, 200);
    let devices = slices(&s.cluster)[0]["spec"]["devices"].clone();

    // The host replaces the folder; the mount still holds the deleted one.
    std::fs::remove_dir_all(s.dirs.cdi()).unwrap();
    std::fs::create_dir(s.dirs.cdi()).unwrap();
    wait::until(
        "/healthz 503",
        || http_get(&probes, "/healthz"),
        |r| r.0 == 503,
    );
    let (_, why) = http_get(&probes, "/healthz");
    assert!(
        why.contains(&mounted.display().to_string()) && why.contains("deleted on the host"),
        "{why}"
    );
    // /livez, the cluster side's name for liveness, gives the same verdict.
    assert_eq!(http_get(&probes, "/livez"), (503, why));
    // Until the kubelet restarts it, the devices stay published.
    let listed = reconciles(&s.cluster.api);
    reconciled(&s.cluster.api, listed, 1);
    assert_eq!(slices(&s.cluster)[0]["spec"]["devices"], devices);
    let (_, log) = driver.terminate();
    assert_eq!(
        log.matches("was deleted on the host while mounted here")
            .count(),
        1,
        "one line for both families: {log}"
    );
}
