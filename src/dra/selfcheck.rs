//! Liveness that means it: the driver dials its own two sockets as kubelet
//! does and `/healthz` fails while either gives no answer. A socket file
//! that is still in place while nothing answers on it (its server task
//! ended, its listener was shut) is invisible to the file checks, and
//! kubelet would call it in vain until the container restarts.
//!
//! The registration socket is asked GetInfo, through its authority front
//! as kubelet's plugin watcher is; the DRA socket is asked
//! NodeUnprepareResources with no claims, which touches no claim and no
//! file. A socket whose file is gone is not counted: the loop serves both
//! again (kubelet removed it).

use super::api::v1::{dra_plugin_client::DraPluginClient, NodeUnprepareResourcesRequest};
use super::metrics::Observed;
use crate::kubelet::registration_api::{registration_client::RegistrationClient, InfoRequest};
use crate::kubelet::socket::{self, SocketError};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The longest one dial and call may take: well inside the liveness
/// probe's usual period (10 s), far above an answer's few milliseconds.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// One socket that did not answer; names the socket.
#[derive(Debug, thiserror::Error)]
#[error("{path}: the {what} socket does not answer a gRPC call: {why}")]
pub struct SelfCheckError {
    /// The socket.
    pub path: PathBuf,
    /// "registration" or "DRA".
    pub what: &'static str,
    /// What the dial or the call said.
    pub why: CallError,
}

/// Why one call to the driver's own socket got no answer, kept typed until
/// `/healthz` says it.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The socket could not be dialled.
    #[error(transparent)]
    Dial(#[from] SocketError),
    /// The call was answered with an error status.
    #[error(transparent)]
    Status(#[from] tonic::Status),
    /// Nothing answered within the check's timeout.
    #[error("no answer within {0:?}")]
    Silent(Duration),
}

/// Dials both sockets every `every`, for ever, telling `observed` whether
/// both answered. Spawned by the server; aborted when it stops.
pub async fn watch(
    registration: PathBuf,
    service: PathBuf,
    every: Duration,
    observed: Arc<Observed>,
) {
    // The first check one interval after the start: sockets a killed
    // driver left behind are not answering until the loop serves anew.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let timeout = CALL_TIMEOUT.min(every);
    loop {
        tick.tick().await;
        let failed = check(&registration, &service, timeout).await.err();
        observed.sockets_answer(failed);
    }
}

/// Calls each socket once, each within `timeout`.
pub async fn check(
    registration: &Path,
    service: &Path,
    timeout: Duration,
) -> Result<(), SelfCheckError> {
    let answered = tokio::time::timeout(timeout, get_info(registration)).await;
    judge(registration, "registration", answered, timeout)?;
    let answered = tokio::time::timeout(timeout, unprepare_nothing(service)).await;
    judge(service, "DRA", answered, timeout)
}

/// Asks the registration socket GetInfo, as kubelet's plugin watcher does.
async fn get_info(path: &Path) -> Result<(), CallError> {
    let channel = socket::connect(path).await?;
    RegistrationClient::new(channel)
        .get_info(InfoRequest {})
        .await?;
    Ok(())
}

/// Asks the DRA socket to unprepare no claims: an answer touching nothing.
async fn unprepare_nothing(path: &Path) -> Result<(), CallError> {
    let channel = socket::connect(path).await?;
    DraPluginClient::new(channel)
        .node_unprepare_resources(NodeUnprepareResourcesRequest { claims: Vec::new() })
        .await?;
    Ok(())
}

fn judge(
    path: &Path,
    what: &'static str,
    answered: Result<Result<(), CallError>, tokio::time::error::Elapsed>,
    timeout: Duration,
) -> Result<(), SelfCheckError> {
    let why = match answered {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(why)) => why,
        Err(_) => CallError::Silent(timeout),
    };
    // Gone, not silent: the loop serves the sockets again.
    let present = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket());
    if !present {
        return Ok(());
    }
    Err(SelfCheckError {
        path: path.to_path_buf(),
        what,
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_socket_file_nothing_listens_on_is_named_and_a_gone_one_is_not_counted() {
        let dir = tempfile::tempdir().unwrap();
        let registration = dir.path().join("reg.sock");
        let service = dir.path().join("dra.sock");
        // Bound, never listened on: the file is a socket, connects are refused.
        let _silent = std::os::unix::net::UnixDatagram::bind(&registration).unwrap();
        let e = check(&registration, &service, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(e.path, registration);
        assert!(
            e.to_string()
                .contains("registration socket does not answer"),
            "{e}"
        );
        std::fs::remove_file(&registration).unwrap();
        check(&registration, &service, Duration::from_secs(1))
            .await
            .unwrap();
    }
}
