//! The one way to the Kubernetes API server: every broker write, the Node
//! Observer and any later API user go through the client made here.
//!
//! - **Configuration** ([`config`]): `KUBECONFIG` when set, else the
//!   in-cluster service account.
//! - **One runtime, one client per process** ([`shared`], [`run`]): built on
//!   first use and reused, so an interval publisher keeps its connection and
//!   its token refresh across passes instead of a new TLS handshake and a new
//!   runtime every pass. A failed build is not kept: the next call tries again.
//! - **One retry policy** ([`retry`]): 429, 503, 504 (and other 5xx that
//!   send `Retry-After`) and connection failures are retried with jittered
//!   exponential backoff; other answers and a timed-out wait are not.
//! - **Timeouts** ([`Settings::timeout`]): bound every wait for the server.

pub mod retry;

use super::ClusterError;
use kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster,
    NamedContext,
};
use kube::{Client, Config};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// Where kubelet mounts the service account's token, CA and namespace.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// How a process reaches the API server: the same for each of its calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The service-account folder (token, ca.crt, namespace) for the
    /// in-cluster configuration; `KUBECONFIG`, when set, wins.
    pub service_account_dir: PathBuf,
    /// Bounds each wait for the server (connecting, sending, each answer):
    /// a one-shot broker must not hang on a silent server. `None` suits a
    /// watch, whose answers come only when something changes.
    pub timeout: Option<Duration>,
}

impl Default for Settings {
    /// The standard service-account folder, and no timeout.
    fn default() -> Settings {
        Settings {
            service_account_dir: PathBuf::from(SERVICE_ACCOUNT_DIR),
            timeout: None,
        }
    }
}

/// Whether a cluster is configured at all: `KUBECONFIG` set, or in a pod.
pub fn configured() -> bool {
    env_set("KUBECONFIG") || env_set("KUBERNETES_SERVICE_HOST")
}

fn env_set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty())
}

/// The client configuration: `KUBECONFIG` when set, else the in-cluster
/// service account found in `sa_dir` (the standard folder unless a test or
/// an unusual mount says otherwise).
pub async fn config(sa_dir: &Path) -> Result<Config, ClusterError> {
    if let Some(path) = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        let source_name = format!("KUBECONFIG={}", PathBuf::from(&path).display());
        // kube-rs reads each listed file whole: a FIFO or a device would
        // block or never end, so only regular files (or absent ones, which
        // it reports) are handed over.
        for file in std::env::split_paths(&path) {
            if std::fs::metadata(&file).is_ok_and(|m| !m.is_file()) {
                return Err(ClusterError::Config {
                    source_name,
                    message: format!("{} is not a regular file", file.display()),
                });
            }
        }
        return Config::from_kubeconfig(&KubeConfigOptions::default())
            .await
            .map_err(|e| ClusterError::Config {
                source_name,
                message: format!("{e:#}"),
            });
    }
    let host = std::env::var("KUBERNETES_SERVICE_HOST")
        .ok()
        .filter(|h| !h.is_empty())
        .ok_or(ClusterError::NoConfig)?;
    let port = std::env::var("KUBERNETES_SERVICE_PORT")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "443".into());
    // An IPv6 service address needs brackets in a URL.
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    let source_name = format!("the service account in {}", sa_dir.display());
    // As for KUBECONFIG: whole-file reads only of regular files.
    for file in ["token", "ca.crt", "namespace"].map(|f| sa_dir.join(f)) {
        if std::fs::metadata(&file).is_ok_and(|m| !m.is_file()) {
            return Err(ClusterError::Config {
                source_name,
                message: format!("{} is not a regular file", file.display()),
            });
        }
    }
    // The in-cluster setup written as a kubeconfig, so kube-rs reads the CA
    // and (re-reads) the token file exactly as it does for any kubeconfig.
    let path = |f: &str| Some(sa_dir.join(f).display().to_string());
    let kubeconfig = Kubeconfig {
        clusters: vec![NamedCluster {
            name: "in-cluster".into(),
            cluster: Some(Cluster {
                server: Some(format!("https://{host}:{port}")),
                certificate_authority: path("ca.crt"),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "in-cluster".into(),
            auth_info: Some(AuthInfo {
                token_file: path("token"),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: "in-cluster".into(),
            context: Some(Context {
                cluster: "in-cluster".into(),
                user: Some("in-cluster".into()),
                namespace: std::fs::read_to_string(sa_dir.join("namespace"))
                    .ok()
                    .map(|n| n.trim().to_string())
                    .filter(|n| !n.is_empty()),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        current_context: Some("in-cluster".into()),
        ..Default::default()
    };
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| ClusterError::Config {
            source_name,
            message: format!("{e:#}"),
        })
}

/// A new client for the configured cluster, with the retry policy and the
/// timeouts of `settings`. Most callers want [`shared`]; this is for a
/// program that runs its own runtime (a benchmark, a test).
pub async fn connect(settings: &Settings) -> Result<Client, ClusterError> {
    let mut config = config(&settings.service_account_dir).await?;
    if let Some(t) = settings.timeout {
        config.connect_timeout = Some(t);
        config.write_timeout = Some(t);
        config.read_timeout = Some(t);
        // A reused connection may sit idle between passes far longer than
        // the timeout: the wait must count from the request, not from then.
        config.reset_reader_on_write = true;
    }
    // kube-rs's own retry layer would be a second policy under this one.
    config.default_retry = false;
    let source_name = config.cluster_url.to_string();
    // Building runs the kubeconfig's credential command (`exec`), a blocking
    // wait on a child: on the blocking pool, so the caller's timeout can
    // give up on it while the runtime carries on.
    let builder =
        tokio::task::spawn_blocking(move || kube::client::ClientBuilder::try_from(config))
            .await
            .map_err(|e| ClusterError::Config {
                source_name: source_name.clone(),
                message: format!("the client setup stopped: {e}"),
            })?
            .map_err(|e| ClusterError::Config {
                source_name,
                message: format!("{e:#}"),
            })?;
    // The retry layer clones its inner service for each attempt: the buffer
    // makes kube-rs's boxed stack cloneable (one worker task on this runtime).
    Ok(builder
        .with_layer(&tower::buffer::BufferLayer::new(1024))
        .with_layer(&tower::retry::RetryLayer::new(retry::Policy::default()))
        .build())
}

/// The process's one client, built on the first call (in the process's
/// runtime, see [`run`]) and handed out again on every later call. A call
/// with other settings than the first is an error, not a second client.
/// A caller that gives up waiting (its timeout) leaves the build running:
/// the next call waits on that same build instead of starting another, so a
/// hung credential command costs one child, not one per pass.
pub async fn shared(settings: &Settings) -> Result<Client, ClusterError> {
    static CLIENT: Slot<Client> = Slot::new();
    let owned = settings.clone();
    one_per_process(&CLIENT, settings, move || connect_owned(owned)).await
}

async fn connect_owned(settings: Settings) -> Result<Client, ClusterError> {
    connect(&settings).await
}

/// The one value of a process ([`shared`]'s client) and the build under way.
struct Slot<T> {
    value: tokio::sync::OnceCell<(Settings, T)>,
    /// The build started and not yet awaited to its end.
    building: tokio::sync::Mutex<Option<tokio::task::JoinHandle<Result<T, ClusterError>>>>,
}

impl<T> Slot<T> {
    const fn new() -> Slot<T> {
        Slot {
            value: tokio::sync::OnceCell::const_new(),
            building: tokio::sync::Mutex::const_new(None),
        }
    }
}

/// The cell behind [`shared`], apart so a test can count the builds.
async fn one_per_process<T, F>(
    slot: &Slot<T>,
    settings: &Settings,
    build: impl FnOnce() -> F,
) -> Result<T, ClusterError>
where
    T: Clone + Send + 'static,
    F: Future<Output = Result<T, ClusterError>> + Send + 'static,
{
    let (first, value) = match slot.value.get() {
        Some(v) => v,
        None => {
            let mut building = slot.building.lock().await;
            match slot.value.get() {
                Some(v) => v,
                None => {
                    let handle = building.get_or_insert_with(|| tokio::spawn(build()));
                    // Dropped here (the caller's timeout), the handle stays
                    // for the next call; finished, it goes.
                    let built = handle.await;
                    *building = None;
                    let built = built.map_err(|e| ClusterError::Config {
                        source_name: "the API client".into(),
                        message: format!("the client setup stopped: {e}"),
                    })??;
                    let _ = slot.value.set((settings.clone(), built));
                    slot.value.get().expect("just set")
                }
            }
        }
    };
    if first != settings {
        return Err(ClusterError::OtherClientSettings {
            first: format!("{first:?}"),
            now: format!("{settings:?}"),
        });
    }
    Ok(value.clone())
}

/// The process's one runtime for API calls: one worker thread, so the
/// client's connections are served between the calls of a synchronous
/// caller too (a pooled connection the server closed is noticed, not reused).
fn runtime() -> Result<&'static tokio::runtime::Runtime, ClusterError> {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("nodefabric-api")
        .enable_all()
        .build()
        .map_err(ClusterError::Runtime)?;
    // A racing first call may have set it meanwhile; its runtime is as good.
    Ok(RUNTIME.get_or_init(|| rt))
}

/// Runs one piece of async cluster work to completion on the process's
/// runtime, from synchronous code (the publisher and the command line are
/// synchronous). Must not be called from inside that runtime.
pub fn block_on<T>(work: impl Future<Output = Result<T, ClusterError>>) -> Result<T, ClusterError> {
    runtime()?.block_on(work)
}

/// Runs `work` (the request `what`) with the process's client (see
/// [`shared`]) on the process's runtime: the synchronous callers' one entry.
/// With a timeout in `settings`, the whole of it is bounded by that timeout:
/// the client's setup and its credential command, a token refresh, every
/// request and its retries.
pub fn run<T, Fut>(
    settings: &Settings,
    what: &str,
    work: impl FnOnce(Client) -> Fut,
) -> Result<T, ClusterError>
where
    Fut: Future<Output = Result<T, ClusterError>>,
{
    block_on(async {
        let Some(after) = settings.timeout else {
            return work(shared(settings).await?).await;
        };
        let deadline = tokio::time::Instant::now() + after;
        let client = tokio::time::timeout_at(deadline, shared(settings))
            .await
            .map_err(|_| ClusterError::SetupTimedOut {
                what: what.to_string(),
                after,
            })??;
        tokio::time::timeout_at(deadline, work(client))
            .await
            .map_err(|_| ClusterError::TimedOut {
                what: what.to_string(),
                after,
            })?
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn one_client_per_process_is_built_once_a_failed_build_is_not_kept_and_other_settings_are_refused(
    ) {
        let cell = Slot::new();
        let builds = std::sync::Arc::new(AtomicUsize::new(0));
        let settings = Settings {
            timeout: Some(Duration::from_secs(30)),
            ..Settings::default()
        };
        let build = |ok: bool| {
            let builds = builds.clone();
            move || async move {
                builds.fetch_add(1, Ordering::SeqCst);
                if ok {
                    Ok(7)
                } else {
                    Err(ClusterError::NoConfig)
                }
            }
        };
        block_on(async {
            assert!(one_per_process(&cell, &settings, build(false))
                .await
                .is_err());
            assert_eq!(one_per_process(&cell, &settings, build(true)).await?, 7);
            assert_eq!(one_per_process(&cell, &settings, build(true)).await?, 7);
            let other = Settings {
                timeout: None,
                ..settings.clone()
            };
            let e = one_per_process(&cell, &other, build(true))
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains("timeout: None") && e.contains("30s"), "{e}");
            Ok(())
        })
        .unwrap();
        assert_eq!(
            builds.load(Ordering::SeqCst),
            2,
            "the failed build and the one kept"
        );
    }

    #[test]
    fn hung_credential_command_a_build_that_outlives_its_caller_is_awaited_again_not_started_twice()
    {
        let cell = Slot::new();
        let builds = std::sync::Arc::new(AtomicUsize::new(0));
        let settings = Settings::default();
        let slow = || {
            let builds = builds.clone();
            move || async move {
                builds.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok(7)
            }
        };
        block_on(async {
            let short = Duration::from_millis(50);
            for _ in 0..2 {
                let r =
                    tokio::time::timeout(short, one_per_process(&cell, &settings, slow())).await;
                assert!(r.is_err(), "the caller gave up");
            }
            assert_eq!(one_per_process(&cell, &settings, slow()).await?, 7);
            Ok(())
        })
        .unwrap();
        assert_eq!(
            builds.load(Ordering::SeqCst),
            1,
            "one build, awaited three times"
        );
    }

    #[test]
    fn the_runtime_is_one_per_process() {
        assert!(std::ptr::eq(runtime().unwrap(), runtime().unwrap()));
    }
}
