//! The flags both kubelet plugins take alike: the CDI folder, how often to
//! re-check when no file event comes, the spec-size cap, the probe address
//! and the log level.

use crate::names::{duration_in, DurationError};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// `--cdi-dir`, declared once for both plugins and flattened where each
/// lists it; each plugin words its help with `mut_arg`, since the driver
/// also writes there.
#[derive(Debug, Clone, clap::Args)]
pub struct CdiDirArg {
    /// Where `nodefabric publish` writes its CDI specs.
    #[arg(
        long,
        env = "NODEFABRIC_CDI_DIR",
        default_value = "/var/run/cdi",
        value_name = "DIR"
    )]
    pub cdi_dir: PathBuf,
}

/// The flags both kubelet plugins share, flattened into each command line.
#[derive(Debug, clap::Args)]
pub struct PluginArgs {
    /// How often files, sockets and registration are re-checked when no
    /// file event arrives (10ms to 24h).
    #[arg(
        long,
        env = "NODEFABRIC_POLL_INTERVAL",
        default_value = "10s",
        value_name = "DURATION",
        value_parser = parse_poll_interval
    )]
    pub poll_interval: Duration,

    /// Spec files larger than this many bytes are refused, and that family
    /// keeps what it served.
    #[arg(
        long,
        env = "NODEFABRIC_MAX_SPEC_BYTES",
        default_value_t = crate::kubelet::specs::DEFAULT_MAX_BYTES,
        value_name = "BYTES",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub max_spec_bytes: u64,

    /// Serve /livez (also as /healthz), /readyz and /metrics (Prometheus)
    /// on this address, e.g. 0.0.0.0:8082; none when unset.
    #[arg(long, env = "NODEFABRIC_METRICS_ADDR", value_name = "ADDR")]
    pub metrics_addr: Option<SocketAddr>,

    /// Log filter for stderr: error, warn, info, debug or trace.
    #[arg(
        long,
        env = "NODEFABRIC_LOG_LEVEL",
        default_value = "info",
        value_name = "LEVEL"
    )]
    pub log_level: tracing::Level,
}

fn parse_poll_interval(s: &str) -> Result<Duration, DurationError> {
    duration_in(s, Duration::from_millis(10), Duration::from_secs(24 * 3600))
}
