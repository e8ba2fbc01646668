//! Selection: for every GPU and every rail, every NIC tied at the closest
//! path class, `PIX < PXB < PHB < NODE < SYS`.

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

/// The ranked classes; anything else (`X`, `NV#`, `SOC`, `UNK`) is unknown.
fn rank(class: &str) -> Option<Distance> {
    Some(match class {
        "PIX" => Distance::Pix,
        "PXB" => Distance::Pxb,
        "PHB" => Distance::Phb,
        "NODE" => Distance::Node,
        "SYS" => Distance::Sys,
        _ => return None,
    })
}

/// Chooses, for every GPU and rail, the NICs tied at the closest class.
/// NICs a GPU has paths to but that are on no rail are ignored.
pub fn select(nic_rails: &BTreeMap<String, BTreeSet<String>>, gpus: &[GpuPaths]) -> Result<Vec<GpuRails>, SelectError> {
    let mut by_rail: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (nic, rails) in nic_rails {
        for r in rails {
            by_rail.entry(r).or_default().push(nic);
        }
    }
    let mut out = Vec::new();
    for gpu in gpus {
        let mut rails = BTreeMap::new();
        for (rail, nics) in &by_rail {
            let mut best: Option<(Distance, Vec<String>)> = None;
            for nic in nics {
                let Some(class) = gpu.paths.get(*nic) else { continue };
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
            let (path_class, mut nics_chosen) = best.ok_or_else(|| SelectError::NoQualifiedNic {
                rail: rail.to_string(),
                gpu: gpu.pci_bus_id.clone(),
                nics: nics.join(","),
                view: gpu.source,
            })?;
            nics_chosen.sort();
            rails.insert(rail.to_string(), RailChoice { path_class, nics: nics_chosen });
        }
        out.push(GpuRails { pci_bus_id: gpu.pci_bus_id.clone(), uuid: gpu.uuid.clone(), source: gpu.source, rails });
    }
    out.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
    Ok(out)
}
