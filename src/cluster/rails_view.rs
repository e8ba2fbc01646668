//! Reads every rail record the cluster holds, in both forms, and the Nodes
//! they are for: what `kubectl nodefabric rails` shows. One list (or get)
//! per resource kind, all three at once, so a 2,000-node cluster answers in
//! three requests.

use super::node_rail_record::{no_resource, owner_uid, NodeRailRecord};
use super::ConfigMapRef;
use super::{code, ClusterError};
use crate::views::cluster::StoredRecord;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use kube::Client;
use kube::Resource;
use serde::Deserialize;
use std::collections::BTreeMap;

/// What the cluster holds.
#[derive(Debug, Clone, Default)]
pub struct ClusterRails {
    /// Node name → UID.
    pub nodes: BTreeMap<String, String>,
    /// Every record, from the ConfigMap's keys and the NodeRailRecords.
    pub records: Vec<StoredRecord>,
    /// False when the ConfigMap does not exist.
    pub configmap_found: bool,
    /// False when the API server does not serve NodeRailRecords (no CRD).
    pub crd_found: bool,
}

/// Reads the Nodes, the ConfigMap `cm` and the NodeRailRecords.
pub async fn read(client: &Client, cm: &ConfigMapRef) -> Result<ClusterRails, ClusterError> {
    let namespace = cm
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let nodes_api: Api<Node> = Api::all(client.clone());
    let cm_api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    // No page limit: one request per kind (a Node's metadata is small, and
    // a 2,000-node list is a few MiB at most).
    let all = ListParams::default();
    let (nodes, map, records) = tokio::join!(
        nodes_api.list_metadata(&all),
        cm_api.get_opt(&cm.name),
        list_records(client, &all)
    );
    let nodes = nodes.map_err(|e| ClusterError::api("LIST Nodes", e))?;
    let shown = format!("{namespace}/{}", cm.name);
    let map = map.map_err(|e| ClusterError::api(format!("GET ConfigMap {shown}"), e))?;
    let mut out = ClusterRails {
        nodes: nodes
            .items
            .into_iter()
            .filter_map(|n| Some((n.metadata.name?, n.metadata.uid?)))
            .collect(),
        configmap_found: map.is_some(),
        ..ClusterRails::default()
    };
    let form = format!("ConfigMap {shown}");
    for (node, value) in map.and_then(|m| m.data).unwrap_or_default() {
        out.records.push(StoredRecord {
            node,
            form: form.clone(),
            record: serde_json::from_str(&value).map_err(|e| e.to_string()),
            owner_uid: None,
        });
    }
    match records {
        Ok(list) => {
            out.crd_found = true;
            for o in list.items {
                let Some(node) = o.metadata.name.clone() else {
                    continue;
                };
                out.records.push(StoredRecord {
                    node,
                    form: "NodeRailRecord".into(),
                    record: o.spec.map_or_else(
                        || Err("the object has no spec".to_string()),
                        |raw| serde_json::from_str(raw.get()).map_err(|e| e.to_string()),
                    ),
                    owner_uid: owner_uid(&o.metadata).map(str::to_string),
                });
            }
        }
        Err(e) if code(&e) == Some(404) && no_resource(&e) => {}
        Err(e) => return Err(ClusterError::api("LIST NodeRailRecords", e)),
    }
    Ok(out)
}

/// A NodeRailRecord list as it comes: each spec kept as its raw text and
/// parsed on its own after, so one record of another format is one row's
/// error, not the list's; kube's typed and dynamic objects are not used
/// because their flattened fields buffer every object once more (at 2,000
/// records that was most of the command's time).
#[derive(Deserialize)]
struct RecordList {
    items: Vec<RecordItem>,
}

/// One item of [`RecordList`].
#[derive(Deserialize)]
struct RecordItem {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<Box<serde_json::value::RawValue>>,
}

/// Every NodeRailRecord, in one request.
async fn list_records(client: &Client, params: &ListParams) -> Result<RecordList, kube::Error> {
    let request = kube::core::Request::new(NodeRailRecord::url_path(&(), None))
        .list(params)
        .map_err(kube::Error::BuildRequest)?;
    client.request::<RecordList>(request).await
}
