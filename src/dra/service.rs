//! kubelet's DRA service: NodePrepareResources and NodeUnprepareResources,
//! served in `v1` and `v1beta1` from one [`Preparer`].
//!
//! Each call is a batch of claims; each claim succeeds or fails on its own,
//! with a message naming it. Calls are serialised (one lock over the
//! checkpoint), idempotent (a prepared claim is answered from the
//! checkpoint; an unknown claim unprepares as done), and every change is
//! checkpointed before it is answered.

use super::checkpoint::Checkpoint;
use super::claim_spec;
use super::claims::{self, Prepared, PreparedDevice};
use super::devices::Pool;
use super::metrics::Observed;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::{Api, Client};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Mutex};
use tracing::{info, warn};

/// What the preparer needs to know of its place.
#[derive(Debug, Clone)]
pub struct Options {
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

/// Prepares and unprepares claims; shared by both API versions' services.
pub struct Preparer {
    options: Options,
    claims: Client,
    pool: watch::Receiver<Arc<Pool>>,
    checkpoint: Mutex<Checkpoint>,
    observed: Arc<Observed>,
}

impl Preparer {
    /// A preparer starting from the checkpoint in the state folder; the
    /// per-claim specs of checkpointed claims are written again if gone.
    pub fn open(
        options: Options,
        client: Client,
        pool: watch::Receiver<Arc<Pool>>,
        observed: Arc<Observed>,
    ) -> Preparer {
        let checkpoint = Checkpoint::load(&options.state_dir);
        for (uid, prepared) in &checkpoint.claims {
            if prepared.rdma_devices.is_empty() {
                continue;
            }
            if let Err(e) = claim_spec::write(&options.cdi_dir, uid, &prepared.rdma_devices) {
                warn!(
                    "restoring the CDI spec of prepared claim {}/{}: {}",
                    prepared.namespace,
                    prepared.name,
                    e.one_line()
                );
            }
        }
        observed.prepared_claims(checkpoint.claims.len());
        Preparer {
            options,
            claims: client,
            pool,
            checkpoint: Mutex::new(checkpoint),
            observed,
        }
    }

    /// Prepares each claim: its devices, or why not.
    pub async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> BTreeMap<String, Result<Vec<PreparedDevice>, String>> {
        let mut checkpoint = self.checkpoint.lock().await;
        let mut out = BTreeMap::new();
        for claim in claims {
            let started = std::time::Instant::now();
            let answer = self.prepare_one(&mut checkpoint, &claim).await;
            self.observed.prepared(answer.is_ok(), started.elapsed());
            if let Err(e) = &answer {
                warn!("Prepare: {e}");
            }
            out.insert(claim.uid, answer);
        }
        self.observed.prepared_claims(checkpoint.claims.len());
        out
    }

    async fn prepare_one(
        &self,
        checkpoint: &mut Checkpoint,
        claim: &ClaimRef,
    ) -> Result<Vec<PreparedDevice>, String> {
        if let Some(done) = checkpoint.claims.get(&claim.uid) {
            if done.namespace == claim.namespace && done.name == claim.name {
                if !done.rdma_devices.is_empty() {
                    claim_spec::write(&self.options.cdi_dir, &claim.uid, &done.rdma_devices)
                        .map_err(|e| format!("{}: {}", describe(claim), e.one_line()))?;
                }
                return Ok(answer(&claim.uid, done));
            }
        }
        let read = self.read_claim(claim).await?;
        let pool = self.pool.borrow().clone();
        let prepared = claims::prepare(
            &read,
            &claim.uid,
            &self.options.driver,
            &self.options.node_name,
            &pool,
        )
        .map_err(|e| e.to_string())?;
        if !prepared.rdma_devices.is_empty() {
            claim_spec::write(&self.options.cdi_dir, &claim.uid, &prepared.rdma_devices)
                .map_err(|e| format!("{}: {}", describe(claim), e.one_line()))?;
        }
        checkpoint
            .claims
            .insert(claim.uid.clone(), prepared.clone());
        if let Err(e) = checkpoint.save(&self.options.state_dir) {
            checkpoint.claims.remove(&claim.uid);
            let _ = claim_spec::remove(&self.options.cdi_dir, &claim.uid);
            return Err(format!("{}: {e}", describe(claim)));
        }
        info!(
            claim = describe(claim),
            devices = prepared.devices.len(),
            "prepared"
        );
        Ok(answer(&claim.uid, &prepared))
    }

    async fn read_claim(&self, claim: &ClaimRef) -> Result<ResourceClaim, String> {
        let api: Api<ResourceClaim> = Api::namespaced(self.claims.clone(), &claim.namespace);
        let what = format!("reading {}", describe(claim));
        match tokio::time::timeout(self.options.api_timeout, api.get_opt(&claim.name)).await {
            Err(_) => Err(format!(
                "{what}: no answer within the API timeout ({})",
                humantime::format_duration(self.options.api_timeout)
            )),
            Ok(Err(e)) => Err(crate::cluster::ClusterError::api(what, e).to_string()),
            Ok(Ok(None)) => Err(format!("{}: not found", describe(claim))),
            Ok(Ok(Some(c))) => Ok(c),
        }
    }

    /// Unprepares each claim: removes its CDI spec and forgets it. A claim
    /// not prepared here is done already.
    pub async fn unprepare(&self, claims: Vec<ClaimRef>) -> BTreeMap<String, Result<(), String>> {
        let mut checkpoint = self.checkpoint.lock().await;
        let mut out = BTreeMap::new();
        for claim in claims {
            let answer = self.unprepare_one(&mut checkpoint, &claim);
            self.observed.unprepared(answer.is_ok());
            if let Err(e) = &answer {
                warn!("Unprepare: {e}");
            }
            out.insert(claim.uid, answer);
        }
        self.observed.prepared_claims(checkpoint.claims.len());
        out
    }

    fn unprepare_one(&self, checkpoint: &mut Checkpoint, claim: &ClaimRef) -> Result<(), String> {
        claim_spec::remove(&self.options.cdi_dir, &claim.uid).map_err(|e| {
            format!(
                "{}: removing {}: {e}",
                describe(claim),
                self.options
                    .cdi_dir
                    .join(claim_spec::file_name(&claim.uid))
                    .display()
            )
        })?;
        if let Some(gone) = checkpoint.claims.remove(&claim.uid) {
            if let Err(e) = checkpoint.save(&self.options.state_dir) {
                checkpoint.claims.insert(claim.uid.clone(), gone);
                return Err(format!("{}: {e}", describe(claim)));
            }
            info!(claim = describe(claim), "unprepared");
        }
        Ok(())
    }
}

/// `ResourceClaim ns/name (uid)`, the way every message names a claim.
fn describe(claim: &ClaimRef) -> String {
    format!(
        "ResourceClaim {}/{} ({})",
        claim.namespace, claim.name, claim.uid
    )
}

/// The devices kubelet is answered with: the claim's own CDI spec's ID once,
/// on its first device.
fn answer(uid: &str, prepared: &Prepared) -> Vec<PreparedDevice> {
    let mut devices = prepared.devices.clone();
    if let Some(first) = devices.first_mut() {
        if !prepared.rdma_devices.is_empty() {
            first.cdi_device_ids.push(claim_spec::cdi_id(uid));
        }
    }
    devices
}

impl From<PreparedDevice> for super::api::v1::Device {
    fn from(d: PreparedDevice) -> Self {
        Self {
            request_names: d.request_names,
            pool_name: d.pool_name,
            device_name: d.device_name,
            cdi_device_ids: d.cdi_device_ids,
            // Set only for a device allocated with a share ID (consumable
            // capacity); every device here is allocated whole.
            share_id: None,
        }
    }
}

impl From<PreparedDevice> for super::api::v1beta1::Device {
    fn from(d: PreparedDevice) -> Self {
        Self {
            request_names: d.request_names,
            pool_name: d.pool_name,
            device_name: d.device_name,
            cdi_device_ids: d.cdi_device_ids,
        }
    }
}

/// The two API versions' services over one [`Preparer`]: their messages are
/// field for field the same (v1 adds a device's `share_id`), so one macro
/// writes both.
macro_rules! service {
    ($version:ident, $name:ident) => {
        /// The DRA service of this API version.
        pub struct $name(pub Arc<Preparer>);

        impl From<super::api::$version::Claim> for ClaimRef {
            fn from(c: super::api::$version::Claim) -> ClaimRef {
                ClaimRef {
                    namespace: c.namespace,
                    uid: c.uid,
                    name: c.name,
                }
            }
        }

        #[tonic::async_trait]
        impl super::api::$version::dra_plugin_server::DraPlugin for $name {
            async fn node_prepare_resources(
                &self,
                request: tonic::Request<super::api::$version::NodePrepareResourcesRequest>,
            ) -> Result<
                tonic::Response<super::api::$version::NodePrepareResourcesResponse>,
                tonic::Status,
            > {
                use super::api::$version as api;
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(ClaimRef::from)
                    .collect();
                let claims = self
                    .0
                    .prepare(claims)
                    .await
                    .into_iter()
                    .map(|(uid, answer)| {
                        let one = match answer {
                            Ok(devices) => api::NodePrepareResourceResponse {
                                devices: devices.into_iter().map(api::Device::from).collect(),
                                error: String::new(),
                            },
                            Err(error) => api::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                error,
                            },
                        };
                        (uid, one)
                    })
                    .collect();
                Ok(tonic::Response::new(api::NodePrepareResourcesResponse {
                    claims,
                }))
            }

            async fn node_unprepare_resources(
                &self,
                request: tonic::Request<super::api::$version::NodeUnprepareResourcesRequest>,
            ) -> Result<
                tonic::Response<super::api::$version::NodeUnprepareResourcesResponse>,
                tonic::Status,
            > {
                use super::api::$version as api;
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(ClaimRef::from)
                    .collect();
                let claims = self
                    .0
                    .unprepare(claims)
                    .await
                    .into_iter()
                    .map(|(uid, answer)| {
                        let error = answer.err().unwrap_or_default();
                        (uid, api::NodeUnprepareResourceResponse { error })
                    })
                    .collect();
                Ok(tonic::Response::new(api::NodeUnprepareResourcesResponse {
                    claims,
                }))
            }
        }
    };
}

service!(v1, ServiceV1);
service!(v1beta1, ServiceV1beta1);
