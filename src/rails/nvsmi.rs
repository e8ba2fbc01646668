//! The `nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader`
//! parser (GPU identity), and the error both nvidia-smi parsers give (the
//! `topo -m` parser is in [`super::topo`]).
//!
//! Parsed strictly: a line that does not fit is an error naming the line,
//! never skipped, because a skipped GPU would silently change the record.

use crate::pci;

/// An nvidia-smi output that cannot be read, naming where once: the file or
/// command, and the 1-based line when one line is at fault. `R` is the
/// parser's own reason ([`QueryFault`] here, [`super::topo::TopoFault`]
/// for `topo -m`), kept typed until the error is printed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}{}: {reason}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
pub struct ParseError<R = QueryFault> {
    /// The file the text came from, or the command that printed it.
    pub origin: String,
    /// The 1-based line; `None` when the text as a whole is at fault.
    pub line: Option<usize>,
    /// What is wrong.
    pub reason: R,
}

/// Why a `--query-gpu` line is refused; the text is what the error has
/// always said.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryFault {
    /// The line does not hold exactly `index, uuid, pci.bus_id`.
    #[error("expected 3 comma-separated fields, got {found}: {line:?}")]
    Fields {
        /// How many fields it held.
        found: usize,
        /// The line, trimmed.
        line: String,
    },
    /// The index field is not a number.
    #[error("index {0:?} is not a number")]
    Index(String),
    /// The uuid field is not a GPU UUID.
    #[error("uuid {0:?} does not start with GPU-")]
    Uuid(String),
    /// The bus id field is not a PCI address.
    #[error("{0:?} is not a PCI address")]
    PciAddress(String),
    /// Two lines give the same index.
    #[error("GPU index {0} listed twice")]
    Twice(u32),
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
    let err = |line: usize, reason: QueryFault| ParseError {
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
                QueryFault::Fields {
                    found: fields.len(),
                    line: line.to_string(),
                },
            ));
        };
        let index: u32 = index
            .parse()
            .map_err(|_| err(n + 1, QueryFault::Index(index.to_string())))?;
        if !uuid.starts_with("GPU-") {
            return Err(err(n + 1, QueryFault::Uuid(uuid.to_string())));
        }
        let pci_bus_id = pci::normalize(bus)
            .ok_or_else(|| err(n + 1, QueryFault::PciAddress(bus.to_string())))?;
        if out.iter().any(|g| g.index == index) {
            return Err(err(n + 1, QueryFault::Twice(index)));
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
