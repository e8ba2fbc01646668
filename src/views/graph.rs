//! The PCIe tree as a Graphviz DOT graph: host bridges, the bridges and
//! switches below them, accelerators and NICs at the leaves, NICs filled by
//! rail and Failed links marked, so the picture `lstopo` gives answers
//! "why did NCCL pick that NIC" for any vendor. Rendering it to SVG is the
//! command line's (a crate only `nodefabric-full` links).

use super::topo::Matrix;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// Fill colours for rails, in rail order; distinct in print and for the
/// common colour blindnesses (Okabe–Ito), lightened so black text reads.
const RAIL_COLOURS: [&str; 8] = [
    "#f5c77e", "#9fd3f5", "#7fd6b9", "#f7f08a", "#8fb8e0", "#f0a673", "#e3b0cf", "#c8c8c8",
];

/// The node that stands for devices the kernel put on no host bridge.
const NO_HOST_BRIDGE: &str = "no host bridge";

/// DOT text of the matrix's tree; the same matrix gives the same bytes.
pub fn dot(m: &Matrix) -> String {
    let rails: BTreeSet<&str> = m
        .nics
        .iter()
        .flat_map(|n| n.rails.iter().map(String::as_str))
        .collect();
    let colour: BTreeMap<&str, &str> = rails
        .iter()
        .enumerate()
        .map(|(i, r)| (*r, RAIL_COLOURS[i % RAIL_COLOURS.len()]))
        .collect();
    let mut inner: BTreeSet<String> = BTreeSet::new();
    let mut edges: BTreeSet<(String, String)> = BTreeSet::new();
    let mut leaves: Vec<(String, String)> = Vec::new();
    // Each device's chain from its host bridge down: the edges of the tree.
    let mut chain = |root: Option<&String>, bridges: &[String], leaf: String| {
        let mut up = root.cloned().unwrap_or_else(|| NO_HOST_BRIDGE.into());
        inner.insert(up.clone());
        for b in bridges {
            inner.insert(b.clone());
            edges.insert((up.clone(), b.clone()));
            up = b.clone();
        }
        edges.insert((up, leaf));
    };
    for a in &m.accelerators {
        let id = a.pci_bus_id.clone();
        chain(a.pcie_root.as_ref(), &a.bridges, id.clone());
        let label = format!("{} {}", a.vendor, a.pci_bus_id);
        leaves.push((
            id,
            format!(
                "shape=box, style=\"filled,bold\", fillcolor=\"#ffffff\", label={}",
                quote(&label)
            ),
        ));
    }
    for n in &m.nics {
        let id = n.pci_bus_id.clone().unwrap_or_else(|| n.name.clone());
        chain(n.pcie_root.as_ref(), &n.bridges, id.clone());
        let mut label = n.name.clone();
        if let Some(nd) = &n.netdev {
            label.push_str(&format!("\\n{nd}"));
        }
        if let Some(p) = &n.pci_bus_id {
            label.push_str(&format!("\\n{p}"));
        }
        if !n.rails.is_empty() {
            label.push_str(&format!("\\n{}", n.rails.join(",")));
        }
        if n.virtual_functions > 0 {
            label.push_str(&format!("\\n+{} VFs", n.virtual_functions));
        }
        let failed = n.link == "Failed";
        if failed {
            label.push_str("\\nlink Failed");
        }
        let fill = n
            .rails
            .first()
            .and_then(|r| colour.get(r.as_str()))
            .copied()
            .unwrap_or("#ffffff");
        let border = if failed { ", color=\"#d62728\"" } else { "" };
        leaves.push((
            id,
            format!(
                "shape=ellipse, style=filled, fillcolor=\"{fill}\"{border}, label=\"{}\"",
                escape(&label)
            ),
        ));
    }
    let mut out = String::from(
        "digraph topo {\n  rankdir=TB;\n  node [fontname=\"monospace\", fontsize=10];\n",
    );
    for b in &inner {
        let (shape, what) = if b.starts_with("pci") || b == NO_HOST_BRIDGE {
            ("box", "host bridge")
        } else {
            ("box", "bridge")
        };
        let label = if b == NO_HOST_BRIDGE {
            b.clone()
        } else {
            format!("{what}\\n{b}")
        };
        let _ = writeln!(
            out,
            "  {} [shape={shape}, style=filled, fillcolor=\"#e8e8e8\", label=\"{}\"];",
            quote(b),
            escape(&label)
        );
    }
    for (id, attrs) in &leaves {
        let _ = writeln!(out, "  {} [{attrs}];", quote(id));
    }
    for (a, b) in &edges {
        let _ = writeln!(out, "  {} -> {};", quote(a), quote(b));
    }
    if !rails.is_empty() {
        // The legend: one filled node per rail, in rail order.
        for r in &rails {
            let _ = writeln!(
                out,
                "  {} [shape=box, style=filled, fillcolor=\"{}\", label={}];",
                quote(&format!("legend {r}")),
                colour[r],
                quote(&format!("rail {r}"))
            );
        }
    }
    out.push_str("}\n");
    out
}

/// `s` as a DOT quoted ID.
fn quote(s: &str) -> String {
    format!("\"{}\"", escape(s))
}

/// Quotes escaped for a DOT string; `\n` sequences made above are kept.
fn escape(s: &str) -> String {
    s.replace('"', "\\\"")
}
