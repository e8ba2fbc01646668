//! The registration socket's service: kubelet's plugin watcher finds the
//! socket in `plugins_registry/`, asks what it is (GetInfo) and says whether
//! it took it (NotifyRegistrationStatus). A refusal is logged and the
//! driver keeps serving: kubelet asks again when it restarts.

use crate::kubelet::registration_api::{
    registration_server::Registration, InfoRequest, PluginInfo, RegistrationStatus,
    RegistrationStatusResponse,
};
use tokio::sync::mpsc;
use tracing::{info, warn};

/// The plugin type kubelet's DRA handler takes.
pub const PLUGIN_TYPE: &str = "DRAPlugin";

/// The services served, as kubelet matches them: the DRA service versions
/// the newest first (kubelet takes the first it knows), then the health
/// stream (kubelet opens it when listed; it ignores names it does not
/// know). These are upstream's `DRAPluginService` names, not the gRPC
/// service names (`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`).
pub const VERSIONS: [&str; 3] = ["v1.DRAPlugin", "v1beta1.DRAPlugin", super::health::SERVICE];

/// The folder under kubelet's root where its plugin watcher looks for
/// registration sockets.
pub const REGISTRY_DIR: &str = "plugins_registry";

/// What follows the driver name in its registration socket's file name.
pub const REGISTRATION_SOCKET_SUFFIX: &str = "-reg.sock";

/// The folder under kubelet's root that holds each plugin's own folder.
pub const PLUGINS_DIR: &str = "plugins";

/// The DRA service socket's file name in `plugins/<driver>/`.
pub const SERVICE_SOCKET: &str = "dra.sock";

/// kubelet's verdict on a registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// kubelet registered the driver.
    Registered,
    /// kubelet refused, saying why.
    Refused(String),
}

/// The Registration service of one driver.
pub struct Registrar {
    /// The driver name.
    pub name: String,
    /// The DRA service socket's full path.
    pub endpoint: String,
    /// Where verdicts go (the loop).
    pub verdicts: mpsc::UnboundedSender<Verdict>,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(
        &self,
        _: tonic::Request<InfoRequest>,
    ) -> Result<tonic::Response<PluginInfo>, tonic::Status> {
        Ok(tonic::Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.to_string(),
            name: self.name.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: VERSIONS.iter().map(|v| v.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: tonic::Request<RegistrationStatus>,
    ) -> Result<tonic::Response<RegistrationStatusResponse>, tonic::Status> {
        let status = request.into_inner();
        let verdict = if status.plugin_registered {
            info!(driver = self.name, "kubelet registered the driver");
            Verdict::Registered
        } else {
            warn!(
                driver = self.name,
                "kubelet refused the registration: {}; serving on until it asks again",
                status.error
            );
            Verdict::Refused(status.error)
        };
        let _ = self.verdicts.send(verdict);
        Ok(tonic::Response::new(RegistrationStatusResponse {}))
    }
}
