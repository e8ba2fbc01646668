//! `kubectl-nodefabric`, a kubectl plugin (`kubectl nodefabric rails`): the
//! cluster's rail records, one row per node, for the person deciding where
//! a job goes or why a node's NCCL is slow.

use super::output::{self, Format, OutputArg};
use crate::cluster::{client, rails_view, ConfigMapRef, SERVICE_ACCOUNT_DIR};
use crate::views::cluster;
use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The cluster's view of nodefabric, as a kubectl plugin: install this
/// binary on PATH as `kubectl-nodefabric` and run `kubectl nodefabric …`.
/// It reads the cluster kubectl reads (KUBECONFIG, else in-cluster).
#[derive(Debug, Parser)]
#[command(name = "kubectl-nodefabric", bin_name = "kubectl nodefabric", version = crate::VERSION)]
pub struct KubectlCli {
    /// What to show.
    #[command(subcommand)]
    pub command: KubectlCommand,
}

/// The plugin's subcommands.
#[derive(Debug, Subcommand)]
pub enum KubectlCommand {
    /// One row per node: its rails, NICs per rail, the worst path class any
    /// GPU has to its chosen NIC, the chosen NICs whose link is down, and
    /// whether the record still belongs to the Node of that name (a Node
    /// deleted and re-created under the same name has a new UID). Reads
    /// the shared ConfigMap and the NodeRailRecords, whichever the cluster
    /// has (both where both exist), and the Nodes: one request each.
    #[command(
        after_help = "Examples:\n  kubectl nodefabric rails\n  kubectl nodefabric rails -o json | jq '.[] | select(.failedLinks != [])'\n  kubectl nodefabric rails --rails-configmap gpu-infra/rails"
    )]
    Rails(ClusterRailsArgs),
}

/// Options of `kubectl nodefabric rails`.
#[derive(Debug, Args)]
pub struct ClusterRailsArgs {
    /// table (default), json or yaml.
    #[command(flatten)]
    pub output: OutputArg,

    /// The shared ConfigMap the publishers write (NAMESPACE/NAME, or NAME in
    /// the kubeconfig's namespace): the chart's configMapName.
    #[arg(long, value_name = "NAMESPACE/NAME", default_value = "nodefabric/nodefabric-rails", value_parser = super::cluster_args::parse_configmap)]
    pub rails_configmap: ConfigMapRef,

    /// How long the whole read may take (1s to 10m).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = crate::names::parse_api_timeout)]
    pub api_timeout: Duration,

    /// The service-account folder for the in-cluster client (KUBECONFIG wins).
    #[arg(long, value_name = "DIR", default_value = SERVICE_ACCOUNT_DIR)]
    pub service_account_dir: PathBuf,
}

/// `kubectl-nodefabric`'s whole `main`.
pub fn main() -> ExitCode {
    let cli = KubectlCli::parse();
    crate::logging::init(tracing::Level::WARN);
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kubectl-nodefabric: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: &KubectlCli) -> Result<()> {
    let KubectlCommand::Rails(args) = &cli.command;
    let format = args
        .output
        .pick("rails", &[Format::Table, Format::Json, Format::Yaml])?;
    if !client::configured() {
        anyhow::bail!(crate::cluster::ClusterError::NoConfig);
    }
    let settings = client::Settings {
        service_account_dir: args.service_account_dir.clone(),
        timeout: Some(args.api_timeout),
    };
    let cm = &args.rails_configmap;
    let read = client::run(
        &settings,
        "reading the cluster's rail records",
        |c| async move { rails_view::read(&c, cm).await },
    )
    .context("reading the cluster's rail records")?;
    if !read.configmap_found && !read.crd_found {
        anyhow::bail!(
            "the cluster has no rail record: neither ConfigMap {cm} nor NodeRailRecords (the CRD is not installed); is nodefabric publishing rails (--rails-configmap or --rails-record custom-resource)?"
        );
    }
    let rows = cluster::rows(&read.records, &read.nodes);
    let text = match format {
        Format::Table => cluster::table(&rows),
        Format::Yaml => output::yaml(&rows)?,
        _ => output::json(&rows)?,
    };
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}
