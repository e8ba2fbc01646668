//! The node-level reduction of a record to label values, and the one
//! sanitiser every label value passes through.
//!
//! Every label describes the whole node and drops detail on purpose; a
//! consumer needing per-interface truth reads the record.

use crate::pci::{self, Distance};
use crate::record::{Fabric, Interface, LinkState, NodeRecord};
use std::collections::{BTreeMap, BTreeSet};

/// The default label namespace (the key prefix before `/`).
pub const DEFAULT_NAMESPACE: &str = "feature.gpustack.ai";

/// Kubernetes' limit on a label value's length.
pub const MAX_VALUE_LEN: usize = 63;

/// The labels one pass publishes, by key without namespace (`rdma.capable`),
/// plus a line per withheld label saying why (for `preflight`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSet {
    /// Published key → value, sorted by key.
    pub values: BTreeMap<String, String>,
    /// Why each withheld label is absent.
    pub withheld: Vec<String>,
}

/// Why a label value cannot be published as-is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("label value {value:?} {why}")]
pub struct ValueError {
    /// The offending value.
    pub value: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// The FNV-1a 64-bit hash (the "FNV-64a" of the label conventions).
pub fn fnv64a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Makes a value publishable, or refuses it. Values over 63 characters become
/// `x` + 16 lowercase hex digits of their FNV-64a hash (identity is kept:
/// equal inputs give equal labels on every node). A value with a character
/// Kubernetes does not allow is refused rather than "cleaned", because dropping
/// a character changes its meaning (`{0,1}` would read as `01`).
pub fn sanitize_value(value: &str) -> Result<String, ValueError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if let Some(_bad) = value.chars().find(|c| !allowed(*c)) {
        return Err(ValueError {
            value: value.to_string(),
            why: "contains a character not allowed in a label value",
        });
    }
    if value.len() > MAX_VALUE_LEN {
        return Ok(format!("x{:016x}", fnv64a(value.as_bytes())));
    }
    let edge_ok = |c: Option<char>| c.is_none_or(|c| c.is_ascii_alphanumeric());
    if !edge_ok(value.chars().next()) || !edge_ok(value.chars().last()) {
        return Err(ValueError {
            value: value.to_string(),
            why: "must begin and end with a letter or digit",
        });
    }
    Ok(value.to_string())
}

/// True when an endpoint counts toward `rdma.capable`: its verdict is anything
/// but `Failed`, or with no verdict, an RDMA device is bound.
pub fn usable(iface: &Interface) -> bool {
    match &iface.link {
        Some(v) => v.state != LinkState::Failed,
        None => iface.rdma,
    }
}

/// Reduces the record to the `rdma.*` labels.
pub fn rdma_labels(record: &NodeRecord) -> LabelSet {
    let mut set = LabelSet::default();
    let usable_eps: Vec<(&Interface, Option<&Interface>)> = record
        .endpoints()
        .into_iter()
        .filter(|(ep, _)| usable(ep))
        .collect();
    if usable_eps.is_empty() {
        set.withheld.push(
            "rdma.capable: no usable RDMA endpoint (every endpoint Failed, or none bound)".into(),
        );
        set.withheld
            .push("rdma.distance: no usable RDMA endpoint to measure from".into());
        set.withheld
            .push("rdma.numa: no usable RDMA endpoint".into());
        return set;
    }
    set.values.insert("rdma.capable".into(), "true".into());

    // Each accelerator placed once, each endpoint once below.
    let accels: Vec<_> = record
        .accelerators()
        .map(|a| pci::Placed::new(a.coordinates()))
        .collect();
    if accels.is_empty() {
        set.withheld
            .push("rdma.distance: the node has no accelerator".into());
    } else {
        // One walk over the endpoints, each compared with the accelerators,
        // stopping at the first PIX: bus coordinates give nothing closer
        // (SELF and LINK never come from them), so the rest cannot change it.
        let mut closest: Option<Distance> = None;
        'endpoints: for (ep, parent) in &usable_eps {
            let at = pci::Placed::new(ep.coordinates(*parent));
            for a in &accels {
                let d = pci::between(a, &at);
                closest = Some(closest.map_or(d, |c| c.min(d)));
                if d == Distance::Pix {
                    break 'endpoints;
                }
            }
        }
        let closest = closest.unwrap_or(Distance::Unk);
        set.values
            .insert("rdma.distance".into(), closest.to_string());
    }

    let numas: BTreeSet<u32> = usable_eps
        .iter()
        .filter_map(|(ep, parent)| ep.effective_numa(*parent))
        .collect();
    if numas.is_empty() {
        set.withheld
            .push("rdma.numa: the kernel gave no NUMA node for any usable endpoint".into());
    } else {
        let joined = numas
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join("_");
        match sanitize_value(&joined) {
            Ok(v) => {
                set.values.insert("rdma.numa".into(), v);
            }
            Err(e) => set.withheld.push(format!("rdma.numa: {e}")),
        }
    }
    set
}

/// The domain value of one fabric: `<kind>-<id>` or `<kind>-<id>-<clique>`.
fn domain(f: &Fabric) -> Option<String> {
    let id = f.id.as_deref()?;
    Some(match &f.clique_id {
        Some(c) => format!("{}-{id}-{c}", f.kind),
        None => format!("{}-{id}", f.kind),
    })
}

/// Reduces the whole node to `fabric.domain` and `fabric.members`: each only
/// when every accelerator agrees (and, for members, on a nonzero count).
pub fn fabric_labels(record: &NodeRecord) -> LabelSet {
    let mut set = LabelSet::default();
    let accs: Vec<_> = record.accelerators().collect();
    if accs.is_empty() {
        set.withheld
            .push("fabric.domain: the node has no accelerator".into());
        set.withheld
            .push("fabric.members: the node has no accelerator".into());
        return set;
    }
    let domains: Vec<Option<String>> = accs
        .iter()
        .map(|a| a.topology.fabric.as_ref().and_then(domain))
        .collect();
    match domains.iter().position(Option::is_none) {
        Some(i) => set.withheld.push(format!(
            "fabric.domain: accelerator {} ({}) reports no domain",
            accs[i].pci_bus_id,
            accs[i].fabric_note.as_deref().unwrap_or("no fabric")
        )),
        None if domains.windows(2).any(|w| w[0] != w[1]) => {
            let mut distinct: Vec<&str> = domains.iter().flatten().map(String::as_str).collect();
            distinct.sort();
            distinct.dedup();
            set.withheld.push(format!(
                "fabric.domain: accelerators sit in different domains: {}",
                distinct.join(", ")
            ));
        }
        None => match sanitize_value(domains[0].as_deref().expect("all present")) {
            Ok(v) => {
                set.values.insert("fabric.domain".into(), v);
            }
            Err(e) => set.withheld.push(format!("fabric.domain: {e}")),
        },
    }
    let counts: Vec<Option<u32>> = accs
        .iter()
        .map(|a| a.topology.fabric.as_ref().and_then(|f| f.member_count))
        .collect();
    match counts[0] {
        Some(n) if n > 0 && counts.iter().all(|c| *c == Some(n)) => {
            set.values.insert("fabric.members".into(), n.to_string());
        }
        _ => set
            .withheld
            .push("fabric.members: accelerators do not all report one nonzero member count".into()),
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_reference_vectors() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv64a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv64a(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv64a(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn sanitiser_hashes_long_and_refuses_bad() {
        assert_eq!(sanitize_value("0_1").unwrap(), "0_1");
        assert!(sanitize_value("0,1").is_err());
        assert!(sanitize_value("{0,1}").is_err());
        assert!(sanitize_value("-a").is_err());
        let long = "a".repeat(64);
        let h = sanitize_value(&long).unwrap();
        assert_eq!(h.len(), 17);
        assert!(h.starts_with('x'));
        assert_eq!(sanitize_value(&"a".repeat(63)).unwrap().len(), 63);
    }
}
