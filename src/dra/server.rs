//! The long-running part of the DRA driver: its two sockets in kubelet's
//! folders, and the loop that keeps the pool, the sockets and the
//! ResourceSlices current. The kubelet-plugin runtime ([`crate::kubelet`])
//! does the sockets, the watch and the probes; this file composes them.
//!
//! Each wake (a file event in the CDI folder or kubelet's folders, the poll
//! tick, the reconcile interval, kubelet's registration verdict) the loop
//! 1. looks at the CDI specs and the rail record (stat; a read only if one
//!    changed) and makes the pool, which Prepare reads;
//! 2. serves both sockets afresh if one is gone (kubelet restarted, or an
//!    operator cleaned the folder);
//! 3. reconciles the ResourceSlices when the pool changed, kubelet
//!    registered the driver (kubelet deletes a driver's slices when it
//!    starts), the interval passed, or a failed reconcile's backoff ended.
//!
//! Before all that it takes the state folder's lock (one driver per node);
//! beside the loop, two tasks sweep stale claims and dial the driver's own
//! sockets for `/healthz`.

use super::checkpoint::LoadError;
use super::devices::{self, Pool, Published};
use super::health::HealthService;
use super::lock::{LockError, StateLock};
use super::metrics::Observed;
use super::preparer::{Options, Preparer};
use super::publish::Reconciler;
use super::rails_file::RailsFile;
use super::registration::{self, Registrar, Verdict};
use super::selfcheck;
use super::service::{ServiceV1, ServiceV1beta1};
use super::shares::Shares;
use super::taints::{FailedEffect, TaintRule};
use crate::cdi::Family;
use crate::cluster::client::{self, Settings};
use crate::cluster::ClusterError;
use crate::kubelet::probes::{self, ProbeError};
use crate::kubelet::quiet::Quiet;
use crate::kubelet::registration_api::registration_server::RegistrationServer;
use crate::kubelet::restart::Retry;
use crate::kubelet::servers::Servers;
use crate::kubelet::socket::SocketError;
use crate::kubelet::specs::{self, Change, Loader};
use crate::kubelet::watch::{FolderWatch, Wake};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tonic::service::Routes;
use tracing::{info, warn};

/// What the driver serves and where.
#[derive(Debug, Clone)]
pub struct Config {
    /// This node's name (the pool's name).
    pub node_name: String,
    /// The driver name.
    pub driver: String,
    /// kubelet's root folder (`plugins_registry/` and `plugins/` under it).
    pub kubelet_root: PathBuf,
    /// Where `nodefabric publish` writes its CDI specs.
    pub cdi_dir: PathBuf,
    /// Where the checkpoint is kept.
    pub state_dir: PathBuf,
    /// The rail record `nodefabric publish --rails-file` writes, if any.
    pub rails_file: Option<PathBuf>,
    /// How often the slices are reconciled when nothing else asks.
    pub interval: Duration,
    /// The fallback re-check of files when no file event arrives.
    pub poll_interval: Duration,
    /// Spec files larger than this are refused (the family keeps its devices).
    pub max_spec_bytes: u64,
    /// Bounds each API request.
    pub api_timeout: Duration,
    /// Where to serve `/healthz`, `/readyz` and `/metrics`; `None` serves none.
    pub metrics_addr: Option<SocketAddr>,
    /// The effect of a Failed link's taint.
    pub failed_link_taint: FailedEffect,
    /// Whole NICs exclusive, or shared N ways (consumable capacity).
    pub shares: Shares,
    /// How often (and at start) checkpointed claims are checked against the
    /// API and stale ones unprepared.
    pub sweep_interval: Duration,
    /// How long to wait for another driver holding the state folder's lock.
    pub lock_wait: Duration,
    /// How often the driver dials its own sockets for `/healthz`.
    pub socket_check_interval: Duration,
}

impl Config {
    /// The registration socket kubelet's plugin watcher finds.
    pub fn registration_socket(&self) -> PathBuf {
        self.kubelet_root
            .join(registration::REGISTRY_DIR)
            .join(format!(
                "{}{}",
                self.driver,
                registration::REGISTRATION_SOCKET_SUFFIX
            ))
    }

    /// The DRA service socket.
    pub fn service_socket(&self) -> PathBuf {
        self.kubelet_root
            .join(registration::PLUGINS_DIR)
            .join(&self.driver)
            .join(registration::SERVICE_SOCKET)
    }
}

/// Why the driver stopped before a shutdown signal.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The probe server could not listen (names the address).
    #[error("--metrics-addr {0}")]
    Probes(ProbeError),
    /// No API client could be made (no kubeconfig, no service account).
    #[error(transparent)]
    Client(#[from] ClusterError),
    /// A folder the driver must write into cannot be made.
    #[error("creating {path}: {cause}")]
    Folder {
        /// The folder.
        path: PathBuf,
        /// What mkdir said.
        cause: std::io::Error,
    },
    /// Another driver holds the state folder, or its lock cannot be taken.
    #[error("--state-dir: {0}")]
    Lock(#[from] LockError),
    /// The checkpoint is of a format this release does not read.
    #[error(transparent)]
    Checkpoint(#[from] LoadError),
    /// The look at the CDI specs panicked.
    #[error("reading the CDI specs in {path}: {cause}")]
    Look {
        /// The CDI folder.
        path: PathBuf,
        /// What the blocking task's join said.
        cause: tokio::task::JoinError,
    },
}

/// The first and the longest wait before a failed reconcile or socket is
/// tried again.
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
/// See [`BACKOFF_FIRST`].
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Runs until `shutdown` resolves, then removes its sockets. Its slices stay:
/// a restarted driver takes them over unchanged, and kubelet removes them
/// when the driver is gone for good.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    let registration = config.registration_socket();
    let service = config.service_socket();
    for dir in [
        Some(config.state_dir.clone()),
        registration.parent().map(PathBuf::from),
        service.parent().map(PathBuf::from),
    ]
    .into_iter()
    .flatten()
    {
        std::fs::create_dir_all(&dir).map_err(|cause| RunError::Folder {
            path: dir.clone(),
            cause,
        })?;
    }
    // Before anything is read or served (the probe port included, which a
    // rolling update's old pod still holds): one driver per state folder.
    let _lock = StateLock::acquire(&config.state_dir, config.lock_wait).await?;
    let observed = Arc::new(Observed::new());
    let _probes = match config.metrics_addr {
        Some(addr) => Some(
            probes::serve(addr, observed.clone())
                .await
                .map_err(RunError::Probes)?,
        ),
        None => None,
    };
    let settings = Settings {
        timeout: Some(config.api_timeout),
        ..Settings::default()
    };
    let api = tokio::time::timeout(config.api_timeout, client::connect(&settings))
        .await
        .map_err(|_| ClusterError::SetupTimedOut {
            what: "starting the DRA driver".into(),
            after: config.api_timeout,
        })??;

    let mut files: Vec<PathBuf> = Family::ALL
        .iter()
        .map(|f| config.cdi_dir.join(f.file_name()))
        .collect();
    files.extend([registration.clone(), service.clone()]);
    files.extend(config.rails_file.clone());
    let mut folders_watched = vec![
        config.cdi_dir.clone(),
        registration.parent().unwrap().to_path_buf(),
        service.parent().unwrap().to_path_buf(),
    ];
    if let Some(parent) = config.rails_file.as_ref().and_then(|f| f.parent()) {
        folders_watched.push(parent.to_path_buf());
    }
    let folder_refs: Vec<&std::path::Path> = folders_watched.iter().map(|p| p.as_path()).collect();
    let (mut folders, watch_error) = FolderWatch::new(&folder_refs, files, config.poll_interval);
    if let Some(e) = watch_error {
        warn!(
            "file watching unavailable, polling every {:?}: {e}",
            config.poll_interval
        );
    }

    let (pool_tx, pool_rx) = watch::channel(Arc::new(Pool::default()));
    let preparer = Arc::new(Preparer::open(
        Options {
            driver: config.driver.clone(),
            node_name: config.node_name.clone(),
            cdi_dir: config.cdi_dir.clone(),
            state_dir: config.state_dir.clone(),
            api_timeout: config.api_timeout,
        },
        api.clone(),
        pool_rx,
        observed.clone(),
    )?);
    let background = [
        tokio::spawn(sweep_every(preparer.clone(), config.sweep_interval)),
        tokio::spawn(selfcheck::watch(
            registration.clone(),
            service.clone(),
            config.socket_check_interval,
            observed.clone(),
        )),
    ];
    let (verdict_tx, mut verdicts) = mpsc::unbounded_channel();
    let mut driver = Driver {
        reconciler: Reconciler::new(
            api,
            &config.node_name,
            TaintRule {
                driver: config.driver.clone(),
                effect: config.failed_link_taint,
            },
            config.shares,
        ),
        loader: Some(Loader::new(config.cdi_dir.clone(), config.max_spec_bytes)),
        rails: config.rails_file.clone().map(RailsFile::new),
        published: Published::new(),
        config,
        observed,
        pool: pool_tx,
        servers: None,
        quiet: Quiet::default(),
        serve_retry: Retry::new(BACKOFF_FIRST, BACKOFF_MAX),
        reconcile_retry: Retry::new(BACKOFF_FIRST, BACKOFF_MAX),
        stale: true,
        failed: false,
    };
    let mut interval = tokio::time::interval(driver.config.interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        folders.rearm();
        driver.look(&preparer).await?;
        driver.keep_serving(&preparer, &verdict_tx);
        if driver.stale && (!driver.failed || driver.reconcile_retry.due(None)) {
            driver.reconcile().await;
        }
        tokio::select! {
            _ = &mut shutdown => break,
            wake = folders.next() => if wake == Wake::Event {
                folders.settle().await;
            },
            _ = interval.tick() => driver.stale = true,
            Some(verdict) = verdicts.recv() => {
                let registered = verdict == Verdict::Registered;
                driver.observed.registered(registered);
                // kubelet deletes a driver's slices when it (re)starts.
                driver.stale |= registered;
            }
            _ = driver.reconcile_retry.wait(), if driver.failed => {}
            _ = driver.serve_retry.wait(), if driver.servers.is_none() => {}
        }
    }
    info!("shutting down");
    for task in &background {
        task.abort();
    }
    drop(driver.servers.take());
    Ok(())
}

/// Sweeps stale claims at start and every `every` after: a pod
/// force-deleted while the node was down is never unprepared by kubelet.
async fn sweep_every(preparer: Arc<Preparer>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        preparer.sweep().await;
    }
}

/// What the loop keeps between wakes.
struct Driver {
    config: Config,
    observed: Arc<Observed>,
    reconciler: Reconciler,
    /// Taken while a look runs off the runtime thread, put back after.
    loader: Option<Loader>,
    rails: Option<RailsFile>,
    /// The specs as last read; an unreadable family keeps its last.
    published: Published,
    /// The pool Prepare reads.
    pool: watch::Sender<Arc<Pool>>,
    servers: Option<Servers>,
    quiet: Quiet,
    serve_retry: Retry,
    reconcile_retry: Retry,
    /// The slices may differ from the pool: reconcile.
    stale: bool,
    /// The last reconcile failed: the next waits for the backoff.
    failed: bool,
}

impl Driver {
    /// Reads what changed in the CDI folder and the rail record, publishes
    /// a changed pool, and puts back any prepared claim's CDI spec that is
    /// missing or changed (a clean-up of the CDI folder must not break the
    /// next container restart of a running pod).
    async fn look(&mut self, preparer: &Arc<Preparer>) -> Result<(), RunError> {
        let preparer = preparer.clone();
        let mut loader = self.loader.take().expect("put back after every look");
        let mut rails = self.rails.take();
        let kubelet_folders = [
            self.config.registration_socket(),
            self.config.service_socket(),
        ];
        // Off the runtime thread: file I/O must never stall the gRPC servers.
        let (loader, rails, mut outcome, rails_changed, kubelet_stale) =
            tokio::task::spawn_blocking(move || {
                let outcome = loader.load();
                preparer.restore_specs();
                let rails_changed = rails.as_mut().is_some_and(RailsFile::look);
                // kubelet's folders too: a socket served in the host's old
                // folder is never found by kubelet.
                let stale = kubelet_folders
                    .iter()
                    .filter_map(|socket| socket.parent())
                    .find(|dir| crate::mounts::deleted_in_place(dir))
                    .map(|dir| crate::mounts::stale_reason("a kubelet folder", dir));
                (loader, rails, outcome, rails_changed, stale)
            })
            .await
            .map_err(|cause| RunError::Look {
                path: self.config.cdi_dir.clone(),
                cause,
            })?;
        self.loader = Some(loader);
        self.rails = rails;
        let changed = rails_changed || !outcome.changed.is_empty();
        for (family, change) in std::mem::take(&mut outcome.changed) {
            match change {
                Change::Spec { path, spec } => {
                    self.published.insert(family, (path, spec));
                }
                Change::Gone => {
                    self.published.remove(&family);
                }
            }
        }
        let mut unreadable: Vec<String> = outcome
            .unreadable
            .iter()
            .map(|(_, _, message)| message.clone())
            .collect();
        let rails_subject = self
            .config
            .rails_file
            .as_ref()
            .map(|f| f.display().to_string())
            .unwrap_or_default();
        match self.rails.as_ref().and_then(|r| r.error()) {
            Some(e) => {
                self.quiet.warn(&rails_subject, e.to_string());
                unreadable.push(e.to_string());
            }
            None => self.quiet.clear(&rails_subject, || {
                format!("{rails_subject} is readable again")
            }),
        }
        specs::report(&mut self.quiet, &self.config.cdi_dir, &outcome, "device");
        // A folder deleted on the host under the driver's mount never comes
        // back by itself: liveness fails, and the restart mounts the new one.
        self.observed.stale_folder(
            outcome
                .folder_deleted()
                .map(str::to_string)
                .or(kubelet_stale),
        );
        self.observed.specs(unreadable);
        if !changed {
            return Ok(());
        }
        let pool = devices::pool(
            &self.published,
            self.rails.as_ref().and_then(|r| r.record()),
        );
        if pool != **self.pool.borrow() {
            for refused in &pool.refused {
                self.quiet
                    .warn(refused, format!("not published: {refused}"));
            }
            info!(devices = pool.devices.len(), "pool read from the CDI specs");
            self.observed.pool(pool.devices.len());
            self.pool.send_replace(Arc::new(pool));
            self.stale = true;
        }
        Ok(())
    }

    /// Serves both sockets afresh when one is gone (or none is served).
    fn keep_serving(
        &mut self,
        preparer: &Arc<Preparer>,
        verdicts: &mpsc::UnboundedSender<Verdict>,
    ) {
        if let Some(s) = &self.servers {
            match s.missing() {
                None => return,
                Some(gone) => info!("{} is gone: serving both sockets again", gone.display()),
            }
            self.servers = None;
            self.observed.registered(false);
        }
        if !self.serve_retry.due(None) {
            return;
        }
        match self.serve(preparer, verdicts) {
            Ok(s) => {
                self.servers = Some(s);
                self.serve_retry.succeeded();
                self.quiet.clear("sockets", || "serving".into());
            }
            Err(e) => {
                self.quiet.warn(
                    "sockets",
                    format!("cannot serve, retrying with backoff: {e}"),
                );
                self.serve_retry.failed(None);
            }
        }
    }

    fn serve(
        &self,
        preparer: &Arc<Preparer>,
        verdicts: &mpsc::UnboundedSender<Verdict>,
    ) -> Result<Servers, SocketError> {
        let mut servers = Servers::default();
        let service = self.config.service_socket();
        // The service first: kubelet dials it as soon as it has registered.
        // Both through the authority front: kubelets before 1.34 send the
        // socket path as `:authority` on the service socket too.
        let routes = Routes::new(super::api::v1::dra_plugin_server::DraPluginServer::new(
            ServiceV1(preparer.clone()),
        ))
        .add_service(
            super::api::v1beta1::dra_plugin_server::DraPluginServer::new(ServiceV1beta1(
                preparer.clone(),
            )),
        )
        .add_service(
            super::api::health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(
                HealthService {
                    pool_name: self.config.node_name.clone(),
                    pool: self.pool.subscribe(),
                },
            ),
        );
        servers.serve_fronted(&service, None, "DRA", routes)?;
        let registrar = Registrar {
            name: self.config.driver.clone(),
            endpoint: service.display().to_string(),
            verdicts: verdicts.clone(),
        };
        servers.serve_fronted(
            &self.config.registration_socket(),
            None,
            "registration",
            Routes::new(RegistrationServer::new(registrar)),
        )?;
        info!(
            registration = %self.config.registration_socket().display(),
            service = %service.display(),
            "serving"
        );
        Ok(servers)
    }

    /// Makes the slices the pool; a failure is logged once per cause and
    /// retried with backoff.
    async fn reconcile(&mut self) {
        let pool = self.pool.borrow().clone();
        match self.reconciler.reconcile(&pool).await {
            Ok(done) => {
                self.stale = false;
                self.failed = false;
                self.reconcile_retry.succeeded();
                let writes = done.created + done.updated + done.deleted;
                self.observed.reconciled(writes, done.generation);
                self.observed
                    .dropped_fields(self.reconciler.dropped_gates());
                if writes > 0 {
                    // The generation's JSON, requests and answers are dropped.
                    crate::kubelet::release_freed_memory();
                }
                self.quiet
                    .clear("slices", || "ResourceSlices published".into());
            }
            Err(e) => {
                let why = e.to_string();
                self.observed.reconcile_failed(why.clone());
                self.quiet.warn(
                    "slices",
                    format!("publishing ResourceSlices, retrying with backoff: {why}"),
                );
                self.failed = true;
                self.reconcile_retry.failed(None);
            }
        }
    }
}
