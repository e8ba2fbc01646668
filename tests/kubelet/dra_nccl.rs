//! `NCCL_IB_HCA` as the driver writes it into each claim's CDI spec: a
//! container given NICs by two claims must see both whichever claim's spec
//! the runtime applies last, so each claim's value is the union of the
//! container's NICs; when the pod cannot be read the claim's own NICs are
//! told, said and counted; with `--rails-file`, each NIC's entry carries its
//! rail's index where the rail record gives one. Each test is named after
//! the fault it guards.

use crate::dra_faults::{claim, devices, name, prepare, started, unprepare};
use crate::dra_lifecycle::claim_spec;
use crate::support::dra::{Driver, Setup, DRIVER};
use crate::support::os::{free_addr, http_get};
use crate::support::wait::{self, within};
use serde_json::{json, Value};
use std::path::Path;

const NODE: &str = "node-a";

/// The `NCCL_IB_HCA` a claim's spec sets.
fn told(s: &Setup, uid: &str) -> String {
    let spec: Value = serde_json::from_slice(&std::fs::read(claim_spec(s, uid)).unwrap()).unwrap();
    let env = spec["devices"][0]["containerEdits"]["env"][0]
        .as_str()
        .unwrap();
    env.strip_prefix("NCCL_IB_HCA=").unwrap().to_string()
}

/// Two whole NICs' names and RDMA devices, in natural order of the latter.
fn two_nics(s: &Setup) -> [(String, String); 2] {
    let mut nics: Vec<(String, String)> = devices(s)
        .iter()
        .filter(|d| d["attributes"]["virtualFunction"]["bool"] == false)
        .map(|d| {
            let rdma = d["attributes"]["rdmaDevice"]["string"].as_str().unwrap();
            (name(d), rdma.to_string())
        })
        .collect();
    nics.sort_by_key(|(_, r)| r.trim_start_matches("mlx5_").parse::<u32>().unwrap());
    [nics[0].clone(), nics[1].clone()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_with_two_claims_is_not_told_only_the_last_claims_nic() {
    let s = Setup::new(NODE);
    let driver = started(&s, &[]);
    let [(n0, r0), (n1, r1)] = two_nics(&s);
    let (a, b) = s.cluster.api.with(|st| {
        let a = st.put_claim("team", "a", &[(DRIVER, NODE, &n0, "nic")]);
        let b = st.put_claim("team", "b", &[(DRIVER, NODE, &n1, "nic")]);
        st.put_pod_holding("team", "job", &[("train", &["a", "b"])]);
        (a, b)
    });
    // Prepared in separate calls, as kubelet may: each still sees the other.
    for (n, uid) in [("a", &a), ("b", &b)] {
        assert_eq!(
            prepare(&driver, vec![claim("team", n, uid)]).await[uid].error,
            ""
        );
    }
    let union = format!("={r0}:1,{r1}:1");
    assert_eq!(told(&s, &a), union);
    assert_eq!(told(&s, &b), union);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_pod_falls_back_to_the_claims_own_nics_said_and_counted() {
    let s = Setup::new(NODE);
    let probes = free_addr();
    let driver: Driver = started(&s, &["--metrics-addr", &probes]);
    let [(n0, r0), (n1, _)] = two_nics(&s);
    let (a, _) = s.cluster.api.with(|st| {
        let a = st.put_claim("team", "a", &[(DRIVER, NODE, &n0, "nic")]);
        let b = st.put_claim("team", "b", &[(DRIVER, NODE, &n1, "nic")]);
        st.put_pod_holding("team", "job", &[("train", &["a", "b"])]);
        (a, b)
    });
    // The pod goes before the driver reads it (deleted meanwhile).
    s.cluster.api.with(|st| st.delete_pod("team", "job"));
    let answer = prepare(&driver, vec![claim("team", "a", &a)]).await;
    assert_eq!(answer[&a].error, "", "the claim is still prepared");
    assert_eq!(told(&s, &a), format!("={r0}:1"));
    let logged = wait::until(
        "the fallback said",
        || driver.log_lines().join("\n"),
        |log| log.contains("NCCL_IB_HCA names only"),
    );
    assert!(logged.contains("team/job"), "{logged}");
    let metrics = within("the metrics", async { http_get(&probes, "/metrics").1 }).await;
    assert!(
        metrics.contains("nodefabric_dra_nccl_inexact_total 1"),
        "{metrics}"
    );
}

/// Writes a rail record putting `nics` (PCI address, rail) on their rails,
/// with `railIndex` when given, as `publish --rails-file` does: whole, by rename.
fn write_rails(path: &Path, nics: &[(&str, &str)], index: Option<Value>) {
    let mut record = json!({
        "version": nodefabric::rails::RAIL_RECORD_FORMAT, "nodeUID": "",
        "railSource": "interface-name", "gpus": [],
        "nics": nics.iter().map(|(pci, rail)| (pci.to_string(), json!([rail]))).collect::<serde_json::Map<_, _>>(),
    });
    if let Some(index) = index {
        record["railIndex"] = index;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(&record).unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The published device `name`'s attribute `attr`, as a string.
fn attribute(s: &Setup, name: &str, attr: &str) -> Option<String> {
    let d = devices(s).into_iter().find(|d| d["name"] == name)?;
    d["attributes"][attr]["string"].as_str().map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nic_on_an_indexed_rail_is_told_its_rail_and_a_record_without_indices_changes_nothing() {
    let s = Setup::new(NODE);
    let dir = tempfile::tempdir().unwrap();
    let rails = dir.path().join("rails.json");
    let driver = started(&s, &["--rails-file", rails.to_str().unwrap()]);
    let [(n0, r0), (n1, r1)] = two_nics(&s);
    let pci = |n: &str| attribute(&s, n, "resource.kubernetes.io/pciBusID").unwrap();
    let (p0, p1) = (pci(&n0), pci(&n1));
    let on_rails = |want: [&str; 2]| {
        wait::until(
            "the rails published",
            || [attribute(&s, &n0, "rail"), attribute(&s, &n1, "rail")],
            |now| now[0].as_deref() == Some(want[0]) && now[1].as_deref() == Some(want[1]),
        );
    };
    let prepared = |pod: &str, a: &str, b: &str| {
        s.cluster.api.with(|st| {
            let ua = st.put_claim("team", a, &[(DRIVER, NODE, &n0, "nic")]);
            let ub = st.put_claim("team", b, &[(DRIVER, NODE, &n1, "nic")]);
            st.put_pod_holding("team", pod, &[("train", &[a, b])]);
            (ua, ub)
        })
    };

    // A record written before railIndex: the rails as attributes, and
    // NCCL told name:port as without a record.
    write_rails(&rails, &[(&p0, "rail0"), (&p1, "rail1")], None);
    on_rails(["rail0", "rail1"]);
    let (a, b) = prepared("old", "a", "b");
    let answer = prepare(
        &driver,
        vec![claim("team", "a", &a), claim("team", "b", &b)],
    )
    .await;
    assert_eq!(
        (answer[&a].error.as_str(), answer[&b].error.as_str()),
        ("", "")
    );
    assert_eq!(told(&s, &a), format!("={r0}:1,{r1}:1"));
    // Exclusive NICs: the pod goes before the next claims get them.
    let gone = unprepare(
        &driver,
        vec![claim("team", "a", &a), claim("team", "b", &b)],
    )
    .await;
    assert!(gone.iter().all(|(_, e)| e.is_empty()), "{gone:?}");

    // Indices that are not the NICs' order or position: each entry carries
    // its own rail's, in both claims' values.
    let index = json!({"rail2": 2, "rail5": 5});
    write_rails(&rails, &[(&p0, "rail5"), (&p1, "rail2")], Some(index));
    on_rails(["rail5", "rail2"]);
    let (c, d) = prepared("new", "c", "d");
    let answer = prepare(
        &driver,
        vec![claim("team", "c", &c), claim("team", "d", &d)],
    )
    .await;
    assert_eq!(
        (answer[&c].error.as_str(), answer[&d].error.as_str()),
        ("", "")
    );
    let union = format!("={r0}:1:5,{r1}:1:2");
    assert_eq!(told(&s, &c), union);
    assert_eq!(told(&s, &d), union);
}
