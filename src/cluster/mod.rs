//! The only part of nodefabric that talks to the Kubernetes API, on kube-rs.
//!
//! Two components share one ConfigMap, as seed 001's "Shared record and
//! lifecycle" lays out:
//! - the **broker** ([`broker`]): every node's `nodefabric rails`/`publish`
//!   reads its Node's UID ([`node`]) and merge-patches only its own data key;
//! - the **Node Observer** ([`observer`]): creates and owns the ConfigMap
//!   ([`owner`]) and removes records of deleted or replaced Nodes
//!   ([`reconcile`]) with an atomic test-and-remove JSON Patch.
//!
//! Client configuration is the standard one ([`connect`]): `KUBECONFIG` when
//! set, else the in-cluster service account.

pub mod args;
pub mod broker;
pub mod health;
pub mod node;
pub mod observer;
pub mod orphans;
pub mod owner;
pub mod reconcile;
pub mod record;

use kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster,
    NamedContext,
};
use kube::{Client, Config};
use std::fmt;
use std::path::{Path, PathBuf};

/// Where kubelet mounts the service account's token, CA and namespace.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The API server's cap on a ConfigMap's data, keys and values together
/// (`MaxSecretSize` in the Kubernetes validation code, shared by ConfigMaps).
pub const CONFIGMAP_LIMIT: usize = 1024 * 1024;

/// The field manager nodefabric's writes are recorded under (`managedFields`).
pub const FIELD_MANAGER: &str = "nodefabric";

/// Everything that can go wrong talking to the cluster, each naming the object.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Neither `KUBECONFIG` nor the in-cluster variables lead to a cluster.
    #[error(
        "no cluster to talk to: set KUBECONFIG, or run in a pod (KUBERNETES_SERVICE_HOST unset)"
    )]
    NoConfig,
    /// The client configuration could not be loaded.
    #[error("loading the client configuration from {source_name}: {message}")]
    Config {
        /// `KUBECONFIG=…` or the service-account folder.
        source_name: String,
        /// What kube-rs said.
        message: String,
    },
    /// `--rails-configmap` is not `NAME` or `NAMESPACE/NAME`.
    #[error("{0:?} is not NAME or NAMESPACE/NAME (lowercase DNS names)")]
    BadConfigMapRef(String),
    /// The Node named on the command line does not exist.
    #[error("no Node named {0:?} (is NODE_NAME set from spec.nodeName?)")]
    NoSuchNode(String),
    /// The API server does not serve NodeRailRecords: the CRD is not installed.
    #[error("{what}: the API server does not know NodeRailRecords (the CRD noderailrecords.nodefabric.gpustack.ai is not installed): install it with `nodefabric crd | kubectl apply -f -` or `kubectl apply -f deploy/crds/` ({message})")]
    NoCrd {
        /// The request.
        what: String,
        /// The server's message.
        message: String,
    },
    /// The shared ConfigMap does not exist (yet).
    #[error("ConfigMap {0} does not exist: the Node Observer (`nodefabric observe`) creates it; is it running?")]
    NoConfigMap(ConfigMapRef),
    /// The API server refused a write for the ConfigMap's size limit.
    #[error(
        "ConfigMap {cm} refused the record of Node {node} ({size} bytes): a ConfigMap holds at most {limit} bytes (1 MiB) of keys and values in all; the previous record is kept ({message})",
        limit = CONFIGMAP_LIMIT
    )]
    TooLarge {
        /// The ConfigMap.
        cm: ConfigMapRef,
        /// The key.
        node: String,
        /// The record's size in bytes.
        size: usize,
        /// The server's message.
        message: String,
    },
    /// The service account lacks a permission; says which.
    #[error("{what}: forbidden: the service account needs {needs} (see deploy/; the API server said: {message})")]
    Forbidden {
        /// The request.
        what: String,
        /// The missing rule, in RBAC words.
        needs: String,
        /// The server's message.
        message: String,
    },
    /// Any other API answer or transport failure (kube-rs's error is the
    /// source, which `{:#}` prints after the request).
    #[error("{what}")]
    Api {
        /// The request.
        what: String,
        /// What kube-rs said.
        #[source]
        source: kube::Error,
    },
    /// The observer found a same-named ConfigMap it does not own.
    #[error("ConfigMap {cm} exists and is not controlled by Deployment {deployment} (uid {uid}); {found}: refusing to adopt it (nothing was changed). Delete it, or give --rails-configmap another name")]
    NotOwned {
        /// The ConfigMap.
        cm: ConfigMapRef,
        /// The observer's Deployment.
        deployment: String,
        /// Its UID.
        uid: String,
        /// Who controls it instead.
        found: String,
    },
    /// An answer that parsed but lacks what the request was for.
    #[error("{what}: {message}")]
    Malformed {
        /// The request.
        what: String,
        /// What is missing or wrong.
        message: String,
    },
    /// The runtime for the API calls could not start.
    #[error("starting the API client runtime: {0}")]
    Runtime(std::io::Error),
}

impl ClusterError {
    /// Wraps a kube-rs error with the request it answered.
    pub fn api(what: impl Into<String>, source: kube::Error) -> ClusterError {
        ClusterError::Api {
            what: what.into(),
            source,
        }
    }
}

/// The status code of an API answer inside a kube-rs error.
pub(crate) fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// The shared ConfigMap, as `--rails-configmap` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigMapRef {
    /// Its namespace; `None` means the client's default (the pod's own).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
}

impl ConfigMapRef {
    /// Parses `NAME` or `NAMESPACE/NAME`, each a lowercase RFC 1123 name.
    pub fn parse(s: &str) -> Result<ConfigMapRef, ClusterError> {
        let bad = || ClusterError::BadConfigMapRef(s.to_string());
        let (ns, name) = match s.split_once('/') {
            Some((ns, name)) => (Some(ns), name),
            None => (None, s),
        };
        if !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(dns_label)
            && ns.is_none_or(|n| n.len() <= 63 && dns_label(n))
        {
            Ok(ConfigMapRef {
                namespace: ns.map(str::to_string),
                name: name.to_string(),
            })
        } else {
            Err(bad())
        }
    }

    /// The namespace, falling back to the client's default.
    fn namespace_or<'a>(&'a self, client: &'a Client) -> &'a str {
        self.namespace
            .as_deref()
            .unwrap_or(client.default_namespace())
    }

    /// The same reference with its namespace filled in from the client.
    pub fn resolved(&self, client: &Client) -> ConfigMapRef {
        ConfigMapRef {
            namespace: Some(self.namespace_or(client).to_string()),
            name: self.name.clone(),
        }
    }
}

impl fmt::Display for ConfigMapRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// A DNS label: lowercase letters, digits and inner dashes, 1 to 63 characters.
fn dns_label(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 63
        && l.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !l.starts_with('-')
        && !l.ends_with('-')
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

/// A client for the configured cluster. `timeout` bounds each wait for the
/// API server's answer (a one-shot broker must not hang on a silent server);
/// `None` suits a watch, whose answers come when something changes.
pub async fn connect(
    sa_dir: &Path,
    timeout: Option<std::time::Duration>,
) -> Result<Client, ClusterError> {
    let mut config = config(sa_dir).await?;
    config.read_timeout = timeout;
    let source_name = config.cluster_url.to_string();
    Client::try_from(config).map_err(|e| ClusterError::Config {
        source_name,
        message: format!("{e:#}"),
    })
}

/// Runs one piece of async cluster work to completion from synchronous code
/// (the publisher is synchronous; each pass talks to the API briefly).
pub fn block_on<T>(
    work: impl std::future::Future<Output = Result<T, ClusterError>>,
) -> Result<T, ClusterError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ClusterError::Runtime)?
        .block_on(work)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configmap_ref_takes_name_or_namespace_slash_name() {
        assert_eq!(
            ConfigMapRef::parse("rails").unwrap(),
            ConfigMapRef {
                namespace: None,
                name: "rails".into()
            }
        );
        let r = ConfigMapRef::parse("nodefabric/topograph-nic-rails").unwrap();
        assert_eq!(
            (r.namespace.as_deref(), r.name.as_str()),
            (Some("nodefabric"), "topograph-nic-rails")
        );
        assert_eq!(r.to_string(), "nodefabric/topograph-nic-rails");
    }

    #[test]
    fn configmap_ref_refuses_malformed_names_and_names_them() {
        for bad in [
            "",
            "/",
            "ns/",
            "/name",
            "a/b/c",
            "Upper",
            "ns/-x",
            "ns/x_y",
            &"x".repeat(254),
            &format!("{}/x", "n".repeat(64)),
        ] {
            let e = ConfigMapRef::parse(bad).unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }
}
