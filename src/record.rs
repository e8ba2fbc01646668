//! The node record: the one description of the host that every published
//! artifact is derived from, in the shape `nodefabric inventory` prints.
//!
//! The JSON follows the `Devices` object of the specification
//! (`.spec.interfaces[]`, `.spec.groups[].accelerators[]`), so its jq recipes
//! work on this output unchanged.

use crate::pci::Coordinates;
use serde::{Deserialize, Serialize};

/// The record's schema version, bumped on any incompatible change.
pub const NODE_RECORD_VERSION: u32 = 1;

/// The whole node record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRecord {
    /// Always `nodefabric/v1`-style versioning: a reader checks this first.
    pub version: u32,
    /// What was found.
    pub spec: Spec,
}

/// The discovered inventory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// One entry per kernel interface, sorted by name; VFs nested under their PF.
    pub interfaces: Vec<Interface>,
    /// Accelerators grouped by manufacturer, sorted by manufacturer.
    pub groups: Vec<AcceleratorGroup>,
    /// The RDMA connection-manager device, where the host has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_cm: Option<CharDevice>,
}

/// A character device as sysfs describes it (`dev` = `major:minor`), with the
/// path it has under `/dev`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CharDevice {
    /// The device path (`/dev/infiniband/uverbs0`).
    pub path: String,
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

/// One network interface, or one SR-IOV virtual function nested in its PF.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    /// Kernel interface name; `None` for a VF that has no netdev (bound to vfio, say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The bus the interface's device sits on (`pci`, `platform`, `virtio`…);
    /// `virtual` for a software interface.
    pub bus: String,
    /// The PCI address, for a PCI device only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// The device's NUMA node; absent when the kernel gave none (`-1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// The device's local CPU list as the kernel prints it (`0-15,32-47`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_affinity: Option<String>,
    /// The interface MTU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// True when the kernel reports the operational state `up`.
    pub up: bool,
    /// True for a software interface (no device behind it).
    #[serde(rename = "virtual")]
    pub is_virtual: bool,
    /// True when an RDMA device is bound to this interface's device.
    pub rdma: bool,
    /// The bound RDMA device (`mlx5_0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_device: Option<String>,
    /// The bound RDMA device's verbs character device (`/dev/infiniband/uverbsN`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verbs: Option<CharDevice>,
    /// Why the verbs device could not be resolved, naming every place checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verbs_error: Option<String>,
    /// The RDMA link verdict; absent when there is nothing RDMA to check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<LinkVerdict>,
    /// True when the device is an SR-IOV physical function (it can carry VFs).
    pub physical_function: bool,
    /// How many VFs are configured on it now (`sriov_numvfs`); 0 when none.
    pub virtual_functions_configured: u32,
    /// The configured VFs, sorted by PCI address.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub virtual_functions: Vec<Interface>,
    /// For a VF: its parent PF's PCI address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// PCI coordinates; absent for a device that is not on the PCI bus.
    /// Shared: every VF of a PF sits where its PF does, and a copy per VF
    /// was most of the allocations of a node of many VFs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<std::sync::Arc<Topology>>,
    /// Facts this pass could not read, each kept from the previous record or
    /// left unknown: an unreadable file is never an answer of "no".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<UnreadableFact>,
}

/// One fact a pass could not read, so that `inventory` and `preflight` show
/// which values are this pass's answers and which are carried over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnreadableFact {
    /// The record field it fills (`virtualFunctionsConfigured`, `rdmaDevice` …),
    /// or `interface` when the whole interface could not be read.
    pub fact: Fact,
    /// Why it could not be read, naming the path.
    pub reason: String,
    /// True when the value was kept from the previous pass; false when there
    /// was none to keep and the value is unknown.
    pub kept: bool,
}

/// A fact that can be unreadable: the record field it fills, spelt as in the
/// record. An enum, so a fact that is noted is always one that can be kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Fact {
    /// The whole interface: its `class/net` entry or `device` link.
    Interface,
    /// The bus its device sits on (the `subsystem` link).
    Bus,
    /// `mtu`.
    Mtu,
    /// `operstate` and `flags`.
    Up,
    /// `numa_node`.
    Numa,
    /// `local_cpulist`.
    CpuAffinity,
    /// `sriov_totalvfs`.
    PhysicalFunction,
    /// `sriov_numvfs`.
    VirtualFunctionsConfigured,
    /// The VF list (`virtfnN` links).
    VirtualFunctions,
    /// The bound RDMA device's verbs character device.
    Verbs,
    /// The bound RDMA device (`device/infiniband`).
    RdmaDevice,
    /// A whole accelerator (`vendor`, `class`).
    Accelerator,
}

impl Fact {
    /// The spelling in the record and in preflight.
    pub fn as_str(self) -> &'static str {
        match self {
            Fact::Interface => "interface",
            Fact::Bus => "bus",
            Fact::Mtu => "mtu",
            Fact::Up => "up",
            Fact::Numa => "numa",
            Fact::CpuAffinity => "cpuAffinity",
            Fact::PhysicalFunction => "physicalFunction",
            Fact::VirtualFunctionsConfigured => "virtualFunctionsConfigured",
            Fact::VirtualFunctions => "virtualFunctions",
            Fact::Verbs => "verbs",
            Fact::RdmaDevice => "rdmaDevice",
            Fact::Accelerator => "accelerator",
        }
    }
}

impl std::fmt::Display for Fact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl UnreadableFact {
    /// The sentence preflight prints for it.
    pub fn describe(&self) -> String {
        if self.kept {
            format!(
                "{}: kept from the previous pass: {}",
                self.fact, self.reason
            )
        } else {
            format!(
                "{}: unknown (no previous pass to keep it from): {}",
                self.fact, self.reason
            )
        }
    }
}

impl Interface {
    /// The NUMA node to use for this endpoint: its own, or for a VF with a
    /// blank reading its parent PF's. Never a made-up 0.
    pub fn effective_numa(&self, parent: Option<&Interface>) -> Option<u32> {
        self.numa.or_else(|| {
            if self.parent.is_some() {
                parent.and_then(|p| p.numa)
            } else {
                None
            }
        })
    }

    /// Where this endpoint sits, for distance questions (NUMA as in
    /// [`Self::effective_numa`]).
    pub fn coordinates(&self, parent: Option<&Interface>) -> Coordinates<'_> {
        Coordinates {
            address: self.pci_bus_id.as_deref(),
            bridges: self.topology.as_ref().map(|t| t.pci_switches.as_slice()),
            numa: self.effective_numa(parent),
        }
    }
}

/// PCI coordinates shared by NICs and accelerators, computed by one walk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Topology {
    /// The outermost PCI bridge above the device (not the root complex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_root_id: Option<String>,
    /// The PCIe host bridge the device hangs under, as sysfs names it
    /// (`pci0000:00`): the value DRA drivers publish as
    /// `resource.kubernetes.io/pcieRoot`, so a claim can pair devices on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_root: Option<String>,
    /// The full upstream bridge path, innermost first.
    pub pci_switches: Vec<String>,
    /// An accelerator's scale-up fabric, only where its manufacturer's rules
    /// establish it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<Fabric>,
}

/// An accelerator's place on a scale-up fabric (NVLink, XGMI, Ascend UB).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fabric {
    /// The interconnect: `nvlink`, `xgmi` or `ub`; part of every comparison.
    pub kind: String,
    /// The domain's identity, comparable across nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The domain's shape as a word (`server-8p`, `pod-1d`).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub shape: Option<String>,
    /// The partition inside the domain whose members can address one another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clique_id: Option<String>,
    /// How many members the domain reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_count: Option<u32>,
    /// This machine's index inside the domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_index: Option<u32>,
    /// This machine's rack inside the domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack_id: Option<u32>,
    /// This accelerator's own fabric addresses, unparsed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<String>,
}

/// The three link outcomes of the specification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LinkState {
    /// Some port is `ACTIVE` with physical state `LinkUp`.
    #[serde(rename = "OK")]
    Ok,
    /// The check ran and could not establish an answer.
    Unverified,
    /// Every port was read and none carries the link.
    Failed,
}

impl LinkState {
    /// The spelling used in the record, tables and annotations.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkState::Ok => "OK",
            LinkState::Unverified => "Unverified",
            LinkState::Failed => "Failed",
        }
    }
}

/// The link verdict for one RDMA device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkVerdict {
    /// The outcome.
    pub state: LinkState,
    /// Why, for `Unverified` and `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The ports as read, values verbatim (`4: ACTIVE`, `5: LinkUp`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortReading>,
    /// For `Failed`: when this failure was first seen (RFC 3339), stable while it persists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_seen: Option<String>,
}

impl LinkVerdict {
    /// The link layer every readable port agrees on; `None` when none could
    /// be read or the ports disagree (a dual-port HCA with one port of each).
    pub fn link_layer(&self) -> Option<&str> {
        let mut layers = self.ports.iter().filter_map(|p| p.link_layer.as_deref());
        let first = layers.next()?;
        layers.all(|l| l == first).then_some(first)
    }
}

/// One RDMA port's attributes, verbatim; `None` where unreadable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortReading {
    /// Port number (the directory name under `ports/`).
    pub port: String,
    /// `ports/N/state` as read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// `ports/N/phys_state` as read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phys_state: Option<String>,
    /// `ports/N/link_layer` as read (`InfiniBand`, `Ethernet`); not part of
    /// the verdict, so an unreadable one is simply absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_layer: Option<String>,
}

/// An accelerator maker, found by its PCI vendor ID and spelt in the record
/// and labels as its key (`nvidia`, `amd`, `ascend` …). The variants are in
/// the keys' alphabetical order, the order of the record's groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    /// 1002, AMD/ATI.
    Amd,
    /// 19e5, Huawei (Ascend NPUs).
    Ascend,
    /// cabc, Cambricon.
    Cambricon,
    /// 1e36, Enflame.
    Enflame,
    /// 1da3, Habana Labs (Intel Gaudi).
    Gaudi,
    /// 1e3e, Iluvatar CoreX.
    Iluvatar,
    /// 9999, MetaX.
    Metax,
    /// 1ed5, Moore Threads.
    Mthreads,
    /// 10de, NVIDIA.
    Nvidia,
}

impl Vendor {
    /// Every maker with its PCI vendor ID. IDs checked against `pci.ids`
    /// from Debian 12's `hwdata` (2023.04.10); cabc, 1e3e and 9999 are not in
    /// it and come from their own Linux drivers' ID tables.
    pub const PCI_IDS: [(u16, Vendor); 9] = [
        (0x10de, Vendor::Nvidia),
        (0x1002, Vendor::Amd),
        (0x1da3, Vendor::Gaudi),
        (0x19e5, Vendor::Ascend),
        (0xcabc, Vendor::Cambricon),
        (0x1e36, Vendor::Enflame),
        (0x1e3e, Vendor::Iluvatar),
        (0x9999, Vendor::Metax),
        (0x1ed5, Vendor::Mthreads),
    ];

    /// The maker of a PCI vendor ID, if it makes accelerators.
    pub fn from_pci_id(id: u32) -> Option<Vendor> {
        Self::PCI_IDS
            .iter()
            .find(|(v, _)| u32::from(*v) == id)
            .map(|(_, maker)| *maker)
    }

    /// The key in the record and labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Amd => "amd",
            Vendor::Ascend => "ascend",
            Vendor::Cambricon => "cambricon",
            Vendor::Enflame => "enflame",
            Vendor::Gaudi => "gaudi",
            Vendor::Iluvatar => "iluvatar",
            Vendor::Metax => "metax",
            Vendor::Mthreads => "mthreads",
            Vendor::Nvidia => "nvidia",
        }
    }
}

impl std::fmt::Display for Vendor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The accelerators of one manufacturer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AcceleratorGroup {
    /// The manufacturer.
    pub manufacturer: Vendor,
    /// Its accelerators, sorted by PCI address.
    pub accelerators: Vec<Accelerator>,
}

/// One accelerator found on the PCI bus.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Accelerator {
    /// Index within its manufacturer, in PCI address order.
    pub id: String,
    /// The manufacturer, as in the group.
    pub manufacturer: Vendor,
    /// PCI vendor:device, lowercase hex (`10de:2330`).
    pub pci_id: String,
    /// The PCI address.
    pub pci_bus_id: String,
    /// NUMA node; absent when the kernel gave none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// PCI coordinates from the same walk as the interfaces', and the fabric.
    pub topology: Topology,
    /// Why this accelerator has no fabric (or whose was kept), for preflight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric_note: Option<String>,
    /// Facts this pass could not read (its NUMA node), kept or unknown.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<UnreadableFact>,
}

impl Accelerator {
    /// Where this accelerator sits, for distance questions.
    pub fn coordinates(&self) -> Coordinates<'_> {
        Coordinates {
            address: Some(&self.pci_bus_id),
            bridges: Some(&self.topology.pci_switches),
            numa: self.numa,
        }
    }
}

impl NodeRecord {
    /// Every RDMA endpoint (interfaces and nested VFs), each with its parent
    /// when it is a VF, in record order.
    pub fn endpoints(&self) -> Vec<(&Interface, Option<&Interface>)> {
        let mut out = Vec::new();
        for iface in &self.spec.interfaces {
            out.push((iface, None));
            for vf in &iface.virtual_functions {
                out.push((vf, Some(iface)));
            }
        }
        out
    }

    /// Calls `f` on every endpoint (interfaces and their nested VFs), for the
    /// passes that fill in per-endpoint facts.
    pub fn for_each_endpoint_mut(&mut self, mut f: impl FnMut(&mut Interface)) {
        for iface in &mut self.spec.interfaces {
            f(iface);
            iface.virtual_functions.iter_mut().for_each(&mut f);
        }
    }

    /// All accelerators across groups.
    pub fn accelerators(&self) -> impl Iterator<Item = &Accelerator> {
        self.spec.groups.iter().flat_map(|g| g.accelerators.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(n: &str, layer: Option<&str>) -> PortReading {
        PortReading {
            port: n.into(),
            state: Some("4: ACTIVE".into()),
            phys_state: Some("5: LinkUp".into()),
            link_layer: layer.map(str::to_string),
        }
    }

    #[test]
    fn the_link_layer_is_the_one_every_readable_port_agrees_on() {
        let verdict = |ports| LinkVerdict {
            state: LinkState::Ok,
            reason: None,
            ports,
            first_seen: None,
        };
        let ib = verdict(vec![port("1", Some("InfiniBand")), port("2", None)]);
        assert_eq!(ib.link_layer(), Some("InfiniBand"));
        let mixed = verdict(vec![
            port("1", Some("InfiniBand")),
            port("2", Some("Ethernet")),
        ]);
        assert_eq!(mixed.link_layer(), None);
        assert_eq!(verdict(vec![port("1", None)]).link_layer(), None);
    }
}
