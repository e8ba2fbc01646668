//! The shutdown signals: kubelet and kubectl stop a plugin's Pod with
//! SIGTERM, a person at a terminal with SIGINT.

use super::chain::error_chain;
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

/// The `main` both kubelet plugins share: stderr logging at `level`, a
/// one-thread runtime, the shutdown handlers, then `serve` until a signal.
/// An error is logged once with its causes (`outer: cause: …`) and the exit
/// status is 1.
pub fn run_until_shutdown<F, Fut, E>(level: tracing::Level, serve: F) -> std::process::ExitCode
where
    F: FnOnce(std::pin::Pin<Box<dyn Future<Output = ()>>>) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::error::Error,
{
    crate::logging::init(level);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        match shutdown() {
            Ok(signal) => serve(Box::pin(signal)).await.map_err(|e| error_chain(&e)),
            Err(e) => Err(error_chain(&e)),
        }
    });
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(text) => {
            tracing::error!("{text}");
            std::process::ExitCode::FAILURE
        }
    }
}
