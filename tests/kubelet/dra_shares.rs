//! Shared NICs (`--shares`, consumable capacity) as kubelet and the API
//! server meet them: several claims prepared on one NIC, each told apart
//! by its allocation's share ID; one unprepared while the others stay; a
//! NIC never handed out whole and in shares at once; a server with the
//! `DRAConsumableCapacity` gate off; a restart with shares prepared. Each
//! test is named after the fault it guards.

use crate::dra_faults::{claim, devices, name, prepare, started, unprepare};
use crate::dra_lifecycle::{checkpoint_json, claim_spec};
use crate::support::dra::{reconciled, reconciles, Driver, Setup, DRIVER};
use crate::support::os::{free_addr, http_get};
use crate::support::wait::{self, within};
use serde_json::json;

const NODE: &str = "node-a";

/// The first device published shareable: a whole NIC.
fn shared_nic(s: &Setup) -> String {
    let all = devices(s);
    let nic = all
        .iter()
        .find(|d| d["allowMultipleAllocations"] == json!(true))
        .unwrap_or_else(|| panic!("no shareable device in {all:#?}"));
    name(nic)
}

/// Stores a claim allocated `share` of `device` (no share: the device
/// whole), as the scheduler writes it; returns its UID.
fn put(s: &Setup, claim_name: &str, device: &str, share: Option<&str>) -> String {
    let mut result = json!({"driver": DRIVER, "pool": NODE, "device": device, "request": "nic"});
    if let Some(share) = share {
        result["shareID"] = json!(share);
        result["consumedCapacity"] = json!({"shares": "1"});
    }
    s.cluster.api.with(|st| {
        let uid = st.new_uid();
        st.put_claim_results("team", claim_name, &uid, vec![result]);
        uid
    })
}

const SHARE_A: &str = "5f0c0a1e-0000-4000-8000-00000000000a";
const SHARE_B: &str = "5f0c0a1e-0000-4000-8000-00000000000b";
const SHARE_C: &str = "5f0c0a1e-0000-4000-8000-00000000000c";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_claim_on_a_shared_nic_is_not_refused_as_if_exclusive_and_unpreparing_one_share_keeps_the_other(
) {
    let s = Setup::new(NODE);
    let driver = started(&s, &["--shares", "64"]);
    // Whole NICs published shareable, with the v1 request policy.
    let nic = shared_nic(&s);
    let published = devices(&s);
    let device = published.iter().find(|d| name(d) == nic).unwrap();
    assert_eq!(
        device["capacity"]["shares"],
        json!({"value": "64", "requestPolicy": {"default": "1",
            "validRange": {"min": "1", "max": "64", "step": "1"}}}),
        "{device:#}"
    );
    let a = put(&s, "a", &nic, Some(SHARE_A));
    let b = put(&s, "b", &nic, Some(SHARE_B));
    let both = prepare(
        &driver,
        vec![claim("team", "a", &a), claim("team", "b", &b)],
    )
    .await;
    for (uid, share) in [(&a, SHARE_A), (&b, SHARE_B)] {
        let answer = &both[uid];
        assert_eq!(answer.error, "", "{both:?}");
        assert_eq!(answer.devices.len(), 1, "{answer:?}");
        assert_eq!(answer.devices[0].device_name, nic);
        // kubelet keys the prepared device by its share ID.
        assert_eq!(answer.devices[0].share_id.as_deref(), Some(share));
        assert!(claim_spec(&s, uid).exists());
    }

    assert_eq!(
        unprepare(&driver, vec![claim("team", "a", &a)]).await,
        [(a.clone(), String::new())]
    );
    assert!(!claim_spec(&s, &a).exists());
    assert!(claim_spec(&s, &b).exists(), "b's spec went with a's");
    let kept = checkpoint_json(&s);
    assert!(kept["claims"].get(&a).is_none(), "{kept:#}");
    assert_eq!(
        kept["claims"][&b]["devices"][0]["shareId"], SHARE_B,
        "{kept:#}"
    );
    // b is still prepared: asked again, the same share, from the checkpoint.
    let again = prepare(&driver, vec![claim("team", "b", &b)]).await;
    assert_eq!(again[&b].error, "");
    assert_eq!(again[&b].devices[0].share_id.as_deref(), Some(SHARE_B));
    // And the NIC takes a new share beside it.
    let c = put(&s, "c", &nic, Some(SHARE_C));
    assert_eq!(
        prepare(&driver, vec![claim("team", "c", &c)]).await[&c].error,
        ""
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nic_is_never_handed_out_whole_and_in_shares_at_once() {
    let s = Setup::new(NODE);
    let driver = started(&s, &["--shares", "64"]);
    let nic = shared_nic(&s);
    let shared = put(&s, "shared", &nic, Some(SHARE_A));
    assert_eq!(
        prepare(&driver, vec![claim("team", "shared", &shared)]).await[&shared].error,
        ""
    );
    // Whole (a claim allocated before --shares was set, say) while a share
    // is held: refused, naming the device and the holder.
    let whole = put(&s, "whole", &nic, None);
    let refused = prepare(&driver, vec![claim("team", "whole", &whole)]).await;
    let error = &refused[&whole].error;
    assert!(
        error.contains(&nic)
            && error.contains(&format!("team/shared ({shared})"))
            && error.contains("asked whole"),
        "{error}"
    );
    assert!(refused[&whole].devices.is_empty());
    assert!(!claim_spec(&s, &whole).exists());

    // The other way round: held whole, a share of it refused.
    unprepare(&driver, vec![claim("team", "shared", &shared)]).await;
    assert_eq!(
        prepare(&driver, vec![claim("team", "whole", &whole)]).await[&whole].error,
        ""
    );
    let share = put(&s, "share", &nic, Some(SHARE_B));
    let refused = prepare(&driver, vec![claim("team", "share", &share)]).await;
    let error = &refused[&share].error;
    assert!(
        error.contains(&nic)
            && error.contains(&format!("team/whole ({whole})"))
            && error.contains(SHARE_B),
        "{error}"
    );
    assert!(refused[&share].devices.is_empty());
    // One share ID twice is no allocation the scheduler made.
    let twin_a = put(&s, "twin-a", &shared_nic_other(&s, &nic), Some(SHARE_C));
    let twin_b = put(&s, "twin-b", &shared_nic_other(&s, &nic), Some(SHARE_C));
    let twins = prepare(
        &driver,
        vec![
            claim("team", "twin-a", &twin_a),
            claim("team", "twin-b", &twin_b),
        ],
    )
    .await;
    let granted = [&twin_a, &twin_b]
        .iter()
        .filter(|u| twins[**u].error.is_empty())
        .count();
    assert_eq!(granted, 1, "{twins:?}");
}

/// A shareable NIC other than `not`.
fn shared_nic_other(s: &Setup, not: &str) -> String {
    devices(s)
        .iter()
        .filter(|d| d["allowMultipleAllocations"] == json!(true))
        .map(name)
        .find(|n| n != not)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_the_consumable_capacity_gate_off_is_told_once_and_keeps_exclusive_nics() {
    let s = Setup::new(NODE);
    s.cluster.api.with(|st| st.disable_consumable_capacity());
    let probes = free_addr();
    let driver = Driver::start(
        &s.place,
        &[
            "--interval",
            "1s",
            "--metrics-addr",
            &probes,
            "--shares",
            "64",
        ],
    );
    wait::until("the slices", || devices(&s), |now| !now.is_empty());
    let listed = reconciles(&s.cluster.api);
    reconciled(&s.cluster.api, listed, 3);
    let writes = |s: &Setup| {
        s.cluster
            .api
            .log()
            .iter()
            .filter(|l| l.path.contains("/resourceslices") && l.method != "GET")
            .count()
    };
    let written = writes(&s);
    let listed = reconciles(&s.cluster.api);
    reconciled(&s.cluster.api, listed, 3);
    assert_eq!(writes(&s), written, "rewritten in a loop");
    // Published as the server keeps them: exclusive NICs with their
    // shares capacity's value, nothing a claim cannot use.
    let published = devices(&s);
    assert!(
        published
            .iter()
            .all(|d| d["allowMultipleAllocations"].is_null()
                && d["capacity"]["shares"]["requestPolicy"].is_null()),
        "{published:#?}"
    );
    let said = driver
        .log_lines()
        .iter()
        .filter(|l| l.contains("DRAConsumableCapacity"))
        .count();
    assert_eq!(said, 1, "{}", driver.log_lines().join("\n"));
    let metrics = within("the metrics", async { http_get(&probes, "/metrics").1 }).await;
    assert!(
        metrics.contains("nodefabric_dra_server_dropped_fields{gate=\"DRAConsumableCapacity\"} 1"),
        "{metrics}"
    );
    // The scheduler allocates such a NIC whole: prepared as ever.
    let nic = name(&published[0]);
    let whole = put(&s, "whole", &nic, None);
    assert_eq!(
        prepare(&driver, vec![claim("team", "whole", &whole)]).await[&whole].error,
        ""
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_driver_forgets_no_share_and_writes_v2_again_once_none_is_held() {
    let s = Setup::new(NODE);
    let driver = started(&s, &["--shares", "64"]);
    let nic = shared_nic(&s);
    let a = put(&s, "a", &nic, Some(SHARE_A));
    let b = put(&s, "b", &nic, Some(SHARE_B));
    prepare(
        &driver,
        vec![claim("team", "a", &a), claim("team", "b", &b)],
    )
    .await;
    assert_eq!(
        checkpoint_json(&s)["format"],
        "dra.nodefabric.gpustack.ai/v3"
    );
    driver.kill9();

    let driver = started(&s, &["--shares", "64"]);
    // The killed driver's socket file stays: wait for the new one serving.
    wait::until(
        "the restarted driver serving",
        || driver.log_lines().iter().any(|l| l.contains("serving")),
        |&serving| serving,
    );
    // Both shares still held: the NIC is not given out whole.
    let whole = put(&s, "whole", &nic, None);
    let refused = prepare(&driver, vec![claim("team", "whole", &whole)]).await;
    assert!(refused[&whole].error.contains(&nic), "{refused:?}");
    let again = prepare(&driver, vec![claim("team", "b", &b)]).await;
    assert_eq!(again[&b].devices[0].share_id.as_deref(), Some(SHARE_B));
    unprepare(
        &driver,
        vec![claim("team", "a", &a), claim("team", "b", &b)],
    )
    .await;
    assert_eq!(
        checkpoint_json(&s)["format"],
        "dra.nodefabric.gpustack.ai/v2"
    );
}
