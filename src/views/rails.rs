//! The rail record as a table: one row per GPU, one column per rail, each
//! cell the chosen NICs and their path class, so "which NIC does GPU 3 use
//! on rail 5" is one look instead of a page of JSON.

use super::natural_key;
use crate::rails::RailRecord;
use crate::record::NodeRecord;
use crate::table::Table;
use std::collections::{BTreeMap, BTreeSet};

/// PCI address → the name people know a NIC by (its RDMA device, else its
/// netdev), from the node record the rail record was built from.
pub fn nic_names(record: &NodeRecord) -> BTreeMap<String, String> {
    record
        .endpoints()
        .into_iter()
        .filter_map(|(i, _)| {
            let name = i.rdma_device.clone().or_else(|| i.name.clone())?;
            Some((i.pci_bus_id.clone()?, name))
        })
        .collect()
}

/// The table: GPU rows, rail columns, `NIC CLASS` cells; a NIC whose link
/// is down is marked `(down)`; NUMA-local picks among several are listed
/// below the table.
pub fn table(record: &RailRecord, names: &BTreeMap<String, String>) -> String {
    let mut rails: Vec<&String> = record
        .gpus
        .iter()
        .flat_map(|g| g.rails.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    rails.sort_by_key(|r| natural_key(r));
    if rails.is_empty() {
        return format!(
            "No rail found ({} source): no port matched the rail rule.\n",
            record.rail_source
        );
    }
    let name = |pci: &String| names.get(pci).unwrap_or(pci).clone();
    let mut header = vec!["GPU".to_string(), "SOURCE".into()];
    header.extend(rails.iter().map(|r| r.to_string()));
    let mut t = Table::new(&header);
    let mut local = Vec::new();
    for g in &record.gpus {
        let mut row = vec![
            g.pci_bus_id.clone(),
            match g.source {
                crate::rails::GpuSource::NvidiaSmi => "nvidia-smi".into(),
                crate::rails::GpuSource::Sysfs => "sysfs".into(),
            },
        ];
        for r in &rails {
            row.push(match g.rails.get(*r) {
                None => "-".into(),
                Some(c) => {
                    let nics: Vec<String> = c
                        .nics
                        .iter()
                        .map(|n| {
                            let mut s = name(n);
                            if c.down.contains(n) {
                                s.push_str("(down)");
                            }
                            s
                        })
                        .collect();
                    if !c.numa_local.is_empty() {
                        let l: Vec<String> = c.numa_local.iter().map(name).collect();
                        local.push(format!("{} {r}: {}", g.pci_bus_id, l.join(",")));
                    }
                    format!("{} {}", nics.join(","), c.path_class)
                }
            });
        }
        t.row(row);
    }
    let mut out = t.render();
    if !local.is_empty() {
        out.push_str("\nNUMA-local among the tied NICs:\n");
        for l in local {
            out.push_str(&format!("  {l}\n"));
        }
    }
    let unused: Vec<String> = record
        .nics
        .iter()
        .filter(|(pci, _)| {
            !record
                .gpus
                .iter()
                .any(|g| g.rails.values().any(|c| c.nics.contains(pci)))
        })
        .map(|(pci, r)| format!("{} ({})", name(pci), r.join(",")))
        .collect();
    if !unused.is_empty() {
        out.push_str(&format!(
            "\nRail NICs no GPU picks: {}\n",
            unused.join(", ")
        ));
    }
    out
}
