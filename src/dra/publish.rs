//! Keeping the node's ResourceSlices equal to the pool: read what the
//! server holds (this node's slices of this driver, by field selector),
//! write nothing when it is the pool already, and otherwise create the next
//! generation whole before deleting the old one, so the scheduler always
//! sees one complete pool.
//!
//! Kubelet deletes a driver's slices when it starts and when it loses the
//! plugin; every reconcile (on each spec change and each `--interval`) puts
//! them back. An API server that drops a field the driver sets (a feature
//! gate off) would make every reconcile a rewrite: the publisher remembers
//! what it sent and what came back, says so once, and takes the server's
//! form as "the same" from then on.

use super::devices::Pool;
use super::slices::{self, Owner};
use crate::cluster::ClusterError;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use kube::{Api, Client};
use tracing::{info, warn};

/// What one reconcile did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    /// Slices created (the new generation).
    pub created: usize,
    /// Old or foreign slices deleted.
    pub deleted: usize,
    /// The pool generation on the server now.
    pub generation: i64,
}

/// Digests of the devices last sent and of the form the server kept of
/// them: digests, not copies, so a large pool is not held three times.
struct LastWrite {
    sent: u64,
    kept: u64,
}

/// A digest of devices, from their JSON (the API types do not hash).
fn digest(devices: &[Device]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_vec(devices)
        .expect("API devices serialise")
        .hash(&mut h);
    h.finish()
}

/// Reconciles one node's pool of one driver.
pub struct Reconciler {
    slices: Api<ResourceSlice>,
    nodes: Api<Node>,
    node: String,
    driver: String,
    last: Option<LastWrite>,
    /// The highest generation this process wrote: after kubelet's wipe the
    /// next generation still counts up, so no reader takes it for an old one.
    written: i64,
}

impl Reconciler {
    /// A reconciler for `node`'s pool of `driver`.
    pub fn new(client: Client, node: &str, driver: &str) -> Reconciler {
        Reconciler {
            slices: Api::all(client.clone()),
            nodes: Api::all(client),
            node: node.to_string(),
            driver: driver.to_string(),
            last: None,
            written: 0,
        }
    }

    /// Makes the server's slices the pool; writes nothing when they are.
    pub async fn reconcile(&mut self, pool: &Pool) -> Result<Outcome, ClusterError> {
        let node = self
            .nodes
            .get_opt(&self.node)
            .await
            .map_err(|e| ClusterError::api(format!("reading Node {}", self.node), e))?
            .ok_or_else(|| ClusterError::NoSuchNode(self.node.clone()))?;
        let owner = Owner {
            name: self.node.clone(),
            uid: node.metadata.uid.unwrap_or_default(),
        };
        let selector = format!("spec.nodeName={},spec.driver={}", self.node, self.driver);
        let existing = self
            .slices
            .list(&ListParams::default().fields(&selector))
            .await
            .map_err(|e| ClusterError::api(format!("listing ResourceSlices ({selector})"), e))?
            .items;
        let wanted = slices::devices(pool);
        // Only slices this Node owns, at a generation the next write can
        // exceed, are the pool as we left it. Anything else under our
        // driver and node (another account's slice, a generation of
        // i64::MAX) is foreign: it is deleted below, and never the base of
        // the next generation, so no slice content can stop the driver.
        let ours = |s: &&ResourceSlice| {
            s.spec.pool.name == self.node
                && owned_by(s, &owner)
                && (0..i64::MAX).contains(&s.spec.pool.generation)
        };
        let latest = existing
            .iter()
            .filter(ours)
            .map(|s| s.spec.pool.generation)
            .max();
        let current: Vec<ResourceSlice> = existing
            .iter()
            .filter(ours)
            .filter(|s| Some(s.spec.pool.generation) == latest)
            .cloned()
            .collect();
        let highest = existing
            .iter()
            .filter(|s| s.spec.pool.name == self.node)
            .map(|s| s.spec.pool.generation)
            .filter(|g| (0..i64::MAX).contains(g))
            .max();
        // A foreign slice above ours would be the pool to the scheduler.
        let in_place = latest.is_some()
            && highest == latest
            && slices::published_devices(&current).is_some_and(|on_server| {
                on_server == wanted
                    || self
                        .last
                        .as_ref()
                        .is_some_and(|l| l.sent == digest(&wanted) && l.kept == digest(&on_server))
            });
        let (keep, created, generation) = if in_place {
            (current, 0, latest.unwrap_or_default())
        } else {
            // Above every generation of the pool that can be exceeded, a
            // foreign one included, so the scheduler takes ours even while a
            // foreign slice resists deletion; starting over at 1 is the
            // answer should nothing be below i64::MAX.
            let generation = highest
                .unwrap_or(0)
                .max(self.written)
                .checked_add(1)
                .unwrap_or(1);
            let made = self.create(pool, &owner, generation, &wanted).await?;
            let n = made.len();
            (made, n, generation)
        };
        let mut deleted = 0;
        for old in &existing {
            if keep.iter().any(|k| k.metadata.uid == old.metadata.uid) {
                continue;
            }
            if self.delete(old).await? {
                deleted += 1;
            }
        }
        Ok(Outcome {
            created,
            deleted,
            generation,
        })
    }

    /// Creates one generation of the pool; returns the slices as created.
    async fn create(
        &mut self,
        pool: &Pool,
        owner: &Owner,
        generation: i64,
        wanted: &[Device],
    ) -> Result<Vec<ResourceSlice>, ClusterError> {
        let mut made = Vec::new();
        for slice in slices::desired(pool, &self.driver, owner, generation) {
            let created = self
                .slices
                .create(&PostParams::default(), &slice)
                .await
                .map_err(|e| {
                    ClusterError::api(
                        format!(
                            "creating a ResourceSlice of pool {} generation {generation}",
                            self.node
                        ),
                        e,
                    )
                })?;
            made.push(created);
        }
        let kept = slices::devices_of(&made);
        if kept != wanted {
            let already = self.last.as_ref().is_some_and(|l| l.kept != l.sent);
            if !already {
                warn!(
                    "the API server did not keep every field of the devices it was sent \
                     (a DRA feature gate off?): {}; publishing on with what it keeps",
                    first_difference(wanted, &kept)
                );
            }
        }
        self.written = generation;
        self.last = Some(LastWrite {
            sent: digest(wanted),
            kept: digest(&kept),
        });
        info!(
            pool = self.node,
            generation,
            slices = made.len(),
            devices = wanted.len(),
            "ResourceSlices published"
        );
        Ok(made)
    }

    /// Deletes one slice, if it is still the one listed (its UID); true when
    /// it went. Already gone or replaced is not an error.
    async fn delete(&self, slice: &ResourceSlice) -> Result<bool, ClusterError> {
        let name = slice.metadata.name.clone().unwrap_or_default();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: slice.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.slices.delete(&name, &params).await {
            Ok(_) => Ok(true),
            Err(e) if matches!(crate::cluster::error::code(&e), Some(404 | 409)) => Ok(false),
            Err(e) => Err(ClusterError::api(
                format!("deleting ResourceSlice {name}"),
                e,
            )),
        }
    }
}

/// Whether a slice names this Node (by UID) as its owner.
fn owned_by(slice: &ResourceSlice, owner: &Owner) -> bool {
    slice
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|refs| refs.iter().any(|r| r.kind == "Node" && r.uid == owner.uid))
}

/// The first device whose kept form differs from the one sent, in words.
fn first_difference(sent: &[Device], kept: &[Device]) -> String {
    for s in sent {
        match kept.iter().find(|k| k.name == s.name) {
            None => return format!("device {} was not kept", s.name),
            Some(k) if k != s => {
                let sent_attrs = s.attributes.clone().unwrap_or_default();
                let kept_attrs = k.attributes.clone().unwrap_or_default();
                let dropped: Vec<&String> = sent_attrs
                    .keys()
                    .filter(|a| !kept_attrs.contains_key(*a))
                    .collect();
                return format!("device {}: attributes dropped: {dropped:?}", s.name);
            }
            Some(_) => {}
        }
    }
    format!("{} devices sent, {} kept", sent.len(), kept.len())
}
