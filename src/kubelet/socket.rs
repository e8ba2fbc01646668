//! The life of a plugin's Unix socket in a kubelet folder, and gRPC over
//! Unix sockets both ways (kubelet speaks only over Unix sockets here).
//!
//! A socket left by an earlier run is replaced, but only a socket: any other
//! file at that path is someone else's and is refused. A socket this process
//! serves is removed when its [`OwnedSocket`] is dropped, and only while the
//! file there is still the one it bound, so a successor's socket at the same
//! path survives its predecessor.

use super::chain::error_chain;
use hyper_util::rt::TokioIo;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint};
use tracing::warn;

/// Why a socket could not be served or reached; every variant names the
/// path. The OS error is part of the message and deliberately not a
/// `source`, so an error chain prints it once.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Something other than a socket stands at the path: not ours to remove.
    #[error("{path}: is not a socket, refusing to replace it")]
    NotASocket {
        /// The socket path asked for.
        path: PathBuf,
    },
    /// The stale socket could not be removed.
    #[error("removing stale socket {path}: {cause}")]
    RemoveStale {
        /// The socket path.
        path: PathBuf,
        /// What the removal said.
        cause: io::Error,
    },
    /// Binding failed (missing folder, permission denied …).
    #[error("listening on {path}: {cause}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// What bind said.
        cause: io::Error,
    },
    /// The socket's permissions could not be set.
    #[error("setting mode {mode:o} on {path}: {cause}")]
    Permissions {
        /// The socket path.
        path: PathBuf,
        /// The mode asked for.
        mode: u32,
        /// What chmod said.
        cause: io::Error,
    },
    /// No gRPC connection to the socket could be made.
    #[error("connecting to {path}: {detail}")]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// What the transport said, with every cause under it.
        detail: String,
    },
}

/// Binds `path`, replacing a stale socket left by an earlier run; the file
/// stays after the listener is dropped, as kubelet's own does. A plugin
/// serving kubelet uses [`OwnedSocket::bind`] instead.
pub fn bind(path: &Path) -> Result<UnixListener, SocketError> {
    match std::fs::symlink_metadata(path) {
        // Removed by someone else (kubelet) since the look: as good.
        Ok(m) if m.file_type().is_socket() => {
            crate::publish::remove_if_present(path).map_err(|cause| SocketError::RemoveStale {
                path: path.into(),
                cause,
            })?;
        }
        Ok(_) => return Err(SocketError::NotASocket { path: path.into() }),
        Err(_) => {}
    }
    UnixListener::bind(path).map_err(|cause| SocketError::Bind {
        path: path.into(),
        cause,
    })
}

/// A socket file this process serves, removed when this is dropped.
#[derive(Debug)]
pub struct OwnedSocket {
    path: PathBuf,
    /// `(device, inode)` of the socket bound, to tell it from a successor.
    identity: (u64, u64),
}

impl OwnedSocket {
    /// Binds `path` as [`bind`] does, then sets its permission bits to
    /// `mode` when one is given (the process umask decides otherwise).
    pub fn bind(
        path: &Path,
        mode: Option<u32>,
    ) -> Result<(OwnedSocket, UnixListener), SocketError> {
        let listener = bind(path)?;
        if let Some(mode) = mode {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(
                |cause| SocketError::Permissions {
                    path: path.into(),
                    mode,
                    cause,
                },
            )?;
        }
        let m = std::fs::symlink_metadata(path).map_err(|cause| SocketError::Bind {
            path: path.into(),
            cause,
        })?;
        let owned = OwnedSocket {
            path: path.into(),
            identity: (m.dev(), m.ino()),
        };
        Ok((owned, listener))
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True while the file at the path is still the socket bound (kubelet
    /// removes plugin sockets when it restarts).
    pub fn is_present(&self) -> bool {
        std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.file_type().is_socket() && (m.dev(), m.ino()) == self.identity)
    }
}

impl Drop for OwnedSocket {
    fn drop(&mut self) {
        if !self.is_present() {
            return;
        }
        if let Err(e) = crate::publish::remove_if_present(&self.path) {
            warn!("removing {}: {e}", self.path.display());
        }
    }
}

/// A client channel to the gRPC server on the Unix socket `path`, with the
/// authority `localhost` kubelet itself sends.
pub async fn connect(path: &Path) -> Result<Channel, SocketError> {
    let target: PathBuf = path.to_path_buf();
    // The URI is required by tonic but unused: every connection goes to `path`.
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let target = target.clone();
            async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(target).await?)) }
        }))
        .await
        .map_err(|e| SocketError::Connect {
            path: path.into(),
            detail: error_chain(&e),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_socket(path: &Path) -> bool {
        std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_another_file_is_refused_and_drop_removes_only_ours() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("p.sock");
        drop(bind(&path).unwrap());
        assert!(is_socket(&path), "a plain bind leaves its file");
        let (first, _l1) = OwnedSocket::bind(&path, Some(0o600)).unwrap();
        assert!(first.is_present());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // A successor binds the same path before the first is dropped.
        let (second, _l2) = OwnedSocket::bind(&path, None).unwrap();
        assert!(!first.is_present());
        drop(first);
        assert!(is_socket(&path), "the successor's socket survives");
        drop(second);
        assert!(!path.exists(), "dropping removes the socket");

        std::fs::write(&path, "data").unwrap();
        let e = bind(&path).unwrap_err();
        assert!(matches!(e, SocketError::NotASocket { .. }), "{e}");
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "data");
    }

    #[tokio::test]
    async fn connecting_to_nothing_names_the_path() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("none.sock");
        let e = connect(&path).await.unwrap_err();
        assert!(e
            .to_string()
            .starts_with(&format!("connecting to {}", path.display())));
    }
}
