//! deploy/components/dra-shares rendered by the real `kubectl kustomize` on
//! top of deploy/ and the dra component: it turns on shared NICs and
//! changes nothing else.

use crate::dra_deploy::{key, kustomize};
use clap::Parser;
use nodefabric::dra::shares::DEFAULT_SHARES;
use serde_json::Value;

/// The driver container's args in `docs`.
fn dra_args(docs: &[Value]) -> Vec<String> {
    let ds = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["name"] == "nodefabric-dra")
        .expect("the nodefabric-dra DaemonSet is rendered");
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    let mut argv = vec![c["command"][0].as_str().unwrap().to_string()];
    argv.extend(
        c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().replace("$(NODE_NAME)", "node-a")),
    );
    argv
}

#[test]
fn the_shares_component_sets_the_device_plugins_64_shares_and_changes_nothing_else() {
    let test = "the_shares_component_sets_the_device_plugins_64_shares_and_changes_nothing_else";
    let dra = ["deploy/components/dra"];
    let both = ["deploy/components/dra", "deploy/components/dra-shares"];
    let (Some(exclusive), Some(shared)) = (
        kustomize(test, &["deploy"], &dra),
        kustomize(test, &["deploy"], &both),
    ) else {
        return;
    };
    assert_eq!(
        exclusive.iter().map(key).collect::<Vec<_>>(),
        shared.iter().map(key).collect::<Vec<_>>()
    );
    for (before, after) in exclusive.iter().zip(&shared) {
        if before["metadata"]["name"] != "nodefabric-dra" || before["kind"] != "DaemonSet" {
            assert_eq!(before, after, "{:?} changed", key(before));
        }
    }
    let (before, after) = (dra_args(&exclusive), dra_args(&shared));
    assert_eq!(after[..before.len()], before[..]);
    assert_eq!(after[before.len()..], ["--shares=64".to_string()]);
    // The driver's own parser: exclusive without it, 64 shares with it.
    let parse = |argv: &[String]| {
        nodefabric::dra::cli::DraCli::try_parse_from(argv)
            .unwrap_or_else(|e| panic!("{argv:?}: {e}"))
            .config()
            .shares
    };
    assert!(!parse(&before).is_shared());
    assert_eq!(parse(&after).count(), DEFAULT_SHARES);
}
