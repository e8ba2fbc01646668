//! The second form of the cluster-wide rail record: one cluster-scoped
//! `NodeRailRecord` per node, named after the node, for clusters past the
//! shared ConfigMap's 1 MiB (about 370 nodes of 8 GPUs and 4 rails).
//!
//! The custom resource's spec is the very record `nodefabric rails` prints
//! (format version, nodeUID, railSource, nics, railIndex, gpus), and its CRD is derived
//! from those Rust types ([`crd_yaml`], `nodefabric crd`), so the schema the
//! API server validates against cannot drift from what the broker writes.
//!
//! Each object carries an ownerReference to its Node (the Node's UID; not a
//! controller reference), so Kubernetes' garbage collector removes it when
//! the Node is deleted, or replaced under the same name with a new UID.
//!
//! Here too: how a refused NodeRailRecord request is told apart (no CRD,
//! no permission), for the broker and the observer alike.

use super::error::status_message;
use super::{code, ClusterError};
use crate::rails::RailRecord;
use kube::api::{ApiResource, DynamicObject};
use kube::CustomResourceExt;
use kube::{Api, Client, CustomResource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// The API group of nodefabric's own resources.
pub const GROUP: &str = "nodefabric.gpustack.ai";

/// The label carrying the record's GPU count (the `GPUs` printer column).
pub const GPUS_LABEL: &str = "nodefabric.gpustack.ai/gpus";

/// The label carrying the record's rail count (the `Rails` printer column).
pub const RAILS_LABEL: &str = "nodefabric.gpustack.ai/rails";

/// The label carrying the record's rail source, for `kubectl get -l`
/// (a label, not a selectable field: those need Kubernetes 1.31).
pub const SOURCE_LABEL: &str = "nodefabric.gpustack.ai/rail-source";

/// The node's rail record: the same JSON `nodefabric rails` prints and the
/// shared ConfigMap holds under the node's key (version, nodeUID,
/// railSource, nics, railIndex, gpus).
// Each printer column repeats `type_ = "integer"` and the like, which clippy
// takes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[kube(
    group = "nodefabric.gpustack.ai",
    version = "v1alpha1",
    kind = "NodeRailRecord",
    plural = "noderailrecords",
    shortname = "nrr",
    category = "nodefabric",
    doc = "One node's GPU-to-NIC rail record: for every GPU and every network rail, the NICs tied at the closest PCIe path class. Named after its Node, owned by it; written by the node's nodefabric broker.",
    // Label values are strings: an integer column would print <none>.
    printcolumn(name = "GPUs", type_ = "string", json_path = ".metadata.labels.nodefabric\\.gpustack\\.ai/gpus", description = "GPUs in the record"),
    printcolumn(name = "Rails", type_ = "string", json_path = ".metadata.labels.nodefabric\\.gpustack\\.ai/rails", description = "distinct network rails"),
    printcolumn(name = "Source", type_ = "string", json_path = ".spec.railSource", description = "where rails came from: host-lldp or interface-name"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
// Atomic for server-side apply: the broker owns the whole spec, so its
// forced apply replaces every field of it, including NIC keys a hand edit
// added (in a granular map those would stay, owned by the editor).
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct NodeRailRecordSpec {
    /// The rail record, its keys at the top of the spec.
    #[serde(flatten)]
    pub record: RailRecord,
}

/// The CRD as YAML, as `deploy/crds/` holds it and `nodefabric crd` prints it.
pub fn crd_yaml() -> String {
    let crd = NodeRailRecord::crd();
    let body = serde_saphyr::to_string(&crd).expect("a CRD serialises to YAML");
    format!(
        "# Generated from the Rust type (src/cluster/node_rail_record.rs) by `nodefabric crd`;\n\
         # a test keeps this file equal to that output.\n{body}"
    )
}

/// The number of distinct rail IDs in `record`, for the `Rails` column.
pub fn rail_count(record: &RailRecord) -> usize {
    record
        .nics
        .values()
        .flatten()
        .collect::<BTreeSet<_>>()
        .len()
}

/// The object the broker applies for Node `node`: the record as spec, the
/// counts as labels, and the Node (by the record's `nodeUID`) as owner.
pub fn object(node: &str, record: &RailRecord) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": format!("{GROUP}/v1alpha1"),
        "kind": "NodeRailRecord",
        "metadata": {
            "name": node,
            "labels": {
                "app.kubernetes.io/managed-by": "nodefabric",
                GPUS_LABEL: record.gpus.len().to_string(),
                RAILS_LABEL: rail_count(record).to_string(),
                SOURCE_LABEL: record.rail_source,
            },
            // Not a controller reference and no blockOwnerDeletion: the Node
            // does not manage the record, it only bounds its life.
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Node",
                "name": node,
                "uid": record.node_uid,
            }],
        },
        "spec": record,
    })
}

/// The UID of the Node that owns a record (its `kind: Node` ownerReference).
pub fn owner_uid(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<&str> {
    meta.owner_references
        .as_deref()?
        .iter()
        .find(|r| r.kind == "Node" && r.api_version == "v1")
        .map(|r| r.uid.as_str())
}

/// NodeRailRecords without their type: for deletes, whose answer (the
/// object as it was) may be of another format version than this build's.
pub(crate) fn records_untyped(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<NodeRailRecord>(&()))
}

/// Names what a refused NodeRailRecord request needs: a missing CRD, a
/// missing permission (`needs`), or the API's own answer.
pub(crate) fn record_error(request: String, needs: &str, e: kube::Error) -> ClusterError {
    match code(&e) {
        Some(404) if no_resource(&e) => ClusterError::NoCrd {
            what: request,
            message: status_message(&e),
        },
        _ => ClusterError::refused(request, needs, e),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crd_is_cluster_scoped_with_a_structural_schema_and_the_printer_columns() {
        let crd = serde_json::to_value(NodeRailRecord::crd()).unwrap();
        assert_eq!(
            crd["metadata"]["name"],
            "noderailrecords.nodefabric.gpustack.ai"
        );
        assert_eq!(crd["spec"]["scope"], "Cluster");
        let v = &crd["spec"]["versions"][0];
        let columns: Vec<&str> = v["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(columns, ["GPUs", "Rails", "Source", "Age"]);
        let spec = &v["schema"]["openAPIV3Schema"]["properties"]["spec"];
        for key in [
            "version",
            "nodeUID",
            "railSource",
            "nics",
            "railIndex",
            "gpus",
        ] {
            assert!(
                spec["properties"].get(key).is_some(),
                "spec.{key} missing: {spec}"
            );
        }
        // A structural schema (what the API server requires) has no $ref,
        // and every node names its type, with no anyOf/oneOf carrying types.
        assert!(!crd.to_string().contains("$ref"), "{crd}");
        fn structural(path: &str, node: &serde_json::Value) {
            assert!(node.get("type").is_some(), "{path} has no type: {node}");
            for k in ["anyOf", "oneOf", "allOf"] {
                assert!(node.get(k).is_none(), "{path} has {k}");
            }
            for (name, child) in node
                .get("properties")
                .and_then(|p| p.as_object())
                .into_iter()
                .flatten()
            {
                structural(&format!("{path}.{name}"), child);
            }
            for k in ["items", "additionalProperties"] {
                if let Some(child) = node.get(k).filter(|c| c.is_object()) {
                    structural(&format!("{path}[{k}]"), child);
                }
            }
        }
        structural("", &v["schema"]["openAPIV3Schema"]);
        assert_eq!(
            spec["x-kubernetes-map-type"], "atomic",
            "the broker owns the whole spec"
        );
        // Printer columns over labels are strings (an integer column shows <none> for a string).
        for c in v["additionalPrinterColumns"].as_array().unwrap() {
            if c["jsonPath"]
                .as_str()
                .unwrap()
                .starts_with(".metadata.labels")
            {
                assert_eq!(c["type"], "string", "{c}");
            }
        }
    }

    #[test]
    fn the_rail_count_is_distinct_rails_not_nics() {
        let mut r = RailRecord {
            version: crate::rails::RAIL_RECORD_FORMAT.into(),
            node_uid: "u".into(),
            rail_source: "host-lldp".into(),
            nics: Default::default(),
            rail_index: Default::default(),
            gpus: vec![],
        };
        r.nics.insert("0000:01:00.0".into(), vec!["rail0".into()]);
        r.nics.insert("0000:02:00.0".into(), vec!["rail0".into()]);
        r.nics.insert("0000:03:00.0".into(), vec!["rail1".into()]);
        assert_eq!(rail_count(&r), 2);
        r.node_uid = "u-1".into();
        let o = object("n1", &r);
        assert_eq!(o["metadata"]["labels"][RAILS_LABEL], "2");
        assert_eq!(o["metadata"]["labels"][SOURCE_LABEL], "host-lldp");
        assert_eq!(o["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(
            o["spec"]["nodeUID"], "u-1",
            "the owner is the record's own Node"
        );
    }
}
