//! The NFD example rule matches only keys and values `nodefabric` publishes:
//! run on the 8-GPU fixture, the rule's every expression is satisfied.

use crate::support::fixtures;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

#[test]
fn the_example_rule_matches_labels_nodefabric_writes() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("nfd-hooks/nodefeaturerule.yaml");
    let rule: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(rule["kind"], "NodeFeatureRule");

    let tmp = tempfile::tempdir().unwrap();
    fixtures::gpu8_switch_paired(tmp.path());
    let out = Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .args(["features", "--sysfs-root", tmp.path().to_str().unwrap()])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    assert!(out.status.success());
    let labels: BTreeMap<String, String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();

    let mut checked = 0;
    for r in rule["spec"]["rules"].as_array().unwrap() {
        for m in r["matchFeatures"].as_array().unwrap() {
            assert_eq!(
                m["feature"], "local.label",
                "the local source is where features.d labels appear"
            );
            for (key, expr) in m["matchExpressions"].as_object().unwrap() {
                let value = labels.get(key).unwrap_or_else(|| {
                    panic!("{key} is not a label nodefabric writes: {labels:?}")
                });
                assert_eq!(expr["op"], "In");
                let allowed: Vec<&str> = expr["value"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap())
                    .collect();
                assert!(
                    allowed.contains(&value.as_str()),
                    "{key}={value} not in {allowed:?}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 2);
}
