//! Selection: for every GPU and every rail, every NIC tied at the closest
//! path class, `PIX < PXB < PHB < NODE < SYS` (the seed's rule), then two
//! narrowings that never change the class: a down NIC gives way to an up NIC
//! tied with it, and where the tied NICs span NUMA nodes the GPU's local ones
//! are named as `numaLocal`.

use super::topo::NodeList;
use super::{GpuRails, GpuSource, RailChoice};
use crate::pci::Distance;
use std::collections::{BTreeMap, BTreeSet};

/// One GPU's paths to NICs, keyed by the NIC's normalised PCI address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuPaths {
    /// The GPU's normalised PCI address.
    pub pci_bus_id: String,
    /// The GPU UUID where the source knows it.
    pub uuid: Option<String>,
    /// Where the path classes came from.
    pub source: GpuSource,
    /// NIC PCI address → path class as the source spelled it.
    pub paths: BTreeMap<String, String>,
    /// The GPU's NUMA node(s): topo -m's NUMA Affinity, else its `numa_node`.
    pub numa: Option<NodeList>,
}

/// One rail port's NIC, as the rail source found it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RailNic {
    /// The rails it is on.
    pub rails: BTreeSet<String>,
    /// Its NUMA node, where the kernel gave one.
    pub numa: Option<u32>,
    /// True when its RDMA link verdict is `Failed` (no port `ACTIVE`/`LinkUp`).
    pub down: bool,
}

/// Why no selection could be made; each names the rail and the GPU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// A rail NIC's path class is not one of the five ranked classes.
    #[error("rail {rail}: GPU {gpu}: path class {class:?} to NIC {nic} is not one of PIX, PXB, PHB, NODE, SYS")]
    UnknownClass {
        /// The rail.
        rail: String,
        /// The GPU's PCI address.
        gpu: String,
        /// The NIC's PCI address.
        nic: String,
        /// The class as given.
        class: String,
    },
    /// None of the rail's NICs has a path class from this GPU.
    #[error("rail {rail}: GPU {gpu}: no qualified NIC (the rail's NICs {nics} have no path from it in the {view} view)")]
    NoQualifiedNic {
        /// The rail.
        rail: String,
        /// The GPU's PCI address.
        gpu: String,
        /// The rail's NICs, comma-joined.
        nics: String,
        /// The GPU source consulted.
        view: GpuSource,
    },
}

/// The ranked classes; anything else (`X`, `NV#`, `UNK`) is unknown. `SOC`
/// is what drivers before NODE existed printed for a path across the socket
/// interconnect: today's `SYS`.
fn rank(class: &str) -> Option<Distance> {
    Some(match class {
        "PIX" => Distance::Pix,
        "PXB" => Distance::Pxb,
        "PHB" => Distance::Phb,
        "NODE" => Distance::Node,
        "SYS" | "SOC" => Distance::Sys,
        _ => return None,
    })
}

/// Chooses, for every GPU and rail, the NICs tied at the closest class.
/// NICs a GPU has paths to but that are on no rail are ignored.
pub fn select(
    nic_rails: &BTreeMap<String, RailNic>,
    gpus: &[GpuPaths],
) -> Result<Vec<GpuRails>, SelectError> {
    let mut by_rail: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (nic, info) in nic_rails {
        for r in &info.rails {
            by_rail.entry(r).or_default().push(nic);
        }
    }
    let mut out = Vec::new();
    for gpu in gpus {
        let mut rails = BTreeMap::new();
        for (rail, nics) in &by_rail {
            let mut best: Option<(Distance, Vec<String>)> = None;
            for nic in nics {
                let Some(class) = gpu.paths.get(*nic) else {
                    continue;
                };
                let d = rank(class).ok_or_else(|| SelectError::UnknownClass {
                    rail: rail.to_string(),
                    gpu: gpu.pci_bus_id.clone(),
                    nic: nic.to_string(),
                    class: class.clone(),
                })?;
                match &mut best {
                    Some((b, list)) if *b == d => list.push(nic.to_string()),
                    Some((b, _)) if *b < d => {}
                    _ => best = Some((d, vec![nic.to_string()])),
                }
            }
            let (path_class, tied) = best.ok_or_else(|| SelectError::NoQualifiedNic {
                rail: rail.to_string(),
                gpu: gpu.pci_bus_id.clone(),
                nics: nics.join(","),
                view: gpu.source,
            })?;
            rails.insert(
                rail.to_string(),
                narrow(path_class, tied, nic_rails, gpu.numa.as_ref()),
            );
        }
        out.push(GpuRails {
            pci_bus_id: gpu.pci_bus_id.clone(),
            uuid: gpu.uuid.clone(),
            source: gpu.source,
            rails,
        });
    }
    out.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
    Ok(out)
}

/// The choice among the NICs `tied` at `path_class`: up NICs before down
/// ones, and the NUMA-local subset when only some are local.
fn narrow(
    path_class: Distance,
    mut tied: Vec<String>,
    nic_rails: &BTreeMap<String, RailNic>,
    gpu_numa: Option<&NodeList>,
) -> RailChoice {
    tied.sort();
    let is_down = |nic: &String| nic_rails.get(nic).is_some_and(|n| n.down);
    let (down, up): (Vec<String>, Vec<String>) = tied.into_iter().partition(is_down);
    let nics = if up.is_empty() { down.clone() } else { up };
    let local: Vec<String> = match gpu_numa {
        Some(list) => nics
            .iter()
            .filter(|n| {
                nic_rails
                    .get(*n)
                    .and_then(|i| i.numa)
                    .is_some_and(|m| list.contains(m))
            })
            .cloned()
            .collect(),
        None => Vec::new(),
    };
    // Only a strict, non-empty subset says anything a consumer can use.
    let numa_local = if local.len() < nics.len() {
        local
    } else {
        Vec::new()
    };
    RailChoice {
        path_class,
        nics,
        numa_local,
        down,
    }
}
