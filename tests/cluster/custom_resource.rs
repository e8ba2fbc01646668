//! The custom-resource form (`--rails-record custom-resource`): each broker
//! applies its own NodeRailRecord owned by its Node, the observer deletes
//! the records of gone and replaced Nodes by precondition, and the watch
//! example sees both.

use super::support::apiserver::{self, Action, ApiServer};
use super::support::host;
use super::support::os::free_port;
use super::support::wait;
use super::{failed, ok, probe, sigterm, spec, World, CM, NRR_PATH};
use serde_json::{json, Value};
use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};

// ---- the broker ----------------------------------------------------------------

#[test]
fn custom_resource_broker_applies_its_record_owned_by_its_node_and_an_empty_result_deletes_it() {
    let w = World::new();
    w.api.install_crd();
    let uid = w.api.add_node("node-a");
    // Under the broker's own account: deploy/'s RBAC must allow all of it.
    let printed: Value =
        serde_json::from_str(&ok(w.cr_broker("node-a", "lldp.json").output().unwrap())).unwrap();
    let obj = w.nrr("node-a").expect("the record was created");
    assert_eq!(
        obj["spec"], printed,
        "the spec is the printed record, nothing pruned or added"
    );
    assert_eq!(
        obj["metadata"]["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": uid}]),
        "owned by the Node's UID, not a controller reference"
    );
    let labels = &obj["metadata"]["labels"];
    assert_eq!(
        (
            labels["nodefabric.gpustack.ai/gpus"].as_str(),
            labels["nodefabric.gpustack.ai/rails"].as_str()
        ),
        (Some("8"), Some("4"))
    );
    let apply = w
        .api
        .log()
        .into_iter()
        .find(|l| l.method == "PATCH" && l.path == format!("{NRR_PATH}/node-a"))
        .unwrap();
    assert!(
        apply
            .content_type
            .starts_with("application/apply-patch+yaml"),
        "{}",
        apply.content_type
    );
    assert!(
        apply.query.contains("fieldManager=nodefabric") && apply.query.contains("force=true"),
        "{}",
        apply.query
    );

    // The same record again: the object does not change.
    let rv = obj["metadata"]["resourceVersion"].clone();
    ok(w.cr_broker("node-a", "lldp.json").output().unwrap());
    assert_eq!(w.nrr("node-a").unwrap()["metadata"]["resourceVersion"], rv);

    // No rail any more: the object goes; gone already is fine.
    ok(w.cr_broker("node-a", "none.json").output().unwrap());
    assert!(w.nrr("node-a").is_none());
    ok(w.cr_broker("node-a", "none.json").output().unwrap());
    // No ConfigMap was touched in this form.
    assert!(w.api.log().iter().all(|l| !l.path.contains("configmaps")));
}

#[test]
fn custom_resource_owner_reference_lets_the_garbage_collector_take_a_replaced_nodes_record() {
    let w = World::with_applied_record();
    assert!(
        w.api.with(|s| s.collect_garbage()).is_empty(),
        "the living Node's record stays"
    );
    w.api.add_node("node-a"); // replaced: same name, new UID
    assert_eq!(w.api.with(|s| s.collect_garbage()), ["node-a"]);
}

#[test]
fn custom_resource_without_the_crd_fails_naming_how_to_install_it() {
    let w = World::new();
    w.api.add_node("node-a");
    let e = failed(w.cr_broker("node-a", "lldp.json").output().unwrap());
    assert!(
        e.contains("APPLY NodeRailRecord node-a")
            && e.contains("not installed")
            && e.contains("nodefabric crd | kubectl apply -f -"),
        "{e}"
    );
    // An empty result has nothing to delete, but the missing CRD is still named.
    let e = failed(w.cr_broker("node-a", "none.json").output().unwrap());
    assert!(
        e.contains("DELETE NodeRailRecord node-a") && e.contains("not installed"),
        "{e}"
    );
}

#[test]
fn custom_resource_a_hand_edit_of_the_spec_does_not_pin_a_stale_rail() {
    let w = World::with_applied_record();
    let good = w.nrr("node-a").unwrap()["spec"].clone();
    let code = w.api.with(|s| {
        s.edit_record(
            "node-a",
            "kubectl-edit",
            json!({"spec": {"nics": {"0000:99:00.0": ["rail9"]}}}),
        )
    });
    assert_eq!(code, 200);
    assert_ne!(w.nrr("node-a").unwrap()["spec"], good);
    // The broker's forced apply takes the fields back (unforced, the stand-in answers 409 as the real server does).
    ok(w.cr_broker("node-a", "lldp.json").output().unwrap());
    assert_eq!(w.nrr("node-a").unwrap()["spec"], good);
}

#[test]
fn custom_resource_api_failure_keeps_the_previous_record_and_fails_the_pass() {
    let w = World::with_applied_record();
    let before = w.nrr("node-a").unwrap();
    w.api
        .fault("PATCH", &format!("{NRR_PATH}/node-a"), Action::Respond(500));
    let e = failed(w.cr_broker("node-a", "lldp.json").output().unwrap());
    assert!(
        e.contains("APPLY NodeRailRecord node-a") && e.contains("500"),
        "{e}"
    );
    w.api.fault(
        "DELETE",
        &format!("{NRR_PATH}/node-a"),
        Action::Respond(500),
    );
    let e = failed(w.cr_broker("node-a", "none.json").output().unwrap());
    assert!(e.contains("DELETE NodeRailRecord node-a"), "{e}");
    assert_eq!(w.nrr("node-a").unwrap(), before);
}

#[test]
fn custom_resource_flags_that_belong_to_the_other_form_are_refused() {
    let w = World::new();
    let mut c = w.cr_broker("node-a", "lldp.json");
    c.args(["--rails-configmap", CM]); // no Node node-a either: the usage error comes first
    let e = failed(c.output().unwrap());
    assert!(
        e.contains("--rails-configmap") && e.contains("custom-resource"),
        "{e}"
    );
    let mut c = w.nodefabric_as(&w.observer_kubeconfig);
    c.args([
        "observe",
        "--rails-record",
        "custom-resource",
        "--rails-configmap",
        CM,
    ]);
    assert!(failed(c.output().unwrap()).contains("custom-resource needs neither"));
    let mut c = w.nodefabric_as(&w.observer_kubeconfig);
    c.args(["observe"]);
    assert!(failed(c.output().unwrap()).contains("needs --rails-configmap and --owner-deployment"));
    // Without a cluster there is nowhere to write the object.
    let mut c = w.cr_broker("node-a", "lldp.json");
    c.env_remove("KUBECONFIG");
    assert!(failed(c.output().unwrap()).contains("needs a cluster"));
}

#[test]
fn malformed_answers_to_the_records_list_or_apply_fail_naming_the_request_and_delete_nothing() {
    let w = World::with_applied_record();
    let before = w.nrr("node-a").unwrap();
    // A broken answer to the apply: the pass fails, naming it.
    for (body, code) in [
        ("not json at all", 200),
        ("{\"kind\": \"Status\"", 500),
        ("", 502),
    ] {
        w.api.fault(
            "PATCH",
            &format!("{NRR_PATH}/node-a"),
            Action::Raw(code, body),
        );
        let e = failed(w.cr_broker("node-a", "lldp.json").output().unwrap());
        assert!(e.contains("APPLY NodeRailRecord node-a"), "{body:?}: {e}");
    }
    assert_eq!(w.nrr("node-a").unwrap(), before);
    // A broken list answer: the observer is unready and deletes nothing, then recovers.
    w.api
        .with(|s| drop(s.put_record("gone", "u-gone", spec("u-gone"))));
    w.api
        .fault("GET", NRR_PATH, Action::Raw(200, "{\"items\": 7}"));
    let mut obs = w.cr_observer("observer.log", "1s");
    w.await_log(
        "the broken list is reported",
        "observer.log",
        "reconciling NodeRailRecords: LIST NodeRailRecords",
    );
    wait::until(
        "the next resync deletes the stale record",
        || w.nrr("gone"),
        Option::is_none,
    );
    assert!(w.nrr("node-a").is_some());
    assert!(sigterm(&mut obs).success());
}

// ---- the observer --------------------------------------------------------------

/// The LIST requests for NodeRailRecords.
fn record_lists(api: &ApiServer) -> Vec<apiserver::Logged> {
    api.log()
        .into_iter()
        .filter(|l| l.method == "GET" && l.path == NRR_PATH)
        .collect()
}

/// The DELETE requests for NodeRailRecords, with their bodies.
fn record_deletes(api: &ApiServer) -> Vec<apiserver::Logged> {
    api.log()
        .into_iter()
        .filter(|l| l.method == "DELETE" && l.path.starts_with(NRR_PATH))
        .collect()
}

#[test]
fn observer_deletes_records_of_gone_and_replaced_nodes_without_the_garbage_collector() {
    let w = World::new();
    w.api.install_crd();
    let (a, b, c) = (
        w.api.add_node("a"),
        w.api.add_node("b"),
        w.api.add_node("c"),
    );
    w.api.add_node("e");
    let (ra, rb) = w.api.with(|s| {
        let ra = s.put_record("a", &a, spec(&a));
        let rb = s.put_record("b", &b, spec(&b));
        s.put_record("c", &c, spec(&c));
        s.put_record("gone", "u-gone", spec("u-gone"));
        // Left by an earlier Node e: its owner UID is not the current e's.
        s.put_record("e", "u-old-e", spec("u-old-e"));
        (ra, rb)
    });
    // Every candidate is judged again by a fresh read of its Node before its delete.
    let mut obs = w.cr_observer("observer.log", "10m");
    wait::until(
        "the record of a Node that never existed is deleted",
        || w.nrr("gone"),
        Option::is_none,
    );
    wait::until(
        "the record of an earlier Node e is deleted",
        || w.nrr("e"),
        Option::is_none,
    );
    assert!(w.nrr("a").is_some() && w.nrr("b").is_some() && w.nrr("c").is_some());

    w.api.touch_node("a"); // an ordinary update: nothing to do
    w.api.delete_node("b");
    wait::until("b's record is deleted", || w.nrr("b"), Option::is_none);
    w.api.add_node("c"); // replaced under the same name; its broker has not applied yet
    wait::until("c's record is deleted", || w.nrr("c"), Option::is_none);
    assert_eq!(w.nrr("a").unwrap()["metadata"]["uid"], ra.as_str());

    // Every delete named the uid and resourceVersion of the object judged.
    let deletes = record_deletes(&w.api);
    let b_delete = deletes.iter().find(|d| d.path.ends_with("/b")).unwrap();
    let body: Value = serde_json::from_str(&b_delete.body).unwrap();
    assert_eq!(body["preconditions"]["uid"], rb.as_str());
    assert!(
        body["preconditions"]["resourceVersion"].is_string(),
        "{body}"
    );
    assert!(deletes.iter().all(|d| d.body.contains("preconditions")));
    // The list is of metadata only, never the records' specs.
    let lists = record_lists(&w.api);
    assert!(!lists.is_empty());
    assert!(sigterm(&mut obs).success());
    let log = w.read_log("observer.log");
    assert!(
        log.contains("deleted NodeRailRecord b: no Node of that name exists"),
        "{log}"
    );
    assert!(
        log.contains("deleted NodeRailRecord e: its owner UID u-old-e is not Node e's UID"),
        "{log}"
    );
}

#[test]
fn observer_never_deletes_a_record_reapplied_in_place_after_it_was_judged() {
    let w = World::new();
    let mut obs = w.observed_records(&["a", "b"], "10m");
    // b is replaced; just before the observer's delete lands, the new Node's
    // broker re-applies the same object in place (same uid, new resourceVersion).
    let new_b = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let uid_cell = new_b.clone();
    w.api.fault(
        "DELETE",
        &format!("{NRR_PATH}/b"),
        Action::Before(Box::new(move |s| {
            let uid = uid_cell.lock().unwrap().clone();
            s.put_record("b", &uid, spec(&uid));
        })),
    );
    let uid = w.api.add_node("b");
    *new_b.lock().unwrap() = uid.clone();
    wait::until(
        "the delete was refused",
        || record_deletes(&w.api),
        |sent| sent.iter().any(|d| d.status == 409),
    );
    let kept = w.nrr("b").expect("the re-applied record stays");
    assert_eq!(kept["metadata"]["ownerReferences"][0]["uid"], uid.as_str());
    // Still running and still working.
    w.api.delete_node("a");
    wait::until("a's record is deleted", || w.nrr("a"), Option::is_none);
    assert!(w
        .read_log("observer.log")
        .contains("changed or went since it was read"));
    assert!(sigterm(&mut obs).success());
}

#[test]
fn observer_judges_a_record_its_node_cache_cannot_explain_by_a_fresh_read() {
    let w = World::new();
    let mut obs = w.observed_records(&["a"], "1s");
    // A new Node the cache does not get to see yet, and its broker's record.
    w.api.pause_watches();
    let d = w.api.add_node("d");
    w.api.with(|s| drop(s.put_record("d", &d, spec(&d))));
    // Several resyncs judge d against a cache without it: each reads Node d afresh and keeps the record.
    wait::until(
        "a resync judged d",
        || w.read_log("observer.log"),
        |log| {
            log.matches("NodeRailRecord d: stale by the Node cache, current by a fresh read")
                .count()
                >= 2
        },
    );
    assert!(
        w.nrr("d").is_some(),
        "a record is never deleted on the cache's word alone"
    );
    w.api.resume_watches();
    assert!(sigterm(&mut obs).success());
    assert!(record_deletes(&w.api).is_empty());
}

#[test]
fn observer_without_the_crd_is_unready_naming_the_fix_and_recovers_once_it_exists() {
    let w = World::new();
    w.api.add_node("a");
    let port = free_port();
    let mut obs = w.spawn_logged(
        w.cr_observe("1s")
            .args(["--health-addr", &format!("127.0.0.1:{port}")]),
        "observer.log",
    );
    w.await_log("the pass failed", "observer.log", "not installed");
    assert!(w
        .read_log("observer.log")
        .contains("nodefabric crd | kubectl apply -f -"));
    assert_eq!(probe(port, "/readyz"), Some(503));
    w.api.install_crd();
    w.api
        .with(|s| drop(s.put_record("gone", "u-gone", spec("u-gone"))));
    wait::until(
        "a resync deleted the stale record",
        || w.nrr("gone"),
        Option::is_none,
    );
    wait::until(
        "ready",
        || probe(port, "/readyz"),
        |code| *code == Some(200),
    );
    assert!(sigterm(&mut obs).success());
}

#[test]
fn observer_delete_refused_or_beaten_by_the_garbage_collector() {
    let w = World::new();
    let mut obs = w.observed_records(&["a", "b"], "10m");
    // The garbage collector deletes b's record between the observer's list and its delete: a 404, not an error.
    w.api.fault(
        "DELETE",
        &format!("{NRR_PATH}/b"),
        Action::Before(Box::new(|s| drop(s.collect_garbage()))),
    );
    w.api.delete_node("b");
    wait::until(
        "the delete found it gone",
        || record_deletes(&w.api),
        |sent| sent.iter().any(|d| d.status == 404),
    );
    assert!(w.nrr("b").is_none());
    // A refused delete names the missing permission, and the record stays.
    w.api
        .fault("DELETE", &format!("{NRR_PATH}/a"), Action::Respond(403));
    w.api.delete_node("a");
    w.await_log(
        "the refusal is logged",
        "observer.log",
        "needs `delete` on noderailrecords",
    );
    assert!(w.nrr("a").is_some());
    assert!(sigterm(&mut obs).success());
}

#[test]
fn observer_pages_through_more_records_than_one_list_holds_and_survives_an_expired_continue() {
    let w = World::new();
    w.api.install_crd();
    const N: usize = 1100; // three pages of 500
    let uids: Vec<String> = (0..N)
        .map(|i| w.api.add_node(&format!("n{i:04}")))
        .collect();
    let stale = [0, 600, N - 1];
    w.api.with(|s| {
        for (i, uid) in uids.iter().enumerate() {
            let owner = if stale.contains(&i) {
                format!("old-{i}")
            } else {
                uid.clone()
            };
            s.put_record(&format!("n{i:04}"), &owner, spec(&owner));
        }
    });
    // The second page's continue token has expired: the list starts over.
    w.api
        .fault_where("GET", NRR_PATH, Some("continue="), Action::Respond(410));
    let mut obs = w.cr_observer("observer.log", "10m");
    for i in stale {
        wait::until(
            &format!("stale record {i} is deleted"),
            || w.nrr(&format!("n{i:04}")),
            Option::is_none,
        );
    }
    assert_eq!(
        w.api.with(|s| (0..N)
            .filter(|i| s.record(&format!("n{i:04}")).is_some())
            .count()),
        N - 3
    );
    let lists = record_lists(&w.api);
    assert!(
        lists.iter().any(|l| l.status == 410)
            && lists
                .iter()
                .filter(|l| l.query.contains("continue="))
                .count()
                >= 2,
        "{lists:?}"
    );
    assert!(w
        .read_log("observer.log")
        .contains("listing again from the start"));
    assert!(sigterm(&mut obs).success());
}

// ---- the watch example ---------------------------------------------------------

/// The example a scheduler extension would start from
/// (examples/watch_rail_records.rs), where a whole `cargo test` builds it.
/// (Building it from here would build it without the dev-dependencies'
/// features, and each build would undo the other's.)
fn example(name: &str) -> PathBuf {
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    deps.parent().unwrap().join("examples").join(name)
}

#[test]
fn the_watch_example_sees_each_record_a_broker_applies_and_deletes() {
    let w = World::new();
    w.api.install_crd();
    w.api.add_node("node-a");
    let bin = example("watch_rail_records");
    let missing = (!bin.exists()).then(|| {
        format!(
            "{} is built by a whole `cargo test`, not by --test cluster alone",
            bin.display()
        )
    });
    if !host::runnable(
        "the_watch_example_sees_each_record_a_broker_applies_and_deletes",
        missing,
    ) {
        return;
    }
    let out = w.dir.join("example.out");
    let mut watcher = Command::new(&bin)
        .env("KUBECONFIG", &w.kubeconfig)
        .stdout(fs::File::create(&out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    ok(w.cr_broker("node-a", "lldp.json").output().unwrap());
    wait::until(
        "the example printed node-a's record",
        || fs::read_to_string(&out).unwrap(),
        |printed| printed.contains("node-a: 8 GPUs, 8 NICs; "),
    );
    ok(w.cr_broker("node-a", "none.json").output().unwrap());
    wait::until(
        "the example printed the deletion",
        || fs::read_to_string(&out).unwrap(),
        |printed| printed.contains("node-a: deleted"),
    );
    let _ = watcher.kill();
    let _ = watcher.wait();
}
