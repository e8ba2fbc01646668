//! The gRPC servers of one registration with kubelet, each on its own socket
//! in a kubelet folder, stopped and removed together when kubelet restarts
//! or the plugin stops.

use super::socket::{OwnedSocket, SocketError};
use super::{authority, conn};
use std::future::Future;
use std::path::Path;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::service::Routes;
use tracing::warn;

/// How a server takes its connections: the two kinds of socket kubelet
/// dials differ in what its client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Front {
    /// Each connection carries a [`conn::Hangup`], so a stuck client can be
    /// cut off: for the device-plugin sockets.
    Hangup,
    /// Each connection passes [`authority`]'s front, which rewrites the
    /// `:authority` kubelet's plugin watcher sends and h2 refuses: for a
    /// registration socket in `plugins_registry/` (and the DRA socket,
    /// which kubelets before 1.34 dial the same way). No hang-up.
    Authority,
}

/// Servers started together and stopped together; dropping them stops them
/// and removes their sockets.
#[derive(Debug)]
pub struct Servers {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    sockets: Vec<OwnedSocket>,
}

impl Default for Servers {
    fn default() -> Servers {
        Servers {
            stop: watch::channel(false).0,
            tasks: Vec::new(),
            sockets: Vec::new(),
        }
    }
}

impl Servers {
    /// Turns `true` when these servers stop: a service ends its long-lived
    /// streams on it, so a client of the old sockets sees its stream end.
    pub fn stopping(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    /// Serves `routes` on a fresh socket at `path` (see
    /// [`OwnedSocket::bind`] for `mode`), taking connections as `front`
    /// says. `name` names the server in the log if it fails.
    pub fn serve(
        &mut self,
        path: &Path,
        mode: Option<u32>,
        name: &str,
        front: Front,
        routes: Routes,
    ) -> Result<(), SocketError> {
        let (socket, listener) = OwnedSocket::bind(path, mode)?;
        let router = tonic::transport::Server::builder().add_routes(routes);
        match front {
            Front::Hangup => self.spawn(name, router.serve_with_incoming(conn::incoming(listener))),
            Front::Authority => self.spawn(
                name,
                router.serve_with_incoming(authority::incoming(listener, path)),
            ),
        }
        self.sockets.push(socket);
        Ok(())
    }

    fn spawn(
        &mut self,
        name: &str,
        server: impl Future<Output = Result<(), tonic::transport::Error>> + Send + 'static,
    ) {
        let name = name.to_string();
        self.tasks.push(tokio::spawn(async move {
            if let Err(e) = server.await {
                warn!("{name} server stopped: {e}");
            }
        }));
    }

    /// The first socket no longer in place (kubelet removed it), if any.
    pub fn missing(&self) -> Option<&Path> {
        self.sockets
            .iter()
            .find(|s| !s.is_present())
            .map(|s| s.path())
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        for t in &self.tasks {
            t.abort();
        }
        // The sockets go with `self.sockets`, after the servers are told.
    }
}
