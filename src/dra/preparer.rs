//! Preparing and unpreparing claims, the work behind kubelet's DRA calls.
//!
//! Each call is a batch of claims; each claim succeeds or fails on its own,
//! with a message naming it. A call answers within kubelet's deadline
//! whatever the API server does: the claims not already prepared are read
//! at once (at most [`READ_CONCURRENCY`] at a time), each bounded by what
//! is left of the call's budget. The checkpoint's lock is never held across
//! an API read (read, then lock, re-check, write), so an Unprepare is not
//! stuck behind a Prepare that waits on the API, and the checkpoint is
//! written once per call. Idempotent: a prepared claim is answered from
//! the checkpoint; an unknown claim unprepares as done.
//!
//! A claim whose pod went away without an Unprepare (force-deleted while
//! the node was down) is swept: [`Preparer::sweep`] reads each checkpointed
//! claim and unprepares those the API no longer allocates here, under the
//! same rule: read without the lock, then lock, re-check and write once.

use super::checkpoint::{Checkpoint, CheckpointError, LoadError};
use super::claim_spec;
use super::claims::{self, ClaimError, Prepared, PreparedDevice};
use super::devices::Pool;
use super::metrics::Observed;
use super::nccl;
use super::shares::{self, Conflict};
use crate::cluster::ClusterError;
use crate::publish::PublishError;
use crate::record::LinkState;
use futures::StreamExt;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::{Api, Client};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Mutex};
use tracing::{info, warn};

/// The longest one call may take when kubelet sends no deadline: below
/// kubelet's own 45 s (`defaultClientCallTimeout`, docs/conformance.md).
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(40);

/// How many claims of one call are read from the API at once: enough that a
/// batch is not serialised behind one slow read, few enough not to flood
/// the API server with one node's start-up.
pub const READ_CONCURRENCY: usize = 16;

/// Where the driver runs, as both the preparer and the server loop read it:
/// one struct inside [`super::server::Config`], not a hand copy of its fields.
#[derive(Debug, Clone)]
pub struct Site {
    /// The driver name: allocation results of other drivers are not ours.
    pub driver: String,
    /// The node, which is the pool's name.
    pub node_name: String,
    /// Where the per-claim CDI specs go (the publisher's CDI folder).
    pub cdi_dir: PathBuf,
    /// Where the checkpoint is kept.
    pub state_dir: PathBuf,
    /// Bounds each read of a claim.
    pub api_timeout: Duration,
}

/// A claim as kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    /// Its namespace.
    pub namespace: String,
    /// Its UID.
    pub uid: String,
    /// Its name.
    pub name: String,
}

impl ClaimRef {
    /// The claim a checkpoint entry was prepared for.
    fn of(uid: String, prepared: &Prepared) -> ClaimRef {
        ClaimRef {
            namespace: prepared.namespace.clone(),
            name: prepared.name.clone(),
            uid,
        }
    }
}

impl std::fmt::Display for ClaimRef {
    /// `ResourceClaim ns/name (uid)`, the way every message names a claim.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ResourceClaim {}/{} ({})",
            self.namespace, self.name, self.uid
        )
    }
}

/// Why one claim was not prepared or unprepared; each names the claim.
/// It becomes text only in kubelet's answer and the log.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The UID is not one the API server makes; no file was touched.
    #[error(
        "{claim}: the UID is not a Kubernetes object UID (8-4-4-4-12 hex digits); nothing was done"
    )]
    BadUid {
        /// The claim as kubelet named it.
        claim: String,
    },
    /// The call's budget ran out before the claim was read.
    #[error("reading {claim}: no answer within the {left:?} left of this call's budget (kubelet's deadline); kubelet asks again")]
    OutOfTime {
        /// The claim.
        claim: String,
        /// What was left of the budget when its read started.
        left: Duration,
    },
    /// The API server did not answer within `--api-timeout`.
    #[error("reading {claim}: no answer within the API timeout ({timeout:?})")]
    ApiTimeout {
        /// The claim.
        claim: String,
        /// `--api-timeout`.
        timeout: Duration,
    },
    /// The API server answered with an error.
    #[error(transparent)]
    Api(#[from] ClusterError),
    /// The claim is not on the server.
    #[error("{claim}: not found")]
    NotFound {
        /// The claim.
        claim: String,
    },
    /// The claim's allocation cannot be served here.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// A device is prepared for another claim in a way this claim's
    /// allocation cannot share (exclusive, whole against shares): never
    /// handed out twice.
    #[error("{claim}: {conflict}")]
    Held {
        /// The claim asking.
        claim: String,
        /// What holds the device, naming it and the holder.
        conflict: Conflict,
    },
    /// A prepared claim's device is no longer published, so the CDI ID
    /// kubelet would hand the runtime resolves to nothing.
    #[error("{claim}: device {device} ({cdi_id}) is no longer published, so the runtime cannot resolve it")]
    Unresolvable {
        /// The claim.
        claim: String,
        /// The device.
        device: String,
        /// Its CDI device ID.
        cdi_id: String,
    },
    /// The claim's own CDI spec could not be written or removed.
    #[error("{claim}: {} {path}: {cause}", .cause.action())]
    Spec {
        /// The claim.
        claim: String,
        /// The spec file.
        path: PathBuf,
        /// What the file system said, and whether writing or removing.
        cause: SpecFileError,
    },
    /// The checkpoint could not be written; nothing of the call was kept.
    #[error("{claim}: {cause}")]
    Checkpoint {
        /// The claim.
        claim: String,
        /// The checkpoint error, shared: one error fails every claim of the
        /// call.
        cause: Arc<CheckpointError>,
    },
}

/// Why a claim's own CDI spec could not be written or removed, kept typed
/// until kubelet's answer or the log says it.
#[derive(Debug, thiserror::Error)]
pub enum SpecFileError {
    /// Writing it failed; said with its causes on one line.
    #[error("{}", .0.one_line())]
    Write(#[source] PublishError),
    /// Removing it failed.
    #[error(transparent)]
    Remove(std::io::Error),
}

impl SpecFileError {
    /// The verb the message puts before the file.
    fn action(&self) -> &'static str {
        match self {
            SpecFileError::Write(_) => "writing",
            SpecFileError::Remove(_) => "removing",
        }
    }
}

/// One answer per claim UID.
pub type Answers<T> = BTreeMap<String, Result<T, PrepareError>>;

/// Prepares and unprepares claims; shared by both API versions' services.
pub struct Preparer {
    site: Site,
    client: Client,
    pool: watch::Receiver<Arc<Pool>>,
    checkpoint: Mutex<Checkpoint>,
    observed: Arc<Observed>,
}

impl Preparer {
    /// A preparer starting from the checkpoint in the state folder; the
    /// per-claim specs of checkpointed claims are written again if gone.
    /// A checkpoint of an unknown format is an error: starting without its
    /// claims would forget what running pods hold.
    pub fn open(
        site: Site,
        client: Client,
        pool: watch::Receiver<Arc<Pool>>,
        observed: Arc<Observed>,
    ) -> Result<Preparer, LoadError> {
        let checkpoint = Checkpoint::load(&site.state_dir, &site.driver)?;
        observed.prepared_claims(checkpoint.claims.len());
        restore_specs(&site.cdi_dir, &checkpoint);
        Ok(Preparer {
            site,
            client,
            pool,
            checkpoint: Mutex::new(checkpoint),
            observed,
        })
    }

    /// Puts back the CDI spec of every prepared claim that is missing or
    /// changed, naming the claim: a container restart resolves the claim's
    /// CDI ID from that file without another Prepare. Blocking file I/O:
    /// call it off the runtime's threads.
    pub fn restore_specs(&self) {
        restore_specs(&self.site.cdi_dir, &self.checkpoint.blocking_lock());
    }

    /// Prepares each claim within `deadline` (kubelet's, from the call's
    /// `grpc-timeout`; [`DEFAULT_BUDGET`] when it sent none): its devices,
    /// or why not.
    pub async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
        deadline: Option<Duration>,
    ) -> Answers<Vec<PreparedDevice>> {
        let started = Instant::now();
        let until = started + budget(deadline);
        let mut out = BTreeMap::new();
        let mut todo = Vec::new();
        for claim in claims {
            if crate::names::is_api_uid(&claim.uid) {
                todo.push(claim);
            } else {
                let claim_text = claim.to_string();
                out.insert(claim.uid, Err(PrepareError::BadUid { claim: claim_text }));
            }
        }

        // Prepared before: answered from the checkpoint, nothing read.
        let mut to_read = Vec::new();
        let mut known = Vec::new();
        {
            let checkpoint = self.checkpoint.lock().await;
            for claim in todo {
                match checkpoint.claims.get(&claim.uid) {
                    Some(done) if done.namespace == claim.namespace && done.name == claim.name => {
                        known.push((claim, done.clone()))
                    }
                    _ => to_read.push(claim),
                }
            }
        }
        let pool = self.pool.borrow().clone();
        for (claim, done) in known {
            let answer = self.answer_again(&claim, &done, &pool);
            out.insert(claim.uid, answer);
        }

        // The rest read at once, each within what is left of the budget,
        // with what their containers hold beside them (for NCCL_IB_HCA).
        let reads: Vec<(ClaimRef, Result<Prepared, PrepareError>)> = futures::stream::iter(to_read)
            .map(|claim| async move {
                let read = self.read_and_decide(&claim, until).await;
                (claim, read)
            })
            .buffer_unordered(READ_CONCURRENCY)
            .collect()
            .await;
        let pool = self.pool.borrow().clone();
        let mut decided = Vec::new();
        for (claim, prepared) in reads {
            match prepared {
                Ok(p) => decided.push((claim, p)),
                Err(e) => {
                    out.insert(claim.uid, Err(e));
                }
            }
        }
        self.keep(decided, &pool, &mut out).await;

        for (uid, answer) in &out {
            self.observed.prepared(answer.is_ok(), started.elapsed());
            if let Err(e) = answer {
                warn!(claim_uid = uid, "Prepare: {e}");
            }
        }
        out.into_iter()
            .map(|(uid, a)| (uid, a.map(|answered| answered.devices)))
            .collect()
    }

    /// Checkpoints the claims read and decided: under the lock, re-checks
    /// each (another call may have prepared it meanwhile), refuses a device
    /// another claim holds, writes their specs, and saves the checkpoint
    /// once for all of them.
    async fn keep(
        &self,
        decided: Vec<(ClaimRef, Prepared)>,
        pool: &Pool,
        out: &mut BTreeMap<String, Result<Answered, PrepareError>>,
    ) {
        if decided.is_empty() {
            return;
        }
        let mut checkpoint = self.checkpoint.lock().await;
        let mut added: Vec<(ClaimRef, Prepared)> = Vec::new();
        for (claim, prepared) in decided {
            if let Some(done) = checkpoint.claims.get(&claim.uid) {
                if done.namespace == claim.namespace && done.name == claim.name {
                    let answer = Ok(Answered::of(&claim.uid, done));
                    out.insert(claim.uid, answer);
                    continue;
                }
            }
            if let Some(e) = held_elsewhere(&checkpoint, &claim, &prepared) {
                out.insert(claim.uid, Err(e));
                continue;
            }
            self.warn_failed_links(&claim, &prepared, pool);
            if let Some(value) = prepared.nccl_value() {
                if let Err(e) = claim_spec::write(&self.site.cdi_dir, &claim.uid, &value) {
                    let error = self.spec_error(&claim, SpecFileError::Write(e));
                    out.insert(claim.uid, Err(error));
                    continue;
                }
            }
            checkpoint
                .claims
                .insert(claim.uid.clone(), prepared.clone());
            added.push((claim, prepared));
        }
        if added.is_empty() {
            return;
        }
        match checkpoint.save(&self.site.state_dir) {
            Ok(()) => {
                for (claim, prepared) in added {
                    info!(
                        claim = claim.to_string(),
                        devices = prepared.devices.len(),
                        "prepared"
                    );
                    out.insert(claim.uid.clone(), Ok(Answered::of(&claim.uid, &prepared)));
                }
            }
            Err(e) => {
                let e = Arc::new(e);
                for (claim, _) in added {
                    checkpoint.claims.remove(&claim.uid);
                    let _ = claim_spec::remove(&self.site.cdi_dir, &claim.uid);
                    let error = PrepareError::Checkpoint {
                        claim: claim.to_string(),
                        cause: e.clone(),
                    };
                    out.insert(claim.uid, Err(error));
                }
            }
        }
        self.observed.prepared_claims(checkpoint.claims.len());
    }

    /// A prepared claim asked again: the same answer, once its spec is in
    /// place and each CDI device it names is still published.
    fn answer_again(
        &self,
        claim: &ClaimRef,
        done: &Prepared,
        pool: &Pool,
    ) -> Result<Answered, PrepareError> {
        for d in &done.devices {
            let published = pool.device(&d.device_name);
            for id in &d.cdi_device_ids {
                if published.is_none_or(|p| &p.cdi_id != id) {
                    return Err(PrepareError::Unresolvable {
                        claim: claim.to_string(),
                        device: d.device_name.clone(),
                        cdi_id: id.clone(),
                    });
                }
            }
        }
        if let Some(value) = done.nccl_value() {
            claim_spec::write(&self.site.cdi_dir, &claim.uid, &value)
                .map_err(|e| self.spec_error(claim, SpecFileError::Write(e)))?;
        }
        Ok(Answered::of(&claim.uid, done))
    }

    /// Says, and counts, a device whose link failed after it was allocated:
    /// the claim is still prepared (the scheduler chose it; refusing would
    /// only stall the pod), but the operator hears of it.
    fn warn_failed_links(&self, claim: &ClaimRef, prepared: &Prepared, pool: &Pool) {
        for d in &prepared.devices {
            if let Some(device) = pool.device(&d.device_name) {
                if device.link == LinkState::Failed {
                    self.observed.prepared_failed_link();
                    warn!(
                        "Prepare: {claim}: device {} ({}) has link verdict {} now; it was allocated before its link failed",
                        d.device_name,
                        device.rdma_device,
                        device.link.as_str()
                    );
                }
            }
        }
    }

    /// The error naming `claim` and its spec file.
    fn spec_error(&self, claim: &ClaimRef, cause: SpecFileError) -> PrepareError {
        PrepareError::Spec {
            claim: claim.to_string(),
            path: self.site.cdi_dir.join(claim_spec::file_name(&claim.uid)),
            cause,
        }
    }

    /// Reads `claim` and decides what it prepares to in the pool as
    /// published once it is read, its `NCCL_IB_HCA` entries included: every
    /// NIC of the containers holding it, or, when those cannot be known,
    /// its own (said, and counted).
    async fn read_and_decide(
        &self,
        claim: &ClaimRef,
        until: Instant,
    ) -> Result<Prepared, PrepareError> {
        let found = self.read_claim(claim, until).await?;
        let pool = self.pool.borrow().clone();
        let pool = pool.as_ref();
        let mut prepared = claims::prepare(
            &found,
            &claim.uid,
            &self.site.driver,
            &self.site.node_name,
            pool,
        )?;
        let place = nccl::Place {
            driver: &self.site.driver,
            pool_name: &self.site.node_name,
            pool,
        };
        let told =
            nccl::read_union(&self.client, &found, place, until, self.site.api_timeout).await;
        prepared.nccl_ib_hca = match told {
            Ok(entries) => entries,
            Err(why) => {
                self.observed.nccl_inexact();
                warn!("Prepare: {claim}: NCCL_IB_HCA names only this claim's NICs, since the NICs its container holds beside them are not known: {why}");
                prepared
                    .devices
                    .iter()
                    .filter_map(|d| pool.device(&d.device_name))
                    .map(nccl::entry)
                    .collect()
            }
        };
        Ok(prepared)
    }

    /// Reads `claim`, within `--api-timeout` and what is left until `until`.
    async fn read_claim(
        &self,
        claim: &ClaimRef,
        until: Instant,
    ) -> Result<ResourceClaim, PrepareError> {
        let left = until.saturating_duration_since(Instant::now());
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &claim.namespace);
        let bound = left.min(self.site.api_timeout);
        match tokio::time::timeout(bound, api.get_opt(&claim.name)).await {
            Err(_) if left < self.site.api_timeout => Err(PrepareError::OutOfTime {
                claim: claim.to_string(),
                left,
            }),
            Err(_) => Err(PrepareError::ApiTimeout {
                claim: claim.to_string(),
                timeout: self.site.api_timeout,
            }),
            Ok(Err(e)) => Err(ClusterError::api(format!("reading {claim}"), e).into()),
            Ok(Ok(None)) => Err(PrepareError::NotFound {
                claim: claim.to_string(),
            }),
            Ok(Ok(Some(c))) => Ok(c),
        }
    }

    /// Unprepares each checkpointed claim the API no longer allocates here:
    /// deleted, replaced by one of another UID, or allocated elsewhere (or
    /// not at all) since. A claim whose read fails is left alone: a failed
    /// read proves nothing. The claims are read without the lock; under
    /// it, only those still checkpointed as read are dropped, their specs
    /// removed, and the checkpoint written once. How many were swept.
    pub async fn sweep(&self) -> usize {
        let held: Vec<(String, Prepared)> = {
            let checkpoint = self.checkpoint.lock().await;
            checkpoint
                .claims
                .iter()
                .map(|(uid, p)| (uid.clone(), p.clone()))
                .collect()
        };
        let read: Vec<(ClaimRef, Prepared, Option<String>)> = futures::stream::iter(held)
            .map(|(uid, prepared)| async move {
                let claim = ClaimRef::of(uid, &prepared);
                let until = Instant::now() + self.site.api_timeout;
                let stale = match self.read_claim(&claim, until).await {
                    Ok(found) => self.stale(&found, &claim, &prepared),
                    Err(PrepareError::NotFound { .. }) => Some("deleted".to_string()),
                    Err(e) => {
                        warn!("sweep: {e}; left prepared until a read succeeds");
                        None
                    }
                };
                (claim, prepared, stale)
            })
            .buffer_unordered(READ_CONCURRENCY)
            .collect()
            .await;
        let stale: Vec<_> = read
            .into_iter()
            .filter_map(|(claim, prepared, why)| why.map(|why| (claim, prepared, why)))
            .collect();
        if stale.is_empty() {
            return 0;
        }
        let mut checkpoint = self.checkpoint.lock().await;
        let mut removed = Vec::new();
        for (claim, prepared, why) in stale {
            // Unprepared, or prepared anew, since it was read: not this one.
            if checkpoint.claims.get(&claim.uid) != Some(&prepared) {
                continue;
            }
            if let Err(e) = claim_spec::remove(&self.site.cdi_dir, &claim.uid) {
                let e = self.spec_error(&claim, SpecFileError::Remove(e));
                warn!("sweeping stale {claim} ({why}): {e}; kept until the next sweep");
                continue;
            }
            checkpoint.claims.remove(&claim.uid);
            removed.push((claim, prepared, why));
        }
        if removed.is_empty() {
            return 0;
        }
        if let Err(e) = checkpoint.save(&self.site.state_dir) {
            // Kept as prepared: the next look writes their specs back, the
            // next sweep tries again.
            for (claim, prepared, why) in removed {
                warn!("sweeping stale {claim} ({why}): {e}; kept until the next sweep");
                checkpoint.claims.insert(claim.uid, prepared);
            }
            return 0;
        }
        for (claim, _, why) in &removed {
            info!("swept stale {claim}: {why}; unprepared without kubelet, whose pod is gone");
            self.observed.swept();
        }
        self.observed.prepared_claims(checkpoint.claims.len());
        removed.len()
    }

    /// Why a checkpointed claim, as the API has it now, is no longer
    /// prepared here; `None` while it is still allocated to this node's
    /// pool by the driver that prepared it.
    fn stale(
        &self,
        found: &ResourceClaim,
        claim: &ClaimRef,
        prepared: &Prepared,
    ) -> Option<String> {
        let uid = found.metadata.uid.as_deref().unwrap_or_default();
        if uid != claim.uid {
            return Some(format!(
                "replaced: the claim of that name now has UID {uid}"
            ));
        }
        let driver = if prepared.driver.is_empty() {
            &self.site.driver
        } else {
            &prepared.driver
        };
        let ours = found
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .is_some_and(|results| {
                results
                    .iter()
                    .any(|r| &r.driver == driver && r.pool == self.site.node_name)
            });
        (!ours).then(|| {
            format!(
                "no longer allocated to pool {} by driver {driver}",
                self.site.node_name
            )
        })
    }

    /// Unprepares each claim: removes its CDI spec and forgets it, with one
    /// checkpoint write for the call. A claim not prepared here is done
    /// already.
    pub async fn unprepare(&self, claims: Vec<ClaimRef>) -> Answers<()> {
        let mut out = BTreeMap::new();
        let mut checkpoint = self.checkpoint.lock().await;
        let mut removed = Vec::new();
        for claim in claims {
            if !crate::names::is_api_uid(&claim.uid) {
                let error = PrepareError::BadUid {
                    claim: claim.to_string(),
                };
                out.insert(claim.uid, Err(error));
                continue;
            }
            if let Err(e) = claim_spec::remove(&self.site.cdi_dir, &claim.uid) {
                let error = self.spec_error(&claim, SpecFileError::Remove(e));
                out.insert(claim.uid, Err(error));
                continue;
            }
            if let Some(gone) = checkpoint.claims.remove(&claim.uid) {
                removed.push((claim.clone(), gone));
            }
            out.insert(claim.uid, Ok(()));
        }
        if !removed.is_empty() {
            match checkpoint.save(&self.site.state_dir) {
                Ok(()) => {
                    for (claim, _) in &removed {
                        info!(claim = claim.to_string(), "unprepared");
                    }
                }
                Err(e) => {
                    // Kept as prepared: the next look writes their specs
                    // back, and kubelet calls Unprepare again.
                    let e = Arc::new(e);
                    for (claim, gone) in removed {
                        checkpoint.claims.insert(claim.uid.clone(), gone);
                        let error = PrepareError::Checkpoint {
                            claim: claim.to_string(),
                            cause: e.clone(),
                        };
                        out.insert(claim.uid, Err(error));
                    }
                }
            }
        }
        self.observed.prepared_claims(checkpoint.claims.len());
        drop(checkpoint);
        for (uid, answer) in &out {
            self.observed.unprepared(answer.is_ok());
            if let Err(e) = answer {
                warn!(claim_uid = uid, "Unprepare: {e}");
            }
        }
        out
    }
}

/// A prepared claim as kubelet is answered: its devices, the claim's own
/// CDI spec's ID once, on its first device.
struct Answered {
    devices: Vec<PreparedDevice>,
}

impl Answered {
    fn of(uid: &str, prepared: &Prepared) -> Answered {
        let mut devices = prepared.devices.clone();
        if let Some(first) = devices.first_mut() {
            if !prepared.rdma_devices.is_empty() {
                first.cdi_device_ids.push(claim_spec::cdi_id(uid));
            }
        }
        Answered { devices }
    }
}

/// Writes back the CDI spec of each claim in `checkpoint` whose file in
/// `cdi_dir` is missing or changed, naming the claim.
fn restore_specs(cdi_dir: &Path, checkpoint: &Checkpoint) {
    for (uid, prepared) in &checkpoint.claims {
        let Some(value) = prepared.nccl_value() else {
            continue;
        };
        let claim = ClaimRef::of(uid.clone(), prepared);
        match claim_spec::write(cdi_dir, uid, &value) {
            Ok(false) => {}
            Ok(true) => warn!(
                "the CDI spec of prepared {claim} was missing or changed: written again as {}",
                cdi_dir.join(claim_spec::file_name(uid)).display()
            ),
            Err(e) => warn!(
                "restoring the CDI spec of prepared {claim}: {}",
                e.one_line()
            ),
        }
    }
}

/// The time one call may take: nine tenths of kubelet's deadline (the rest
/// is for answering), never more than [`DEFAULT_BUDGET`].
fn budget(deadline: Option<Duration>) -> Duration {
    deadline.map_or(DEFAULT_BUDGET, |d| (d - d / 10).min(DEFAULT_BUDGET))
}

/// A device of `prepared` that cannot be prepared beside the other claims
/// the checkpoint holds (see [`shares::conflict`]).
fn held_elsewhere(
    checkpoint: &Checkpoint,
    claim: &ClaimRef,
    prepared: &Prepared,
) -> Option<PrepareError> {
    let others = checkpoint
        .claims
        .iter()
        .filter(|(uid, _)| **uid != claim.uid);
    shares::conflict(others, prepared).map(|conflict| PrepareError::Held {
        claim: claim.to_string(),
        conflict,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_keeps_a_tenth_of_kubelets_deadline_for_answering() {
        assert_eq!(budget(None), DEFAULT_BUDGET);
        assert_eq!(budget(Some(Duration::from_secs(45))), DEFAULT_BUDGET);
        assert_eq!(
            budget(Some(Duration::from_secs(3))),
            Duration::from_millis(2700)
        );
        assert_eq!(budget(Some(Duration::ZERO)), Duration::ZERO);
    }

    #[test]
    fn a_spec_file_error_says_the_verb_the_file_and_the_cause() {
        let e = PrepareError::Spec {
            claim: "ResourceClaim team/a (uid-a)".into(),
            path: PathBuf::from("/var/run/cdi/a.json"),
            cause: SpecFileError::Remove(std::io::Error::from_raw_os_error(13)),
        };
        assert_eq!(
            e.to_string(),
            "ResourceClaim team/a (uid-a): removing /var/run/cdi/a.json: Permission denied (os error 13)"
        );
    }

    #[test]
    fn a_device_checkpointed_for_another_claim_is_held_naming_the_holder() {
        let device = |name: &str| PreparedDevice {
            request_names: vec!["nic".into()],
            pool_name: "node-a".into(),
            device_name: name.into(),
            cdi_device_ids: vec![],
            share_id: None,
        };
        let mut checkpoint = Checkpoint::empty();
        checkpoint.claims.insert(
            "uid-a".into(),
            Prepared {
                namespace: "team".into(),
                name: "a".into(),
                driver: "rdma.gpustack.ai".into(),
                devices: vec![device("pci-0000-3b-00-0")],
                rdma_devices: vec![],
                nccl_ib_hca: vec![],
            },
        );
        let b = ClaimRef {
            namespace: "team".into(),
            name: "b".into(),
            uid: "uid-b".into(),
        };
        let wants = |name: &str| Prepared {
            devices: vec![device(name)],
            ..Prepared::default()
        };
        let e = held_elsewhere(&checkpoint, &b, &wants("pci-0000-3b-00-0")).unwrap();
        let e = e.to_string();
        assert!(
            e.contains("pci-0000-3b-00-0") && e.contains("team/a (uid-a)"),
            "{e}"
        );
        assert!(held_elsewhere(&checkpoint, &b, &wants("pci-0000-af-00-0")).is_none());
    }
}
