//! The Node Observer of the shared ConfigMap (`observe --rails-configmap`):
//! it creates and owns the object, removes the records of deleted and
//! replaced Nodes by test-and-remove, survives restarts, lost watches and
//! refused removals, and says when it is ready.

use super::support::apiserver::Action;
use super::support::cluster::{NS, OWNER};
use super::support::os::free_port;
use super::{eventually, failed, ok, patches, probe, sigterm, World, CM, CM_PATH};
use serde_json::{json, Value};
use std::fs;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A record as a broker of Node `uid` would write it (only nodeUID matters to the observer).
fn record(uid: &str) -> String {
    format!("{{\"nodeUID\":\"{uid}\",\"version\":\"rails.nodefabric.gpustack.ai/v1\"}}")
}

#[test]
fn observer_creates_the_configmap_with_a_controller_owner_reference_and_exits_0_on_sigterm() {
    let w = World::new();
    let uid = w.api.add_deployment(NS, OWNER);
    let mut obs = w.observer("observer.log");
    eventually("the observer created the ConfigMap", || {
        w.api.configmap(NS, CM).is_some()
    });
    let cm = w.api.configmap(NS, CM).unwrap();
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
    eventually("the restarted observer synced", || {
        w.read_log("observer2.log")
            .contains("reconciling every record")
    });
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
    let a = w.api.add_node("a");
    w.owned_configmap(json!({"a": record(&a)}));
    let mut obs = w
        .observe()
        .args(["--resync", "1s", "--log-level", "debug"])
        .stdout(Stdio::null())
        .stderr(fs::File::create(w.dir.join("observer.log")).unwrap())
        .spawn()
        .unwrap();
    eventually("the observer synced", || {
        w.read_log("observer.log")
            .contains("reconciling every record")
    });
    // Someone else's ConfigMap now, with a record whose Node is gone.
    w.api.put_configmap(
        NS,
        CM,
        json!({"data": {"a": record(&a), "gone": record("u-gone")}}),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = obs.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the observer carries on: {}",
            w.read_log("observer.log")
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
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
    let w = World::new();
    let (a, b, c) = (
        w.api.add_node("a"),
        w.api.add_node("b"),
        w.api.add_node("c"),
    );
    w.owned_configmap(json!({"a": record(&a), "b": record(&b), "c": record(&c)}));
    let mut obs = w.synced_observer();
    assert_eq!(
        w.data().len(),
        3,
        "every record is current: nothing removed"
    );

    w.api.touch_node("a"); // an ordinary update: no reconciliation
    w.api.delete_node("b");
    eventually("b's record is removed", || !w.data().contains_key("b"));
    // c is replaced: a new UID under the same name; its broker has not written yet.
    w.api.add_node("c");
    eventually("c's stale record is removed", || {
        !w.data().contains_key("c")
    });
    assert_eq!(w.data().keys().collect::<Vec<_>>(), ["a"]);
    // Every removal was a test-and-remove of the exact value read.
    let removals: Vec<Value> = patches(&w.api)
        .iter()
        .map(|p| serde_json::from_str(&p.body).unwrap())
        .collect();
    assert_eq!(
        removals[0],
        json!([{"op": "test", "path": "/data/b", "value": record(&b)}, {"op": "remove", "path": "/data/b"}])
    );
    assert!(patches(&w.api)
        .iter()
        .all(|p| p.content_type == "application/json-patch+json"));
    assert!(sigterm(&mut obs).success());
}

#[test]
fn observer_restart_cleans_deletions_missed_while_it_was_down() {
    let w = World::new();
    let (a, b) = (w.api.add_node("a"), w.api.add_node("b"));
    w.owned_configmap(json!({"a": record(&a), "b": record(&b), "never-a-node": record("u-z")}));
    let mut obs = w.observer("observer.log");
    eventually(
        "the first reconciliation removed the record of a Node that does not exist",
        || !w.data().contains_key("never-a-node"),
    );
    assert!(sigterm(&mut obs).success());

    // While it is down: b deleted, a replaced.
    w.api.delete_node("b");
    w.api.add_node("a");
    w.api.compact(); // the history is gone too: only the list tells
    let mut obs = w.observer("observer2.log");
    eventually("both stale records are removed after the restart", || {
        w.data().is_empty()
    });
    assert!(sigterm(&mut obs).success());
}

#[test]
fn node_name_reuse_a_replacement_record_written_before_the_observer_sees_the_deletion_stays() {
    let w = World::new();
    let old = w.api.add_node("x");
    w.owned_configmap(json!({"x": record(&old)}));
    let mut obs = w.synced_observer();

    // The observer sees nothing while x is deleted, re-created and its new broker publishes.
    w.api.pause_watches();
    w.api.delete_node("x");
    let new = w.api.add_node("x");
    ok(w.broker("x", "lldp.json").output().unwrap());
    assert_eq!(w.record_uid("x").as_deref(), Some(new.as_str()));
    w.api.resume_watches();
    // The observer handles the old Node's deletion: it checks Node x as it is now, and keeps the record.
    eventually("the observer judged x's record", || {
        w.read_log("observer.log")
            .contains("Node x is current, record kept")
            || !w.data().contains_key("x")
    });
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
    let w = World::new();
    let (a, b) = (w.api.add_node("a"), w.api.add_node("b"));
    w.owned_configmap(json!({"a": record(&a), "b": record(&b)}));
    let mut obs = w.synced_observer();
    // Just before the observer's removal lands, someone writes a new value under b.
    w.api.fault(
        "PATCH",
        CM_PATH,
        Action::Before(Box::new(|s| s.set_configmap_key(NS, CM, "b", "rewritten"))),
    );
    w.api.delete_node("b");
    eventually("the removal was refused", || {
        patches(&w.api).iter().any(|p| p.status == 422)
    });
    assert_eq!(
        w.data()["b"],
        "rewritten",
        "the test failed, so nothing was removed"
    );
    // Still running and still working.
    w.api.delete_node("a");
    eventually("a's record is removed", || !w.data().contains_key("a"));
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
    let w = World::new();
    let (a, b) = (w.api.add_node("a"), w.api.add_node("b"));
    w.owned_configmap(json!({"a": record(&a), "b": record(&b)}));
    let mut obs = w.synced_observer();
    // b's deletion is never delivered: held back, then compacted away, then the watch drops.
    w.api.pause_watches();
    w.api.delete_node("b");
    w.api.compact();
    w.api.resume_watches();
    w.api.drop_watches();
    eventually("the re-list removed b's record", || {
        !w.data().contains_key("b")
    });
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
    let w = World::new();
    let (a, b) = (w.api.add_node("a"), w.api.add_node("b"));
    w.owned_configmap(json!({"a": record(&a), "b": record(&b)}));
    let mut obs = w.synced_observer(); // resync: the 10m default
                                       // One plain 500 (not retried by the request policy) on the removal.
    w.api.fault("PATCH", CM_PATH, Action::Respond(500));
    w.api.delete_node("b");
    // Well before the resync: a hang guard, not a measurement.
    let deadline = Instant::now() + Duration::from_secs(45);
    while w.data().contains_key("b") {
        assert!(
            Instant::now() < deadline,
            "the record of deleted Node b is still there: {}",
            w.read_log("observer.log")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
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
    let mut obs = w
        .observe()
        .args(["--health-addr", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually("the observer is ready", || {
        probe(port, "/readyz") == Some(200)
    });
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
    let mut obs = w
        .observe()
        .args(["--health-addr", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually("the observer is ready", || {
        probe(port, "/readyz") == Some(200)
    });
    for _ in 0..3 {
        w.api
            .fault_where("GET", "/api/v1/nodes", Some("watch="), Action::Respond(500));
    }
    w.api.drop_watches();
    eventually("the observer is unready", || {
        probe(port, "/readyz") == Some(503)
    });
    assert_eq!(probe(port, "/livez"), Some(200));
    // The watch works again: the next event shows it, and it is ready.
    w.api.touch_node("a");
    eventually("the observer is ready again", || {
        probe(port, "/readyz") == Some(200)
    });
    assert!(sigterm(&mut obs).success());
}
