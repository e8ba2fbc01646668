//! The shutdown signals: kubelet and kubectl stop a plugin's Pod with
//! SIGTERM, a person at a terminal with SIGINT.

use std::future::Future;
use tokio::signal::unix::{signal, SignalKind};

/// A signal handler could not be installed; names the signal.
#[derive(Debug, thiserror::Error)]
#[error("installing the {signal} handler: {cause}")]
pub struct SignalError {
    /// The signal's name (`SIGTERM`, `SIGINT`).
    pub signal: &'static str,
    /// What the runtime said.
    pub cause: std::io::Error,
}

/// Resolves on the first SIGTERM or SIGINT. The handlers are installed now,
/// not on first poll, so a signal that arrives while the plugin is busy
/// registering is not lost. Needs a running tokio runtime with signals.
pub fn shutdown() -> Result<impl Future<Output = ()>, SignalError> {
    let install = |kind, name| {
        signal(kind).map_err(|cause| SignalError {
            signal: name,
            cause,
        })
    };
    let mut term = install(SignalKind::terminate(), "SIGTERM")?;
    let mut int = install(SignalKind::interrupt(), "SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}
