//! Parser for `nvidia-smi topo -m`: the GPU-to-device path matrix, its
//! affinity columns and its NIC Legend, as the tool prints it and as people
//! paste it.
//!
//! Accepted layouts:
//! - cells separated by TABs (what nvidia-smi prints), or by runs of
//!   whitespace when no TAB is on the header line (a copy from a terminal,
//!   an issue or a wiki). In the whitespace form the only multi-word cells
//!   are the affinity headers (`CPU Affinity`, `NUMA Affinity`,
//!   `GPU NUMA ID`), which are read as one cell each;
//! - NIC columns named `NICn` with a `NIC Legend` (current drivers), or named
//!   by the RDMA device itself (`mlx5_2`, older drivers), in any order;
//! - any of the affinity columns or none; list affinities (`0,3-9`), `N/A`,
//!   NIC rows without affinity cells, the extra empty cell nvidia-smi puts
//!   before `GPU NUMA ID`, a header without its leading empty cell;
//! - text before the header and after the matrix or legend (a shell prompt),
//!   terminal escapes, CRLF line ends, no final newline.
//!
//! Refused, with the 1-based line: a row whose cell count is not the
//! header's, a device cell that is not a path class, an affinity cell that
//! is not a list, a row whose `X` is not under its own column (cells
//! shifted), a device with no row or two rows, a legend entry that is not
//! `NICn: name`. Nothing is shifted, skipped or guessed: a misread cell would
//! silently map a GPU to the wrong NIC.

pub use super::nvsmi::ParseError;
use std::collections::BTreeMap;
use std::ops::RangeInclusive;

/// Why a `topo -m` dump is refused, kept typed until the error is
/// printed; each variant's text is what the error has always said (the
/// README and the tests quote it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopoFault {
    /// No line reads as a header naming a GPU column.
    #[error("no header row with GPU columns")]
    NoHeader,
    /// A blank or legend line ends the matrix before this device's row.
    #[error("the matrix ends here without a row for {0}")]
    MatrixEnds(String),
    /// The text ends before this device's row.
    #[error("the text ends after this line without a row for {0}")]
    TextEnds(String),
    /// A header cell after the affinity columns is not one of them.
    #[error("header cell {cell:?} after the affinity columns is not one of {names:?}", names = AFFINITY_COLUMNS)]
    AfterAffinity {
        /// The cell.
        cell: String,
    },
    /// A header cell is neither a device nor an affinity column.
    #[error("header cell {cell:?} is neither a device name nor one of {names:?}", names = AFFINITY_COLUMNS)]
    HeaderCell {
        /// The cell.
        cell: String,
    },
    /// The header names a device twice.
    #[error("header names {0} twice")]
    HeaderTwice(String),
    /// The header has no GPU column.
    #[error("no GPU column before the affinity columns")]
    NoGpuColumn,
    /// A row's label is not a device column.
    #[error("row {label:?} is not a device column of the header ({})", columns.join(" "))]
    UnknownRow {
        /// The row's first cell.
        label: String,
        /// The header's device columns.
        columns: Vec<String>,
    },
    /// A device has a second row.
    #[error("{0} has a second row")]
    SecondRow(String),
    /// A row has fewer cells than device columns.
    #[error("{label}: {found} cells, the header has {devices} device columns (a lost separator?)")]
    FewCells {
        /// The row's device.
        label: String,
        /// The cells after its label.
        found: usize,
        /// The header's device columns.
        devices: usize,
    },
    /// A row's affinity cells are neither all nor none.
    #[error("{label}: {found} cells, the header has {devices} device and {affinity} affinity columns (a lost or extra separator?)")]
    AffinityCells {
        /// The row's device.
        label: String,
        /// The non-empty cells after its label.
        found: usize,
        /// The header's device columns.
        devices: usize,
        /// The header's affinity columns.
        affinity: usize,
    },
    /// A device cell is empty.
    #[error("{label}: empty cell under {column}")]
    EmptyCell {
        /// The row's device.
        label: String,
        /// The column.
        column: String,
    },
    /// A device cell is not a path class.
    #[error("{label}: cell {cell:?} under {column} is not a path class")]
    NotAClass {
        /// The row's device.
        label: String,
        /// The cell.
        cell: String,
        /// The column.
        column: String,
    },
    /// The row's `X` is not under its own column (cells shifted).
    #[error("{label}: `X` must stand under {label} only, found {cell:?} under {column} (cells shifted?)")]
    Shifted {
        /// The row's device.
        label: String,
        /// The cell.
        cell: String,
        /// The column.
        column: String,
    },
    /// An affinity cell is neither a list nor `N/A`.
    #[error("{label}: {column} {cell:?} is neither a list like 0-15,32 nor N/A")]
    Affinity {
        /// The row's device.
        label: String,
        /// The affinity column.
        column: String,
        /// The cell.
        cell: String,
    },
    /// A legend line starting `NICn` is not `NICn: name`.
    #[error("NIC Legend entry {0:?} is not `NICn: name`")]
    LegendEntry(String),
    /// The legend names a NIC the matrix has no column for.
    #[error("NIC Legend names {0}, which is not a column of the matrix")]
    LegendUnknown(String),
    /// The legend gives one device name to two NICs.
    #[error("NIC Legend gives {name} to both {other} and {nic}")]
    LegendShared {
        /// The device name.
        name: String,
        /// The NIC it was given to first.
        other: String,
        /// The NIC it is given to again.
        nic: String,
    },
    /// The legend lists a NIC twice.
    #[error("NIC Legend lists {0} twice")]
    LegendTwice(String),
    /// A `NICn` column has no legend entry.
    #[error("column {0} is not in the NIC Legend")]
    NotInLegend(String),
    /// A device is named both by a column and by a legend entry.
    #[error("{0} is both a column and a NIC Legend name")]
    ColumnAndLegend(String),
}

/// The three affinity columns nvidia-smi prints after the device columns.
pub const AFFINITY_COLUMNS: [&str; 3] = ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"];

/// The matrix as read: device columns, one row per device, the legend.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Topo {
    /// The device columns in header order, as printed (`GPU0`, `NIC3`, `mlx5_0`).
    pub columns: Vec<String>,
    /// The affinity columns after them, in header order.
    pub affinity_columns: Vec<String>,
    /// Every device row, in text order.
    pub rows: Vec<Row>,
    /// `NICn` → RDMA device name, from the NIC Legend.
    pub legend: BTreeMap<String, String>,
    /// GPU index → (RDMA device name → path class as printed, e.g. `PIX`).
    pub gpu_to_nic: BTreeMap<u32, BTreeMap<String, String>>,
    /// GPU index → its `NUMA Affinity`, where the row gives a list.
    pub gpu_numa: BTreeMap<u32, NodeList>,
}

/// One device row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The 1-based line it was read from.
    pub line: usize,
    /// The device (`GPU0`, `NIC1`, `mlx5_0`).
    pub label: String,
    /// One cell per device column, trimmed (`X` on the diagonal).
    pub cells: Vec<String>,
    /// One cell per affinity column, or none (NIC rows).
    pub affinity: Vec<String>,
}

/// A kernel-style list of numbers (`0,3-9,11-17`), kept as ranges so a
/// hostile `0-4294967295` costs nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeList(Vec<RangeInclusive<u32>>);

impl NodeList {
    /// Parses `0`, `0-3`, `0,3-9,11`; `None` for anything else (`N/A` included).
    pub fn parse(s: &str) -> Option<NodeList> {
        let mut out = Vec::new();
        for part in s.split(',') {
            let (lo, hi) = part.split_once('-').unwrap_or((part, part));
            let (lo, hi) = (number(lo)?, number(hi)?);
            if lo > hi {
                return None;
            }
            out.push(lo..=hi);
        }
        Some(NodeList(out))
    }

    /// The list of one node (a GPU's `numa_node`).
    pub fn single(n: u32) -> NodeList {
        NodeList(vec![n..=n])
    }

    /// Whether `n` is in the list.
    pub fn contains(&self, n: u32) -> bool {
        self.0.iter().any(|r| r.contains(&n))
    }
}

/// A decimal number without sign or spaces.
fn number(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// How the cells of a line are separated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// nvidia-smi's own output: one TAB between cells, empty cells kept.
    Tabs,
    /// A pasted copy: runs of whitespace, empty cells lost.
    Spaces,
}

impl Layout {
    /// The trimmed cells of a line; in the whitespace layout empty cells
    /// cannot be seen, so none are returned.
    fn cells(self, line: &str) -> Vec<&str> {
        match self {
            Layout::Tabs => line.split('\t').map(str::trim).collect(),
            Layout::Spaces => line.split_whitespace().collect(),
        }
    }
}

/// Parses `nvidia-smi topo -m`; `origin` names the text in errors (a path,
/// or the command).
pub fn parse_topo(text: &str, origin: &str) -> Result<Topo, ParseError<TopoFault>> {
    let err = |line: Option<usize>, reason: TopoFault| ParseError {
        origin: origin.to_string(),
        line,
        reason,
    };
    let text = strip_ansi(text);
    let lines: Vec<&str> = text.lines().collect();
    let Header {
        at: header_at,
        layout,
        columns:
            Columns {
                devices: columns,
                affinity: affinity_columns,
            },
    } = find_header(&lines).map_err(|found| match found {
        Some((n, reason)) => err(Some(n + 1), reason),
        None => err(None, TopoFault::NoHeader),
    })?;
    let mut topo = Topo {
        columns,
        affinity_columns,
        ..Topo::default()
    };

    // The matrix: one row per device column, ending at a blank line, at the
    // legend, or as soon as every device has its row (a prompt may follow).
    let mut end = lines.len();
    for (n, line) in lines.iter().enumerate().skip(header_at + 1) {
        if topo.rows.len() == topo.columns.len()
            || line.trim().is_empty()
            || line.trim_start().starts_with("Legend:")
        {
            end = n;
            break;
        }
        let row = row(layout, line, n + 1, &topo).map_err(|r| err(Some(n + 1), r))?;
        topo.rows.push(row);
    }
    if let Some(missing) = topo
        .columns
        .iter()
        .find(|c| !topo.rows.iter().any(|r| &r.label == *c))
    {
        // Point at the blank or legend line that ended the matrix, or at the
        // last line when the text itself ends (a paste cut short).
        return Err(if end < lines.len() {
            err(Some(end + 1), TopoFault::MatrixEnds(missing.clone()))
        } else {
            err(Some(end), TopoFault::TextEnds(missing.clone()))
        });
    }
    topo.legend = legend(&lines[end..], end, &topo.columns).map_err(|(line, r)| err(line, r))?;
    reduce(&mut topo).map_err(|r| err(None, r))?;
    Ok(topo)
}

/// The header: a line that names a GPU column, holds no `X` (every matrix
/// row has its `X`) and reads as a header. The first one followed by a row of
/// one of its devices wins, so that text before the dump that happens to name
/// a GPU (`GPU0 NVIDIA H100`) is passed over; else the first one that reads
/// (its damaged first row is then refused on its own line); else the first
/// candidate's fault, if any. Returns the line, its layout and its columns.
fn find_header(lines: &[&str]) -> Result<Header, Option<(usize, TopoFault)>> {
    let mut fallback = None;
    let mut first_fault = None;
    for (n, line) in lines.iter().enumerate() {
        let layout = if line.contains('\t') {
            Layout::Tabs
        } else {
            Layout::Spaces
        };
        let cells = layout.cells(line);
        if !cells.iter().any(|c| device_index(c, "GPU").is_some()) || cells.contains(&"X") {
            continue;
        }
        match header(layout, line) {
            Ok(columns) => {
                let next = lines
                    .get(n + 1)
                    .map(|l| layout.cells(l))
                    .unwrap_or_default();
                let is_row = next
                    .first()
                    .is_some_and(|label| columns.devices.iter().any(|c| c == label));
                if is_row && next.contains(&"X") {
                    return Ok(Header {
                        at: n,
                        layout,
                        columns,
                    });
                }
                fallback.get_or_insert(Header {
                    at: n,
                    layout,
                    columns,
                });
            }
            Err(reason) => {
                first_fault.get_or_insert((n, reason));
            }
        }
    }
    fallback.ok_or(first_fault)
}

/// A header's device columns and affinity columns, in order.
struct Columns {
    /// The device columns (`GPU0`, `NIC3`, `mlx5_0`).
    devices: Vec<String>,
    /// The affinity columns after them.
    affinity: Vec<String>,
}

/// The header line found: where, how its cells are separated, its columns.
struct Header {
    /// The 0-based index of the header line.
    at: usize,
    /// How its cells (and the rows') are separated.
    layout: Layout,
    /// What it names.
    columns: Columns,
}

/// The device columns and affinity columns of the header line.
fn header(layout: Layout, line: &str) -> Result<Columns, TopoFault> {
    let mut cells: Vec<String> = match layout {
        Layout::Tabs => {
            let mut cells = layout.cells(line);
            // The corner cell is empty; a paste may have lost it.
            if cells.first() == Some(&"") {
                cells.remove(0);
            }
            while cells.last() == Some(&"") {
                cells.pop();
            }
            cells.into_iter().map(str::to_string).collect()
        }
        Layout::Spaces => merge_affinity_words(&layout.cells(line)),
    };
    let first_affinity = cells
        .iter()
        .position(|c| AFFINITY_COLUMNS.contains(&c.as_str()))
        .unwrap_or(cells.len());
    let affinity = cells.split_off(first_affinity);
    if let Some(bad) = affinity
        .iter()
        .find(|c| !AFFINITY_COLUMNS.contains(&c.as_str()))
    {
        return Err(TopoFault::AfterAffinity { cell: bad.clone() });
    }
    for (i, c) in cells.iter().enumerate() {
        if !is_device_name(c) {
            return Err(TopoFault::HeaderCell { cell: c.clone() });
        }
        if cells[..i].contains(c) {
            return Err(TopoFault::HeaderTwice(c.clone()));
        }
    }
    if !cells.iter().any(|c| device_index(c, "GPU").is_some()) {
        return Err(TopoFault::NoGpuColumn);
    }
    Ok(Columns {
        devices: cells,
        affinity,
    })
}

/// Whitespace-separated header words with the affinity headers joined back.
fn merge_affinity_words(words: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    'words: while i < words.len() {
        for name in AFFINITY_COLUMNS {
            let parts: Vec<&str> = name.split(' ').collect();
            if words[i..].starts_with(&parts) {
                out.push(name.to_string());
                i += parts.len();
                continue 'words;
            }
        }
        out.push(words[i].to_string());
        i += 1;
    }
    out
}

/// One matrix row, checked against the header.
fn row(layout: Layout, line: &str, line_no: usize, topo: &Topo) -> Result<Row, TopoFault> {
    let cells = layout.cells(line);
    let label = cells[0];
    if !topo.columns.iter().any(|c| c == label) {
        return Err(TopoFault::UnknownRow {
            label: label.to_string(),
            columns: topo.columns.clone(),
        });
    }
    if topo.rows.iter().any(|r| r.label == label) {
        return Err(TopoFault::SecondRow(label.to_string()));
    }
    let (d, a) = (topo.columns.len(), topo.affinity_columns.len());
    let rest = &cells[1..];
    if rest.len() < d {
        return Err(TopoFault::FewCells {
            label: label.to_string(),
            found: rest.len(),
            devices: d,
        });
    }
    let (devices, tail) = rest.split_at(d);
    // Tabs keep empty cells: NIC rows end in them, GPU rows carry one before
    // GPU NUMA ID. Whitespace loses them. Either way what is left must be
    // every affinity cell or none.
    let affinity: Vec<&str> = tail.iter().copied().filter(|c| !c.is_empty()).collect();
    if !affinity.is_empty() && affinity.len() != a {
        return Err(TopoFault::AffinityCells {
            label: label.to_string(),
            found: rest.iter().filter(|c| !c.is_empty()).count(),
            devices: d,
            affinity: a,
        });
    }
    for (col, cell) in topo.columns.iter().zip(devices) {
        if cell.is_empty() {
            return Err(TopoFault::EmptyCell {
                label: label.to_string(),
                column: col.clone(),
            });
        }
        if !is_class(cell) {
            return Err(TopoFault::NotAClass {
                label: label.to_string(),
                cell: cell.to_string(),
                column: col.clone(),
            });
        }
        if (*cell == "X") != (col == label) {
            return Err(TopoFault::Shifted {
                label: label.to_string(),
                cell: cell.to_string(),
                column: col.clone(),
            });
        }
    }
    for (col, cell) in topo.affinity_columns.iter().zip(&affinity) {
        if *cell != "N/A" && NodeList::parse(cell).is_none() {
            return Err(TopoFault::Affinity {
                label: label.to_string(),
                column: col.clone(),
                cell: cell.to_string(),
            });
        }
    }
    Ok(Row {
        line: line_no,
        label: label.to_string(),
        cells: devices.iter().map(|c| c.to_string()).collect(),
        affinity: affinity.iter().map(|c| c.to_string()).collect(),
    })
}

/// The NIC Legend after the matrix: `NICn: name` lines after a `NIC Legend:`
/// line. A line starting with `NIC<digits>` is an entry and must be
/// well-formed; any other line after an entry ends the legend (a prompt).
fn legend(
    lines: &[&str],
    offset: usize,
    columns: &[String],
) -> Result<BTreeMap<String, String>, (Option<usize>, TopoFault)> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let start = lines.iter().position(|l| l.trim() == "NIC Legend:");
    if let Some(start) = start {
        for (i, l) in lines.iter().enumerate().skip(start + 1) {
            let line_no = Some(offset + i + 1);
            let l = l.trim();
            let word = l.split([':', ' ', '\t']).next().unwrap_or("");
            if device_index(word, "NIC").is_none() {
                if l.is_empty() || out.is_empty() {
                    continue;
                }
                break;
            }
            let entry = l
                .split_once(':')
                .map(|(nic, name)| (nic.trim(), name.trim()));
            let Some((nic, name)) =
                entry.filter(|(nic, name)| *nic == word && is_device_name(name))
            else {
                return Err((line_no, TopoFault::LegendEntry(l.to_string())));
            };
            if !columns.iter().any(|c| c == nic) {
                return Err((line_no, TopoFault::LegendUnknown(nic.to_string())));
            }
            if let Some(other) = out.iter().find_map(|(k, v)| (v == name).then_some(k)) {
                return Err((
                    line_no,
                    TopoFault::LegendShared {
                        name: name.to_string(),
                        other: other.clone(),
                        nic: nic.to_string(),
                    },
                ));
            }
            if out.insert(nic.to_string(), name.to_string()).is_some() {
                return Err((line_no, TopoFault::LegendTwice(nic.to_string())));
            }
        }
    }
    if let Some(c) = columns
        .iter()
        .find(|c| device_index(c, "NIC").is_some() && !out.contains_key(*c))
    {
        return Err((None, TopoFault::NotInLegend(c.clone())));
    }
    Ok(out)
}

/// Fills the GPU views from the rows.
fn reduce(topo: &mut Topo) -> Result<(), TopoFault> {
    let numa_col = topo
        .affinity_columns
        .iter()
        .position(|c| c == "NUMA Affinity");
    for row in &topo.rows {
        let Some(index) = device_index(&row.label, "GPU") else {
            continue;
        };
        let mut paths = BTreeMap::new();
        for (col, cell) in topo.columns.iter().zip(&row.cells) {
            if device_index(col, "GPU").is_some() {
                continue;
            }
            let name = topo.legend.get(col).unwrap_or(col);
            if paths.insert(name.clone(), cell.clone()).is_some() {
                return Err(TopoFault::ColumnAndLegend(name.clone()));
            }
        }
        topo.gpu_to_nic.insert(index, paths);
        if let Some(list) = numa_col
            .and_then(|i| row.affinity.get(i))
            .and_then(|c| NodeList::parse(c))
        {
            topo.gpu_numa.insert(index, list);
        }
    }
    Ok(())
}

/// `GPU3` → 3 for prefix `GPU`: the index that ties a column to nvidia-smi's
/// GPU numbering (and `NICn` to its legend entry).
fn device_index(cell: &str, prefix: &str) -> Option<u32> {
    number(cell.strip_prefix(prefix)?)
}

/// A device column name: a letter, then letters, digits, `_`, `-` or `.`
/// (`GPU0`, `NIC1`, `mlx5_0`, `roceP2p1s0f0`, `bnxt_re0`).
fn is_device_name(s: &str) -> bool {
    let mut b = s.bytes();
    b.next().is_some_and(|c| c.is_ascii_alphabetic())
        && b.all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'))
}

/// A path class as printed: `X`, `PIX`, `NV18`, `SOC`… (letters, then
/// letters or digits). Affinity values (`0-15`, `N/A`) are not.
fn is_class(s: &str) -> bool {
    let mut b = s.bytes();
    b.next().is_some_and(|c| c.is_ascii_uppercase())
        && b.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

/// Drops terminal escapes (bold and underlined headers on a tty).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, then a final byte in @..~
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn nics(t: &Topo, gpu: u32) -> BTreeSet<&str> {
        t.gpu_to_nic[&gpu].keys().map(String::as_str).collect()
    }

    const TABS: &str = "\tGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n\
GPU0\t X \tNV18\tPIX\tSYS\t0-7\t0\t\tN/A\n\
GPU1\tNV18\t X \tSYS\tPIX\t8-15\t1\t\tN/A\n\
NIC0\tPIX\tSYS\t X \tSYS\t\t\t\t\n\
NIC1\tSYS\tPIX\tSYS\t X \t\t\t\t\n\
\n\
Legend:\n\n  X    = Self\n\n\
NIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n\n";

    #[test]
    fn tabs_with_the_empty_cell_before_gpu_numa_id() {
        let t = parse_topo(TABS, "t").unwrap();
        assert_eq!(t.columns, ["GPU0", "GPU1", "NIC0", "NIC1"]);
        assert_eq!(t.gpu_to_nic[&1]["mlx5_1"], "PIX");
        assert_eq!(nics(&t, 0), BTreeSet::from(["mlx5_0", "mlx5_1"]));
        assert!(t.gpu_numa[&1].contains(1) && !t.gpu_numa[&1].contains(0));
        assert!(t.rows.iter().all(|r| r.cells.len() == 4));
    }

    #[test]
    fn lost_tab_in_a_gpu_row_is_refused_not_shifted() {
        let broken = TABS.replacen("PIX\tSYS\t0-7", "PIXSYS\t0-7", 1);
        let e = parse_topo(&broken, "f.txt").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.to_string().starts_with("f.txt line 2: GPU0"), "{e}");
    }

    #[test]
    fn each_refusal_names_its_line_and_reason_as_the_readme_shows() {
        let cases = [
            (
                TABS.replacen("SYS\t0-7", "0-7\tSYS", 1),
                2,
                "GPU0: cell \"0-7\" under NIC1 is not a path class",
            ),
            (
                TABS.replacen("\tPIX\tSYS\t0-7", "\t\tSYS\t0-7", 1),
                2,
                "GPU0: empty cell under NIC0",
            ),
            (
                TABS.replacen("NV18\t X ", "NV18\tNV18", 1),
                3,
                "GPU1: `X` must stand under GPU1 only, found \"NV18\" under GPU1 (cells shifted?)",
            ),
            (
                TABS.replacen("\t0\t\tN/A", "\tzero\t\tN/A", 1),
                2,
                "GPU0: NUMA Affinity \"zero\" is neither a list like 0-15,32 nor N/A",
            ),
            (
                TABS.replacen("NIC1\tSYS", "NIC0\tSYS", 1),
                5,
                "NIC0 has a second row",
            ),
            (
                TABS.replacen("NIC1\tSYS\tPIX\tSYS\t X \t\t\t\t\n", "", 1),
                5,
                "the matrix ends here without a row for NIC1",
            ),
            (
                TABS.replacen("\nGPU1\t", "\nGPU9\t", 1),
                3,
                "row \"GPU9\" is not a device column of the header (GPU0 GPU1 NIC0 NIC1)",
            ),
            (
                TABS.replacen("  NIC1: mlx5_1", "  NIC1: mlx5_0", 1),
                14,
                "NIC Legend gives mlx5_0 to both NIC0 and NIC1",
            ),
            (
                TABS.replacen("  NIC1: mlx5_1", "  NIC7: mlx5_7", 1),
                14,
                "NIC Legend names NIC7, which is not a column of the matrix",
            ),
            (
                TABS.replacen("\tGPU NUMA ID", "\tGPU NUMA ID\tPower", 1),
                1,
                "header cell \"Power\" after the affinity columns is not one of",
            ),
            (
                TABS.replacen("\tNIC1\t", "\tNIC0\t", 1),
                1,
                "header names NIC0 twice",
            ),
        ];
        for (text, line, reason) in cases {
            let e = parse_topo(&text, "topo.txt").unwrap_err();
            assert!(
                e.to_string()
                    .starts_with(&format!("topo.txt line {line}: {reason}")),
                "{e}"
            );
        }
    }

    #[test]
    fn text_before_the_dump_that_names_a_gpu_is_passed_over() {
        let preamble = "GPU0 NVIDIA H100 80GB HBM3\nGPU0 NVIDIA H100\n";
        let t = parse_topo(&format!("{preamble}{TABS}"), "t").unwrap();
        assert_eq!(t.gpu_to_nic, parse_topo(TABS, "t").unwrap().gpu_to_nic);
        assert_eq!(t.rows[0].line, 4, "lines are counted in the whole text");
        // A damaged first row does not hide the header: the row is refused.
        let e = parse_topo(&TABS.replacen("GPU0\t X ", "GPU0 X ", 1), "t").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        // With no dump after it, the first line that reads as a header is
        // taken, and its missing rows are the fault.
        let e = parse_topo(preamble, "t").unwrap_err();
        assert_eq!(
            e.to_string(),
            "t line 2: the text ends after this line without a row for GPU0"
        );
        // Nothing that reads as a header: the first candidate's fault.
        let e = parse_topo("GPU0 NVIDIA H100 80GB HBM3\n", "t").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("t line 1: header cell \"80GB\" is neither a device name"),
            "{e}"
        );
    }

    #[test]
    fn node_lists_are_ranges_and_refuse_junk() {
        let l = NodeList::parse("0,3-9,11-4294967295").unwrap();
        assert!(l.contains(5) && l.contains(4_000_000_000) && !l.contains(10));
        for bad in ["", "N/A", "3-1", "1,", "-1", " 1", "1-2-3"] {
            assert!(NodeList::parse(bad).is_none(), "{bad:?}");
        }
    }
}
