//! `nodefabric rails` and the rail inputs `publish --rails-file` shares:
//! the flags and values file that pick rail ports, and writing the record.

use super::{folder_and_name, Cli};
use crate::pass::Pass;
use crate::{cluster, publish, rails};
use anyhow::{Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};

/// Options of `rails`.
#[derive(Debug, Clone, Args)]
pub struct RailsCommand {
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
    /// values file holding it (see README, "Rails"); flags win over it.
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

    /// This node's identity and the shared ConfigMap (the broker).
    #[command(flatten)]
    pub cluster: super::BrokerArgs,
}

impl RailArgs {
    /// The values file of `--rails-config`, read once per pass, so that
    /// where the record goes and how it is built come from one version of
    /// it (a ConfigMap mount may change between two reads).
    /// A pipe given as the file is read for at most `wait` (the tool timeout).
    pub fn config(&self, wait: std::time::Duration) -> Result<Option<rails::config::RailConfig>> {
        self.rails_config
            .as_deref()
            .map(|path| rails::config::RailConfig::read(path, wait))
            .transpose()
    }

    /// The rail options, flags over the config file (as [`Self::config`] read it).
    pub fn options(
        &self,
        config: Option<&rails::config::RailConfig>,
        nvidia_smi: Option<&Path>,
        timeout: std::time::Duration,
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
        let source = match (source, &self.lldp_json) {
            (rails::INTERFACE_NAME, None) if self.lldp_socket.is_none() => rails::RailInput::InterfaceName,
            (rails::INTERFACE_NAME, _) => anyhow::bail!("--lldp-json and --lldp-socket are for the host-lldp rail source, not interface-name"),
            (_, Some(f)) => rails::RailInput::HostLldp(rails::LldpInput::File(f.clone())),
            (_, None) => rails::RailInput::HostLldp(rails::LldpInput::Lldpctl(self.lldp_socket.clone())),
        };
        let nvidia = match (&self.topo_file, &self.gpu_query_file) {
            _ if self.sysfs_paths => rails::NvidiaInput::Sysfs,
            (Some(topo), Some(query)) => rails::NvidiaInput::Files {
                query: query.clone(),
                topo: topo.clone(),
            },
            _ => rails::NvidiaInput::Command(nvidia_smi.map(Path::to_path_buf)),
        };
        let node_uid = self.cluster.node_uid()?;
        Ok(rails::Options {
            source,
            interface_regex,
            rail_id,
            nvidia,
            node_uid,
            timeout,
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

/// Builds the rail record from a pass.
pub(super) fn rail_record(
    cli: &Cli,
    pass: &Pass,
    options: &rails::Options,
) -> Result<rails::RailRecord> {
    let root = crate::sysfs::SysRoot::new(&cli.sysfs_root)?;
    rails::build(&root, &pass.record, options)
}

/// Writes the rail record to `file` if it changed, and to this node's
/// cluster record (`target`); on failure the previous file and record stay.
pub(super) fn publish_rails(
    cli: &Cli,
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
        .options(config, cli.nvidia_smi.as_deref(), cli.tool_timeout)
        .and_then(|o| rail_record(cli, pass, &o))
        .with_context(|| format!("rail record not built; {kept}"))?;
    // The file does not wait on the cluster: each fails or succeeds on its own.
    let written = file.map_or(Ok(()), |file| {
        let (dir, name) = folder_and_name(file, "--rails-file")?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        publish::write_if_changed(dir, name, &rails::to_bytes(&record))?;
        Ok(())
    });
    let patched = target.map_or(Ok(()), |t| args.cluster.publish(t, &record));
    written.and(patched)
}
