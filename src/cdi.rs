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

use crate::record::{CharDevice, Interface, LinkState, NodeRecord};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The lowest CDI version with the fields we use (annotations need 0.6.0).
pub const CDI_VERSION: &str = "0.6.0";

/// The annotation-key prefix of the device annotations.
pub const ANNOTATION_PREFIX: &str = "rdma.gpustack.ai";

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
    /// What the device plugin needs to know about the endpoint.
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
    fn is_empty(&self) -> bool {
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

/// Why a family's spec cannot be generated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{kind}: {reasons}", reasons = .reasons.join("; "))]
pub struct CdiError {
    /// The family's kind.
    pub kind: &'static str,
    /// One diagnostic per endpoint that could not be resolved.
    pub reasons: Vec<String>,
}

/// An endpoint of a family: the interface and, for a VF, its PF.
type Endpoint<'a> = (&'a Interface, Option<&'a Interface>);

/// The endpoints of a family, read off the record (never chosen): a PF with
/// VFs configured serves only through its VFs. Endpoints without a bound
/// RDMA device name have nothing to hand over and are in no family.
pub fn endpoints(record: &NodeRecord, family: Family) -> Vec<Endpoint<'_>> {
    let mut out = Vec::new();
    for iface in &record.spec.interfaces {
        let partitioned = iface.physical_function && iface.virtual_functions_configured > 0;
        match (family, partitioned) {
            (Family::Whole, false) => out.push((iface, None)),
            (Family::Partitioned, true) => {
                out.extend(iface.virtual_functions.iter().map(|vf| (vf, Some(iface))))
            }
            _ => {}
        }
    }
    out.retain(|(ep, _)| ep.rdma_device.is_some());
    out
}

fn device(ep: &Interface, parent: Option<&Interface>) -> Result<Device, String> {
    let ibdev = ep
        .rdma_device
        .as_deref()
        .expect("endpoints() keeps bound ones");
    if !crate::names::is_cdi_device_name(ibdev) {
        return Err(format!(
            "RDMA device name {ibdev:?} is not a valid CDI device name"
        ));
    }
    let verbs = ep.verbs.as_ref().ok_or_else(|| {
        ep.verbs_error
            .clone()
            .unwrap_or_else(|| format!("no verbs device for {ibdev}"))
    })?;
    let key = |k: &str| format!("{ANNOTATION_PREFIX}/{k}");
    let mut annotations = BTreeMap::new();
    annotations.insert(key("rdma-device"), ibdev.to_string());
    if let Some(pci) = &ep.pci_bus_id {
        annotations.insert(key("pci-address"), pci.clone());
    }
    if let Some(numa) = ep.effective_numa(parent) {
        annotations.insert(key("numa"), numa.to_string());
    }
    let link = ep.link.as_ref().map_or(LinkState::Unverified, |l| l.state);
    annotations.insert(key("link"), link.as_str().to_string());
    if let Some(name) = &ep.name {
        annotations.insert(key("interface"), name.clone());
    }
    if let Some(pf) = parent.and_then(|p| p.pci_bus_id.clone()) {
        annotations.insert(key("parent"), pf);
    }
    Ok(Device {
        name: ibdev.to_string(),
        annotations,
        container_edits: ContainerEdits {
            env: vec![],
            device_nodes: vec![verbs.into()],
        },
    })
}

/// The spec of one family: `Ok(None)` when it has no endpoints (its file is
/// removed), an error naming every endpoint that cannot be resolved.
pub fn spec(record: &NodeRecord, family: Family) -> Result<Option<Spec>, CdiError> {
    let eps = endpoints(record, family);
    if eps.is_empty() {
        return Ok(None);
    }
    let mut devices = Vec::new();
    let mut reasons = Vec::new();
    for (ep, parent) in eps {
        match device(ep, parent) {
            Ok(d) => devices.push(d),
            Err(why) => reasons.push(why),
        }
    }
    devices.sort_by(|a, b| {
        a.name.cmp(&b.name).then_with(|| {
            a.annotations
                .get(&interface_key())
                .cmp(&b.annotations.get(&interface_key()))
        })
    });
    let devices = merge_shared_rdma_devices(devices, &mut reasons);
    if !reasons.is_empty() {
        return Err(CdiError {
            kind: family.kind(),
            reasons,
        });
    }
    let container_edits = ContainerEdits {
        env: vec![],
        device_nodes: record.spec.rdma_cm.iter().map(DeviceNode::from).collect(),
    };
    Ok(Some(Spec {
        cdi_version: CDI_VERSION.into(),
        kind: family.kind().into(),
        devices,
        container_edits,
    }))
}

/// The annotation naming an endpoint's interface(s).
fn interface_key() -> String {
    format!("{ANNOTATION_PREFIX}/interface")
}

/// One CDI device per RDMA device: two netdevs on one RDMA device (both
/// ports of a dual-port HCA on one PCI function, an IPoIB child interface)
/// would otherwise give two devices of one name, and CDI loaders reject a
/// spec with a duplicate name whole. The devices are merged when they inject
/// the same thing; their interface names are listed together, sorted, joined
/// with `+` (a `,` would read as a list separator to annotation consumers).
/// Devices that share a name but differ in what they inject cannot be one
/// device and are refused, naming the RDMA device. `devices` is sorted by name.
fn merge_shared_rdma_devices(devices: Vec<Device>, reasons: &mut Vec<String>) -> Vec<Device> {
    let mut out: Vec<Device> = Vec::with_capacity(devices.len());
    for d in devices {
        match out.last_mut() {
            Some(prev) if prev.name == d.name => {
                if prev.container_edits != d.container_edits {
                    reasons.push(format!(
                        "RDMA device {} is bound to endpoints that inject different device nodes",
                        d.name
                    ));
                    continue;
                }
                let key = interface_key();
                if let Some(name) = d.annotations.get(&key) {
                    let joined = match prev.annotations.get(&key) {
                        Some(old) => format!("{old}+{name}"),
                        None => name.clone(),
                    };
                    prev.annotations.insert(key, joined);
                }
            }
            _ => out.push(d),
        }
    }
    out
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
