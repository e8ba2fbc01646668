//! The only part of nodefabric that talks to the Kubernetes API, on kube-rs.
//!
//! - [`client`]: the one way to the API server (configuration, one runtime
//!   and one client per process, the retry policy, timeouts);
//! - [`broker`]: what every node's `nodefabric rails`/`publish` writes, its
//!   key of the shared ConfigMap or its own NodeRailRecord ([`node_rail_record`]);
//! - [`observer`]: the Node Observer, which creates and owns the shared
//!   ConfigMap and removes the records of deleted or replaced Nodes;
//! - [`gpu_exec`]: nvidia-smi's rail answers, run in the same-node GPU
//!   Operator pod through the exec subresource (`gpuSource`);
//! - [`health`]: the probes of the long-running parts.
//!
//! Each part takes plain settings; the flags that fill them live in
//! `cli::cluster_args`.

pub mod broker;
pub mod client;
pub(crate) mod error;
pub mod gpu_exec;
pub mod health;
pub mod node_rail_record;
pub mod observer;
pub mod rails_view;

pub use client::SERVICE_ACCOUNT_DIR;
pub(crate) use error::code;
pub use error::ClusterError;
use kube::Client;
use std::fmt;

/// The API server's cap on a ConfigMap's data, keys and values together
/// (`MaxSecretSize` in the Kubernetes validation code, shared by ConfigMaps).
pub const CONFIGMAP_LIMIT: usize = 1024 * 1024;

/// The field manager nodefabric's writes are recorded under (`managedFields`).
pub const FIELD_MANAGER: &str = "nodefabric";

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
