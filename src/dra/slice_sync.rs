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
use super::shares::{self, Shares};
use super::slices::{self, Owner};
use super::taints::{self, TaintRule};
use crate::cluster::ClusterError;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use kube::{Api, Client};
use tracing::{info, warn};

/// What one reconcile did: named apart from the spec loader's
/// [`crate::kubelet::specs::Outcome`], which is what one look at the CDI
/// folder found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reconciled {
    /// Slices created (the new generation).
    pub created: usize,
    /// Slices changed in place (the same devices, same generation).
    pub updated: usize,
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
    rule: TaintRule,
    shares: Shares,
    last: Option<LastWrite>,
    /// What the server dropped of the last write, said once until it keeps
    /// everything again.
    dropped: Option<Dropped>,
    /// The highest generation this process wrote: after kubelet's wipe the
    /// next generation still counts up, so no reader takes it for an old one.
    written: i64,
}

impl Reconciler {
    /// A reconciler for `node`'s pool of `rule.driver`, tainted by `rule`,
    /// its whole NICs shared as `shares` says.
    pub fn new(client: Client, node: &str, rule: TaintRule, shares: Shares) -> Reconciler {
        Reconciler {
            slices: Api::all(client.clone()),
            nodes: Api::all(client),
            node: node.to_string(),
            rule,
            shares,
            last: None,
            dropped: None,
            written: 0,
        }
    }

    /// The feature gates whose fields the API server dropped from the last
    /// write (`DRADeviceTaints` and `DRAConsumableCapacity` are told
    /// apart), for the metric.
    pub fn dropped_gates(&self) -> &[&'static str] {
        match &self.dropped {
            Some(Dropped::Gates(gates)) => gates.as_slice(),
            _ => &[],
        }
    }

    /// Makes the server's slices the pool; writes nothing when they are.
    pub async fn reconcile(&mut self, pool: &Pool) -> Result<Reconciled, ClusterError> {
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
        let selector = format!(
            "spec.nodeName={},spec.driver={}",
            self.node, self.rule.driver
        );
        let existing = self
            .slices
            .list(&ListParams::default().fields(&selector))
            .await
            .map_err(|e| ClusterError::api(format!("listing ResourceSlices ({selector})"), e))?
            .items;
        let wanted = slices::devices(pool, &self.rule, self.shares);
        // Only slices this Node owns, at a generation the next write can
        // exceed, are the pool as we left it. Anything else under our
        // driver and node (another account's slice, a generation of
        // i64::MAX) is foreign: it is deleted below, and never the base of
        // the next generation, so no slice content can stop the driver.
        let ours = |s: &&ResourceSlice| {
            s.spec.pool.name == self.node
                && owned_by(s, &owner)
                && exceedable(s.spec.pool.generation)
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
            .filter(|g| exceedable(*g))
            .max();
        // A foreign slice above ours would be the pool to the scheduler.
        let on_server = if latest.is_some() && highest == latest {
            slices::published_devices(&current)
        } else {
            None
        };
        let in_place = on_server.as_ref().is_some_and(|on_server| {
            *on_server == taints::stamped(&wanted, on_server)
                || self
                    .last
                    .as_ref()
                    .is_some_and(|l| l.sent == digest(&wanted) && l.kept == digest(on_server))
        });
        // The same devices, only some changed (a link failing: its taint
        // and linkState): the slices that hold a changed device are updated
        // in place, at the same generation (the KEP allows it), so a link
        // failing rewrites one slice, not the pool.
        let same_devices = !in_place
            && on_server.as_ref().is_some_and(|on_server| {
                on_server
                    .iter()
                    .map(|d| &d.name)
                    .eq(wanted.iter().map(|d| &d.name))
            });
        let (keep, created, updated, generation) = if in_place {
            (current, 0, 0, latest.unwrap_or_default())
        } else if let (true, Some(generation)) = (same_devices, latest) {
            match self
                .update_in_place(pool, &owner, generation, &current, &wanted)
                .await?
            {
                Some((kept, updated)) => (kept, 0, updated, generation),
                None => {
                    let generation = self.next_generation(highest);
                    let made = self.create(pool, &owner, generation, &wanted).await?;
                    let n = made.len();
                    (made, n, 0, generation)
                }
            }
        } else {
            // Above every generation of the pool that can be exceeded, a
            // foreign one included, so the scheduler takes ours even while a
            // foreign slice resists deletion; starting over at 1 is the
            // answer should nothing be below i64::MAX.
            let generation = self.next_generation(highest);
            let made = self.create(pool, &owner, generation, &wanted).await?;
            let n = made.len();
            (made, n, 0, generation)
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
        Ok(Reconciled {
            created,
            updated,
            deleted,
            generation,
        })
    }

    /// The generation after `highest` (the pool's highest that can be
    /// exceeded) and every one this process wrote.
    fn next_generation(&self, highest: Option<i64>) -> i64 {
        highest
            .unwrap_or(0)
            .max(self.written)
            .checked_add(1)
            .unwrap_or(1)
    }

    /// Updates in place each slice of `current` whose devices changed;
    /// `None` when the slices are not cut as the pool would be now (then a
    /// new generation is written instead). Returns the slices as kept and
    /// how many were written.
    async fn update_in_place(
        &mut self,
        pool: &Pool,
        owner: &Owner,
        generation: i64,
        current: &[ResourceSlice],
        wanted: &[Device],
    ) -> Result<Option<(Vec<ResourceSlice>, usize)>, ClusterError> {
        let names = |devices: Option<&Vec<Device>>| -> Vec<String> {
            devices
                .into_iter()
                .flatten()
                .map(|d| d.name.clone())
                .collect()
        };
        let desired = slices::desired(pool, &self.rule, self.shares, owner, generation);
        let mut pairs = Vec::new();
        for d in &desired {
            let want = names(d.spec.devices.as_ref());
            match current
                .iter()
                .find(|c| names(c.spec.devices.as_ref()) == want)
            {
                Some(c) => pairs.push((d, c)),
                None => return Ok(None),
            }
        }
        if pairs.len() != current.len() {
            return Ok(None);
        }
        let mut kept = Vec::new();
        let mut updated = 0;
        for (d, c) in pairs {
            let on = c.spec.devices.clone().unwrap_or_default();
            let want = taints::stamped(d.spec.devices.as_deref().unwrap_or_default(), &on);
            if want == on {
                kept.push(c.clone());
                continue;
            }
            let name = c.metadata.name.clone().unwrap_or_default();
            let mut next = c.clone();
            next.spec.devices = Some(want);
            let written = self
                .slices
                .replace(&name, &PostParams::default(), &next)
                .await
                .map_err(|e| {
                    ClusterError::api(format!("updating ResourceSlice {name} in place"), e)
                })?;
            updated += 1;
            kept.push(written);
        }
        self.noticed(wanted, &slices::devices_of(&kept));
        info!(
            pool = self.node,
            generation,
            slices = updated,
            "ResourceSlices updated in place"
        );
        Ok(Some((kept, updated)))
    }

    /// Remembers what was sent and what the server kept of it, and says
    /// once what it dropped.
    fn noticed(&mut self, wanted: &[Device], kept: &[Device]) {
        let dropped = dropped(wanted, kept);
        if let Some(what) = &dropped {
            if self.dropped.as_ref() != Some(what) {
                warn!(
                    "the API server did not keep every field of the devices it was sent: {what}; \
                     publishing on with what it keeps"
                );
            }
        }
        self.dropped = dropped;
        self.last = Some(LastWrite {
            sent: digest(wanted),
            kept: digest(kept),
        });
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
        for slice in slices::desired(pool, &self.rule, self.shares, owner, generation) {
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
        self.noticed(wanted, &kept);
        self.written = generation;
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

/// A generation the next write can exceed (the API allows any i64).
fn exceedable(generation: i64) -> bool {
    (0..i64::MAX).contains(&generation)
}

/// What the API server dropped of a write.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Dropped {
    /// Only the fields of these feature gates (`DRADeviceTaints`: the
    /// devices' taints; `DRAConsumableCapacity`: `allowMultipleAllocations`
    /// and capacity request policies): those gates are off.
    Gates(Vec<&'static str>),
    /// Something else, in words: the first device that differs.
    Other(String),
}

/// What each gate's fields being dropped means for the pool.
fn gate_consequence(gate: &str) -> &'static str {
    if gate == taints::GATE {
        "device taints were dropped: the linkState attribute still keeps Failed links out of this driver's DeviceClasses"
    } else {
        "allowMultipleAllocations and the shares capacity's request policy were dropped: each whole NIC is published exclusive, one claim at a time, as without --shares"
    }
}

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dropped::Gates(gates) => {
                for (i, gate) in gates.iter().enumerate() {
                    if i > 0 {
                        write!(f, "; ")?;
                    }
                    write!(f, "feature gate {gate} off? {}", gate_consequence(gate))?;
                }
                Ok(())
            }
            Dropped::Other(first) => write!(f, "(a DRA feature gate off?) {first}"),
        }
    }
}

/// What the server dropped of `sent` (its own stamps aside); `None` when it
/// kept all.
fn dropped(sent: &[Device], kept: &[Device]) -> Option<Dropped> {
    let sent = taints::stamped(sent, kept);
    if sent == kept {
        return None;
    }
    let lost_taints = sent.iter().any(|s| {
        s.taints.as_ref().is_some_and(|t| !t.is_empty())
            && kept
                .iter()
                .find(|k| k.name == s.name)
                .is_some_and(|k| k.taints.as_ref().is_none_or(Vec::is_empty))
    });
    let gates: Vec<&'static str> = [
        (lost_taints, taints::GATE),
        (shares::lost(&sent, kept), shares::GATE),
    ]
    .into_iter()
    .filter_map(|(lost, gate)| lost.then_some(gate))
    .collect();
    // Nothing but those gates' fields differs.
    let bare = |d: &[Device]| taints::untainted(&shares::unshared(d));
    if !gates.is_empty() && bare(&sent[..]) == bare(kept) {
        return Some(Dropped::Gates(gates));
    }
    Some(Dropped::Other(first_difference(&sent, kept)))
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
