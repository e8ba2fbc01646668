//! `nodefabric rails` and the rail inputs `publish --rails-file` shares:
//! the flags and values file that pick rail ports, and writing the record.

use super::{folder_and_name, Cli};
use crate::discover::rail_inputs::{self, LldpSource, NvidiaSource};
use crate::pass::Pass;
use crate::sysfs::SysRoot;
use crate::{cluster, publish, rails};
use anyhow::{Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};

/// The formats `rails` prints, its default first.
pub const FORMATS: [super::output::Format; 3] = [
    super::output::Format::Table,
    super::output::Format::Json,
    super::output::Format::Yaml,
];

/// The GPU-to-NIC rail record: for every GPU and rail, the NICs tied at
/// the closest PCIe path class.
///
/// Formats (-o): table (default: one row per GPU, one column per rail,
/// each cell the NICs by RDMA device name and their class, `(down)` after
/// a NIC whose link is down), json (the record itself: what
/// `publish --rails-file` writes and the cluster record holds) and yaml.
#[derive(Debug, Clone, Args)]
pub struct RailsCommand {
    /// table (default: GPU rows, rail columns, each cell the NICs and their
    /// path class), json (the rail record, as `publish --rails-file` writes
    /// it) or yaml.
    #[command(flatten)]
    pub output: super::output::OutputArg,

    /// Folder holding the last published record; read only by this command.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// The rail inputs.
    #[command(flatten)]
    pub rails: RailArgs,
}

/// Where rails and GPU paths come from (`rails`, and `publish --rails-file`).
#[derive(Debug, Args, Clone, Default)]
pub struct RailArgs {
    /// YAML rail configuration: the Helm `gpuNicRailMapping` block or a whole
    /// values file holding it (see docs/rails.md); flags win over it.
    #[arg(long, value_name = "FILE")]
    pub rails_config: Option<PathBuf>,

    /// Where rail ports come from: `host-lldp` (interfaces with an LLDP
    /// neighbour; the default) or `interface-name` (every port whose netdev
    /// or RDMA device name matches --interface-regex: InfiniBand has no LLDP).
    #[arg(long, value_name = "SOURCE", value_parser = rails::RAIL_SOURCES)]
    pub rail_source: Option<String>,

    /// Rail ports: a regular expression on interface names (with
    /// interface-name also RDMA device names) whose capture groups feed
    /// --rail-id, e.g. '^eth_r([0-9]+)_p[0-9]+$'.
    #[arg(long, value_name = "RE")]
    pub interface_regex: Option<String>,

    /// Rail ID template with $1-style capture references, e.g. 'rail$1'.
    #[arg(long, value_name = "TEMPLATE")]
    pub rail_id: Option<String>,

    /// Where the LLDP table and nvidia-smi's answers come from.
    #[command(flatten)]
    pub inputs: RailInputArgs,

    /// This node's identity and the shared ConfigMap (the broker).
    #[command(flatten)]
    pub cluster: super::BrokerArgs,
}

/// Where the rail inputs are read from (`rails`, `publish --rails-file`
/// and `capture`, which stores what they answered).
#[derive(Debug, Args, Clone, Default)]
pub struct RailInputArgs {
    /// Run `lldpctl -u PATH -f json` against this lldpd socket (default: lldpd's own).
    #[arg(long, value_name = "PATH", conflicts_with = "lldp_json")]
    pub lldp_socket: Option<PathBuf>,

    /// Read a saved `lldpctl -f json` output instead of running lldpctl.
    #[arg(long, value_name = "FILE")]
    pub lldp_json: Option<PathBuf>,

    /// Read a saved `nvidia-smi topo -m` instead of running nvidia-smi (needs --gpu-query-file).
    #[arg(long, value_name = "FILE", requires = "gpu_query_file")]
    pub topo_file: Option<PathBuf>,

    /// Read a saved `nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader` (needs --topo-file).
    #[arg(long, value_name = "FILE", requires = "topo_file")]
    pub gpu_query_file: Option<PathBuf>,

    /// Take every GPU's paths from the PCIe walk, even where nvidia-smi exists.
    #[arg(long, conflicts_with = "topo_file")]
    pub sysfs_paths: bool,

    /// Run nvidia-smi in this DaemonSet's Running pod on this node
    /// (--node-name) through the API server's exec, not on the node
    /// (gpuSource.daemonSet in --rails-config); needs a cluster
    /// (KUBECONFIG, or in a pod) and --gpu-operator-namespace.
    #[arg(long, value_name = "NAME", value_parser = parse_object_name, conflicts_with_all = ["topo_file", "sysfs_paths"])]
    pub gpu_operator_daemonset: Option<String>,

    /// The namespace of --gpu-operator-daemonset (gpuSource.gpuOperatorNamespace
    /// in --rails-config).
    #[arg(long, value_name = "NAMESPACE", value_parser = parse_object_name, conflicts_with_all = ["topo_file", "sysfs_paths"])]
    pub gpu_operator_namespace: Option<String>,
}

/// Parses a namespace or object name for clap: one that is no DNS name
/// would reach the API as another path.
fn parse_object_name(s: &str) -> std::result::Result<String, String> {
    crate::names::parse_namespace(s).map_err(|e| e.to_string())
}

impl RailInputArgs {
    /// True when a GPU Operator flag is given (nvidia-smi is then run in its pod).
    pub fn gpu_operator_named(&self) -> bool {
        self.gpu_operator_daemonset.is_some() || self.gpu_operator_namespace.is_some()
    }

    /// The rail inputs these flags name. Replaying a capture that holds rail
    /// answers, each input not named on the command line (the LLDP table;
    /// nvidia-smi, with --nvidia-smi, --topo-file or --sysfs-paths naming
    /// it) answers as the captured pass read it.
    pub fn sources(&self, source: rails::PortSource, cli: &Cli) -> rail_inputs::Sources {
        let replay = cli.replayed_rails.as_ref();
        let lldp = match (source, &self.lldp_json, replay) {
            (rails::PortSource::InterfaceName, _, _) => None,
            (_, Some(f), _) => Some(LldpSource::File(f.clone())),
            (_, None, Some(r)) if self.lldp_socket.is_none() => {
                Some(LldpSource::Replay(r.lldp.clone()))
            }
            (_, None, _) => Some(LldpSource::Lldpctl(self.lldp_socket.clone())),
        };
        let nvidia = match (&self.topo_file, &self.gpu_query_file, replay) {
            _ if self.sysfs_paths => NvidiaSource::Sysfs,
            (Some(topo), Some(query), _) => NvidiaSource::Files {
                query: query.clone(),
                topo: topo.clone(),
            },
            (_, _, Some(r)) if cli.nvidia_smi.is_none() => NvidiaSource::Replay(r.nvidia.clone()),
            _ => NvidiaSource::Command(cli.nvidia_smi.clone()),
        };
        rail_inputs::Sources {
            lldp,
            nvidia,
            timeout: cli.tool_timeout,
        }
    }
}

impl RailArgs {
    /// The values file of `--rails-config`, read once per pass, so that
    /// where the record goes and how it is built come from one version of
    /// it (a ConfigMap mount may change between two reads).
    /// A pipe given as the file is read for at most `wait` (the tool timeout).
    pub fn config(&self, wait: std::time::Duration) -> Result<Option<rails::config::RailConfig>> {
        Ok(self
            .rails_config
            .as_deref()
            .map(|path| rails::config::RailConfig::read(path, wait))
            .transpose()?)
    }

    /// The rail options, flags over the config file (as [`Self::config`] read it).
    pub fn options(
        &self,
        cli: &Cli,
        config: Option<&rails::config::RailConfig>,
    ) -> Result<rails::Options> {
        if let Some(c) = config {
            if !c.enabled {
                anyhow::bail!(
                    "{}: gpuNicRailMapping is disabled (enabled: false)",
                    self.rails_config.as_ref().unwrap().display()
                );
            }
        }
        let source = self
            .rail_source
            .clone()
            .or_else(|| config.map(|c| c.rail_source.name.clone()));
        let source = source.as_deref().unwrap_or(rails::HOST_LLDP);
        // The config's port settings count only for the source they belong to.
        let lldp_cfg = config
            .filter(|c| c.rail_source.name == source)
            .and_then(|c| c.rail_source.ports().cloned());
        let regex = self
            .interface_regex
            .clone()
            .or_else(|| lldp_cfg.as_ref().map(|l| l.interface_regex.clone()))
            .context("rails need --interface-regex (or railSource.hostLLDP/interfaceName.interfaceRegex in --rails-config)")?;
        let rail_id = self
            .rail_id
            .clone()
            .or_else(|| lldp_cfg.as_ref().map(|l| l.rail_id.clone()))
            .context("rails need --rail-id (or railSource.hostLLDP/interfaceName.railID in --rails-config)")?;
        let interface_regex =
            regex::Regex::new(&regex).with_context(|| format!("--interface-regex {regex:?}"))?;
        let lldp_named = self.inputs.lldp_json.is_some() || self.inputs.lldp_socket.is_some();
        let source = match source {
            rails::INTERFACE_NAME if lldp_named => anyhow::bail!("--lldp-json and --lldp-socket are for the host-lldp rail source, not interface-name"),
            rails::INTERFACE_NAME => rails::PortSource::InterfaceName,
            _ => rails::PortSource::HostLldp,
        };
        let node_uid = match self.cluster.node_uid_from_api() {
            true => cli.full()?.node_uid(&self.cluster)?,
            false => self.cluster.node_uid.clone(),
        };
        Ok(rails::Options {
            source,
            interface_regex,
            rail_id,
            node_uid,
        })
    }

    /// Where the record is published in the cluster, if anywhere: this
    /// node's NodeRailRecord (--rails-record custom-resource), or its key of
    /// --rails-configmap, else of configMapName from --rails-config where a
    /// cluster is configured.
    pub fn target(
        &self,
        config: Option<&rails::config::RailConfig>,
    ) -> Result<Option<cluster::broker::Target>> {
        self.cluster
            .target(config.and_then(|c| c.config_map_name.as_deref()))
    }
}

/// Reads the rail inputs on the pass's tree and builds the rail record from them.
pub(super) fn rail_record(
    cli: &Cli,
    root: &SysRoot,
    pass: &Pass,
    args: &RailArgs,
    config: Option<&rails::config::RailConfig>,
    options: &rails::Options,
) -> Result<rails::RailRecord> {
    let gpu_source = config.and_then(|c| c.gpu_source.as_ref());
    let sources = rail_sources(
        cli,
        &args.inputs,
        options.source,
        gpu_source,
        &args.cluster,
        &pass.record,
    )?;
    let inputs = rail_inputs::read(root, &pass.record, &sources);
    Ok(rails::build(&pass.record, &inputs, options)?)
}

/// The rail inputs of one pass (`rails`, `publish`, `capture`): the local
/// ones the flags name, except that where a GPU source is configured
/// (--gpu-operator-namespace/--gpu-operator-daemonset, or the values
/// file's gpuSource where a cluster is configured, flags winning key by
/// key) nvidia-smi's answers are asked of the GPU Operator's pod on this
/// node first, on a node whose record has an NVIDIA GPU. A local input named
/// on the command line (--topo-file, --sysfs-paths, --nvidia-smi) or a
/// replayed capture's answers win over the values file; over the flags,
/// only a replay's do not.
pub(super) fn rail_sources(
    cli: &Cli,
    inputs: &RailInputArgs,
    port_source: rails::PortSource,
    gpu_source: Option<&rails::config::GpuSourceConfig>,
    broker: &super::BrokerArgs,
    record: &crate::record::NodeRecord,
) -> Result<rail_inputs::Sources> {
    let mut sources = inputs.sources(port_source, cli);
    let flagged = inputs.gpu_operator_named();
    if flagged && cli.nvidia_smi.is_some() {
        anyhow::bail!("--nvidia-smi runs nvidia-smi on this node and --gpu-operator-daemonset in the GPU Operator's pod: name one");
    }
    let configured = gpu_source.filter(|_| cluster::client::configured());
    if !flagged && configured.is_none() {
        return Ok(sources);
    }
    let local = match &sources.nvidia {
        NvidiaSource::Command(None) => false,
        NvidiaSource::Replay(_) => !flagged,
        _ => true,
    };
    if local {
        return Ok(sources);
    }
    if flagged && !cluster::client::configured() {
        anyhow::bail!("--gpu-operator-daemonset asks the API server to run nvidia-smi: set KUBECONFIG, or run in a pod");
    }
    let namespace = inputs.gpu_operator_namespace.clone()
        .or_else(|| configured.and_then(|c| c.gpu_operator_namespace.clone()))
        .context("the GPU source needs --gpu-operator-namespace (or gpuSource.gpuOperatorNamespace in --rails-config)")?;
    let daemon_set = inputs.gpu_operator_daemonset.clone()
        .or_else(|| configured.and_then(|c| c.daemon_set.clone()))
        .context("the GPU source needs --gpu-operator-daemonset (or gpuSource.daemonSet in --rails-config)")?;
    let node = broker.node_name.clone().with_context(|| {
        format!("the GPU source (DaemonSet {namespace}/{daemon_set}) needs --node-name (or NODE_NAME): its pod on this node is asked")
    })?;
    // As for a local run: a node without an NVIDIA GPU has nothing to ask,
    // and no GPU Operator pod to ask it of.
    let has_nvidia = record
        .accelerators()
        .any(|a| a.manufacturer == crate::record::Vendor::Nvidia);
    if !has_nvidia {
        return Ok(sources);
    }
    let settings = cluster::gpu_exec::Settings {
        namespace,
        daemon_set,
        node,
        timeout: cli.tool_timeout,
        cap: rails::MAX_SAVED_OUTPUT,
    };
    sources.nvidia = NvidiaSource::Answered(cli.full()?.gpu_answers(broker, &settings));
    Ok(sources)
}

/// Writes the rail record to `file` if it changed, and to this node's
/// cluster record (`target`); on failure the previous file and record stay.
pub(super) fn publish_rails(
    cli: &Cli,
    root: &SysRoot,
    pass: &Pass,
    args: &RailArgs,
    config: Option<&rails::config::RailConfig>,
    file: Option<&Path>,
    target: Option<&cluster::broker::Target>,
) -> Result<()> {
    let kept = match (file, target) {
        (Some(f), Some(t)) => format!("previous {} and {t} kept", f.display()),
        (Some(f), None) => format!("previous {} kept", f.display()),
        (None, Some(t)) => format!("previous {t} kept"),
        (None, None) => String::new(),
    };
    let record = args
        .options(cli, config)
        .and_then(|o| rail_record(cli, root, pass, args, config, &o))
        .with_context(|| format!("rail record not built; {kept}"))?;
    // The file does not wait on the cluster: each fails or succeeds on its own.
    let written = file.map_or(Ok(()), |file| {
        let (dir, name) = folder_and_name(file, "--rails-file")?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        publish::write_if_changed(dir, name, &rails::to_bytes(&record))?;
        Ok(())
    });
    let patched = target.map_or(Ok(()), |t| {
        cli.full()?.publish_record(&args.cluster, t, &record)
    });
    written.and(patched)
}
