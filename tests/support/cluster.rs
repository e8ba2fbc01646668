//! An API stand-in with the client configuration each command runs with:
//! a kubeconfig for the administrator and one for each ServiceAccount the
//! manifests in deploy/ run the binaries as, under deploy/'s RBAC.

use super::apiserver::{ApiServer, TOKEN};
use std::path::{Path, PathBuf};

/// The namespace deploy/ installs into.
pub const NS: &str = "nodefabric";
/// The publisher DaemonSet's ServiceAccount.
pub const BROKER: &str = "nodefabric";
/// The observer Deployment and its ServiceAccount.
pub const OWNER: &str = "nodefabric-observer";
/// The DRA driver DaemonSet's ServiceAccount (deploy/components/dra).
pub const DRA: &str = "nodefabric-dra";

/// A running API stand-in and the kubeconfigs written for it.
pub struct Cluster {
    pub api: ApiServer,
    /// The administrator (any request).
    pub kubeconfig: PathBuf,
    /// The publisher DaemonSet's ServiceAccount, under deploy/'s RBAC.
    pub broker_kubeconfig: PathBuf,
    /// The observer Deployment's ServiceAccount, under deploy/'s RBAC.
    pub observer_kubeconfig: PathBuf,
    /// The DRA driver's ServiceAccount, under its component's RBAC.
    pub dra_kubeconfig: PathBuf,
}

impl Cluster {
    /// Starts the API stand-in and writes the kubeconfigs into `dir`.
    pub fn start(dir: &Path) -> Cluster {
        Cluster::start_with(dir, ApiServer::start())
    }

    /// The kubeconfigs of [`Cluster::start`] for a server already started
    /// (under RBAC of the test's choosing).
    pub fn start_with(dir: &Path, api: ApiServer) -> Cluster {
        let kubeconfig = api.kubeconfig(dir, TOKEN, NS);
        let broker_kubeconfig = api.kubeconfig(dir, &api.account_token(NS, BROKER), NS);
        let observer_kubeconfig = api.kubeconfig(dir, &api.account_token(NS, OWNER), NS);
        let dra_kubeconfig = api.kubeconfig(dir, &api.account_token(NS, DRA), NS);
        Cluster {
            api,
            kubeconfig,
            broker_kubeconfig,
            observer_kubeconfig,
            dra_kubeconfig,
        }
    }
}
