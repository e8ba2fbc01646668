//! The `nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader`
//! parser (GPU identity), and the error both nvidia-smi parsers give (the
//! `topo -m` parser is in [`super::topo`]).
//!
//! Parsed strictly: a line that does not fit is an error naming the line,
//! never skipped, because a skipped GPU would silently change the record.

use crate::pci;

/// An nvidia-smi output that cannot be read, naming where once: the file or
/// command, and the 1-based line when one line is at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}{}: {reason}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
pub struct ParseError {
    /// The file the text came from, or the command that printed it.
    pub origin: String,
    /// The 1-based line; `None` when the text as a whole is at fault.
    pub line: Option<usize>,
    /// What is wrong.
    pub reason: String,
}

/// One GPU's stable identity from `--query-gpu`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuIdentity {
    /// nvidia-smi's index (`GPU<index>` in `topo -m`).
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// The PCI address, normalised (4-digit domain, lowercase).
    pub pci_bus_id: String,
}

/// Parses `index, uuid, pci.bus_id` lines; `origin` names the text in errors.
pub fn parse_query(text: &str, origin: &str) -> Result<Vec<GpuIdentity>, ParseError> {
    let err = |line: usize, reason: String| ParseError {
        origin: origin.to_string(),
        line: Some(line),
        reason,
    };
    let mut out: Vec<GpuIdentity> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [index, uuid, bus] = fields[..] else {
            return Err(err(
                n + 1,
                format!(
                    "expected 3 comma-separated fields, got {}: {line:?}",
                    fields.len()
                ),
            ));
        };
        let index: u32 = index
            .parse()
            .map_err(|_| err(n + 1, format!("index {index:?} is not a number")))?;
        if !uuid.starts_with("GPU-") {
            return Err(err(
                n + 1,
                format!("uuid {uuid:?} does not start with GPU-"),
            ));
        }
        let pci_bus_id = pci::normalize(bus)
            .ok_or_else(|| err(n + 1, format!("{bus:?} is not a PCI address")))?;
        if out.iter().any(|g| g.index == index) {
            return Err(err(n + 1, format!("GPU index {index} listed twice")));
        }
        out.push(GpuIdentity {
            index,
            uuid: uuid.to_string(),
            pci_bus_id,
        });
    }
    out.sort_by_key(|g| g.index);
    Ok(out)
}
