//! The rail configuration file: the `gpuNicRailMapping` block of a Helm
//! values file, or the whole values file with that block under
//! `nodeMetadata.plugins`. Flags given on the command line win over it.
//!
//! ```yaml
//! enabled: true
//! configMapName: topograph-nic-rails        # the shared ConfigMap (--rails-configmap) in a cluster
//! railSource:
//!   name: host-lldp
//!   hostLLDP:
//!     interfaceRegex: '^eth_r([0-9]+)_p[0-9]+$'
//!     railID: 'rail$1'
//!   # or, on InfiniBand fabrics (no LLDP): every port whose name matches
//!   # name: interface-name
//!   # interfaceName:
//!   #   interfaceRegex: '^mlx5_([0-9]+)$'
//!   #   railID: 'rail$1'
//! gpuSource:                                # nvidia-smi in the GPU Operator's pod on the node, where a cluster is configured
//!   gpuOperatorNamespace: gpu-operator
//!   daemonSet: nvidia-device-plugin-daemonset
//! ```

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// A rails values file that cannot be used; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read (missing, too large, a stalled pipe …).
    #[error(transparent)]
    Read(#[from] crate::input::InputError),
    /// The text is not YAML.
    #[error("{}: not YAML: {cause}", path.display())]
    NotYaml {
        /// The file.
        path: PathBuf,
        /// The YAML parser's words.
        cause: String,
    },
    /// A whole values file without the plugin's block.
    #[error("{}: nodeMetadata has no plugins.gpuNicRailMapping block", path.display())]
    NoBlock {
        /// The file.
        path: PathBuf,
    },
    /// The block does not have the expected shape.
    #[error("{}: invalid rail configuration: {cause}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What serde found.
        cause: String,
    },
    /// `railSource.name: xplane`.
    #[error("{}: railSource xplane is not supported (no API gives host PCI identity yet)", path.display())]
    Xplane {
        /// The file.
        path: PathBuf,
    },
    /// A rail source name this version does not know.
    #[error("{}: unknown railSource {name:?} (one of {:?})", path.display(), super::RAIL_SOURCES)]
    UnknownSource {
        /// The file.
        path: PathBuf,
        /// The name given.
        name: String,
    },
}

/// The largest values file read: a ConfigMap, where it is mounted from,
/// holds at most 1 MiB.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The `gpuNicRailMapping` block.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RailConfig {
    /// Whether the mapping runs at all; `false` makes `rails` refuse to run.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The shared ConfigMap the broker patches (`--rails-configmap` wins),
    /// in the pod's namespace; used only where a cluster is configured.
    #[serde(default)]
    pub config_map_name: Option<String>,
    /// Where rails come from.
    pub rail_source: RailSource,
    /// Where a cluster deployment finds nvidia-smi: the GPU Operator's pod
    /// on this node (used where a cluster is configured; the flags
    /// `--gpu-operator-namespace`/`--gpu-operator-daemonset` win).
    #[serde(default)]
    pub gpu_source: Option<GpuSourceConfig>,
}

fn yes() -> bool {
    true
}

/// `railSource`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RailSource {
    /// `host-lldp` or `interface-name`.
    pub name: String,
    /// The host-lldp settings.
    #[serde(rename = "hostLLDP", default)]
    pub host_lldp: Option<HostLldp>,
    /// The interface-name settings (the same two keys).
    #[serde(rename = "interfaceName", default)]
    pub interface_name: Option<HostLldp>,
}

impl RailSource {
    /// The port-naming settings of the named source.
    pub fn ports(&self) -> Option<&HostLldp> {
        match self.name.as_str() {
            super::INTERFACE_NAME => self.interface_name.as_ref(),
            _ => self.host_lldp.as_ref(),
        }
    }
}

/// `railSource.hostLLDP` and `railSource.interfaceName`: which ports are
/// rail ports and their rail IDs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostLldp {
    /// The rail-interface regular expression.
    #[serde(rename = "interfaceRegex")]
    pub interface_regex: String,
    /// The rail ID template (`rail$1`).
    #[serde(rename = "railID")]
    pub rail_id: String,
}

/// `gpuSource`: the GPU Operator's DaemonSet whose pod on this node runs nvidia-smi.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuSourceConfig {
    /// The GPU Operator's namespace.
    #[serde(default)]
    pub gpu_operator_namespace: Option<String>,
    /// The DaemonSet whose pod runs nvidia-smi.
    #[serde(default)]
    pub daemon_set: Option<String>,
}

impl RailConfig {
    /// Parses a config file's text; `path` only names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<RailConfig, ConfigError> {
        let value: serde_json::Value =
            serde_saphyr::from_str(text).map_err(|e| ConfigError::NotYaml {
                path: path.to_path_buf(),
                cause: e.to_string(),
            })?;
        // A whole values file: take the plugin's block.
        let block = match value.pointer("/nodeMetadata/plugins/gpuNicRailMapping") {
            Some(b) => b.clone(),
            None if value.get("nodeMetadata").is_some() => {
                return Err(ConfigError::NoBlock {
                    path: path.to_path_buf(),
                })
            }
            None => value,
        };
        let config: RailConfig =
            serde_json::from_value(block).map_err(|e| ConfigError::Invalid {
                path: path.to_path_buf(),
                cause: e.to_string(),
            })?;
        match config.rail_source.name.as_str() {
            super::HOST_LLDP | super::INTERFACE_NAME => {}
            "xplane" => {
                return Err(ConfigError::Xplane {
                    path: path.to_path_buf(),
                })
            }
            other => {
                return Err(ConfigError::UnknownSource {
                    path: path.to_path_buf(),
                    name: other.to_string(),
                })
            }
        }
        Ok(config)
    }

    /// Reads and parses a config file, refusing one larger than a
    /// ConfigMap can hold ([`MAX_CONFIG_BYTES`]), or a pipe not written to
    /// its end within `wait`.
    pub fn read(path: &Path, wait: std::time::Duration) -> Result<RailConfig, ConfigError> {
        let text = crate::input::read_text(
            path,
            MAX_CONFIG_BYTES,
            "a rails values file",
            crate::input::Pipes::Wait(wait),
        )?;
        RailConfig::parse(&text, path)
    }
}
