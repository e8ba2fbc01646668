//! The cluster's rails, one row per node (`kubectl nodefabric rails`): its
//! rails, NICs per rail, the worst path class any GPU has to its rail, the
//! NICs whose link is down, and whether the record still belongs to the
//! Node of that name. Pure: the records and Nodes come from
//! [`crate::cluster::rails_view`].

use crate::pci::Distance;
use crate::rails::RailRecord;
use crate::table::Table;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// One stored rail record, as the cluster holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    /// The node it is for (the ConfigMap key, the NodeRailRecord's name).
    pub node: String,
    /// Where it is kept: `ConfigMap NS/NAME` or `NodeRailRecord`.
    pub form: String,
    /// The record, or why it does not parse.
    pub record: Result<RailRecord, String>,
    /// The Node UID its owner reference names (NodeRailRecords only).
    pub owner_uid: Option<String>,
}

/// One node's row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRails {
    /// The node's name.
    pub node: String,
    /// Where its record is kept; `none` for a Node without a record.
    pub form: String,
    /// GPUs in the record.
    pub gpus: usize,
    /// Rail ID → how many NICs are on it.
    pub rails: BTreeMap<String, usize>,
    /// The farthest class any GPU's chosen NICs are at; absent without GPUs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst_path_class: Option<Distance>,
    /// The chosen NICs whose link is down (PCI addresses, sorted).
    pub failed_links: Vec<String>,
    /// The Node UID the record names (empty when it names none).
    #[serde(rename = "nodeUID")]
    pub node_uid: String,
    /// `current`, `stale` (the Node of that name has another UID), `node
    /// gone`, `no record`, `no node UID`, or `unreadable: …`.
    pub status: String,
}

/// The rows: every record, and every Node without one, sorted by node name
/// (a node with records in both forms has a row for each).
pub fn rows(stored: &[StoredRecord], nodes: &BTreeMap<String, String>) -> Vec<NodeRails> {
    let mut out: Vec<NodeRails> = stored.iter().map(|s| row(s, nodes)).collect();
    let recorded: BTreeSet<&str> = stored.iter().map(|s| s.node.as_str()).collect();
    out.extend(
        nodes
            .keys()
            .filter(|n| !recorded.contains(n.as_str()))
            .map(|n| NodeRails {
                node: n.clone(),
                form: "none".into(),
                gpus: 0,
                rails: BTreeMap::new(),
                worst_path_class: None,
                failed_links: Vec::new(),
                node_uid: String::new(),
                status: "no record".into(),
            }),
    );
    out.sort_by(|a, b| (&a.node, &a.form).cmp(&(&b.node, &b.form)));
    out
}

fn row(s: &StoredRecord, nodes: &BTreeMap<String, String>) -> NodeRails {
    let mut r = NodeRails {
        node: s.node.clone(),
        form: s.form.clone(),
        gpus: 0,
        rails: BTreeMap::new(),
        worst_path_class: None,
        failed_links: Vec::new(),
        node_uid: String::new(),
        status: String::new(),
    };
    let record = match &s.record {
        Ok(record) => record,
        Err(why) => {
            r.status = format!("unreadable: {why}");
            return r;
        }
    };
    r.gpus = record.gpus.len();
    for rails in record.nics.values() {
        for rail in rails {
            *r.rails.entry(rail.clone()).or_default() += 1;
        }
    }
    let mut failed = BTreeSet::new();
    for choice in record.gpus.iter().flat_map(|g| g.rails.values()) {
        r.worst_path_class = r.worst_path_class.max(Some(choice.path_class));
        failed.extend(choice.down.iter().cloned());
    }
    r.failed_links = failed.into_iter().collect();
    r.node_uid = if record.node_uid.is_empty() {
        s.owner_uid.clone().unwrap_or_default()
    } else {
        record.node_uid.clone()
    };
    r.status = match nodes.get(&s.node) {
        None => "node gone".into(),
        Some(_) if r.node_uid.is_empty() => "no node UID".into(),
        Some(uid) if *uid == r.node_uid => "current".into(),
        Some(uid) => format!("stale: the Node now has UID {uid}"),
    };
    r
}

/// The rows as a table.
pub fn table(rows: &[NodeRails]) -> String {
    if rows.is_empty() {
        return "No Node and no rail record.\n".into();
    }
    let mut t = Table::new(&[
        "NODE",
        "FORM",
        "GPUS",
        "RAILS",
        "NICS/RAIL",
        "WORST",
        "FAILED",
        "RECORD",
    ]);
    for r in rows {
        let counts: BTreeSet<usize> = r.rails.values().copied().collect();
        let per_rail = match counts.len() {
            0 => "-".to_string(),
            1 => counts.first().unwrap().to_string(),
            _ => r
                .rails
                .iter()
                .map(|(rail, n)| format!("{rail}={n}"))
                .collect::<Vec<_>>()
                .join(","),
        };
        t.row(vec![
            r.node.clone(),
            r.form.clone(),
            r.gpus.to_string(),
            r.rails.len().to_string(),
            per_rail,
            r.worst_path_class
                .map_or_else(|| "-".into(), |d| d.to_string()),
            if r.failed_links.is_empty() {
                "-".into()
            } else {
                r.failed_links.join(",")
            },
            r.status.clone(),
        ]);
    }
    t.notes_in(7).render()
}
