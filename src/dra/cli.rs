//! The `nodefabric-dra` command line. Kept in the library so the deploy
//! tests can parse manifests' container args with the real parser.

use super::preparer::Site;
use super::server::{self, Config, RunError};
use super::shares::{Shares, SharesError};
use super::taints::FailedEffect;
use crate::kubelet::args::{CdiDirArg, PluginArgs};
use crate::kubelet::command::{self, PluginCommand, Shutdown};
use crate::names::{
    duration_in, parse_api_timeout, parse_driver_name, parse_node_name, DurationError,
};
use clap::Parser;
use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Serves the RDMA endpoints `nodefabric publish` describes in its CDI specs
/// as Dynamic Resource Allocation devices (`resource.k8s.io/v1`), so one
/// ResourceClaim can ask for a GPU and the NIC on its PCIe root.
///
/// It publishes this node's ResourceSlices (one device per CDI device, with
/// `resource.kubernetes.io/pcieRoot`, `pciBusID`, the link verdict, NUMA
/// node and rail as attributes), registers with kubelet, and prepares
/// allocated claims to the publisher's CDI device IDs plus one small spec
/// per claim that sets `NCCL_IB_HCA`. It reads nothing of the host but
/// those files. API access: `KUBECONFIG`, else the in-cluster service
/// account.
///
/// Every flag can also be set from the environment variable shown beside it
/// (a flag on the command line wins), as a DaemonSet usually does.
#[derive(Debug, Parser)]
#[command(name = "nodefabric-dra", version = crate::VERSION)]
#[command(mut_arg("cdi_dir", |a| a.help(
    "Where `nodefabric publish` writes its CDI specs; the driver adds one small spec per prepared claim there"
)))]
pub struct DraCli {
    /// This node's name (the Node object's, from the downward API).
    #[arg(long, env = "NODE_NAME", value_name = "NAME", value_parser = parse_node_name)]
    pub node_name: String,

    /// kubelet's root folder: the driver serves
    /// `<DIR>/plugins_registry/<driver>-reg.sock` and
    /// `<DIR>/plugins/<driver>/dra.sock`.
    #[arg(
        long,
        env = "NODEFABRIC_KUBELET_ROOT_DIR",
        default_value = "/var/lib/kubelet",
        value_name = "DIR"
    )]
    pub kubelet_root_dir: PathBuf,

    /// `--cdi-dir`.
    #[command(flatten)]
    pub cdi: CdiDirArg,

    /// Where the prepared claims are checkpointed (keep it across restarts).
    #[arg(
        long,
        env = "NODEFABRIC_STATE_DIR",
        default_value = "/var/lib/nodefabric/dra",
        value_name = "DIR"
    )]
    pub state_dir: PathBuf,

    /// How often the ResourceSlices are checked against the pool when
    /// nothing changed (1s to 24h); this also restores slices deleted on
    /// the server.
    #[arg(
        long,
        env = "NODEFABRIC_INTERVAL",
        default_value = "30s",
        value_name = "DURATION",
        value_parser = parse_interval
    )]
    pub interval: Duration,

    /// The driver name: the DRA driver, its sockets and the domain of its
    /// device attributes (a DNS subdomain of at most 63 characters, as the
    /// API server requires of a ResourceSlice's driver).
    #[arg(
        long,
        env = "NODEFABRIC_DRIVER_NAME",
        default_value = super::DEFAULT_DRIVER,
        value_name = "NAME",
        value_parser = parse_driver_name
    )]
    pub driver_name: String,

    /// The rail record `nodefabric publish --rails-file` writes; each
    /// device on exactly one rail gets the `rail` attribute.
    #[arg(long, env = "NODEFABRIC_RAILS_FILE", value_name = "FILE")]
    pub rails_file: Option<PathBuf>,

    /// Bounds each API request, the client's setup included (1s to 10m).
    #[arg(
        long,
        env = "NODEFABRIC_API_TIMEOUT",
        default_value = "10s",
        value_name = "DURATION",
        value_parser = parse_api_timeout
    )]
    pub api_timeout: Duration,

    /// The effect of the `<driver>/link-failed` taint a device with a
    /// Failed link carries (Kubernetes ≥ 1.35 with DRADeviceTaints; on by
    /// default from 1.36). NoSchedule keeps new claims off it; NoExecute
    /// also evicts the pods already using it, so a flapping link restarts
    /// jobs: choose it only where that is wanted.
    #[arg(
        long,
        env = "NODEFABRIC_FAILED_LINK_TAINT",
        default_value = "no-schedule",
        value_name = "EFFECT",
        value_enum
    )]
    pub failed_link_taint: FailedEffect,

    /// How often each prepared claim is looked up in the API, and at start;
    /// one deleted, replaced or no longer allocated to this node is
    /// unprepared (1s to 24h).
    #[arg(
        long,
        env = "NODEFABRIC_SWEEP_INTERVAL",
        default_value = "5m",
        value_name = "DURATION",
        value_parser = parse_interval
    )]
    pub sweep_interval: Duration,

    /// How long to wait for another nodefabric-dra holding `--state-dir`
    /// (a rolling update's old pod) before exiting with its name (0s to 1h).
    #[arg(
        long,
        env = "NODEFABRIC_LOCK_WAIT",
        default_value = "60s",
        value_name = "DURATION",
        value_parser = parse_lock_wait
    )]
    pub lock_wait: Duration,

    /// How often the driver calls its own registration and DRA sockets;
    /// `/healthz` fails while one does not answer (1s to 1h).
    #[arg(
        long,
        env = "NODEFABRIC_SOCKET_CHECK_INTERVAL",
        default_value = "10s",
        value_name = "DURATION",
        value_parser = parse_socket_check
    )]
    pub socket_check_interval: Duration,

    /// Shares per whole NIC: 0 publishes each NIC exclusive (one claim at a
    /// time); 1 to 1024 publishes it shareable by that many claims through
    /// consumable capacity (`allowMultipleAllocations` and a `shares`
    /// capacity; Kubernetes ≥ 1.34 with DRAConsumableCapacity, on by
    /// default from 1.36). `--shares` alone means 64, the device plugin's
    /// `rdma.shared` count. VFs stay exclusive.
    #[arg(
        long,
        env = "NODEFABRIC_SHARES",
        default_value = "0",
        num_args = 0..=1,
        default_missing_value = "64",
        value_name = "N",
        value_parser = parse_shares
    )]
    pub shares: Shares,

    /// The flags both kubelet plugins share.
    #[command(flatten)]
    pub common: PluginArgs,
}

fn parse_shares(s: &str) -> Result<Shares, SharesError> {
    Shares::parse(s)
}

fn parse_interval(s: &str) -> Result<Duration, DurationError> {
    duration_in(s, Duration::from_secs(1), Duration::from_secs(24 * 3600))
}

fn parse_lock_wait(s: &str) -> Result<Duration, DurationError> {
    duration_in(s, Duration::ZERO, Duration::from_secs(3600))
}

fn parse_socket_check(s: &str) -> Result<Duration, DurationError> {
    duration_in(s, Duration::from_secs(1), Duration::from_secs(3600))
}

impl DraCli {
    /// The server configuration this command line asks for.
    pub fn config(&self) -> Config {
        Config {
            site: Site {
                driver: self.driver_name.clone(),
                node_name: self.node_name.clone(),
                cdi_dir: self.cdi.cdi_dir.clone(),
                state_dir: self.state_dir.clone(),
                api_timeout: self.api_timeout,
            },
            kubelet_root: self.kubelet_root_dir.clone(),
            rails_file: self.rails_file.clone(),
            interval: self.interval,
            poll_interval: self.common.poll_interval,
            max_spec_bytes: self.common.max_spec_bytes,
            metrics_addr: self.common.metrics_addr,
            failed_link_taint: self.failed_link_taint,
            shares: self.shares,
            sweep_interval: self.sweep_interval,
            lock_wait: self.lock_wait,
            socket_check_interval: self.socket_check_interval,
        }
    }
}

impl PluginCommand for DraCli {
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
    command::main::<DraCli>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::shares::DEFAULT_SHARES;

    fn shares(args: &[&str]) -> Result<Shares, clap::Error> {
        let argv = ["nodefabric-dra", "--node-name", "node-a"];
        DraCli::try_parse_from(argv.iter().chain(args)).map(|c| c.shares)
    }

    #[test]
    fn shares_default_to_exclusive_a_bare_flag_is_the_device_plugins_64_and_nonsense_is_named() {
        assert_eq!(shares(&[]).unwrap(), Shares::EXCLUSIVE);
        assert_eq!(shares(&["--shares"]).unwrap().count(), DEFAULT_SHARES);
        assert_eq!(shares(&["--shares", "8"]).unwrap().count(), 8);
        assert_eq!(shares(&["--shares=0"]).unwrap(), Shares::EXCLUSIVE);
        let e = shares(&["--shares", "4096"]).unwrap_err().to_string();
        assert!(e.contains("4096") && e.contains("1024"), "{e}");
        let e = shares(&["--shares", "many"]).unwrap_err().to_string();
        assert!(e.contains("many"), "{e}");
    }
}
