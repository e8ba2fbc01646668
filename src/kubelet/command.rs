//! The `main` both kubelet plugins share: parse the command line, then
//! serve until a shutdown signal, so a plugin's `cli.rs` says only what its
//! flags are and what configuration they make.

use super::args::PluginArgs;
use super::signals;
use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;

/// The shutdown signal a plugin's server runs until.
pub type Shutdown = Pin<Box<dyn Future<Output = ()>>>;

/// A kubelet plugin's command line and the server it configures.
pub trait PluginCommand: clap::Parser {
    /// What the server is given.
    type Config;
    /// Why the server stopped before a signal.
    type Error: std::error::Error;
    /// The flags both plugins share (the log level among them).
    fn common(&self) -> &PluginArgs;
    /// The server configuration this command line asks for.
    fn server_config(&self) -> Self::Config;
    /// Runs the server until `shutdown` resolves.
    fn serve(
        config: Self::Config,
        shutdown: Shutdown,
    ) -> impl Future<Output = Result<(), Self::Error>>;
}

/// Parses `std::env::args` and runs `C`'s server until SIGTERM or SIGINT;
/// a usage error exits 2, a server error is logged and exits 1.
pub fn main<C: PluginCommand>() -> ExitCode {
    let cli = C::parse();
    signals::run_until_shutdown(cli.common().log_level, |shutdown| {
        C::serve(cli.server_config(), shutdown)
    })
}
