//! The DRA driver as a cluster breaks it: a hung API server under a
//! Prepare, a foreign slice in its pool, a CDI folder cleaned under a
//! prepared claim, an exclusive NIC allocated to a second claim before the
//! first was unprepared, a claim UID that climbs out of the CDI folder, a
//! link that fails after allocation. Each test is named after the fault.

use crate::support::apiserver::Action;
use crate::support::dra::{Driver, Setup, DRIVER};
use crate::support::fixtures;
use crate::support::os::http_get;
use crate::support::published::publish;
use crate::support::wait::{self, within};
use nodefabric::dra::api::v1;
use nodefabric::kubelet::socket;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const NODE: &str = "node-a";

/// The devices of this driver's slices, as published.
pub(crate) fn devices(s: &Setup) -> Vec<Value> {
    s.cluster
        .api
        .with(|st| st.resource_slices())
        .iter()
        .filter(|sl| sl["spec"]["driver"] == DRIVER)
        .flat_map(|sl| {
            sl["spec"]["devices"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect()
}

pub(crate) fn name(d: &Value) -> String {
    d["name"].as_str().unwrap().to_string()
}

pub(crate) fn claim(ns: &str, name: &str, uid: &str) -> v1::Claim {
    v1::Claim {
        namespace: ns.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

/// Prepares `claims` as kubelet does; the answer by claim UID.
pub(crate) async fn prepare(
    driver: &Driver,
    claims: Vec<v1::Claim>,
) -> std::collections::HashMap<String, v1::NodePrepareResourceResponse> {
    driver
        .v1()
        .await
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner()
        .claims
}

/// Unprepares `claims` as kubelet does; the errors by claim UID.
pub(crate) async fn unprepare(driver: &Driver, claims: Vec<v1::Claim>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = driver
        .v1()
        .await
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner()
        .claims
        .into_iter()
        .map(|(uid, r)| (uid, r.error))
        .collect();
    out.sort();
    out
}

/// A started driver with its pool published.
pub(crate) fn started(s: &Setup, extra: &[&str]) -> Driver {
    let mut flags = vec!["--interval", "1h"];
    flags.extend_from_slice(extra);
    let driver = Driver::start(&s.place, &flags);
    wait::until("the slices", || devices(s), |now| !now.is_empty());
    driver
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_api_neither_outlives_kubelets_deadline_nor_blocks_an_unprepare() {
    let s = Setup::new(NODE);
    let driver = started(&s, &[]);
    let pool = devices(&s);
    let prepared = s
        .cluster
        .api
        .with(|st| st.put_claim("team", "running", &[(DRIVER, NODE, &name(&pool[0]), "nic")]));
    let ok = prepare(&driver, vec![claim("team", "running", &prepared)]).await;
    assert_eq!(ok[&prepared].error, "");

    // Five new claims whose reads the API server never answers.
    let mut hung = Vec::new();
    for i in 0..5 {
        let claim_name = format!("starting-{i}");
        let uid = s.cluster.api.with(|st| {
            st.put_claim(
                "team",
                &claim_name,
                &[(DRIVER, NODE, &name(&pool[1 + i]), "nic")],
            )
        });
        s.cluster.api.fault(
            "GET",
            &format!("/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/{claim_name}"),
            Action::Hang,
        );
        hung.push(claim("team", &claim_name, &uid));
    }
    // kubelet's grpc-go with a 3 s deadline: the driver answers inside it.
    let mut client = v1::dra_plugin_client::DraPluginClient::new(
        socket::connect(&s.place.service()).await.unwrap(),
    );
    let mut request = tonic::Request::new(v1::NodePrepareResourcesRequest {
        claims: hung.clone(),
    });
    request.set_timeout(Duration::from_secs(3));
    let started_at = Instant::now();
    let pending = tokio::spawn(async move { client.node_prepare_resources(request).await });

    // Meanwhile, with the Prepare hung on a claim's read, the running
    // pod's teardown is answered at once.
    wait::until_async(
        "the Prepare to hang on a claim's read",
        || {
            let log = s.cluster.api.log();
            log.iter()
                .filter(|l| l.path.contains("/resourceclaims/starting-"))
                .count()
        },
        |&reads| reads > 0,
    )
    .await;
    let t = Instant::now();
    let gone = unprepare(&driver, vec![claim("team", "running", &prepared)]).await;
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "Unprepare waited {:?} behind a Prepare",
        t.elapsed()
    );
    assert_eq!(gone, [(prepared.clone(), String::new())]);

    let answer = pending
        .await
        .unwrap()
        .expect("answered before kubelet's deadline");
    let took = started_at.elapsed();
    assert!(took < Duration::from_secs(3), "answered after {took:?}");
    let answer = answer.into_inner();
    for c in &hung {
        let error = &answer.claims[&c.uid].error;
        assert!(error.contains(&format!("team/{}", c.name)), "{error}");
        assert!(error.contains("budget"), "{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_checkpointed_whole_and_the_gauge_follows_each_write() {
    let s = Setup::new(NODE);
    let probes = crate::support::os::free_addr();
    let driver = started(&s, &["--metrics-addr", &probes]);
    let pool = devices(&s);
    let mut batch = Vec::new();
    for (i, d) in pool.iter().take(6).enumerate() {
        let claim_name = format!("job-{i}");
        let uid = s
            .cluster
            .api
            .with(|st| st.put_claim("team", &claim_name, &[(DRIVER, NODE, &name(d), "nic")]));
        batch.push(claim("team", &claim_name, &uid));
    }
    let checkpoint = s.place.state_dir.join("dra-checkpoint.json");
    let before = std::fs::metadata(&checkpoint)
        .ok()
        .map(|m| m.modified().unwrap());
    let answer = prepare(&driver, batch.clone()).await;
    assert!(answer.values().all(|a| a.error.is_empty()), "{answer:?}");
    assert_ne!(
        std::fs::metadata(&checkpoint).unwrap().modified().unwrap(),
        before.unwrap_or(std::time::UNIX_EPOCH)
    );
    let text = std::fs::read_to_string(&checkpoint).unwrap();
    assert!(batch.iter().all(|c| text.contains(&c.uid)));
    let gauge = |n: usize| format!("nodefabric_dra_prepared_claims {n}");
    assert!(http_get(&probes, "/metrics").1.contains(&gauge(6)));
    unprepare(&driver, batch[..2].to_vec()).await;
    assert!(http_get(&probes, "/metrics").1.contains(&gauge(4)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_slice_at_the_largest_generation_neither_crashes_nor_stops_the_driver() {
    let s = Setup::new(NODE);
    // Any account that may create ResourceSlices (every other DRA driver)
    // can write one under our driver, node and pool.
    let foreign = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "planted"},
        "spec": {
            "driver": DRIVER, "nodeName": NODE,
            "pool": {"name": NODE, "generation": i64::MAX, "resourceSliceCount": 1},
            "devices": [{"name": "planted-0"}],
        },
    });
    let code = s.cluster.api.with(|st| st.create_slice(foreign.clone()));
    assert_eq!(code, 201);
    let mut driver = Driver::start(&s.place, &["--interval", "1s"]);
    wait::until(
        "our pool in place of the planted slice",
        || devices(&s).iter().map(name).collect::<Vec<String>>(),
        |names| !names.is_empty() && !names.contains(&"planted-0".to_string()),
    );
    // Planted again while running: removed at the next interval, and the
    // driver is alive throughout.
    let code = s.cluster.api.with(|st| st.create_slice(foreign));
    assert_eq!(code, 201);
    wait::until(
        "the planted slice removed again",
        || devices(&s).iter().map(name).collect::<Vec<String>>(),
        |names| names.iter().all(|n| n != "planted-0"),
    );
    assert!(
        driver.child.try_wait().unwrap().is_none(),
        "{}",
        driver.log_lines().join("\n")
    );
    let generations: Vec<i64> = s
        .cluster
        .api
        .with(|st| st.resource_slices())
        .iter()
        .map(|sl| sl["spec"]["pool"]["generation"].as_i64().unwrap())
        .collect();
    assert!(generations.iter().all(|g| *g < i64::MAX), "{generations:?}");
    let log = driver.log_lines().join("\n");
    assert!(!log.contains("panicked"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_claims_cdi_spec_deleted_under_it_is_written_back_and_a_gone_device_is_not_answered(
) {
    let s = Setup::new(NODE);
    let driver = started(&s, &[]);
    let pool = devices(&s);
    let uid = s
        .cluster
        .api
        .with(|st| st.put_claim("team", "job", &[(DRIVER, NODE, &name(&pool[0]), "nic")]));
    let first = prepare(&driver, vec![claim("team", "job", &uid)]).await;
    assert_eq!(first[&uid].error, "");
    let spec = s.dirs.cdi().join(format!("nodefabric-claim-{uid}.json"));
    let content = std::fs::read(&spec).unwrap();
    std::fs::remove_file(&spec).unwrap();
    let restored = |c: &std::io::Result<String>| c.as_ref().is_ok_and(|c| c.as_bytes() == content);
    wait::until(
        "the claim's spec written back",
        || std::fs::read_to_string(&spec),
        restored,
    )
    .unwrap();
    wait::until(
        "a warning naming the claim",
        || driver.log_lines(),
        |log| {
            log.iter()
                .any(|l| l.contains("team/job") && l.contains("written again"))
        },
    );
    // Changed under it: put back too.
    std::fs::write(&spec, b"{}").unwrap();
    wait::until(
        "the claim's spec restored",
        || std::fs::read_to_string(&spec),
        restored,
    )
    .unwrap();

    // The publisher no longer lists the device (the node now has only VFs):
    // a re-Prepare from the checkpoint is an error naming it, not an ID the
    // runtime cannot resolve.
    let vf = tempfile::tempdir().unwrap();
    fixtures::vf_only(vf.path());
    publish(vf.path(), &s.dirs.cdi());
    wait::until(
        "the new pool",
        || devices(&s).iter().map(name).collect::<Vec<String>>(),
        |names| names.iter().all(|n| *n != name(&pool[0])),
    );
    let again = prepare(&driver, vec![claim("team", "job", &uid)]).await;
    let error = &again[&uid].error;
    assert!(
        error.contains(&name(&pool[0])) && error.contains("team/job"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_nic_still_prepared_for_one_claim_is_not_prepared_for_another() {
    let s = Setup::new(NODE);
    let driver = started(&s, &[]);
    let nic = name(&devices(&s)[0]);
    let a = s
        .cluster
        .api
        .with(|st| st.put_claim("team", "a", &[(DRIVER, NODE, &nic, "nic")]));
    let b = s
        .cluster
        .api
        .with(|st| st.put_claim("team", "b", &[(DRIVER, NODE, &nic, "nic")]));
    assert_eq!(
        prepare(&driver, vec![claim("team", "a", &a)]).await[&a].error,
        ""
    );
    let refused = prepare(&driver, vec![claim("team", "b", &b)]).await;
    let error = &refused[&b].error;
    assert!(error.contains(&nic), "{error}");
    assert!(error.contains(&format!("team/a ({a})")), "{error}");
    assert!(!s
        .dirs
        .cdi()
        .join(format!("nodefabric-claim-{b}.json"))
        .exists());
    // Two claims of one call asking for the same NIC: one gets it.
    let other = name(&devices(&s)[1]);
    let c = s
        .cluster
        .api
        .with(|st| st.put_claim("team", "c", &[(DRIVER, NODE, &other, "nic")]));
    let d = s
        .cluster
        .api
        .with(|st| st.put_claim("team", "d", &[(DRIVER, NODE, &other, "nic")]));
    let both = prepare(
        &driver,
        vec![claim("team", "c", &c), claim("team", "d", &d)],
    )
    .await;
    let granted = [&c, &d]
        .iter()
        .filter(|u| both[**u].error.is_empty())
        .count();
    assert_eq!(granted, 1, "{both:?}");

    assert_eq!(
        unprepare(&driver, vec![claim("team", "a", &a)]).await,
        [(a.clone(), String::new())]
    );
    assert_eq!(
        prepare(&driver, vec![claim("team", "b", &b)]).await[&b].error,
        ""
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_uid_that_climbs_out_of_the_cdi_folder_touches_no_file() {
    let s = Setup::new(NODE);
    let driver = started(&s, &[]);
    let cdi = s.dirs.cdi();
    // What `x/../../victim` would reach from the CDI folder.
    std::fs::create_dir_all(cdi.join("nodefabric-claim-x")).unwrap();
    let victim = cdi.parent().unwrap().join("victim.json");
    std::fs::write(&victim, b"keep me").unwrap();
    let uid = "x/../../victim";
    let answer = unprepare(&driver, vec![claim("team", "evil", uid)]).await;
    assert_eq!(answer.len(), 1);
    assert!(
        answer[0].1.contains("not a Kubernetes object UID"),
        "{answer:?}"
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
    let answer = prepare(&driver, vec![claim("team", "evil", uid)]).await;
    assert!(answer[uid].error.contains("not a Kubernetes object UID"));
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_whose_link_failed_after_allocation_is_prepared_with_a_warning_and_counted() {
    let s = Setup::on(NODE, "ports-down", |d| fixtures::all_ports_down(d, true));
    let probes = crate::support::os::free_addr();
    let driver = started(&s, &["--metrics-addr", &probes]);
    let failed = devices(&s)
        .into_iter()
        .find(|d| d["attributes"]["linkState"]["string"] == "Failed")
        .expect("the fixture's down NIC is published as Failed");
    let uid = s
        .cluster
        .api
        .with(|st| st.put_claim("team", "late", &[(DRIVER, NODE, &name(&failed), "nic")]));
    let answer = prepare(&driver, vec![claim("team", "late", &uid)]).await;
    assert_eq!(answer[&uid].error, "");
    let log = driver.log_lines().join("\n");
    assert!(
        log.contains("team/late") && log.contains(&name(&failed)) && log.contains("Failed"),
        "{log}"
    );
    let metrics = within("the metrics", async { http_get(&probes, "/metrics").1 }).await;
    assert!(
        metrics.contains("nodefabric_dra_prepared_failed_link_total 1"),
        "{metrics}"
    );
}
