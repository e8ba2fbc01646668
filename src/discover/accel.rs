//! Accelerators, found on the PCI bus by vendor ([`Vendor::PCI_IDS`]) and class.

use super::net::VfParents;
use super::{device_topology, numa_answer};
use crate::publish::Previous;
use crate::record::{Accelerator, AcceleratorGroup, Fact, UnreadableFact, Vendor};
use crate::sysfs::{basename, join, parse_hex, with_joined, BuildPathHash, SysError, SysRoot};
use std::collections::{BTreeMap, HashMap};
use tracing::{debug, warn};

/// True for the PCI classes an accelerator presents: display controllers
/// (0x03xx: VGA, 3D, other) and processing accelerators (0x12xx). This keeps
/// out the same vendors' audio functions, NICs (Huawei) and NVSwitch bridges.
fn is_accelerator_class(class: u32) -> bool {
    matches!(class >> 16, 0x03 | 0x12)
}

/// Scans `bus/pci/devices`. A tree without a PCI bus has no accelerators; a
/// bus folder that exists but cannot be listed is an enumeration failure. A
/// device whose vendor or class cannot be read is kept as the previous record
/// had it (if it was an accelerator there), so no accelerator, and no label
/// derived from it, disappears on a failed read.
///
/// `vf_parents` names VFs known as such from the `class/net` walk, with
/// their PF: the kernel gives a VF its PF's vendor ID, so a VF whose PF
/// answered with another maker's ID is no accelerator and nothing of it is
/// read (on a NIC node with SR-IOV, most PCI functions are such VFs).
pub fn accelerators(
    root: &SysRoot,
    previous: &Previous,
    vf_parents: &VfParents,
) -> Result<Vec<AcceleratorGroup>, SysError> {
    let kept = |addr: &str, why: String| {
        let prev = previous
            .get()?
            .accelerators()
            .find(|a| a.pci_bus_id == addr)?;
        let mut acc = prev.clone();
        acc.unreadable = vec![UnreadableFact {
            fact: Fact::Accelerator,
            reason: why,
            kept: true,
        }];
        Some(acc)
    };
    let entries = match root.list("bus/pci/devices") {
        Ok(e) => e,
        Err(e) if e.is_not_found() => {
            debug!("no bus/pci/devices: no PCI bus, no accelerators");
            return Ok(vec![]);
        }
        Err(e) => return Err(e),
    };
    let mut by_vendor: BTreeMap<Vendor, Vec<Accelerator>> = BTreeMap::new();
    // Every other function first, so that each known VF's PF has answered
    // by the time the VF comes (the kernel's order would do, as a VF's
    // address follows its PF's, but nothing here leans on it).
    let (vfs, others): (Vec<String>, Vec<String>) = entries
        .into_iter()
        .partition(|e| vf_parents.contains_key(e));
    let mut vendors: HashMap<String, u32, BuildPathHash> = HashMap::default();
    for entry in others.into_iter().chain(vfs) {
        let pf_vendor = vf_parents.get(&entry).and_then(|pf| vendors.get(pf));
        if pf_vendor.is_some_and(|v| Vendor::from_pci_id(*v).is_none()) {
            continue;
        }
        let dev = match with_joined("bus/pci/devices", &entry, |rel| root.resolve(rel)) {
            Ok(d) => d,
            Err(e) => {
                warn!("skipping PCI device {entry}: {e}");
                continue;
            }
        };
        // Read in the function's folder, the target of its `bus/pci` link:
        // the read proves it where the tree presumed it.
        let hex = |attr: &str| {
            let v = root
                .read_trimmed_proving(&dev, attr)
                .map_err(|e| e.to_string())?;
            parse_hex(&v).ok_or_else(|| format!("{}: {v:?} is not a hex number", join(&dev, attr)))
        };
        // The vendor first: a device of any other maker is answered by it,
        // so its class is not read (most PCI functions on a GPU node are
        // NIC functions, VFs above all).
        let read = hex("vendor").and_then(|v| {
            vendors.insert(entry.clone(), v);
            match Vendor::from_pci_id(v) {
                None => Ok(None),
                Some(maker) => hex("class").map(|c| Some((v, maker, c))),
            }
        });
        let (vendor, maker, class) = match read {
            Ok(Some(read)) => read,
            Ok(None) => continue,
            Err(why) => {
                if let Some(acc) = kept(basename(&dev), why) {
                    warn!("PCI device {entry} unreadable, keeping the previous record's accelerator: {}", acc.unreadable[0].reason);
                    by_vendor.entry(acc.manufacturer).or_default().push(acc);
                }
                continue;
            }
        };
        if !is_accelerator_class(class) {
            continue;
        }
        let device_id = root
            .read_trimmed(&join(&dev, "device"))
            .ok()
            .and_then(|v| parse_hex(&v))
            .unwrap_or(0);
        let pci_bus_id = basename(&dev).to_string();
        let (numa, unreadable) = match numa_answer(root, &dev) {
            Ok(n) => (n, vec![]),
            Err(why) => {
                let prev = previous
                    .get()
                    .and_then(|p| p.accelerators().find(|a| a.pci_bus_id == pci_bus_id));
                (
                    prev.and_then(|a| a.numa),
                    vec![UnreadableFact {
                        fact: Fact::Numa,
                        reason: why.to_string(),
                        kept: prev.is_some(),
                    }],
                )
            }
        };
        by_vendor.entry(maker).or_default().push(Accelerator {
            id: String::new(),
            manufacturer: maker,
            pci_id: format!("{vendor:04x}:{device_id:04x}"),
            pci_bus_id,
            numa,
            topology: device_topology(&dev).unwrap_or_default(),
            fabric_note: None,
            unreadable,
        });
    }
    Ok(by_vendor
        .into_iter()
        .map(|(maker, mut accs)| {
            accs.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
            for (i, a) in accs.iter_mut().enumerate() {
                a.id = i.to_string();
            }
            AcceleratorGroup {
                manufacturer: maker,
                accelerators: accs,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert!(is_accelerator_class(0x030200));
        assert!(is_accelerator_class(0x120000));
        assert!(!is_accelerator_class(0x040300));
        assert!(!is_accelerator_class(0x068000));
        assert!(!is_accelerator_class(0x020000));
    }
}
