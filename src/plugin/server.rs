//! The long-running part: one gRPC server per resource on its own socket in
//! the kubelet folder, registration with kubelet, and the loop that keeps
//! both current.
//!
//! The loop wakes on the file events that matter (see [`super::watcher`]),
//! on a poll tick as a fallback, and on the registration backoff. Each wake it
//! 1. looks at the CDI specs (stat; a read only if one changed, a parse only
//!    if its bytes did), so ListAndWatch streams send a new list when a
//!    token appears, disappears or changes health;
//! 2. checks its registration: if one of its sockets is gone (kubelet
//!    removes them when it restarts) or `kubelet.sock` is a new file, it
//!    serves fresh sockets and registers again.

use super::allocate::CdiDelivery;
use super::api::{
    device_plugin_server::DevicePluginServer, registration_client::RegistrationClient,
};
use super::api::{DevicePluginOptions, RegisterRequest};
use super::catalog::{Catalog, Resource};
use super::conn;
use super::http;
use super::loader::{Loader, Outcome};
use super::metrics::Observed;
use super::quiet::Quiet;
use super::service::{ResourceService, Shared};
use super::uds;
use super::watcher::FolderWatch;
use anyhow::{Context, Result};
use std::future::Future;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

/// kubelet's registration socket in its device-plugin folder.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// The device-plugin API version this plugin speaks.
pub const API_VERSION: &str = "v1beta1";

/// What the plugin serves and where.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where `nodefabric` writes its CDI specs.
    pub cdi_dir: PathBuf,
    /// kubelet's device-plugin folder (holds `kubelet.sock` and our sockets).
    pub kubelet_dir: PathBuf,
    /// The resources served (exclusive always).
    pub resources: Vec<Resource>,
    /// The resource-name prefix (`device.gpustack.ai`).
    pub resource_prefix: String,
    /// How allocations hand CDI names to the runtime.
    pub delivery: CdiDelivery,
    /// The fallback re-check period when no file event arrives.
    pub poll_interval: Duration,
    /// Spec files larger than this are refused (the family keeps its tokens).
    pub max_spec_bytes: u64,
    /// Where to serve `/healthz`, `/readyz` and `/metrics`; `None` serves none.
    pub metrics_addr: Option<SocketAddr>,
    /// How long a ListAndWatch client may leave a list untaken before its
    /// connection is closed.
    pub drain_timeout: Duration,
}

impl Config {
    /// The full resource name, `<prefix>/<suffix>`.
    pub fn resource_name(&self, r: Resource) -> String {
        format!("{}/{}", self.resource_prefix, r.suffix())
    }
}

/// The servers of one registration, and how to stop them.
struct Generation {
    stop: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
    /// `(device, inode)` of the kubelet.sock we registered with.
    kubelet: (u64, u64),
}

impl Generation {
    fn shut(self) {
        let _ = self.stop.send(true);
        for s in self.servers {
            s.abort();
        }
    }
}

/// How long a burst of file events (a rename, a kubelet restart) may take
/// to settle before the loop looks.
const DEBOUNCE: Duration = Duration::from_millis(50);

/// The first and the longest wait between registration attempts while
/// kubelet does not answer; a new `kubelet.sock` is tried at once.
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
/// See [`BACKOFF_FIRST`].
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The cause word of [`super::specfile::SpecReadError::FolderMissing`].
const FOLDER_MISSING: &str = "folder_missing";

/// The cause word of [`super::specfile::SpecReadError::FolderDeleted`].
const FOLDER_DELETED: &str = "folder_deleted";

/// True for the causes that are the folder's, not one family's file.
fn folder_cause(cause: &str) -> bool {
    cause == FOLDER_MISSING || cause == FOLDER_DELETED
}

/// The de-duplication subject for registration trouble.
const KUBELET_SUBJECT: &str = "kubelet";

/// Runs until `shutdown` resolves, then removes its sockets.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<()> {
    // The channel holds the one current catalog; the loop below fills it.
    let (catalog_tx, catalog_rx) = watch::channel(Arc::new(Catalog::default()));
    let (wake_tx, mut wake) = mpsc::channel::<()>(1);
    let mut files: Vec<PathBuf> = crate::cdi::Family::ALL
        .iter()
        .map(|f| config.cdi_dir.join(f.file_name()))
        .collect();
    files.push(config.kubelet_dir.join(KUBELET_SOCKET));
    files.extend(
        config
            .resources
            .iter()
            .map(|r| config.kubelet_dir.join(r.socket_name())),
    );
    let (mut folders, watch_error) =
        FolderWatch::new(&[&config.cdi_dir, &config.kubelet_dir], files, wake_tx);
    if let Some(e) = watch_error {
        warn!(
            "file watching unavailable, polling every {:?}: {e}",
            config.poll_interval
        );
    }
    let names: Vec<(Resource, String)> = config
        .resources
        .iter()
        .map(|&r| (r, config.resource_name(r)))
        .collect();
    let observed = Arc::new(Observed::new(
        &names.iter().map(|(_, n)| n.clone()).collect::<Vec<_>>(),
    ));
    observed.catalog(&catalog_rx.borrow(), &names);
    let _http = match config.metrics_addr {
        Some(addr) => Some(http::serve(addr, observed.clone()).await?),
        None => None,
    };
    let mut loader = Some(Loader::new(config.cdi_dir.clone(), config.max_spec_bytes));
    let mut quiet = Quiet::default();
    let mut tick = tokio::time::interval(config.poll_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut current: Option<Generation> = None;
    let mut backoff = BACKOFF_FIRST;
    let mut next_attempt = Instant::now();
    // The kubelet.sock the last failed attempt saw: a different one is tried at once.
    let mut attempted: Option<Option<(u64, u64)>> = None;
    tokio::pin!(shutdown);
    loop {
        folders.rearm();
        // Reload first so a fresh registration starts from the current specs.
        let served = catalog_tx.borrow().clone();
        let mut l = loader
            .take()
            .expect("the loader is put back after every look");
        // Off the runtime thread: file I/O must never stall the gRPC servers.
        observed.loading(true);
        let kubelet_dir = config.kubelet_dir.clone();
        let (l, fresh, outcome, kubelet_stale) = tokio::task::spawn_blocking(move || {
            let (c, o) = l.load(&served);
            // The kubelet folder too: a new kubelet.sock in the host's new
            // folder is never seen through the old mount.
            let stale = crate::mounts::deleted_in_place(&kubelet_dir)
                .then(|| crate::mounts::stale_reason("the kubelet folder", &kubelet_dir));
            (l, c, o, stale)
        })
        .await
        .context("reading the CDI specs")?;
        loader = Some(l);
        observed.loading(false);
        report(&mut quiet, &config, &outcome);
        // A folder deleted under the mount never comes back by itself:
        // liveness fails, and the kubelet's restart mounts the new one.
        observed.stale_folder(
            outcome
                .unreadable
                .iter()
                .find(|(_, cause, _)| *cause == FOLDER_DELETED)
                .map(|(_, _, message)| message.clone())
                .or(kubelet_stale),
        );
        observed.look(
            &outcome.reloaded,
            &outcome.new_errors,
            outcome
                .unreadable
                .iter()
                .map(|(f, _, m)| (*f, m.clone()))
                .collect(),
        );
        if fresh != **catalog_tx.borrow() {
            info!(
                whole = fresh.endpoints(crate::cdi::Family::Whole).len(),
                partitioned = fresh.endpoints(crate::cdi::Family::Partitioned).len(),
                "CDI specs read"
            );
            observed.catalog(&fresh, &names);
            catalog_tx.send_replace(Arc::new(fresh));
        }
        if let Some(why) = needs_registration(&config, current.as_ref()) {
            let kubelet = kubelet_identity(&config.kubelet_dir);
            if Instant::now() >= next_attempt || attempted != Some(kubelet) {
                if let Some(old) = current.take() {
                    info!("re-registering: {why}");
                    old.shut();
                }
                observed.unregistered();
                match start(&config, &catalog_rx, &observed).await {
                    Ok(g) => {
                        current = Some(g);
                        backoff = BACKOFF_FIRST;
                        attempted = None;
                        quiet.clear(KUBELET_SUBJECT, || "kubelet answered: registered".into());
                    }
                    Err(e) => {
                        observed.unregistered();
                        quiet.warn(
                            KUBELET_SUBJECT,
                            format!("waiting for kubelet, retrying with backoff: {e:#}"),
                        );
                        attempted = Some(kubelet);
                        next_attempt = Instant::now() + backoff;
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                    }
                }
            }
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tick.tick() => {}
            _ = tokio::time::sleep_until(next_attempt), if current.is_none() => {}
            Some(()) = wake.recv() => {
                tokio::time::sleep(DEBOUNCE).await;
                while wake.try_recv().is_ok() {}
            }
        }
    }
    info!("shutting down");
    if let Some(g) = current.take() {
        g.shut();
    }
    for r in &config.resources {
        let path = config.kubelet_dir.join(r.socket_name());
        if let Err(e) = std::fs::remove_file(&path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!("removing {}: {e}", path.display());
            }
        }
    }
    Ok(())
}

/// Logs each unreadable spec once per cause, and once when it reads again.
fn report(quiet: &mut Quiet, config: &Config, outcome: &Outcome) {
    // A missing folder is one cause for both families: one line, under the
    // folder's name, and the families' own warnings are left as they were.
    let folder = config.cdi_dir.display().to_string();
    match outcome
        .unreadable
        .iter()
        .find(|(_, cause, _)| folder_cause(cause))
    {
        Some((_, cause, message)) => {
            let restart = if *cause == FOLDER_DELETED {
                "; /healthz fails until the kubelet restarts the plugin"
            } else {
                ""
            };
            quiet.warn(
                &folder,
                format!("{message}; keeping every token already served{restart}"),
            );
        }
        None => quiet.clear(&folder, || format!("{folder} is back")),
    }
    for family in crate::cdi::Family::ALL {
        let subject = config
            .cdi_dir
            .join(family.file_name())
            .display()
            .to_string();
        match outcome.unreadable.iter().find(|(f, _, _)| *f == family) {
            Some((_, cause, _)) if folder_cause(cause) => {}
            Some((_, _, message)) => {
                quiet.warn(
                    &subject,
                    format!(
                        "skipping CDI spec: {message}; keeping the {} tokens already served",
                        family.kind()
                    ),
                );
            }
            None => quiet.clear(&subject, || format!("{subject} is readable again")),
        }
    }
}

/// Why the plugin must (re-)register now, or `None` when all is in place.
fn needs_registration(config: &Config, current: Option<&Generation>) -> Option<String> {
    let Some(g) = current else {
        return Some("not registered".into());
    };
    for r in &config.resources {
        let path = config.kubelet_dir.join(r.socket_name());
        if !is_socket(&path) {
            return Some(format!("{} is gone", path.display()));
        }
    }
    match kubelet_identity(&config.kubelet_dir) {
        Some(id) if id != g.kubelet => Some(format!("{KUBELET_SOCKET} was recreated")),
        // No kubelet.sock: kubelet is restarting; keep serving until it returns.
        _ => None,
    }
}

/// Serves every resource on a fresh socket, then registers each with kubelet.
async fn start(
    config: &Config,
    catalog: &watch::Receiver<Arc<Catalog>>,
    observed: &Arc<Observed>,
) -> Result<Generation> {
    let kubelet_sock = config.kubelet_dir.join(KUBELET_SOCKET);
    let kubelet = kubelet_identity(&config.kubelet_dir)
        .with_context(|| format!("{} does not exist", kubelet_sock.display()))?;
    let (stop, stop_rx) = watch::channel(false);
    let mut servers = Vec::new();
    // Serve before registering: kubelet calls GetDevicePluginOptions while Register is in flight.
    for &r in &config.resources {
        let listener = uds::bind(&config.kubelet_dir.join(r.socket_name()))?;
        let shared = Shared {
            catalog: catalog.clone(),
            delivery: config.delivery,
            stop: stop_rx.clone(),
            observed: observed.clone(),
            drain_timeout: config.drain_timeout,
        };
        let svc = ResourceService::new(r, config.resource_name(r), shared);
        let server = tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(svc))
            .serve_with_incoming(conn::incoming(listener));
        servers.push(tokio::spawn(async move {
            if let Err(e) = server.await {
                warn!("{} server stopped: {e}", r.suffix());
            }
        }));
    }
    let generation = Generation {
        stop,
        servers,
        kubelet,
    };
    if let Err(e) = register_all(config, &kubelet_sock, observed).await {
        generation.shut();
        return Err(e);
    }
    Ok(generation)
}

async fn register_all(config: &Config, kubelet_sock: &Path, observed: &Observed) -> Result<()> {
    let mut client = RegistrationClient::new(uds::connect(kubelet_sock).await?);
    for &r in &config.resources {
        let request = RegisterRequest {
            version: API_VERSION.into(),
            endpoint: r.socket_name().into(),
            resource_name: config.resource_name(r),
            options: Some(DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        };
        client.register(request).await.with_context(|| {
            format!(
                "registering {} with {}",
                config.resource_name(r),
                kubelet_sock.display()
            )
        })?;
        info!(
            resource = config.resource_name(r),
            socket = r.socket_name(),
            "registered with kubelet"
        );
        observed.registered(&config.resource_name(r));
    }
    Ok(())
}

fn is_socket(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

fn kubelet_identity(kubelet_dir: &Path) -> Option<(u64, u64)> {
    let m = std::fs::symlink_metadata(kubelet_dir.join(KUBELET_SOCKET)).ok()?;
    m.file_type().is_socket().then(|| (m.dev(), m.ino()))
}
