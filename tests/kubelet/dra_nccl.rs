//! `NCCL_IB_HCA` as the driver writes it into each claim's CDI spec: a
//! container given NICs by two claims must see both whichever claim's spec
//! the runtime applies last, so each claim's value is the union of the
//! container's NICs; when the pod cannot be read the claim's own NICs are
//! told, said and counted. Each test is named after the fault it guards.

use crate::dra_faults::{claim, devices, name, prepare, started};
use crate::dra_lifecycle::claim_spec;
use crate::support::dra::{Driver, Setup, DRIVER};
use crate::support::os::{free_addr, http_get};
use crate::support::wait::{self, within};
use serde_json::Value;

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
