//! gRPC over Unix sockets: a listener stream for tonic's server and a
//! channel for its client (kubelet speaks only over Unix sockets here).

use anyhow::{Context, Result};
use hyper_util::rt::TokioIo;
use std::path::{Path, PathBuf};
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint};

/// Binds `path`, replacing a stale socket file left by an earlier run.
pub fn bind(path: &Path) -> Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(e).with_context(|| format!("removing stale socket {}", path.display()))
        }
    }
    UnixListener::bind(path).with_context(|| format!("listening on {}", path.display()))
}

/// A client channel to the gRPC server on the Unix socket `path`.
pub async fn connect(path: &Path) -> Result<Channel> {
    let path: PathBuf = path.to_path_buf();
    let shown = path.display().to_string();
    // The URI is required by tonic but unused: every connection goes to `path`.
    Endpoint::try_from("http://localhost")?
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .with_context(|| format!("connecting to {shown}"))
}
