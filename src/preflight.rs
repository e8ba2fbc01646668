//! The human-readable preflight report: one row per RDMA endpoint and the
//! labels the same pass would publish.

use crate::nfd;
use crate::pass::Pass;
use crate::table::Table;

/// Renders rows as left-aligned columns separated by two spaces.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    crate::table::layout(header, rows)
}

/// The whole report for one pass.
pub fn report(pass: &Pass, namespace: &str) -> String {
    let dash = || "-".to_string();
    let rows: Vec<Vec<String>> = pass
        .record
        .endpoints()
        .into_iter()
        .filter(|(ep, _)| ep.rdma || ep.link.is_some())
        .map(|(ep, parent)| {
            let numa = ep.effective_numa(parent);
            vec![
                ep.name.clone().unwrap_or_else(dash),
                parent.and_then(|p| p.name.clone()).unwrap_or_else(dash),
                ep.rdma_device.clone().unwrap_or_else(dash),
                ep.pci_bus_id.clone().unwrap_or_else(dash),
                numa.map_or_else(dash, |n| n.to_string()),
                ep.link
                    .as_ref()
                    .map_or_else(|| "none".to_string(), |l| l.state.as_str().to_string()),
                ep.link
                    .as_ref()
                    .and_then(|l| l.reason.clone())
                    .unwrap_or_else(dash),
            ]
        })
        .collect();
    let mut out = String::new();
    if rows.is_empty() {
        out.push_str("No RDMA endpoint found.\n");
    } else {
        let mut t = Table::new(&[
            "INTERFACE",
            "PF",
            "RDMA",
            "PCI",
            "NUMA",
            "VERDICT",
            "REASON",
        ]);
        rows.into_iter().for_each(|r| {
            t.row(r);
        });
        out.push_str(&t.notes_in(6).render());
    }
    let unreadable = unreadable_lines(pass);
    if !unreadable.is_empty() {
        out.push_str("\nFacts this pass could not read:\n");
        for l in unreadable {
            out.push_str(&format!("  {l}\n"));
        }
    }
    let accels: Vec<Vec<String>> = pass
        .record
        .accelerators()
        .map(|a| {
            let f = a.topology.fabric.as_ref();
            vec![
                a.manufacturer.to_string(),
                a.pci_bus_id.clone(),
                a.numa.map_or_else(dash, |n| n.to_string()),
                f.map_or_else(dash, |f| f.kind.clone()),
                f.and_then(|f| f.id.clone()).unwrap_or_else(dash),
                f.and_then(|f| f.clique_id.clone()).unwrap_or_else(dash),
                f.and_then(|f| f.member_count)
                    .map_or_else(dash, |n| n.to_string()),
                a.fabric_note.clone().unwrap_or_else(dash),
            ]
        })
        .collect();
    out.push_str(&format!("\nAccelerators: {}\n", accels.len()));
    if !accels.is_empty() {
        let mut t = Table::new(&[
            "MAKER", "PCI", "NUMA", "FABRIC", "DOMAIN", "CLIQUE", "MEMBERS", "NOTE",
        ]);
        accels.into_iter().for_each(|r| {
            t.row(r);
        });
        // Eight GPUs without a fabric answer share one long reason: said
        // once below the table, naming them.
        out.push_str(&t.named_by(1).notes_in(7).render());
    }
    out.push_str(&format!(
        "\nLabels that would be published ({namespace}):\n"
    ));
    let lines = nfd::label_lines(&pass.labels, namespace);
    if lines.is_empty() {
        out.push_str("  (none)\n");
    }
    for l in lines.lines() {
        out.push_str(&format!("  {l}\n"));
    }
    if !pass.labels.withheld.is_empty() {
        out.push_str("\nWithheld:\n");
        for w in &pass.labels.withheld {
            out.push_str(&format!("  {w}\n"));
        }
    }
    out
}

/// One line per unreadable fact, naming its endpoint or accelerator, so an
/// operator sees which values are this pass's answers and which are carried.
fn unreadable_lines(pass: &Pass) -> Vec<String> {
    let mut out = Vec::new();
    for (ep, _) in pass.record.endpoints() {
        let who = ep
            .name
            .clone()
            .or_else(|| ep.pci_bus_id.clone())
            .unwrap_or_else(|| "?".into());
        out.extend(
            ep.unreadable
                .iter()
                .map(|u| format!("{who}: {}", u.describe())),
        );
    }
    for a in pass.record.accelerators() {
        out.extend(
            a.unreadable
                .iter()
                .map(|u| format!("{} {}: {}", a.manufacturer, a.pci_bus_id, u.describe())),
        );
    }
    out
}
