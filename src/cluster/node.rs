//! The Node object's UID, the record's `nodeUID`: it tells a record apart
//! from one an earlier node of the same name left behind.

use super::{code, ClusterError};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};

/// Reads `metadata.uid` of Node `name` (RBAC: `get` on nodes).
pub async fn uid(client: &Client, name: &str) -> Result<String, ClusterError> {
    let what = format!("GET Node {name}");
    // Only the metadata: a Node's status (images, conditions) can be large.
    let node = Api::<Node>::all(client.clone())
        .get_metadata(name)
        .await
        .map_err(|e| match code(&e) {
            Some(404) => ClusterError::NoSuchNode(name.to_string()),
            Some(403) => ClusterError::Forbidden {
                what: what.clone(),
                needs: "`get` on nodes".into(),
                message: e.to_string(),
            },
            _ => ClusterError::api(what.clone(), e),
        })?;
    match node.metadata.uid {
        Some(uid) if !uid.is_empty() => Ok(uid),
        _ => Err(ClusterError::Malformed {
            what,
            message: "the answer has no metadata.uid".into(),
        }),
    }
}
