//! The observer's clean-up of NodeRailRecords whose Node is gone or was
//! replaced (`observe --rails-record custom-resource`).
//!
//! Kubernetes' garbage collector deletes a record once its owner Node is
//! gone, but it may be disabled, slow or behind; the observer does not rely
//! on it. A record is stale when no Node of its name exists, or when the
//! UID of its `kind: Node` ownerReference is not the Node's current UID.
//!
//! Two guards keep a live record safe:
//! - The Node watch cache only picks candidates. Each is judged again
//!   against a fresh read of its one Node, which is newer than the record
//!   listed before it (resourceVersions of different resources are not
//!   compared: the API calls them opaque). So the record of a Node the cache
//!   has not seen yet is kept, and the cost stays one read per stale record.
//! - The delete carries `uid` and `resourceVersion` preconditions: those of
//!   the object judged. A record re-created meanwhile (new uid) or
//!   re-applied in place (same uid, new resourceVersion) by the new Node's
//!   broker fails them (409) and stays.
//!
//! Records are listed as metadata only, in pages, so 10,000 records cost a
//! few MiB, and requests beyond the list grow with the stale records alone.

use super::stale_keys::{node_now, Cleanup, Nodes};
use crate::cluster::node_rail_record::{
    no_resource, owner_uid, record_error, records_untyped, NodeRailRecord,
};
use crate::cluster::{code, ClusterError};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Preconditions};
use kube::{Api, Client};

/// How many records one list page carries.
const PAGE: u32 = 500;

/// What the observer needs of one record: its identity and owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordMeta {
    /// The object's name (its Node's name).
    pub name: String,
    /// The object's UID, a delete precondition.
    pub uid: String,
    /// The object's resourceVersion, a delete precondition.
    pub resource_version: String,
    /// The UID of its `kind: Node` owner, if it names one.
    pub owner: Option<String>,
}

impl RecordMeta {
    /// Takes the fields out of an object's metadata; `None` when it lacks
    /// the name, uid or resourceVersion every stored object has.
    pub fn from_meta(meta: &ObjectMeta) -> Option<RecordMeta> {
        Some(RecordMeta {
            name: meta.name.clone()?,
            uid: meta.uid.clone()?,
            resource_version: meta.resource_version.clone()?,
            owner: owner_uid(meta).map(str::to_string),
        })
    }
}

/// Why `record` is stale given `nodes`, or `None` when it is current.
pub fn why_stale(record: &RecordMeta, nodes: &Nodes) -> Option<String> {
    match (nodes.get(&record.name), &record.owner) {
        (None, _) => Some("no Node of that name exists".into()),
        // No Node owner to compare: its broker's next apply adds one.
        (Some(_), None) => None,
        (Some(uid), Some(owner)) if owner == uid => None,
        (Some(uid), Some(owner)) => Some(format!(
            "its owner UID {owner} is not Node {}'s UID {uid} (the name was reused)",
            record.name
        )),
    }
}

/// Every record's metadata, page by page (RBAC: `list` on noderailrecords).
/// `only` narrows the list to one name (a field selector).
pub async fn list(client: &Client, only: Option<&str>) -> Result<Vec<RecordMeta>, ClusterError> {
    let api: Api<NodeRailRecord> = Api::all(client.clone());
    let mut params = ListParams::default().limit(PAGE);
    if let Some(name) = only {
        params = params.fields(&format!("metadata.name={name}"));
    }
    let what = || match only {
        Some(name) => format!("LIST NodeRailRecords metadata.name={name}"),
        None => "LIST NodeRailRecords".to_string(),
    };
    let mut out = Vec::new();
    let mut restarted = false;
    loop {
        let page = match api.list_metadata(&params).await {
            Ok(page) => page,
            // The continue token outlived the server's history (a compaction
            // during a long list): start over once from a fresh list.
            Err(e) if code(&e) == Some(410) && params.continue_token.is_some() && !restarted => {
                tracing::info!(
                    "{}: the list expired mid-way ({}); listing again from the start",
                    what(),
                    crate::cluster::error::describe(&e)
                );
                restarted = true;
                out.clear();
                params.continue_token = None;
                continue;
            }
            Err(e) => return Err(record_error(what(), "`list` on noderailrecords", e)),
        };
        out.extend(
            page.items
                .iter()
                .filter_map(|o| RecordMeta::from_meta(&o.metadata)),
        );
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

/// Deletes the stale NodeRailRecords: every record, or only the one named
/// `only`. `nodes` is the watch cache, which picks the candidates.
pub async fn clean(
    client: &Client,
    nodes: &Nodes,
    only: Option<&str>,
) -> Result<Cleanup, ClusterError> {
    // Untyped: a stored record of another format version must not fail the
    // delete's answer after the server has done it.
    let api = records_untyped(client);
    let mut out = Cleanup::default();
    for record in list(client, only).await? {
        if why_stale(&record, nodes).is_none() {
            continue;
        }
        let Some(why) = why_stale(&record, &node_now(client, &record.name).await?) else {
            tracing::debug!(
                "NodeRailRecord {}: stale by the Node cache, current by a fresh read of its Node; kept",
                record.name
            );
            continue;
        };
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(record.uid.clone()),
                resource_version: Some(record.resource_version.clone()),
            }),
            ..Default::default()
        };
        let what = || format!("DELETE NodeRailRecord {}", record.name);
        match api.delete(&record.name, &params).await {
            Ok(_) => {
                tracing::info!("deleted NodeRailRecord {}: {why}", record.name);
                out.removed.push(record.name);
            }
            // A precondition failed (re-created or re-applied since the
            // list), or it is gone already (the garbage collector was first);
            // a 404 for the whole resource (the CRD removed) is an error.
            Err(e) if code(&e) == Some(409) || (code(&e) == Some(404) && !no_resource(&e)) => {
                tracing::info!(
                    "NodeRailRecord {} not deleted: it changed or went since it was read ({})",
                    record.name,
                    crate::cluster::error::describe(&e)
                );
                out.changed.push(record.name);
            }
            Err(e) => return Err(record_error(what(), "`delete` on noderailrecords", e)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, owner: Option<&str>, rv: &str) -> RecordMeta {
        RecordMeta {
            name: name.into(),
            uid: format!("r-{name}"),
            resource_version: rv.into(),
            owner: owner.map(str::to_string),
        }
    }

    #[test]
    fn records_of_gone_and_replaced_nodes_are_stale_and_current_ones_are_not() {
        let nodes = Nodes::from([
            ("alive".to_string(), "u-alive".to_string()),
            ("reused".to_string(), "u-new".to_string()),
            ("unowned".to_string(), "u-x".to_string()),
        ]);
        assert_eq!(why_stale(&rec("alive", Some("u-alive"), "1"), &nodes), None);
        assert_eq!(why_stale(&rec("unowned", None, "1"), &nodes), None);
        let gone = why_stale(&rec("gone", Some("u-gone"), "1"), &nodes).unwrap();
        assert!(gone.contains("no Node"), "{gone}");
        let reused = why_stale(&rec("reused", Some("u-old"), "1"), &nodes).unwrap();
        assert!(
            reused.contains("u-old") && reused.contains("u-new"),
            "{reused}"
        );
        // Without a Node owner, a record is still stale once its Node is gone.
        assert!(why_stale(&rec("gone", None, "1"), &nodes).is_some());
    }
}
