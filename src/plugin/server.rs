//! The long-running part of the device plugin: one gRPC server per
//! resource on its own socket in the kubelet folder, registration with
//! kubelet, and what the shared loop ([`crate::kubelet::plugin_loop`]) does
//! for it. The kubelet-plugin runtime ([`crate::kubelet`]) does the
//! sockets, the watch, the restart check and the probes; this file fills
//! the loop in.
//!
//! The loop wakes on the file events that matter (see
//! [`crate::kubelet::watch`]), on a poll tick as a fallback, and on the
//! registration backoff. Each wake it
//! 1. looks at the CDI specs (stat; a read only if one changed, a parse only
//!    if its bytes did), so ListAndWatch streams send a new list when a
//!    token appears, disappears or changes health;
//! 2. checks its registration: if one of its sockets is gone (kubelet
//!    removes them when it restarts) or `kubelet.sock` is a new file (the
//!    folder watch saw it created, or its identity, change time included,
//!    differs: see [`crate::kubelet::restart`]), it serves fresh sockets
//!    and registers again.

use super::allocate::CdiDelivery;
use super::api::{
    device_plugin_server::DevicePluginServer, registration_client::RegistrationClient,
};
use super::api::{DevicePluginOptions, RegisterRequest};
use super::catalog::{Catalog, Resource};
use super::metrics::Observed;
use super::service::{list_bytes, ResourceService, Shared, MAX_LIST_BYTES};
use crate::kubelet::plugin_loop::{self, KubeletPlugin, Look, LoopError, Watched};
use crate::kubelet::quiet::Quiet;
use crate::kubelet::restart::{Identity, Retry};
use crate::kubelet::servers::{Front, Servers};
use crate::kubelet::socket::{self, SocketError};
use crate::kubelet::specs::{self, Loader, Outcome, Unreadable};
use crate::kubelet::watch::FolderWatch;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tonic::service::Routes;
use tracing::info;

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

/// Why the plugin stopped before a shutdown signal: only the loop's own
/// reasons; registration trouble is not among them (the plugin waits for
/// kubelet instead).
pub type RunError = LoopError;

/// Why one registration attempt failed; logged, then retried with backoff.
#[derive(Debug, thiserror::Error)]
enum RegisterError {
    /// kubelet is not (yet) there.
    #[error("{0} does not exist")]
    NoKubelet(PathBuf),
    /// A socket could not be served, or kubelet's could not be reached.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// kubelet refused or did not answer the registration.
    #[error("registering {resource} with {kubelet}: {status}")]
    Refused {
        /// The full resource name.
        resource: String,
        /// kubelet's socket.
        kubelet: PathBuf,
        /// kubelet's answer.
        status: tonic::Status,
    },
    /// kubelet accepted the connection but gave no answer in time.
    #[error("registering {resource} with {kubelet}: no answer within {REGISTER_TIMEOUT:?}")]
    Unanswered {
        /// The full resource name.
        resource: String,
        /// kubelet's socket.
        kubelet: PathBuf,
    },
}

/// How long one Register call may wait for kubelet's answer: kubelet
/// answers at once, and a silent one must not hold the loop (and with it
/// every spec reload) until the plugin is restarted; the attempt is retried
/// with the backoff.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// The servers of one registration, and the kubelet they registered with.
struct Generation {
    servers: Servers,
    kubelet: Identity,
}

/// The first and the longest wait between registration attempts while
/// kubelet does not answer; a new `kubelet.sock` is tried at once.
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
/// See [`BACKOFF_FIRST`].
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The cause word of a spec refused because a list of its tokens would be
/// larger than kubelet takes in one message.
const TOO_MANY_TOKENS: &str = "too_many_tokens";

/// The de-duplication subject for registration trouble.
const KUBELET_SUBJECT: &str = "kubelet";

/// Runs until `shutdown` resolves, then removes its sockets.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    let plugin = Plugin::new(config);
    let probes = plugin
        .config
        .metrics_addr
        .map(|addr| (addr, plugin.observed.clone()));
    plugin_loop::run(probes, async { Ok(plugin) }, shutdown).await
}

/// What the loop keeps between wakes.
struct Plugin {
    config: Config,
    /// Each served resource with its full name.
    names: Vec<(Resource, String)>,
    observed: Arc<Observed>,
    /// Holds the one current catalog; every service reads it.
    catalog: watch::Sender<Arc<Catalog>>,
    /// Taken while a look runs off the runtime thread, put back after.
    loader: Option<Loader>,
    quiet: Quiet,
    current: Option<Generation>,
    retry: Retry,
    /// Families whose current spec is refused because one of its lists
    /// would be over [`MAX_LIST_BYTES`], with the message: kept until the
    /// family's spec changes, since the loader reports a spec only once.
    oversized: std::collections::BTreeMap<crate::cdi::Family, String>,
    /// The folder watch saw `kubelet.sock` created since the last
    /// registration attempt: a kubelet restart even when the new socket
    /// has the old one's identity.
    kubelet_created: bool,
}

impl Plugin {
    fn new(config: Config) -> Plugin {
        let names: Vec<(Resource, String)> = config
            .resources
            .iter()
            .map(|&r| (r, config.resource_name(r)))
            .collect();
        let observed = Arc::new(Observed::new(
            &names.iter().map(|(_, n)| n.clone()).collect::<Vec<_>>(),
        ));
        let catalog = watch::Sender::new(Arc::new(Catalog::default()));
        observed.catalog(&catalog.borrow(), &names);
        Plugin {
            loader: Some(Loader::new(config.cdi_dir.clone(), config.max_spec_bytes)),
            config,
            names,
            observed,
            catalog,
            quiet: Quiet::default(),
            current: None,
            retry: Retry::new(BACKOFF_FIRST, BACKOFF_MAX),
            kubelet_created: false,
            oversized: Default::default(),
        }
    }

    /// Serves fresh sockets and registers again when kubelet needs it and
    /// an attempt is due; a failure is logged once per cause and retried.
    async fn keep_registered(&mut self) {
        let Some(why) =
            needs_registration(&self.config, self.current.as_ref(), self.kubelet_created)
        else {
            return;
        };
        let kubelet = Identity::of(&self.config.kubelet_dir.join(KUBELET_SOCKET));
        if !self.retry.due(kubelet) {
            return;
        }
        // This attempt registers with the kubelet that created it.
        self.kubelet_created = false;
        if let Some(old) = self.current.take() {
            info!("re-registering: {why}");
            drop(old);
        }
        self.observed.unregistered();
        match start(&self.config, &self.catalog, &self.observed).await {
            Ok(g) => {
                self.current = Some(g);
                self.retry.succeeded();
                self.quiet
                    .clear(KUBELET_SUBJECT, || "kubelet answered: registered".into());
            }
            Err(e) => {
                self.observed.unregistered();
                self.quiet.warn(
                    KUBELET_SUBJECT,
                    format!("waiting for kubelet, retrying with backoff: {e}"),
                );
                self.retry.failed(kubelet);
            }
        }
    }
}

/// What one look read, carried back from the blocking thread.
struct Seen {
    /// The loader, put back.
    loader: Loader,
    /// The catalog the specs make now, refused families kept as served.
    catalog: Catalog,
    /// What the loader found.
    outcome: Outcome,
    /// Families whose new list kubelet would reject whole.
    refused: Vec<Refused>,
}

/// A family kept as served because one of its lists is too large.
struct Refused {
    family: crate::cdi::Family,
    /// The resource whose list is over [`MAX_LIST_BYTES`].
    resource: Resource,
    /// That list's size.
    bytes: usize,
}

impl KubeletPlugin for Plugin {
    type Error = RunError;
    type Seen = Seen;

    fn cdi_dir(&self) -> &Path {
        &self.config.cdi_dir
    }

    fn watched(&self) -> Watched {
        let config = &self.config;
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
        Watched {
            folders: vec![config.cdi_dir.clone(), config.kubelet_dir.clone()],
            files,
        }
    }

    fn poll_interval(&self) -> Duration {
        self.config.poll_interval
    }

    fn kubelet_folders(&self) -> Vec<PathBuf> {
        vec![self.config.kubelet_dir.clone()]
    }

    fn noticed(&mut self, watch: &FolderWatch) {
        // Sticky until the next registration attempt takes it.
        self.kubelet_created |= watch.take_created(&self.config.kubelet_dir.join(KUBELET_SOCKET));
    }

    /// Reads what changed in the CDI folder; `looked` publishes a changed
    /// catalog.
    fn look(&mut self) -> Look<Seen> {
        let served = self.catalog.borrow().clone();
        let mut loader = self
            .loader
            .take()
            .expect("the loader is put back after every look");
        self.observed.loading(true);
        let resources = self.config.resources.clone();
        Box::new(move || {
            let outcome = loader.load();
            // An unreadable family is not among the changes: it keeps its
            // tokens, since kubelet has checkpointed their IDs.
            let mut catalog = served.with_changes(&outcome.changed);
            // So does a family whose new list kubelet would reject whole.
            let mut refused = Vec::new();
            for (family, _) in &outcome.changed {
                let over = resources
                    .iter()
                    .filter(|r| r.family() == *family)
                    .map(|&r| (r, list_bytes(&catalog, r)))
                    .find(|(_, bytes)| *bytes > MAX_LIST_BYTES);
                if let Some((resource, bytes)) = over {
                    catalog = catalog.with_family(*family, served.endpoints(*family).to_vec());
                    refused.push(Refused {
                        family: *family,
                        resource,
                        bytes,
                    });
                }
            }
            Seen {
                loader,
                catalog,
                outcome,
                refused,
            }
        })
    }

    /// Takes in what a look read: the loader back, the refused families
    /// noted, the warnings and metrics, and a changed catalog published.
    fn looked(&mut self, seen: Seen, kubelet_stale: Option<String>) {
        let Seen {
            loader,
            catalog: fresh,
            mut outcome,
            refused,
        } = seen;
        self.loader = Some(loader);
        self.observed.loading(false);
        for (family, _) in &outcome.changed {
            self.oversized.remove(family);
        }
        for Refused {
            family,
            resource: r,
            bytes,
        } in refused
        {
            let message = format!(
                "{}: its {} device list would be {bytes} bytes, over the {MAX_LIST_BYTES} \
                 bytes kubelet accepts in one message",
                self.config.cdi_dir.join(family.file_name()).display(),
                self.config.resource_name(r),
            );
            self.oversized.insert(family, message);
            outcome.new_errors.push((family, TOO_MANY_TOKENS));
        }
        for (family, message) in &self.oversized {
            outcome.unreadable.push(Unreadable {
                family: *family,
                cause: TOO_MANY_TOKENS,
                message: message.clone(),
            });
        }
        specs::report(&mut self.quiet, &self.config.cdi_dir, &outcome, "token");
        // A folder deleted under the mount never comes back by itself:
        // liveness fails, and the kubelet's restart mounts the new one.
        self.observed.stale_folder(
            outcome
                .folder_deleted()
                .map(str::to_string)
                .or(kubelet_stale),
        );
        self.observed.look(
            &outcome.reloaded,
            &outcome.new_errors,
            outcome
                .unreadable
                .iter()
                .map(|u| (u.family, u.message.clone()))
                .collect(),
        );
        if fresh != **self.catalog.borrow() {
            info!(
                whole = fresh.endpoints(crate::cdi::Family::Whole).len(),
                partitioned = fresh.endpoints(crate::cdi::Family::Partitioned).len(),
                "CDI specs read"
            );
            self.observed.catalog(&fresh, &self.names);
            self.catalog.send_replace(Arc::new(fresh));
        }
    }

    async fn keep_current(&mut self) {
        self.keep_registered().await;
    }

    async fn wake(&mut self) {
        match self.current {
            None => self.retry.wait().await,
            // Registered: only a file event or the poll tick wakes the loop.
            Some(_) => std::future::pending().await,
        }
    }

    fn stop(mut self) {
        // Stops the servers and removes their sockets.
        drop(self.current.take());
    }
}

/// Why the plugin must (re-)register now, or `None` when all is in place.
fn needs_registration(
    config: &Config,
    current: Option<&Generation>,
    kubelet_created: bool,
) -> Option<String> {
    let Some(g) = current else {
        return Some("not registered".into());
    };
    if let Some(path) = g.servers.missing() {
        return Some(format!("{} is gone", path.display()));
    }
    match Identity::of(&config.kubelet_dir.join(KUBELET_SOCKET)) {
        Some(id) if id != g.kubelet || kubelet_created => {
            Some(format!("{KUBELET_SOCKET} was recreated"))
        }
        // No kubelet.sock: kubelet is restarting; keep serving until it returns.
        _ => None,
    }
}

/// Serves every resource on a fresh socket, then registers each with kubelet.
async fn start(
    config: &Config,
    catalog: &watch::Sender<Arc<Catalog>>,
    observed: &Arc<Observed>,
) -> Result<Generation, RegisterError> {
    let kubelet_sock = config.kubelet_dir.join(KUBELET_SOCKET);
    let kubelet = Identity::of(&kubelet_sock)
        .ok_or_else(|| RegisterError::NoKubelet(kubelet_sock.clone()))?;
    let mut servers = Servers::default();
    // Serve before registering: kubelet calls GetDevicePluginOptions while Register is in flight.
    for &r in &config.resources {
        let shared = Shared {
            catalog: catalog.subscribe(),
            delivery: config.delivery,
            stop: servers.stopping(),
            observed: observed.clone(),
            drain_timeout: config.drain_timeout,
        };
        let svc = ResourceService::new(r, config.resource_name(r), shared);
        servers.serve(
            &config.kubelet_dir.join(r.socket_name()),
            None,
            r.suffix(),
            Front::Hangup,
            Routes::new(DevicePluginServer::new(svc)),
        )?;
    }
    // A failure drops `servers`, which stops them and removes their sockets.
    register_all(config, &kubelet_sock, observed).await?;
    Ok(Generation { servers, kubelet })
}

async fn register_all(
    config: &Config,
    kubelet_sock: &Path,
    observed: &Observed,
) -> Result<(), RegisterError> {
    let mut client = RegistrationClient::new(socket::connect(kubelet_sock).await?);
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
        tokio::time::timeout(REGISTER_TIMEOUT, client.register(request))
            .await
            .map_err(|_| RegisterError::Unanswered {
                resource: config.resource_name(r),
                kubelet: kubelet_sock.into(),
            })?
            .map_err(|status| RegisterError::Refused {
                resource: config.resource_name(r),
                kubelet: kubelet_sock.into(),
                status,
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
