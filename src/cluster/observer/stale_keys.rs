//! The observer's clean-up of stale keys of the shared ConfigMap: which are stale, and their removal.
//!
//! A key is stale when no Node of that name exists, or when its record's
//! `nodeUID` is not the Node's current UID (a replaced node that reused the
//! name). The decision from the watch cache is confirmed by a fresh read of
//! the one Node before anything is removed, and the removal itself is an
//! atomic JSON Patch `[test /data/KEY == value read, remove /data/KEY]`: a
//! record written after the read (by a reused name's new broker) fails the
//! test and stays.

use super::claim::Owner;
use crate::cluster::error::describe;
use crate::cluster::{code, ClusterError, ConfigMapRef, FIELD_MANAGER};
use json_patch::jsonptr::PointerBuf;
use json_patch::{PatchOperation, RemoveOperation, TestOperation};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use std::collections::BTreeMap;

/// Node name → UID, the observer's picture of the cluster.
pub type Nodes = BTreeMap<String, String>;

/// A key judged stale, with the exact value judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stale {
    /// The data key (a Node name).
    pub key: String,
    /// The value as read; the removal is conditional on it.
    pub value: String,
    /// Why, for the log.
    pub why: String,
}

/// What one clean-up did (named for what it is, not `Outcome`: the
/// kubelet spec loader and the DRA slice publisher have their own).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cleanup {
    /// Keys removed.
    pub removed: Vec<String>,
    /// Keys whose value changed between the read and the removal: left alone.
    pub changed: Vec<String>,
}

/// The record's `nodeUID`, if the value is a JSON object carrying one. Read
/// untyped so records of any format version are judged alike.
pub fn record_uid(value: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(value).ok()?;
    v.get("nodeUID")?.as_str().map(str::to_string)
}

/// The stale keys of `data` given `nodes`, in key order; only `key` when given.
pub fn stale(data: &BTreeMap<String, String>, nodes: &Nodes, key: Option<&str>) -> Vec<Stale> {
    data.iter()
        .filter(|(k, _)| key.is_none_or(|only| only == k.as_str()))
        .filter_map(|(k, v)| {
            let why = match (nodes.get(k), record_uid(v)) {
                (None, _) => "no Node of that name exists".to_string(),
                // A record that names no UID (or is not a record) cannot be
                // judged against a living Node: its broker will rewrite it.
                (Some(_), None) => return None,
                (Some(uid), Some(r)) if r.is_empty() || &r == uid => return None,
                (Some(uid), Some(r)) => {
                    format!("its nodeUID {r} is not Node {k}'s UID {uid} (the name was reused)")
                }
            };
            Some(Stale {
                key: k.clone(),
                value: v.clone(),
                why,
            })
        })
        .collect()
}

/// The atomic test-and-remove patch for one stale key.
pub fn test_and_remove(stale: &Stale) -> json_patch::Patch {
    let path = PointerBuf::from_tokens(["data", stale.key.as_str()]);
    json_patch::Patch(vec![
        PatchOperation::Test(TestOperation {
            path: path.clone(),
            value: serde_json::Value::String(stale.value.clone()),
        }),
        PatchOperation::Remove(RemoveOperation { path }),
    ])
}

/// Removes the stale keys of ConfigMap `cm` (namespace filled in): every key,
/// or only `key`. `nodes` is the watch cache; each candidate is confirmed
/// against the Node as it is now before its removal.
/// Removes nothing, with the error a restart would give, once the ConfigMap
/// is no longer controlled by `owner` (someone replaced it or edited its
/// ownerReferences).
pub async fn clean(
    client: &Client,
    cm: &ConfigMapRef,
    owner: &Owner,
    nodes: &Nodes,
    key: Option<&str>,
) -> Result<Cleanup, ClusterError> {
    let api: Api<ConfigMap> =
        Api::namespaced(client.clone(), cm.namespace.as_deref().unwrap_or_default());
    let current = api.get(&cm.name).await.map_err(|e| match code(&e) {
        Some(404) => ClusterError::NoConfigMap(cm.clone()),
        _ => ClusterError::api(format!("GET ConfigMap {cm}"), e),
    })?;
    super::claim::check(cm, owner, &current)?;
    let data = current.data.unwrap_or_default();
    let mut out = Cleanup::default();
    for candidate in stale(&data, nodes, key) {
        let now = node_now(client, &candidate.key).await?;
        let Some(confirmed) = stale(
            &BTreeMap::from([(candidate.key.clone(), candidate.value.clone())]),
            &now,
            None,
        )
        .pop() else {
            tracing::debug!(
                "record {}: the watch was behind; Node {} is current, record kept",
                candidate.key,
                candidate.key
            );
            continue;
        };
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match api
            .patch(
                &cm.name,
                &params,
                &Patch::<()>::Json(test_and_remove(&confirmed)),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(
                    "removed record {} from ConfigMap {cm}: {}",
                    confirmed.key,
                    confirmed.why
                );
                out.removed.push(confirmed.key);
            }
            // The test failed: someone wrote a newer record (or removed it) since the read.
            Err(e) if code(&e) == Some(422) => {
                tracing::info!(
                    "record {} not removed: the test-and-remove was refused, so it changed since it was read ({})",
                    confirmed.key,
                    describe(&e)
                );
                out.changed.push(confirmed.key);
            }
            Err(e) => {
                return Err(ClusterError::api(
                    format!("PATCH ConfigMap {cm} (test-and-remove {})", confirmed.key),
                    e,
                ))
            }
        }
    }
    Ok(out)
}

/// The Node named `name` as the API server has it now (RBAC: `list`, by field selector).
pub(crate) async fn node_now(client: &Client, name: &str) -> Result<Nodes, ClusterError> {
    let params = ListParams::default().fields(&format!("metadata.name={name}"));
    let list = Api::<Node>::all(client.clone())
        .list_metadata(&params)
        .await
        .map_err(|e| ClusterError::api(format!("LIST Nodes metadata.name={name}"), e))?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|n| Some((n.metadata.name?, n.metadata.uid?)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(uid: &str) -> String {
        format!("{{\"nodeUID\": \"{uid}\", \"version\": \"rails.nodefabric.gpustack.ai/v1\"}}")
    }

    #[test]
    fn gone_and_replaced_nodes_are_stale_and_living_ones_are_not() {
        let data = BTreeMap::from([
            ("alive".to_string(), record("u-alive")),
            ("gone".to_string(), record("u-gone")),
            ("reused".to_string(), record("u-old")),
            ("no-uid".to_string(), record("")),
            ("garbage".to_string(), "not json".to_string()),
        ]);
        let nodes = Nodes::from([
            ("alive".to_string(), "u-alive".to_string()),
            ("reused".to_string(), "u-new".to_string()),
            ("no-uid".to_string(), "u-x".to_string()),
            ("garbage".to_string(), "u-g".to_string()),
        ]);
        let s = stale(&data, &nodes, None);
        assert_eq!(
            s.iter().map(|s| s.key.as_str()).collect::<Vec<_>>(),
            ["gone", "reused"]
        );
        assert_eq!(
            s[1].value,
            record("u-old"),
            "the removal is conditional on the exact value read"
        );
        assert!(
            s[1].why.contains("u-old") && s[1].why.contains("u-new"),
            "{}",
            s[1].why
        );
        assert_eq!(stale(&data, &nodes, Some("reused")).len(), 1);
        assert!(stale(&data, &nodes, Some("alive")).is_empty());
    }

    #[test]
    fn a_record_that_is_not_json_is_stale_once_its_node_is_gone() {
        let data = BTreeMap::from([("gone".to_string(), "{truncated".to_string())]);
        assert_eq!(stale(&data, &Nodes::new(), None).len(), 1);
    }

    #[test]
    fn test_and_remove_tests_the_exact_value_then_removes_and_escapes_the_key() {
        let s = Stale {
            key: "a~b".into(),
            value: record("u"),
            why: String::new(),
        };
        let v = serde_json::to_value(test_and_remove(&s)).unwrap();
        assert_eq!(
            v,
            serde_json::json!([{"op": "test", "path": "/data/a~0b", "value": record("u")}, {"op": "remove", "path": "/data/a~0b"}])
        );
        // Applied to a document whose value changed, the whole patch fails and nothing is removed.
        let mut doc = serde_json::json!({"data": {"a~b": record("u2")}});
        let before = doc.clone();
        assert!(json_patch::patch(&mut doc, &test_and_remove(&s)).is_err());
        assert_eq!(doc, before);
    }
}
