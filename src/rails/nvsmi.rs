//! Parsers for the two `nvidia-smi` outputs the rail mapping reads:
//! `--query-gpu=index,uuid,pci.bus_id --format=csv,noheader` (GPU identity)
//! and `topo -m` (the GPU-to-device path matrix and its NIC legend).
//!
//! Both are parsed strictly: a line that does not fit is an error naming the
//! line, never skipped, because a skipped row would silently change which NIC
//! a GPU is mapped to.

use crate::pci;
use std::collections::BTreeMap;

/// A parse failure, with the 1-based line it happened on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} line {line}: {reason}")]
pub struct ParseError {
    /// Which output was being parsed.
    pub what: &'static str,
    /// The 1-based line number (0: the output as a whole).
    pub line: usize,
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

/// Parses `index, uuid, pci.bus_id` lines.
pub fn parse_query(text: &str) -> Result<Vec<GpuIdentity>, ParseError> {
    let err = |line, reason: String| ParseError { what: "nvidia-smi --query-gpu", line, reason };
    let mut out: Vec<GpuIdentity> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [index, uuid, bus] = fields[..] else {
            return Err(err(n + 1, format!("expected 3 comma-separated fields, got {}: {line:?}", fields.len())));
        };
        let index: u32 = index.parse().map_err(|_| err(n + 1, format!("index {index:?} is not a number")))?;
        if !uuid.starts_with("GPU-") {
            return Err(err(n + 1, format!("uuid {uuid:?} does not start with GPU-")));
        }
        let pci_bus_id = pci::normalize(bus).ok_or_else(|| err(n + 1, format!("{bus:?} is not a PCI address")))?;
        if out.iter().any(|g| g.index == index) {
            return Err(err(n + 1, format!("GPU index {index} listed twice")));
        }
        out.push(GpuIdentity { index, uuid: uuid.to_string(), pci_bus_id });
    }
    out.sort_by_key(|g| g.index);
    Ok(out)
}

/// The `topo -m` matrix, reduced to what the rail mapping needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Topo {
    /// GPU index → (NIC device name → path class as printed, e.g. `PIX`).
    pub gpu_to_nic: BTreeMap<u32, BTreeMap<String, String>>,
}

/// Columns after the device columns; they hold affinities, not paths.
const AFFINITY_COLUMNS: [&str; 3] = ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"];

/// Parses `nvidia-smi topo -m`. NIC columns are named `NICn` with a trailing
/// "NIC Legend" mapping them to RDMA device names (current drivers), or by the
/// device name itself (older drivers); either way the result is keyed by the
/// RDMA device name (`mlx5_0`).
pub fn parse_topo(text: &str) -> Result<Topo, ParseError> {
    let err = |line, reason: String| ParseError { what: "nvidia-smi topo -m", line, reason };
    // Drop terminal escapes (bold/underline headers when run on a tty).
    let text = strip_ansi(text);
    let lines: Vec<&str> = text.lines().collect();
    let (header_no, header) = lines
        .iter()
        .enumerate()
        .find(|(_, l)| l.split('\t').any(|c| is_device(c.trim(), "GPU")))
        .ok_or_else(|| err(0, "no header row with GPU columns".into()))?;
    let cells: Vec<&str> = header.split('\t').map(str::trim).collect();
    if !cells[0].is_empty() {
        return Err(err(header_no + 1, format!("the header must start with an empty cell, found {:?}", cells[0])));
    }
    let mut columns: Vec<&str> = Vec::new();
    for c in &cells[1..] {
        if c.is_empty() || AFFINITY_COLUMNS.contains(c) {
            break;
        }
        columns.push(c);
    }
    if !columns.iter().any(|c| is_device(c, "GPU")) {
        return Err(err(header_no + 1, "no GPU column".into()));
    }
    let legend = parse_legend(&lines)?;
    let nic_name = |col: &str| -> Result<String, ParseError> {
        if is_device(col, "NIC") {
            legend.get(col).cloned().ok_or_else(|| err(0, format!("column {col} is not in the NIC Legend")))
        } else {
            Ok(col.to_string())
        }
    };
    let mut topo = Topo::default();
    for (n, line) in lines.iter().enumerate().skip(header_no + 1) {
        let row: Vec<&str> = line.split('\t').map(str::trim).collect();
        let Some(label) = row.first() else { continue };
        // The matrix ends at the first blank line or at the legend.
        if *label == "Legend:" || row.iter().all(|c| c.is_empty()) {
            break;
        }
        if label.is_empty() {
            return Err(err(n + 1, "a row without a device name".into()));
        }
        if row.len() < columns.len() + 1 {
            return Err(err(n + 1, format!("{label}: {} cells, the header has {} device columns", row.len() - 1, columns.len())));
        }
        let Some(index) = device_index(label, "GPU") else {
            continue; // NIC rows repeat the NIC columns' information
        };
        let mut paths = BTreeMap::new();
        for (col, cell) in columns.iter().zip(&row[1..]) {
            if cell.is_empty() {
                return Err(err(n + 1, format!("{label}: empty cell under {col}")));
            }
            if !is_device(col, "GPU") {
                paths.insert(nic_name(col)?, cell.to_string());
            }
        }
        if topo.gpu_to_nic.insert(index, paths).is_some() {
            return Err(err(n + 1, format!("{label} listed twice")));
        }
    }
    if topo.gpu_to_nic.is_empty() {
        return Err(err(0, "no GPU rows".into()));
    }
    Ok(topo)
}

/// `NIC0: mlx5_0` lines after a `NIC Legend:` line.
fn parse_legend(lines: &[&str]) -> Result<BTreeMap<String, String>, ParseError> {
    let mut legend = BTreeMap::new();
    let Some(start) = lines.iter().position(|l| l.trim() == "NIC Legend:") else {
        return Ok(legend);
    };
    for (n, l) in lines.iter().enumerate().skip(start + 1) {
        let l = l.trim();
        if l.is_empty() {
            continue;
        }
        let entry = l.split_once(':').map(|(nic, name)| (nic.trim(), name.trim()));
        let Some((nic, name)) = entry.filter(|(nic, name)| is_device(nic, "NIC") && !name.is_empty()) else {
            return Err(ParseError { what: "nvidia-smi topo -m", line: n + 1, reason: format!("NIC Legend entry {l:?} is not `NICn: name`") });
        };
        legend.insert(nic.to_string(), name.to_string());
    }
    Ok(legend)
}

fn device_index(cell: &str, prefix: &str) -> Option<u32> {
    let digits = cell.strip_prefix(prefix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn is_device(cell: &str, prefix: &str) -> bool {
    device_index(cell, prefix).is_some()
}

fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ params final-byte(@..~)
            if chars.next() == Some('[') {
                for d in chars.by_ref() {
                    if ('@'..='~').contains(&d) {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
