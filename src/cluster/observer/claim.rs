//! The observer's claim on the shared ConfigMap: it creates it with a
//! controller ownerReference to its own Deployment (so deleting the
//! Deployment garbage-collects the records) and never adopts a same-named
//! object that someone else made.

use crate::cluster::{code, ClusterError, ConfigMapRef, FIELD_MANAGER};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::PostParams;
use kube::{Api, Client};
use std::collections::BTreeMap;

/// The observer's Deployment, the ConfigMap's controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// `NAMESPACE/NAME`, for messages.
    pub display: String,
    /// Its name.
    pub name: String,
    /// Its UID, what the ownerReference must carry.
    pub uid: String,
}

impl Owner {
    /// The controller ownerReference the ConfigMap carries. No
    /// `blockOwnerDeletion`: setting it needs `update` on the Deployment's
    /// finalizers, which the observer does not otherwise need.
    pub fn reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            controller: Some(true),
            block_owner_deletion: None,
        }
    }
}

/// Reads Deployment `name` in `namespace` for its UID (RBAC: `get` on it).
pub async fn deployment(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Owner, ClusterError> {
    let what = format!("GET Deployment {namespace}/{name}");
    let d = Api::<Deployment>::namespaced(client.clone(), namespace)
        .get_metadata(name)
        .await
        .map_err(|e| match code(&e) {
            Some(404) => ClusterError::Malformed {
                what: what.clone(),
                message:
                    "no such Deployment: --owner-deployment names the observer's own Deployment"
                        .into(),
            },
            _ => ClusterError::refused(what.clone(), format!("`get` on the Deployment {name}"), e),
        })?;
    let uid = d
        .metadata
        .uid
        .filter(|u| !u.is_empty())
        .ok_or_else(|| ClusterError::Malformed {
            what,
            message: "the answer has no metadata.uid".into(),
        })?;
    Ok(Owner {
        display: format!("{namespace}/{name}"),
        name: name.to_string(),
        uid,
    })
}

/// Makes sure the ConfigMap exists under `owner`'s control: creates it when
/// absent, accepts it when `owner` is its controller, refuses otherwise
/// (without changing anything). `cm` must carry its namespace.
pub async fn ensure(client: &Client, cm: &ConfigMapRef, owner: &Owner) -> Result<(), ClusterError> {
    let ns = cm.namespace.as_deref().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let get = |e: kube::Error| {
        ClusterError::refused(
            format!("GET ConfigMap {cm}"),
            "`get` on configmaps in its namespace",
            e,
        )
    };
    if let Some(existing) = api.get_opt(&cm.name).await.map_err(get)? {
        return check(cm, owner, &existing);
    }
    let fresh = ConfigMap {
        metadata: ObjectMeta {
            name: Some(cm.name.clone()),
            namespace: Some(ns.to_string()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "nodefabric".to_string(),
            )])),
            owner_references: Some(vec![owner.reference()]),
            ..Default::default()
        },
        ..Default::default()
    };
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match api.create(&params, &fresh).await {
        Ok(_) => {
            tracing::info!(
                "created ConfigMap {cm}, controlled by Deployment {}",
                owner.display
            );
            Ok(())
        }
        // Made meanwhile (another observer replica, or someone else): judge it like any existing one.
        Err(e) if code(&e) == Some(409) => check(cm, owner, &api.get(&cm.name).await.map_err(get)?),
        Err(e) => Err(ClusterError::refused(
            format!("POST ConfigMap {cm}"),
            "`create` on configmaps in its namespace",
            e,
        )),
    }
}

/// Accepts `existing` only when `owner` (by UID) is its controller.
pub fn check(cm: &ConfigMapRef, owner: &Owner, existing: &ConfigMap) -> Result<(), ClusterError> {
    let refs = existing
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default();
    let controller = refs.iter().find(|r| r.controller == Some(true));
    match controller {
        Some(r) if r.uid == owner.uid && r.kind == "Deployment" => Ok(()),
        Some(r) => Err(not_owned(
            cm,
            owner,
            format!("its controller is {} {} (uid {})", r.kind, r.name, r.uid),
        )),
        None => Err(not_owned(
            cm,
            owner,
            "it has no controller ownerReference".into(),
        )),
    }
}

fn not_owned(cm: &ConfigMapRef, owner: &Owner, found: String) -> ClusterError {
    ClusterError::NotOwned {
        cm: cm.clone(),
        deployment: owner.display.clone(),
        uid: owner.uid.clone(),
        found,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Owner {
        Owner {
            display: "ns/observer".into(),
            name: "observer".into(),
            uid: "u-1".into(),
        }
    }

    fn cm_with(refs: Option<Vec<OwnerReference>>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                owner_references: refs,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn ownership_conflict_an_unowned_configmap_is_refused() {
        let cm = ConfigMapRef::parse("ns/rails").unwrap();
        let e = check(&cm, &owner(), &cm_with(None))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ns/rails")
                && e.contains("no controller")
                && e.contains("refusing to adopt"),
            "{e}"
        );
    }

    #[test]
    fn ownership_conflict_a_same_named_deployment_with_another_uid_is_refused() {
        let cm = ConfigMapRef::parse("ns/rails").unwrap();
        let stale = Owner {
            uid: "u-0".into(),
            ..owner()
        };
        let e = check(&cm, &owner(), &cm_with(Some(vec![stale.reference()])))
            .unwrap_err()
            .to_string();
        assert!(e.contains("uid u-0"), "{e}");
        // A non-controller reference to the right owner is not control either.
        let weak = OwnerReference {
            controller: None,
            ..owner().reference()
        };
        assert!(check(&cm, &owner(), &cm_with(Some(vec![weak]))).is_err());
        assert!(check(&cm, &owner(), &cm_with(Some(vec![owner().reference()]))).is_ok());
    }
}
