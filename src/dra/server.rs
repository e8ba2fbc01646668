//! The long-running part of the DRA driver: its two sockets in kubelet's
//! folders, and the loop that keeps the pool, the sockets and the
//! ResourceSlices current. The kubelet-plugin runtime ([`crate::kubelet`])
//! does the sockets, the watch, the probes and the loop
//! ([`crate::kubelet::plugin_loop`]); this file fills the loop in.
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
use super::preparer::{Preparer, Site};
use super::rails_file::RailsFile;
use super::registration::{self, Registrar, Verdict};
use super::selfcheck;
use super::service::{ServiceV1, ServiceV1beta1};
use super::shares::Shares;
use super::slice_sync::Reconciler;
use super::taints::{FailedEffect, TaintRule};
use crate::cdi::Family;
use crate::cluster::client::{self, Settings};
use crate::cluster::ClusterError;
use crate::kubelet::backoff::Backoff;
use crate::kubelet::plugin_loop::{self, KubeletPlugin, Look, LoopError, Watched};
use crate::kubelet::quiet::Quiet;
use crate::kubelet::registration_api::registration_server::RegistrationServer;
use crate::kubelet::servers::{Front, Servers};
use crate::kubelet::socket::SocketError;
use crate::kubelet::specs::{self, Change, Loader, Outcome};
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tonic::service::Routes;
use tracing::info;

/// What the driver serves and where.
#[derive(Debug, Clone)]
pub struct Config {
    /// The driver name, the node (the pool's name), the CDI and state
    /// folders and the API bound: what the preparer shares.
    pub site: Site,
    /// kubelet's root folder (`plugins_registry/` and `plugins/` under it).
    pub kubelet_root: PathBuf,
    /// The rail record `nodefabric publish --rails-file` writes, if any.
    pub rails_file: Option<PathBuf>,
    /// How often the slices are reconciled when nothing else asks.
    pub interval: Duration,
    /// The fallback re-check of files when no file event arrives.
    pub poll_interval: Duration,
    /// Spec files larger than this are refused (the family keeps its devices).
    pub max_spec_bytes: u64,
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
                self.site.driver,
                registration::REGISTRATION_SOCKET_SUFFIX
            ))
    }

    /// The DRA service socket.
    pub fn service_socket(&self) -> PathBuf {
        self.kubelet_root
            .join(registration::PLUGINS_DIR)
            .join(&self.site.driver)
            .join(registration::SERVICE_SOCKET)
    }
}

/// Why the driver stopped before a shutdown signal.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The shared loop stopped: the probe port is taken, or a look panicked.
    #[error(transparent)]
    Loop(#[from] LoopError),
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
        Some(config.site.state_dir.clone()),
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
    let _lock = StateLock::acquire(&config.site.state_dir, config.lock_wait).await?;
    let observed = Arc::new(Observed::new());
    let probes = config.metrics_addr.map(|addr| (addr, observed.clone()));
    plugin_loop::run(probes, Driver::start(config, observed), shutdown).await
}

/// What one look read, carried back from the blocking thread.
struct Seen {
    /// The loader, put back.
    loader: Loader,
    /// The rail record, put back.
    rails: Option<RailsFile>,
    /// What the loader found.
    outcome: Outcome,
    /// The rail record's content changed.
    rails_changed: bool,
}

impl KubeletPlugin for Driver {
    type Error = RunError;
    type Seen = Seen;

    fn cdi_dir(&self) -> &Path {
        &self.config.site.cdi_dir
    }

    fn watched(&self) -> Watched {
        let config = &self.config;
        let (registration, service) = (config.registration_socket(), config.service_socket());
        let mut files: Vec<PathBuf> = Family::ALL
            .iter()
            .map(|f| config.site.cdi_dir.join(f.file_name()))
            .collect();
        let mut folders = vec![config.site.cdi_dir.clone()];
        folders.extend(self.kubelet_folders());
        files.extend([registration, service]);
        files.extend(config.rails_file.clone());
        if let Some(parent) = config.rails_file.as_ref().and_then(|f| f.parent()) {
            folders.push(parent.to_path_buf());
        }
        Watched { folders, files }
    }

    fn poll_interval(&self) -> Duration {
        self.config.poll_interval
    }

    fn kubelet_folders(&self) -> Vec<PathBuf> {
        [
            self.config.registration_socket(),
            self.config.service_socket(),
        ]
        .iter()
        .filter_map(|socket| socket.parent().map(PathBuf::from))
        .collect()
    }

    /// Reads what changed in the CDI folder and the rail record, and puts
    /// back any prepared claim's CDI spec that is missing or changed (a
    /// clean-up of the CDI folder must not break the next container
    /// restart of a running pod); `looked` publishes a changed pool.
    fn look(&mut self) -> Look<Seen> {
        let preparer = self.preparer.clone();
        let mut loader = self.loader.take().expect("put back after every look");
        let mut rails = self.rails.take();
        Box::new(move || {
            let outcome = loader.load();
            preparer.restore_specs();
            let rails_changed = rails.as_mut().is_some_and(RailsFile::look);
            Seen {
                loader,
                rails,
                outcome,
                rails_changed,
            }
        })
    }

    fn looked(&mut self, seen: Seen, kubelet_stale: Option<String>) {
        let Seen {
            loader,
            rails,
            mut outcome,
            rails_changed,
        } = seen;
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
            .map(|u| u.message.clone())
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
        specs::report(
            &mut self.quiet,
            &self.config.site.cdi_dir,
            &outcome,
            "device",
        );
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
            return;
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
    }

    async fn keep_current(&mut self) {
        self.keep_serving();
        if self.stale && (!self.failed || self.reconcile_retry.due()) {
            self.reconcile().await;
        }
    }

    async fn wake(&mut self) {
        tokio::select! {
            _ = self.interval.tick() => self.stale = true,
            Some(verdict) = self.verdicts.recv() => {
                let registered = verdict == Verdict::Registered;
                self.observed.registered(registered);
                // kubelet deletes a driver's slices when it (re)starts.
                self.stale |= registered;
            }
            _ = self.reconcile_retry.wait(), if self.failed => {}
            _ = self.serve_retry.wait(), if self.servers.is_none() => {}
        }
    }

    /// In order: 1. the sweep and the self-check stop, so no claim is
    /// unprepared and no liveness verdict written while the driver goes;
    /// 2. both sockets stop and are removed, so kubelet sees the driver
    /// gone; 3. nothing more: the slices stay for the next driver to take
    /// over unchanged (kubelet removes them when the driver is gone for
    /// good), and the state-folder lock goes when `run` returns.
    fn stop(mut self) {
        for task in &self.background {
            task.abort();
        }
        drop(self.servers.take());
    }
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
    /// Prepare and Unprepare, served on the DRA socket.
    preparer: Arc<Preparer>,
    /// The sweep and the socket self-check, stopped with the driver.
    background: [JoinHandle<()>; 2],
    /// Handed to each registration socket's service.
    verdict_tx: mpsc::UnboundedSender<Verdict>,
    /// kubelet's registration verdicts.
    verdicts: mpsc::UnboundedReceiver<Verdict>,
    /// The reconcile interval.
    interval: tokio::time::Interval,
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
    serve_retry: Backoff,
    reconcile_retry: Backoff,
    /// The slices may differ from the pool: reconcile.
    stale: bool,
    /// The last reconcile failed: the next waits for the backoff.
    failed: bool,
}

impl Driver {
    /// What the loop needs besides the lock and the probes: the API client
    /// (bounded by `--api-timeout`), the checkpoint, the two background
    /// tasks.
    async fn start(config: Config, observed: Arc<Observed>) -> Result<Driver, RunError> {
        let settings = Settings {
            timeout: Some(config.site.api_timeout),
            ..Settings::default()
        };
        let api = tokio::time::timeout(config.site.api_timeout, client::connect(&settings))
            .await
            .map_err(|_| ClusterError::SetupTimedOut {
                what: "starting the DRA driver".into(),
                after: config.site.api_timeout,
            })??;
        let (pool_tx, pool_rx) = watch::channel(Arc::new(Pool::default()));
        let preparer = Arc::new(Preparer::open(
            config.site.clone(),
            api.clone(),
            pool_rx,
            observed.clone(),
        )?);
        let background = [
            tokio::spawn(sweep_every(preparer.clone(), config.sweep_interval)),
            tokio::spawn(selfcheck::watch(
                config.registration_socket(),
                config.service_socket(),
                config.socket_check_interval,
                observed.clone(),
            )),
        ];
        let (verdict_tx, verdicts) = mpsc::unbounded_channel();
        let mut interval = tokio::time::interval(config.interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ok(Driver {
            reconciler: Reconciler::new(
                api,
                &config.site.node_name,
                TaintRule {
                    driver: config.site.driver.clone(),
                    effect: config.failed_link_taint,
                },
                config.shares,
            ),
            loader: Some(Loader::new(
                config.site.cdi_dir.clone(),
                config.max_spec_bytes,
            )),
            rails: config.rails_file.clone().map(RailsFile::new),
            published: Published::new(),
            config,
            preparer,
            background,
            verdict_tx,
            verdicts,
            interval,
            observed,
            pool: pool_tx,
            servers: None,
            quiet: Quiet::default(),
            serve_retry: Backoff::new(BACKOFF_FIRST, BACKOFF_MAX),
            reconcile_retry: Backoff::new(BACKOFF_FIRST, BACKOFF_MAX),
            stale: true,
            failed: false,
        })
    }

    /// Serves both sockets afresh when one is gone (or none is served).
    fn keep_serving(&mut self) {
        if let Some(s) = &self.servers {
            match s.missing() {
                None => return,
                Some(gone) => info!("{} is gone: serving both sockets again", gone.display()),
            }
            self.servers = None;
            self.observed.registered(false);
        }
        if !self.serve_retry.due() {
            return;
        }
        match self.serve() {
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
                self.serve_retry.failed();
            }
        }
    }

    fn serve(&self) -> Result<Servers, SocketError> {
        let preparer = &self.preparer;
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
                    pool_name: self.config.site.node_name.clone(),
                    pool: self.pool.subscribe(),
                },
            ),
        );
        servers.serve(&service, None, "DRA", Front::Authority, routes)?;
        let registrar = Registrar {
            name: self.config.site.driver.clone(),
            endpoint: service.display().to_string(),
            verdicts: self.verdict_tx.clone(),
        };
        servers.serve(
            &self.config.registration_socket(),
            None,
            "registration",
            Front::Authority,
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
                    crate::heap::release_freed_memory();
                }
                self.quiet
                    .clear("slices", || "ResourceSlices published".into());
            }
            Err(e) => {
                self.quiet.warn(
                    "slices",
                    format!("publishing ResourceSlices, retrying with backoff: {e}"),
                );
                self.observed.reconcile_failed(e);
                self.failed = true;
                self.reconcile_retry.failed();
            }
        }
    }
}
