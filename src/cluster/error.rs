//! What can go wrong talking to the cluster: one error type for the client,
//! the broker and the observer, each variant naming the object or value.

use super::{ConfigMapRef, CONFIGMAP_LIMIT};

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
    /// Any other API answer or transport failure, each cause said once, in
    /// words ([`describe`]).
    #[error("{what}: {}", describe(error))]
    Api {
        /// The request.
        what: String,
        /// What kube-rs said.
        error: kube::Error,
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
    /// A second user of the process's one client asked for other settings.
    #[error("the API client of this process was made with {first}; a later call asked for {now}: one process, one client")]
    OtherClientSettings {
        /// The settings the client was made with.
        first: String,
        /// The settings asked for since.
        now: String,
    },
    /// The client's setup (its configuration and credential command) did
    /// not finish within the API timeout.
    #[error("{what}: setting up the API client (its configuration and credential command) took longer than the API timeout ({}, --api-timeout)", humantime::format_duration(*after))]
    SetupTimedOut {
        /// The request it was for.
        what: String,
        /// The API timeout.
        after: std::time::Duration,
    },
    /// A request (with its retries and token refresh) did not finish within
    /// the API timeout.
    #[error("{what}: not done within the API timeout ({}, --api-timeout)", humantime::format_duration(*after))]
    TimedOut {
        /// The request.
        what: String,
        /// The API timeout.
        after: std::time::Duration,
    },
    /// A publication names no node to key the record by.
    #[error("publishing to a {0} needs --node-name")]
    NoNodeName(String),
    /// A NodeRailRecord cannot name its owner without the Node's UID.
    #[error("NodeRailRecord {0} needs its Node's UID for the ownerReference (--node-uid, or a readable Node {0})")]
    NoNodeUid(String),
    /// Reading this node's Node object for its UID failed.
    #[error("reading Node {node}'s UID")]
    NodeUid {
        /// The Node's name.
        node: String,
        /// Why.
        #[source]
        source: Box<ClusterError>,
    },
}

impl ClusterError {
    /// Wraps a kube-rs error with the request it answered.
    pub fn api(what: impl Into<String>, error: kube::Error) -> ClusterError {
        ClusterError::Api {
            what: what.into(),
            error,
        }
    }

    /// A kube-rs error with the request it answered, where a 403 becomes
    /// [`ClusterError::Forbidden`] naming the permission the request `needs`.
    pub fn refused(
        what: impl Into<String>,
        needs: impl Into<String>,
        error: kube::Error,
    ) -> ClusterError {
        match code(&error) {
            Some(403) => ClusterError::Forbidden {
                what: what.into(),
                needs: needs.into(),
                message: status_message(&error),
            },
            _ => ClusterError::api(what, error),
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

/// The server's own message of a refused request (kube-rs's text otherwise).
pub(crate) fn status_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

/// A kube-rs error in words, each cause once: an API answer as "the API
/// server refused: 409 Conflict: <its message>" (not kube-rs's text, which
/// adds the whole `Status` as a debug dump), anything else as its chain of
/// causes ([`Chain`]).
pub(crate) fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => {
            let words = axum::http::StatusCode::from_u16(s.code)
                .ok()
                .and_then(|c| c.canonical_reason())
                .unwrap_or(s.reason.as_str());
            match s.message.trim() {
                "" => format!("the API server refused: {} {words}", s.code),
                m => format!("the API server refused: {} {words}: {m}", s.code),
            }
        }
        other => Chain(other).to_string(),
    }
}

/// An error and its sources joined by `: `, as the command line prints a
/// cause chain, for the log lines of a process that carries on after the error;
/// a source whose words are already said (kube-rs and hyper repeat their
/// source in their own text) is left out.
pub(crate) struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut said = self.0.to_string();
        let mut next = self.0.source();
        while let Some(e) = next {
            let words = e.to_string();
            if !said.contains(&words) {
                said = format!("{said}: {words}");
            }
            next = e.source();
        }
        f.write_str(&said)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_error_texts_say_each_cause_once_in_words() {
        let status =
            kube::core::Status::failure("configmaps \"x\" already exists", "AlreadyExists")
                .with_code(409);
        let e = ClusterError::api("POST ConfigMap ns/x", kube::Error::Api(Box::new(status)));
        assert_eq!(
            Chain(&e).to_string(),
            "POST ConfigMap ns/x: the API server refused: 409 Conflict: configmaps \"x\" already exists"
        );
        #[derive(Debug, thiserror::Error)]
        #[error("outer: inner")]
        struct Outer(#[source] Inner);
        #[derive(Debug, thiserror::Error)]
        #[error("inner")]
        struct Inner;
        assert_eq!(Chain(&Outer(Inner)).to_string(), "outer: inner");
    }
}
