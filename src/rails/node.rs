//! The Node object's UID, read from the Kubernetes API when running in a
//! cluster, so a rail record can be told apart from one of an earlier node
//! that had the same name.
//!
//! In-cluster means what every client library takes it to mean: the
//! `KUBERNETES_SERVICE_HOST` / `KUBERNETES_SERVICE_PORT` variables kubelet
//! sets in each container, and the mounted service-account token and CA.
//! The only request is `GET /api/v1/nodes/<name>`; `deploy/rbac.yaml` grants
//! exactly that.

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Where kubelet mounts the service account's token and the cluster CA.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The API server address from the in-cluster variables, if set.
pub fn api_server_from_env() -> Option<String> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST").ok().filter(|h| !h.is_empty())?;
    let port = std::env::var("KUBERNETES_SERVICE_PORT").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "443".into());
    // An IPv6 service address needs brackets in a URL.
    let host = if host.contains(':') { format!("[{host}]") } else { host };
    Some(format!("https://{host}:{port}"))
}

/// Reads `metadata.uid` of Node `name` from the API server at `server`,
/// authenticating with the service account in `sa_dir`.
pub fn uid(server: &str, sa_dir: &Path, name: &str) -> Result<String> {
    let token_path = sa_dir.join("token");
    let token = std::fs::read_to_string(&token_path).with_context(|| format!("reading {}", token_path.display()))?;
    let ca_path = sa_dir.join("ca.crt");
    let ca_pem = std::fs::read(&ca_path).with_context(|| format!("reading {}", ca_path.display()))?;
    let ca = ureq::tls::Certificate::from_pem(&ca_pem).with_context(|| format!("{} is not a PEM certificate", ca_path.display()))?;
    let tls = ureq::tls::TlsConfig::builder().root_certs(ureq::tls::RootCerts::Specific(Arc::new(vec![ca]))).build();
    let agent: ureq::Agent = ureq::Agent::config_builder().tls_config(tls).timeout_global(Some(Duration::from_secs(10))).build().into();
    let url = format!("{server}/api/v1/nodes/{name}");
    let mut response = agent.get(&url).header("Authorization", &format!("Bearer {}", token.trim())).call().map_err(|e| match e {
        ureq::Error::StatusCode(403) => anyhow::anyhow!("GET {url}: forbidden: the service account needs `get` on nodes (deploy/rbac.yaml)"),
        ureq::Error::StatusCode(404) => anyhow::anyhow!("GET {url}: no Node named {name:?} (is NODE_NAME set from spec.nodeName?)"),
        other => anyhow::anyhow!("GET {url}: {other}"),
    })?;
    let node: serde_json::Value = serde_json::from_reader(response.body_mut().as_reader()).with_context(|| format!("GET {url}: the answer is not JSON"))?;
    match node.pointer("/metadata/uid").and_then(|u| u.as_str()) {
        Some(uid) if !uid.is_empty() => Ok(uid.to_string()),
        _ => bail!("GET {url}: the answer has no metadata.uid"),
    }
}
