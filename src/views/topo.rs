//! The `nvidia-smi topo -m` question for every accelerator vendor: how far
//! each accelerator sits from each RDMA NIC on the PCIe tree, by the same
//! walk the `rdma.distance` label uses ([`crate::pci::between`]), with each
//! NIC's NUMA node, link verdict and rails.

use super::natural_key;
use crate::pci::{self, Distance};
use crate::rails::RailRecord;
use crate::record::{Interface, NodeRecord};
use crate::table::Table;
use serde::Serialize;
use std::collections::BTreeMap;

/// The whole matrix: accelerator rows, NIC columns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Matrix {
    /// One per accelerator, sorted by PCI address.
    pub accelerators: Vec<Row>,
    /// One per RDMA NIC (a PF and its VFs are one), in column order.
    pub nics: Vec<Nic>,
}

/// One accelerator and its path class to every NIC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// The accelerator's PCI address: its name in the matrix.
    pub pci_bus_id: String,
    /// Its manufacturer (`nvidia`, `amd` …).
    pub vendor: String,
    /// Its NUMA node, where the kernel gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// The PCIe host bridge it hangs under (`pci0000:00`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pcie_root: Option<String>,
    /// Upstream bridges, outermost first: its place in the tree.
    pub bridges: Vec<String>,
    /// NIC name → path class (`PIX` … `SYS`, `UNK` where a coordinate is missing).
    pub paths: BTreeMap<String, Distance>,
}

/// One RDMA NIC: a column of the matrix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Nic {
    /// The column's name: the RDMA device, else the netdev, else the PCI address.
    pub name: String,
    /// The netdev, where there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub netdev: Option<String>,
    /// The PCI address, for a PCI device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// The NUMA node, where the kernel gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// The link verdict (`OK`, `Unverified`, `Failed`); `none` when no RDMA
    /// device is bound to the PF itself.
    pub link: String,
    /// SR-IOV VFs configured on it, folded into this column.
    pub virtual_functions: usize,
    /// The rails the rail record puts it on; empty without a record.
    pub rails: Vec<String>,
    /// The PCIe host bridge it hangs under.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pcie_root: Option<String>,
    /// Upstream bridges, outermost first.
    pub bridges: Vec<String>,
}

/// A whole interface that is an RDMA endpoint itself or carries VFs that are.
fn is_rdma_nic(iface: &Interface) -> bool {
    let own = |i: &Interface| i.rdma || i.link.is_some();
    own(iface) || iface.virtual_functions.iter().any(own)
}

/// Builds the matrix from the record, with rails from `rails` where given.
pub fn matrix(record: &NodeRecord, rails: Option<&RailRecord>) -> Matrix {
    let mut picked: Vec<&Interface> = record
        .spec
        .interfaces
        .iter()
        .filter(|i| is_rdma_nic(i))
        .collect();
    let name_of = |i: &Interface| {
        i.rdma_device
            .clone()
            .or_else(|| i.name.clone())
            .or_else(|| i.pci_bus_id.clone())
            .unwrap_or_else(|| "?".into())
    };
    picked.sort_by_key(|i| natural_key(&name_of(i)));
    let outermost_first = |t: Option<&crate::record::Topology>| {
        t.map(|t| t.pci_switches.iter().rev().cloned().collect())
            .unwrap_or_default()
    };
    let nics: Vec<Nic> = picked
        .iter()
        .map(|i| Nic {
            name: name_of(i),
            netdev: i.name.clone(),
            pci_bus_id: i.pci_bus_id.clone(),
            numa: i.numa,
            link: i
                .link
                .as_ref()
                .map_or_else(|| "none".into(), |l| l.state.as_str().into()),
            virtual_functions: i.virtual_functions.len(),
            rails: i
                .pci_bus_id
                .as_ref()
                .and_then(|p| rails?.nics.get(p).cloned())
                .unwrap_or_default(),
            pcie_root: i.topology.as_ref().and_then(|t| t.pcie_root.clone()),
            bridges: outermost_first(i.topology.as_deref()),
        })
        .collect();
    let placed: Vec<pci::Placed> = picked
        .iter()
        .map(|i| pci::Placed::new(i.coordinates(None)))
        .collect();
    let mut accelerators: Vec<Row> = record
        .accelerators()
        .map(|a| {
            let at = pci::Placed::new(a.coordinates());
            Row {
                pci_bus_id: a.pci_bus_id.clone(),
                vendor: a.manufacturer.as_str().into(),
                numa: a.numa,
                pcie_root: a.topology.pcie_root.clone(),
                bridges: outermost_first(Some(&a.topology)),
                paths: nics
                    .iter()
                    .zip(&placed)
                    .map(|(n, p)| (n.name.clone(), pci::between(&at, p)))
                    .collect(),
            }
        })
        .collect();
    accelerators.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
    Matrix { accelerators, nics }
}

/// What each class means, printed under the table as nvidia-smi does.
const LEGEND: &str = "PIX: at most one PCIe switch between; PXB: several switches, no host bridge; PHB/NODE: across host bridges on one NUMA node; SYS: across NUMA nodes; UNK: a coordinate is missing";

/// The matrix as people read it: the class grid, then one row per NIC.
pub fn table(m: &Matrix) -> String {
    if m.nics.is_empty() && m.accelerators.is_empty() {
        return "No accelerator and no RDMA NIC found.\n".into();
    }
    let mut header = vec!["ACCELERATOR".to_string(), "MAKER".into(), "NUMA".into()];
    header.extend(m.nics.iter().map(|n| n.name.clone()));
    let mut grid = Table::new(&header);
    for a in &m.accelerators {
        let mut row = vec![a.pci_bus_id.clone(), a.vendor.clone(), or_dash(a.numa)];
        row.extend(m.nics.iter().map(|n| a.paths[&n.name].to_string()));
        grid.row(row);
    }
    let mut out = if m.accelerators.is_empty() {
        "No accelerator found.\n".to_string()
    } else {
        grid.render()
    };
    let mut nics = Table::new(&["NIC", "NETDEV", "PCI", "NUMA", "LINK", "VFS", "RAIL"]);
    for n in &m.nics {
        nics.row(vec![
            n.name.clone(),
            n.netdev.clone().unwrap_or_else(|| "-".into()),
            n.pci_bus_id.clone().unwrap_or_else(|| "-".into()),
            or_dash(n.numa),
            n.link.clone(),
            n.virtual_functions.to_string(),
            if n.rails.is_empty() {
                "-".into()
            } else {
                n.rails.join(",")
            },
        ]);
    }
    out.push('\n');
    if nics.is_empty() {
        out.push_str("No RDMA NIC found.\n");
    } else {
        out.push_str(&nics.render());
    }
    out.push_str(&format!("\n{LEGEND}\n"));
    out
}

fn or_dash(n: Option<u32>) -> String {
    n.map_or_else(|| "-".into(), |n| n.to_string())
}
