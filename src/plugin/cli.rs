//! The `nodefabric-device-plugin` command line. Kept in the library so the
//! deploy tests can parse manifests' container args with the real parser.

use super::allocate::CdiDelivery;
use super::catalog::Resource;
use super::server::{self, Config, RunError};
use crate::kubelet::args::{CdiDirArg, PluginArgs};
use crate::kubelet::command::{self, PluginCommand, Shutdown};
use crate::names::{duration_in, parse_namespace, DurationError};
use clap::builder::BoolishValueParser;
use clap::Parser;
use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Serves RDMA tokens to kubelet from the CDI specs `nodefabric publish`
/// writes: `<prefix>/rdma` (one whole interface), `<prefix>/rdma.shared`
/// (64 concurrent uses of one interface) and `<prefix>/rdma.partitioned`
/// (one SR-IOV virtual function).
///
/// Each token carries its endpoint's NUMA node as a topology hint and its
/// link health (a `Failed` link is advertised Unhealthy, never withdrawn).
/// Allocation hands the container the endpoint's CDI device and
/// `NCCL_IB_HCA`. The plugin re-reads the specs when they change and
/// registers again when kubelet restarts; SIGTERM removes its sockets.
///
/// Every flag can also be set from the environment variable shown beside it
/// (a flag on the command line wins), as a DaemonSet usually does.
#[derive(Debug, Parser)]
#[command(name = "nodefabric-device-plugin", version = crate::VERSION)]
#[command(mut_arg("cdi_dir", |a| a.help(
    "Where `nodefabric publish` writes its CDI specs (its only input)"
)))]
pub struct PluginCli {
    /// `--cdi-dir`.
    #[command(flatten)]
    pub cdi: CdiDirArg,

    /// kubelet's device-plugin folder: holds kubelet.sock and this plugin's sockets.
    #[arg(
        long,
        env = "NODEFABRIC_KUBELET_DIR",
        default_value = "/var/lib/kubelet/device-plugins",
        value_name = "DIR"
    )]
    pub kubelet_dir: PathBuf,

    /// Do not serve `<prefix>/rdma.shared`.
    #[arg(long, env = "NODEFABRIC_NO_SHARED", value_parser = BoolishValueParser::new())]
    pub no_shared: bool,

    /// Do not serve `<prefix>/rdma.partitioned`.
    #[arg(long, env = "NODEFABRIC_NO_PARTITIONED", value_parser = BoolishValueParser::new())]
    pub no_partitioned: bool,

    /// The resource-name prefix (a DNS subdomain).
    #[arg(
        long,
        env = "NODEFABRIC_RESOURCE_PREFIX",
        default_value = "device.gpustack.ai",
        value_name = "PREFIX",
        value_parser = parse_namespace
    )]
    pub resource_prefix: String,

    /// Hand CDI device names to the runtime as `cdi.k8s.io/nodefabric_<resource>`
    /// annotations instead of the typed field, for kubelets before 1.31.
    #[arg(long, env = "NODEFABRIC_CDI_ANNOTATIONS", value_parser = BoolishValueParser::new())]
    pub cdi_annotations: bool,

    /// How long a ListAndWatch client may leave a device list untaken before
    /// its connection is closed (1s to 1h).
    #[arg(
        long,
        env = "NODEFABRIC_DRAIN_TIMEOUT",
        default_value = "30s",
        value_name = "DURATION",
        value_parser = parse_drain_timeout
    )]
    pub drain_timeout: Duration,

    /// The flags both kubelet plugins share.
    #[command(flatten)]
    pub common: PluginArgs,
}

fn parse_drain_timeout(s: &str) -> Result<Duration, DurationError> {
    duration_in(s, Duration::from_secs(1), Duration::from_secs(3600))
}

impl PluginCli {
    /// The server configuration this command line asks for.
    pub fn config(&self) -> Config {
        let resources = Resource::ALL
            .into_iter()
            .filter(|r| match r {
                Resource::Exclusive => true,
                Resource::Shared => !self.no_shared,
                Resource::Partitioned => !self.no_partitioned,
            })
            .collect();
        Config {
            cdi_dir: self.cdi.cdi_dir.clone(),
            kubelet_dir: self.kubelet_dir.clone(),
            resources,
            resource_prefix: self.resource_prefix.clone(),
            delivery: if self.cdi_annotations {
                CdiDelivery::Annotations
            } else {
                CdiDelivery::Field
            },
            poll_interval: self.common.poll_interval,
            max_spec_bytes: self.common.max_spec_bytes,
            metrics_addr: self.common.metrics_addr,
            drain_timeout: self.drain_timeout,
        }
    }
}

impl PluginCommand for PluginCli {
    type Config = Config;
    type Error = RunError;

    fn common(&self) -> &PluginArgs {
        &self.common
    }

    fn server_config(&self) -> Config {
        self.config()
    }

    fn serve(config: Config, shutdown: Shutdown) -> impl Future<Output = Result<(), RunError>> {
        server::run(config, shutdown)
    }
}

/// Parses `std::env::args` and runs until SIGTERM or SIGINT.
pub fn main() -> ExitCode {
    command::main::<PluginCli>()
}
