//! Discovery: the only part of the program that reads the host. It turns a
//! sysfs tree (and the previous record, for `firstSeen`) into a [`NodeRecord`],
//! and reads what the rail record is built from ([`rail_inputs`]).

pub mod accel;
pub mod keep;
pub mod net;
pub mod rail_inputs;
pub mod rdma;

use crate::pci;
use crate::publish::Previous;
use crate::record::{Fact, LinkState, NodeRecord, Spec, Topology, NODE_RECORD_VERSION};
use crate::sysfs::{SysError, SysRoot};
use tracing::debug;

/// Discovery could not enumerate the node: nothing may be published from it.
/// The sysfs error is in the message, not a `source`, so it prints once.
#[derive(Debug, thiserror::Error)]
#[error("enumeration failed: {0}")]
pub struct DiscoverError(pub SysError);

impl From<SysError> for DiscoverError {
    fn from(e: SysError) -> Self {
        DiscoverError(e)
    }
}

/// Reads the whole node record from `root`.
///
/// `previous` is the last record published (for `firstSeen`); `now` is the
/// RFC 3339 time stamped on failures first seen in this pass.
pub fn discover(
    root: &SysRoot,
    previous: &Previous,
    now: &str,
) -> Result<NodeRecord, DiscoverError> {
    // Link targets are presumed plain while the tree is read, each proved
    // by a read beneath it or checked at the end (see `sysfs::trust`); one
    // that is not plain (a damaged or hostile tree) has the tree read
    // again with every target checked as it is met.
    root.presume();
    let mut read = read_tree(root, previous);
    if !root.settle() {
        debug!("a link target presumed plain was not: reading the tree again, checking each");
        root.forget_resolutions();
        read = read_tree(root, previous);
    }
    let Tree {
        interfaces,
        groups,
        rdma_cm,
        verbs,
    } = read?;
    // The tree is read: its resolutions (~31 MB at 10,000 endpoints) are
    // dropped before the previous record (~17 MB) is parsed for kept facts
    // or failed links' `firstSeen`, so the two are never held together.
    root.forget_resolutions();
    let mut record = NodeRecord {
        version: NODE_RECORD_VERSION,
        spec: Spec {
            interfaces,
            groups,
            rdma_cm,
        },
    };
    // Before the verbs lookup, so a kept RDMA device name resolves to its
    // character device like a freshly read one.
    keep::keep_previous(&mut record, previous);
    resolve_verbs(&mut record, &verbs);
    if verbs.has_unreadable() {
        // A verbs device the index could not read is kept like any other fact.
        keep::keep_previous(&mut record, previous);
    }
    stamp_first_seen(&mut record, previous, now);
    Ok(record)
}

/// What [`discover`] reads from the tree, before the previous record fills
/// in what it could not.
struct Tree {
    interfaces: Vec<crate::record::Interface>,
    groups: Vec<crate::record::AcceleratorGroup>,
    rdma_cm: Option<crate::record::CharDevice>,
    verbs: rdma::VerbsIndex,
}

/// Reads the interfaces, the accelerators and the RDMA character devices.
fn read_tree(root: &SysRoot, previous: &Previous) -> Result<Tree, DiscoverError> {
    let net::Scan {
        interfaces,
        vf_parents,
    } = net::interfaces(root)?;
    let groups = accel::accelerators(root, previous, &vf_parents)?;
    Ok(Tree {
        interfaces,
        groups,
        rdma_cm: rdma::rdma_cm(root),
        verbs: rdma::VerbsIndex::read(root),
    })
}

/// Attaches each bound RDMA device's verbs character device, or the reason it
/// could not be found.
fn resolve_verbs(record: &mut NodeRecord, index: &rdma::VerbsIndex) {
    record.for_each_endpoint_mut(|iface| {
        if let Some(ibdev) = &iface.rdma_device {
            match index.lookup(ibdev) {
                Ok(dev) => iface.verbs = Some(dev),
                Err(why) => {
                    let why = why.to_string();
                    if index.has_unreadable() {
                        keep::note(iface, Fact::Verbs, why.clone());
                    }
                    iface.verbs_error = Some(why);
                }
            }
        }
    });
}

/// The NUMA node of a device folder: `Ok(None)` when the kernel declined to
/// answer (`-1`, or no `numa_node` at all), an error when the file could not
/// be read or holds no number: unreadable is not the kernel's blank.
pub(crate) fn numa_answer(root: &SysRoot, device: &str) -> Result<Option<u32>, keep::Unreadable> {
    Ok(numa_node(root, device)?.and_then(node_number))
}

/// The `numa_node` attribute of a device folder as the kernel printed it
/// (`-1` included): `Ok(None)` when there is no such attribute.
pub(crate) fn numa_node(root: &SysRoot, device: &str) -> Result<Option<i64>, keep::Unreadable> {
    keep::parsed_in::<i64>(root, device, "numa_node")
}

/// A printed `numa_node` as a node number: `-1` (the kernel's "no node") is none.
pub(crate) fn node_number(printed: i64) -> Option<u32> {
    u32::try_from(printed).ok()
}

/// The PCI coordinates of a device from its canonical path (the one walk).
pub(crate) fn device_topology(device: &str) -> Option<Topology> {
    let bridges = pci::upstream_bridges(device)?;
    Some(Topology {
        pci_root_id: bridges.last().cloned(),
        pcie_root: pci::host_bridge(device).map(str::to_string),
        pci_switches: bridges,
        fabric: None,
    })
}

/// Gives every `Failed` verdict a `firstSeen`: the previous record's when the
/// same endpoint was already failing, else `now`. Keyed by RDMA device and PCI
/// address, so an unchanged failure stamps the same time on every pass.
fn stamp_first_seen(record: &mut NodeRecord, previous: &Previous, now: &str) {
    let mut failing = false;
    record.for_each_endpoint_mut(|iface| {
        failing |= iface
            .link
            .as_ref()
            .is_some_and(|l| l.state == LinkState::Failed);
    });
    if !failing {
        return;
    }
    let seen = previous.failing_since();
    record.for_each_endpoint_mut(|iface| {
        if let Some(link) = iface.link.as_mut() {
            if link.state == LinkState::Failed {
                let key = (iface.rdma_device.clone(), iface.pci_bus_id.clone());
                link.first_seen = Some(seen.get(&key).cloned().unwrap_or_else(|| now.to_string()));
            }
        }
    });
}
