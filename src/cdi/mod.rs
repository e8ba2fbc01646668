//! CDI specs: one per resource family, derived from the node record, and the
//! only input of the device plugin.
//!
//! | family | kind | endpoints | file |
//! |---|---|---|---|
//! | whole interface (exclusive and shared tokens) | `gpustack.ai/rdma` | interfaces that are not a PF with VFs configured | `nodefabric-rdma.json` |
//! | partitioned | `gpustack.ai/rdma-vf` | each VF of a PF with VFs configured | `nodefabric-rdma-vf.json` |
//!
//! A device is named after its RDMA device (`gpustack.ai/rdma=mlx5_0`) and
//! injects exactly its own verbs character device; the spec-level edit adds
//! `rdma_cm` once per container, where the host has one.

use crate::record::CharDevice;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

mod annotations;
mod generate;

pub use annotations::{AnnotationError, EndpointAnnotations, Key, INTERFACE_SEPARATOR, PREFIX};
pub use generate::{endpoints, spec, CdiError, Unresolved};

/// The lowest CDI version with the fields we use (annotations need 0.6.0).
pub const CDI_VERSION: &str = "0.6.0";

/// A resource family: which endpoints a spec holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// Whole interfaces: served as exclusive and as shared tokens.
    Whole,
    /// SR-IOV VFs of a PF that has VFs configured.
    Partitioned,
}

impl Family {
    /// Every family, in file order.
    pub const ALL: [Family; 2] = [Family::Whole, Family::Partitioned];

    /// The CDI kind (`vendor/class`).
    pub fn kind(self) -> &'static str {
        match self {
            Family::Whole => "gpustack.ai/rdma",
            Family::Partitioned => "gpustack.ai/rdma-vf",
        }
    }

    /// The spec's file name in the CDI folder; these names are ours alone.
    pub fn file_name(self) -> &'static str {
        match self {
            Family::Whole => "nodefabric-rdma.json",
            Family::Partitioned => "nodefabric-rdma-vf.json",
        }
    }
}

/// A CDI spec (the subset of the format we write).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// The CDI version the document complies with.
    pub cdi_version: String,
    /// `vendor/class`.
    pub kind: String,
    /// The devices, sorted by name.
    pub devices: Vec<Device>,
    /// Edits applied once when any device of the spec is injected.
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

/// One CDI device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// The name users type after `kind=`.
    pub name: String,
    /// What readers need to know about the endpoint: an
    /// [`EndpointAnnotations`], in its annotation form.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// What injecting it does to the container.
    pub container_edits: ContainerEdits,
}

/// Container edits (the subset we use).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// Environment variables, `NAME=value`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes to create in the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
}

impl ContainerEdits {
    pub(crate) fn is_empty(&self) -> bool {
        self.env.is_empty() && self.device_nodes.is_empty()
    }
}

/// A device node, with type and numbers so a runtime can create it even when
/// the host path is absent from its view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path in the container (and on the host).
    pub path: String,
    /// `c` for a character device.
    #[serde(rename = "type")]
    pub node_type: String,
    /// Major number.
    pub major: i64,
    /// Minor number.
    pub minor: i64,
    /// cgroup permissions.
    pub permissions: String,
}

impl From<&CharDevice> for DeviceNode {
    fn from(d: &CharDevice) -> Self {
        DeviceNode {
            path: d.path.clone(),
            node_type: "c".into(),
            major: d.major.into(),
            minor: d.minor.into(),
            permissions: "rw".into(),
        }
    }
}

impl Device {
    /// The typed annotations of this device, for a reader: an error names
    /// the spec file, the device and the annotation at fault.
    pub fn endpoint(
        &self,
        kind: &str,
        path: &std::path::Path,
    ) -> Result<EndpointAnnotations, DeviceError> {
        EndpointAnnotations::from_map(&self.name, &self.annotations).map_err(|source| DeviceError {
            path: path.to_path_buf(),
            device: format!("{kind}={}", self.name),
            source,
        })
    }
}

/// A CDI device whose annotations do not keep the contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: CDI device {device}: {source}", path.display())]
pub struct DeviceError {
    /// The spec file it was read from.
    pub path: std::path::PathBuf,
    /// The fully qualified device name, `kind=name`.
    pub device: String,
    /// What is wrong with its annotations.
    pub source: AnnotationError,
}

/// A spec as written to disk: pretty JSON with a trailing newline.
pub fn to_bytes(spec: &Spec) -> Vec<u8> {
    let mut s = serde_json::to_string_pretty(spec).expect("spec serialises");
    s.push('\n');
    s.into_bytes()
}

#[cfg(test)]
mod tests {
    use crate::names::is_cdi_device_name as valid_device_name;

    #[test]
    fn device_names_refuse_list_and_key_separators() {
        assert!(!valid_device_name("mlx5_0,nvidia.com/gpu=all"));
        assert!(!valid_device_name("a=b"));
    }

    #[test]
    fn device_names() {
        assert!(valid_device_name("mlx5_0"));
        assert!(valid_device_name("hns_0"));
        assert!(!valid_device_name("mlx5/0"));
        assert!(!valid_device_name("_x"));
    }
}
