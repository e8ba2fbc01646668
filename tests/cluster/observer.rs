//! The Node Observer of the shared ConfigMap (`observe --rails-configmap`):
//! it creates and owns the object, removes the records of deleted and
//! replaced Nodes by test-and-remove, survives restarts, lost watches and
//! refused removals, and says when it is ready.

use super::support::apiserver::Action;
use super::support::cluster::{NS, OWNER};
use super::support::os::free_port;
use super::support::wait;
use super::{failed, ok, patches, probe, sigterm, World, CM, CM_PATH};
use serde_json::{json, Map, Value};
use std::process::Child;
use std::time::Duration;

/// A record as a broker of Node `uid` would write it (only nodeUID matters to the observer).
fn record(uid: &str) -> String {
    format!("{{\"nodeUID\":\"{uid}\",\"version\":\"rails.nodefabric.gpustack.ai/v1\"}}")
}

/// Nodes `names`, and the observer's ConfigMap holding each one's current
/// record and the records of `stale` (name, UID of a Node that is not
/// there): what the observer tests start from. Gives the Nodes' UIDs.
fn recorded(w: &World, names: &[&str], stale: &[(&str, &str)]) -> Vec<String> {
    let uids: Vec<String> = names.iter().map(|n| w.api.add_node(n)).collect();
    let mut data: Map<String, Value> = names
        .iter()
        .zip(&uids)
        .map(|(n, uid)| (n.to_string(), json!(record(uid))))
        .collect();
    data.extend(
        stale
            .iter()
            .map(|(n, uid)| (n.to_string(), json!(record(uid)))),
    );
    w.owned_configmap(Value::Object(data));
    uids
}

/// [`recorded`] Nodes `names`, and the observer past its first
/// reconciliation (resync: the 10m default).
fn observing(names: &[&str]) -> (World, Vec<String>, Child) {
    let w = World::new();
    let uids = recorded(&w, names, &[]);
    let obs = w.synced_observer();
    (w, uids, obs)
}

/// The observer with its probes on `port` (logging to observer.log).
fn probed_observer(w: &World, port: u16) -> Child {
    w.spawn_logged(
        w.observe()
            .args(["--health-addr", &format!("127.0.0.1:{port}")]),
        "observer.log",
    )
}

#[test]
fn observer_creates_the_configmap_with_a_controller_owner_reference_and_exits_0_on_sigterm() {
    let w = World::new();
    let uid = w.api.add_deployment(NS, OWNER);
    let mut obs = w.observer("observer.log");
    let cm = wait::until(
        "the observer created the ConfigMap",
        || w.api.configmap(NS, CM),
        Option::is_some,
    )
    .unwrap();
    assert_eq!(
        cm["metadata"]["ownerReferences"],
        json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": OWNER, "uid": uid, "controller": true}])
    );
    assert!(cm.get("data").is_none());
    // A broker can publish into it straight away.
    w.api.add_node("node-a");
    ok(w.broker("node-a", "lldp.json").output().unwrap());
    let status = sigterm(&mut obs);
    assert!(
        status.success(),
        "{status:?}: {}",
        w.read_log("observer.log")
    );
    // A restart adopts its own ConfigMap and changes nothing.
    let before = w.api.configmap(NS, CM).unwrap();
    let mut obs = w.observer("observer2.log");
    w.await_log(
        "the restarted observer synced",
        "observer2.log",
        "reconciling every record",
    );
    assert_eq!(w.api.configmap(NS, CM).unwrap(), before);
    assert!(sigterm(&mut obs).success());
}

#[test]
fn ownership_conflict_an_unrelated_same_named_configmap_is_not_adopted() {
    let w = World::new();
    w.api.add_deployment(NS, OWNER);
    w.api.add_node("node-a");
    w.api.put_configmap(NS, CM, json!({"metadata": {"labels": {"app": "someone-else"}}, "data": {"node-gone": record("u-x")}}));
    let before = w.api.configmap(NS, CM).unwrap();
    let o = w.observe().output().unwrap();
    let e = failed(o);
    assert!(e.contains("ConfigMap nodefabric/nodefabric-rails exists and is not controlled by Deployment nodefabric/nodefabric-observer") && e.contains("refusing to adopt"), "{e}");
    assert_eq!(w.api.configmap(NS, CM).unwrap(), before, "nothing modified");
    assert!(!w.api.log().iter().any(|l| l.method != "GET"), "only reads");

    // Controlled by another Deployment (or an earlier one of the same name): refused too.
    w.api.put_configmap(NS, CM, json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": OWNER, "uid": "old-uid", "controller": true}]}}));
    let e = failed(w.observe().output().unwrap());
    assert!(
        e.contains("its controller is Deployment nodefabric-observer (uid old-uid)"),
        "{e}"
    );
}

#[test]
fn observer_without_its_deployment_fails_naming_it() {
    let w = World::new();
    let e = failed(w.observe().output().unwrap());
    assert!(
        e.contains("Deployment nodefabric/nodefabric-observer") && e.contains("--owner-deployment"),
        "{e}"
    );
    assert!(w.api.configmap(NS, CM).is_none());
}

#[test]
fn running_observer_that_loses_its_configmap_ownership_refuses_it_as_a_restart_would() {
    let w = World::new();
    let a = recorded(&w, &["a"], &[]).remove(0);
    let mut obs = w.spawn_logged(w.observe().args(["--resync", "1s"]), "observer.log");
    w.synced("observer.log");
    // Someone else's ConfigMap now, with a record whose Node is gone.
    w.api.put_configmap(
        NS,
        CM,
        json!({"data": {"a": record(&a), "gone": record("u-gone")}}),
    );
    let (status, _) = wait::until_by(
        Duration::from_secs(20),
        "the observer to exit (and its log)",
        || (obs.try_wait().unwrap(), w.read_log("observer.log")),
        |(status, _)| status.is_some(),
    );
    assert!(!status.unwrap().success());
    let log = w.read_log("observer.log");
    assert!(
        log.contains("refusing to adopt") && log.contains("no controller ownerReference"),
        "{log}"
    );
    assert!(w.data().contains_key("gone"), "nothing was changed");
    // A restart says the same.
    let e = failed(w.observe().output().unwrap());
    assert!(e.contains("refusing to adopt"), "{e}");
}

#[test]
fn observer_removes_records_of_deleted_and_replaced_nodes_seen_on_the_watch() {
    let (w, uids, mut obs) = observing(&["a", "b", "c"]);
    let b = &uids[1];
    assert_eq!(
        w.data().len(),
        3,
        "every record is current: nothing removed"
    );

    w.api.touch_node("a"); // an ordinary update: no reconciliation
    w.api.delete_node("b");
    wait::until(
        "b's record is removed",
        || w.data(),
        |d| !d.contains_key("b"),
    );
    // c is replaced: a new UID under the same name; its broker has not written yet.
    w.api.add_node("c");
    wait::until(
        "c's stale record is removed",
        || w.data(),
        |d| !d.contains_key("c"),
    );
    assert_eq!(w.data().keys().collect::<Vec<_>>(), ["a"]);
    // Every removal was a test-and-remove of the exact value read.
    let removals: Vec<Value> = patches(&w.api)
        .iter()
        .map(|p| serde_json::from_str(&p.body).unwrap())
        .collect();
    assert_eq!(
        removals[0],
        json!([{"op": "test", "path": "/data/b", "value": record(b)}, {"op": "remove", "path": "/data/b"}])
    );
    assert!(patches(&w.api)
        .iter()
        .all(|p| p.content_type == "application/json-patch+json"));
    assert!(sigterm(&mut obs).success());
}

#[test]
fn observer_restart_cleans_deletions_missed_while_it_was_down() {
    let w = World::new();
    recorded(&w, &["a", "b"], &[("never-a-node", "u-z")]);
    let mut obs = w.observer("observer.log");
    wait::until(
        "the first reconciliation removed the record of a Node that does not exist",
        || w.data(),
        |d| !d.contains_key("never-a-node"),
    );
    assert!(sigterm(&mut obs).success());

    // While it is down: b deleted, a replaced.
    w.api.delete_node("b");
    w.api.add_node("a");
    w.api.compact(); // the history is gone too: only the list tells
    let mut obs = w.observer("observer2.log");
    wait::until(
        "both stale records are removed after the restart",
        || w.data(),
        |d| d.is_empty(),
    );
    assert!(sigterm(&mut obs).success());
}

#[test]
fn node_name_reuse_a_replacement_record_written_before_the_observer_sees_the_deletion_stays() {
    let (w, _, mut obs) = observing(&["x"]);

    // The observer sees nothing while x is deleted, re-created and its new broker publishes.
    w.api.pause_watches();
    w.api.delete_node("x");
    let new = w.api.add_node("x");
    ok(w.broker("x", "lldp.json").output().unwrap());
    assert_eq!(w.record_uid("x").as_deref(), Some(new.as_str()));
    w.api.resume_watches();
    // The observer handles the old Node's deletion: it checks Node x as it is now, and keeps the record.
    wait::until(
        "the observer judged x's record",
        || (w.read_log("observer.log"), w.data()),
        |(log, d)| log.contains("Node x is current, record kept") || !d.contains_key("x"),
    );
    assert_eq!(
        w.record_uid("x").as_deref(),
        Some(new.as_str()),
        "the replacement record stays"
    );
    assert!(
        patches(&w.api)
            .iter()
            .all(|p| p.content_type != "application/json-patch+json"),
        "no removal attempted"
    );
    assert!(sigterm(&mut obs).success());
}

#[test]
fn failed_test_a_record_rewritten_between_read_and_removal_stays_and_the_observer_carries_on() {
    let (w, _, mut obs) = observing(&["a", "b"]);
    // Just before the observer's removal lands, someone writes a new value under b.
    w.api.fault(
        "PATCH",
        CM_PATH,
        Action::Before(Box::new(|s| s.set_configmap_key(NS, CM, "b", "rewritten"))),
    );
    w.api.delete_node("b");
    wait::until(
        "the removal was refused",
        || patches(&w.api),
        |sent| sent.iter().any(|p| p.status == 422),
    );
    assert_eq!(
        w.data()["b"],
        "rewritten",
        "the test failed, so nothing was removed"
    );
    // Still running and still working.
    w.api.delete_node("a");
    wait::until(
        "a's record is removed",
        || w.data(),
        |d| !d.contains_key("a"),
    );
    assert!(
        w.read_log("observer.log")
            .contains("changed since it was read"),
        "{}",
        w.read_log("observer.log")
    );
    assert!(sigterm(&mut obs).success());
}

#[test]
fn observer_whose_watch_is_too_old_relists_and_cleans_what_it_missed() {
    let (w, _, mut obs) = observing(&["a", "b"]);
    // b's deletion is never delivered: held back, then compacted away, then the watch drops.
    w.api.pause_watches();
    w.api.delete_node("b");
    w.api.compact();
    w.api.resume_watches();
    w.api.drop_watches();
    wait::until(
        "the re-list removed b's record",
        || w.data(),
        |d| !d.contains_key("b"),
    );
    assert!(
        w.api
            .log()
            .iter()
            .any(|l| l.query.contains("watch") && l.status == 200),
        "it watched again"
    );
    assert_eq!(w.data().keys().collect::<Vec<_>>(), ["a"]);
    assert!(sigterm(&mut obs).success());
}

#[test]
fn observer_cleanup_transient_error_is_retried_with_backoff_not_left_until_the_resync() {
    let (w, _, mut obs) = observing(&["a", "b"]); // resync: the 10m default
                                                  // One plain 500 (not retried by the request policy) on the removal.
    w.api.fault("PATCH", CM_PATH, Action::Respond(500));
    w.api.delete_node("b");
    // Well before the resync: a hang guard, not a measurement.
    wait::until_by(
        Duration::from_secs(45),
        "the record of deleted Node b removed (and the observer's log)",
        || (w.data(), w.read_log("observer.log")),
        |(d, _)| !d.contains_key("b"),
    );
    assert!(w.data().contains_key("a"));
    assert!(
        patches(&w.api).iter().any(|p| p.status == 500),
        "the first removal failed"
    );
    assert!(sigterm(&mut obs).success());
}

// ---- health --------------------------------------------------------------------

#[test]
fn observer_is_ready_once_its_first_reconciliation_succeeded() {
    let w = World::new();
    w.api.add_deployment(NS, OWNER);
    let port = free_port();
    let mut obs = probed_observer(&w, port);
    wait::until(
        "the observer is ready",
        || probe(port, "/readyz"),
        |code| *code == Some(200),
    );
    assert_eq!(probe(port, "/livez"), Some(200));
    assert_eq!(probe(port, "/metrics"), Some(404));
    assert!(sigterm(&mut obs).success());
    assert!(
        !w.api.log().iter().any(|l| l.status == 403),
        "deploy/'s RBAC covers every request the observer makes"
    );
}

#[test]
fn observer_is_unready_while_its_node_watch_keeps_failing() {
    let w = World::new();
    w.api.add_node("a");
    w.api.add_deployment(NS, OWNER);
    let port = free_port();
    let mut obs = probed_observer(&w, port);
    wait::until(
        "the observer is ready",
        || probe(port, "/readyz"),
        |code| *code == Some(200),
    );
    for _ in 0..3 {
        w.api
            .fault_where("GET", "/api/v1/nodes", Some("watch="), Action::Respond(500));
    }
    w.api.drop_watches();
    wait::until(
        "the observer is unready",
        || probe(port, "/readyz"),
        |code| *code == Some(503),
    );
    assert_eq!(probe(port, "/livez"), Some(200));
    // The watch works again: the next event shows it, and it is ready.
    w.api.touch_node("a");
    wait::until(
        "the observer is ready again",
        || probe(port, "/readyz"),
        |code| *code == Some(200),
    );
    assert!(sigterm(&mut obs).success());
}
