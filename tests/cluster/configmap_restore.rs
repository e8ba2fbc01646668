//! The shared ConfigMap deleted under a running observer and interval
//! publishers (issue 39, item 7): the observer re-creates its own object on
//! the deletion event, and every publisher writes its key again.

use super::support::cluster::{NS, OWNER};
use super::support::wait;
use super::{sigterm, spawn_publisher, World, CM};
use serde_json::json;
use std::collections::BTreeMap;
use std::process::Child;
use std::time::Duration;

/// `publish --interval 2s` for Node `node` under the broker's account, into
/// the shared ConfigMap; its output folders are its own.
fn publisher(w: &World, node: &str) -> Child {
    let prefix = format!("{node}-");
    spawn_publisher(w, node, &prefix, "2s", None, &["--rails-configmap", CM])
}

#[test]
fn deleted_rail_configmap_is_recreated_by_the_observer_and_every_key_is_back_within_two_intervals()
{
    let w = World::new();
    let owner_uid = w.api.add_deployment(NS, OWNER);
    let nodes = ["node-a", "node-b"];
    for n in nodes {
        w.api.add_node(n);
    }
    let mut obs = w.synced_observer(); // resync: the 10m default
    let mut publishers: Vec<Child> = nodes.iter().map(|n| publisher(&w, n)).collect();
    let every_key = |d: &Option<BTreeMap<String, String>>| {
        d.as_ref()
            .is_some_and(|d| nodes.iter().all(|n| d.contains_key(*n)))
    };
    wait::until(
        "every publisher wrote its key",
        || w.api.data(NS, CM),
        every_key,
    );
    let first = w.api.configmap(NS, CM).unwrap();

    w.api.delete_configmap(NS, CM);
    // Two 2 s intervals and some slack; far below the 10 minute resync.
    wait::until_by(
        Duration::from_secs(10),
        "the ConfigMap back with every key (and the observer's log)",
        || (w.api.data(NS, CM), w.read_log("observer.log")),
        |(d, _)| every_key(d),
    );

    // The observer's own object again: a new one, same labels, its controller.
    let again = w.api.configmap(NS, CM).unwrap();
    assert_ne!(again["metadata"]["uid"], first["metadata"]["uid"]);
    assert_eq!(
        again["metadata"]["ownerReferences"],
        json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": OWNER, "uid": owner_uid, "controller": true}])
    );
    assert_eq!(again["metadata"]["labels"], first["metadata"]["labels"]);
    let log = w.read_log("observer.log");
    assert!(
        log.contains("ConfigMap nodefabric/nodefabric-rails was deleted"),
        "the observer names what it restores: {log}"
    );
    // Nobody crashed on the way.
    for p in &mut publishers {
        assert!(p.try_wait().unwrap().is_none(), "a publisher exited");
        p.kill().unwrap();
        p.wait().unwrap();
    }
    assert!(obs.try_wait().unwrap().is_none(), "the observer exited");
    assert!(sigterm(&mut obs).success());
}
