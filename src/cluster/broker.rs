//! The broker's one write: this node's key of the shared ConfigMap, or (with
//! `--rails-record custom-resource`) this node's own NodeRailRecord.
//!
//! A JSON merge patch `{"data": {"NODE": record}}` (`null` to remove) touches
//! only that key, so brokers of many nodes patch at once without reading and
//! rewriting the object. A JSON Patch would not do: `add /data/NODE` is
//! refused (422) while the ConfigMap has no `data` yet, and `remove` of an
//! absent key is refused too; a merge patch has neither problem.

use super::record::NodeRailRecord;
use super::{code, ClusterError, ConfigMapRef, CONFIGMAP_LIMIT, FIELD_MANAGER};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

/// What the broker writes under its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publication<'a> {
    /// The record's bytes (the JSON `nodefabric rails` prints).
    Record(&'a str),
    /// An empty rail result: the key goes (absent already is fine).
    Remove,
}

/// Sets (or removes) key `node` of the ConfigMap `cm`; on any error the
/// ConfigMap is unchanged, since a patch applies whole or not at all.
pub async fn publish(
    client: &Client,
    cm: &ConfigMapRef,
    node: &str,
    what: Publication<'_>,
) -> Result<(), ClusterError> {
    let cm = cm.resolved(client);
    let api: Api<ConfigMap> =
        Api::namespaced(client.clone(), cm.namespace.as_deref().unwrap_or_default());
    let (value, size) = match what {
        Publication::Record(r) => (json!(r), node.len() + r.len()),
        Publication::Remove => (serde_json::Value::Null, 0),
    };
    let patch = json!({ "data": { node: value } });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let request = format!("PATCH ConfigMap {cm} key {node}");
    match api.patch(&cm.name, &params, &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(e) => Err(match code(&e) {
            Some(404) => ClusterError::NoConfigMap(cm),
            Some(403) => ClusterError::Forbidden {
                what: request,
                needs: format!("`patch` on the ConfigMap {} (resourceNames)", cm.name),
                message: e.to_string(),
            },
            Some(422) if too_long(&e) => ClusterError::TooLarge {
                cm,
                node: node.to_string(),
                size,
                message: status_message(&e),
            },
            _ => ClusterError::api(request, e),
        }),
    }
}

/// Whether a 422 is the size check: the validation cause `FieldValueTooLong`
/// (or, from a server that sends no causes, its message).
fn too_long(e: &kube::Error) -> bool {
    let kube::Error::Api(s) = e else { return false };
    let by_cause = s
        .details
        .as_ref()
        .is_some_and(|d| d.causes.iter().any(|c| c.reason == "FieldValueTooLong"));
    by_cause || s.message.contains("Too long") || s.message.contains(&CONFIGMAP_LIMIT.to_string())
}

fn status_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

/// Server-side-applies this node's NodeRailRecord (created when absent):
/// the record as spec, its Node (by the record's nodeUID) as owner. Forced:
/// the broker is the record's only writer, and a hand edit must not pin a
/// stale rail. On any error the previous object stays as it was.
pub async fn apply_record(
    client: &Client,
    node: &str,
    record: &crate::rails::RailRecord,
) -> Result<(), ClusterError> {
    let api: Api<NodeRailRecord> = Api::all(client.clone());
    let object = super::record::object(node, record);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let request = format!("APPLY NodeRailRecord {node}");
    match api.patch(node, &params, &Patch::Apply(&object)).await {
        Ok(_) => Ok(()),
        Err(e) => Err(record_error(
            request,
            "`patch` (and `create`) on noderailrecords",
            e,
        )),
    }
}

/// NodeRailRecords without their type: for deletes, whose answer (the
/// object as it was) may be of another format version than this build's.
pub(crate) fn records_untyped(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<NodeRailRecord>(&()))
}

/// Deletes this node's NodeRailRecord (an empty rail result); absent is fine.
pub async fn delete_record(client: &Client, node: &str) -> Result<(), ClusterError> {
    let api = records_untyped(client);
    match api.delete(node, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(e) if code(&e) == Some(404) && !no_resource(&e) => Ok(()),
        Err(e) => Err(record_error(
            format!("DELETE NodeRailRecord {node}"),
            "`delete` on noderailrecords",
            e,
        )),
    }
}

/// Names what a refused NodeRailRecord request needs: a missing CRD, a
/// missing permission (`needs`), or the API's own answer.
pub(crate) fn record_error(request: String, needs: &str, e: kube::Error) -> ClusterError {
    match code(&e) {
        Some(404) if no_resource(&e) => ClusterError::NoCrd {
            what: request,
            message: status_message(&e),
        },
        Some(403) => ClusterError::Forbidden {
            what: request,
            needs: needs.to_string(),
            message: e.to_string(),
        },
        _ => ClusterError::api(request, e),
    }
}

/// Whether a 404 says the resource type is unknown (no CRD installed)
/// rather than that one object is absent: the API server answers an unknown
/// path in plain text ("404 page not found", which kube-rs turns into a
/// Status without details), an absent object with `details.name`.
pub(crate) fn no_resource(e: &kube::Error) -> bool {
    let kube::Error::Api(s) = e else { return false };
    s.details.as_ref().is_none_or(|d| d.name.is_empty())
}
