//! The long-running part: one gRPC server per resource on its own socket in
//! the kubelet folder, registration with kubelet, and the loop that keeps
//! both current.
//!
//! The loop wakes on file events in the CDI and kubelet folders (inotify via
//! `notify`) and on a poll tick as a fallback. Each wake it
//! 1. re-reads the CDI specs, so ListAndWatch streams send a new list when a
//!    token appears, disappears or changes health;
//! 2. checks its registration: if one of its sockets is gone (kubelet
//!    removes them when it restarts) or `kubelet.sock` is a new file, it
//!    serves fresh sockets and registers again.

use super::allocate::CdiDelivery;
use super::api::{device_plugin_server::DevicePluginServer, registration_client::RegistrationClient};
use super::api::{DevicePluginOptions, RegisterRequest};
use super::catalog::{Catalog, Resource};
use super::service::ResourceService;
use super::uds;
use anyhow::{Context, Result};
use notify::Watcher;
use std::future::Future;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
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

/// Runs until `shutdown` resolves, then removes its sockets.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<()> {
    // The channel holds the one current catalog; the loop below fills it.
    let (catalog_tx, catalog_rx) = watch::channel(Arc::new(Catalog::default()));
    let (events_tx, mut events) = mpsc::unbounded_channel::<()>();
    let _watcher = watch_folders(&[&config.cdi_dir, &config.kubelet_dir], events_tx);
    let mut tick = tokio::time::interval(config.poll_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut current: Option<Generation> = None;
    tokio::pin!(shutdown);
    loop {
        // Reload first so a fresh registration starts from the current specs.
        let served = catalog_tx.borrow().clone();
        let fresh = Catalog::load(&config.cdi_dir, &served);
        if fresh != *served {
            info!(
                whole = fresh.endpoints(crate::cdi::Family::Whole).len(),
                partitioned = fresh.endpoints(crate::cdi::Family::Partitioned).len(),
                "CDI specs read"
            );
            catalog_tx.send_replace(Arc::new(fresh));
        }
        if let Some(why) = needs_registration(&config, current.as_ref()) {
            if let Some(old) = current.take() {
                info!("re-registering: {why}");
                old.shut();
            }
            match start(&config, &catalog_rx).await {
                Ok(g) => current = Some(g),
                Err(e) => warn!("not registered yet ({why}): {e:#}"),
            }
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tick.tick() => {}
            Some(()) = events.recv() => {
                // Let a burst of events (a rename, a kubelet restart) settle.
                tokio::time::sleep(Duration::from_millis(50)).await;
                while events.try_recv().is_ok() {}
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
async fn start(config: &Config, catalog: &watch::Receiver<Arc<Catalog>>) -> Result<Generation> {
    let kubelet_sock = config.kubelet_dir.join(KUBELET_SOCKET);
    let kubelet = kubelet_identity(&config.kubelet_dir).with_context(|| format!("{} does not exist", kubelet_sock.display()))?;
    let (stop, stop_rx) = watch::channel(false);
    let mut servers = Vec::new();
    // Serve before registering: kubelet calls GetDevicePluginOptions while Register is in flight.
    for &r in &config.resources {
        let listener = uds::bind(&config.kubelet_dir.join(r.socket_name()))?;
        let svc = ResourceService::new(r, catalog.clone(), config.delivery, stop_rx.clone());
        let server = tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(svc))
            .serve_with_incoming(UnixListenerStream::new(listener));
        servers.push(tokio::spawn(async move {
            if let Err(e) = server.await {
                warn!("{} server stopped: {e}", r.suffix());
            }
        }));
    }
    let generation = Generation { stop, servers, kubelet };
    if let Err(e) = register_all(config, &kubelet_sock).await {
        generation.shut();
        return Err(e);
    }
    Ok(generation)
}

async fn register_all(config: &Config, kubelet_sock: &Path) -> Result<()> {
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
        client
            .register(request)
            .await
            .with_context(|| format!("registering {} with {}", config.resource_name(r), kubelet_sock.display()))?;
        info!(resource = config.resource_name(r), socket = r.socket_name(), "registered with kubelet");
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

/// Watches the folders for any change; a folder that cannot be watched is
/// logged and left to the poll tick.
fn watch_folders(dirs: &[&Path], events: mpsc::UnboundedSender<()>) -> Option<notify::RecommendedWatcher> {
    let mut watcher = match notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if res.is_ok() {
            let _ = events.send(());
        }
    }) {
        Ok(w) => w,
        Err(e) => {
            warn!("file watching unavailable, polling only: {e}");
            return None;
        }
    };
    for dir in dirs {
        if let Err(e) = watcher.watch(dir, notify::RecursiveMode::NonRecursive) {
            warn!("cannot watch {}, polling it instead: {e}", dir.display());
        }
    }
    Some(watcher)
}
