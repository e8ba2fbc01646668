//! Plain-text tables for people: aligned columns, and a long note that
//! several rows share printed once below the table, naming those rows, so
//! the rows stay one line each and a reader sees the cause once.

/// A table before it is laid out.
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    /// The column whose cell names its row in a note (the first by default).
    name_column: usize,
    /// The columns whose cells may be folded into a note below.
    note_columns: Vec<usize>,
}

/// Cells at most this long stay in their row even when shared: a short word
/// (`-`, `Active`) says as much in place as a reference would.
const FOLD_ABOVE: usize = 16;

impl Table {
    /// A table with these column headings.
    pub fn new<S: AsRef<str>>(header: &[S]) -> Table {
        Table {
            header: header.iter().map(|h| h.as_ref().to_string()).collect(),
            ..Table::default()
        }
    }

    /// Adds one row; cells beyond the header are ignored, missing ones blank.
    pub fn row(&mut self, cells: Vec<String>) -> &mut Table {
        self.rows.push(cells);
        self
    }

    /// Marks `column` as holding notes: a long one that two or more rows
    /// share becomes `[n]` in those rows and is printed once below.
    pub fn notes_in(&mut self, column: usize) -> &mut Table {
        self.note_columns.push(column);
        self
    }

    /// Names rows in notes by `column`'s cell instead of the first column's.
    pub fn named_by(&mut self, column: usize) -> &mut Table {
        self.name_column = column;
        self
    }

    /// True when the table has no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The laid-out text: the header, the rows, then the shared notes.
    pub fn render(&self) -> String {
        let mut rows = self.rows.clone();
        let mut notes: Vec<(String, Vec<String>)> = Vec::new();
        for &col in &self.note_columns {
            // Notes numbered in the order their first row appears, so the
            // output is the same for the same rows.
            let mut order: Vec<&str> = Vec::new();
            for row in &self.rows {
                if let Some(cell) = row.get(col) {
                    if cell.chars().count() > FOLD_ABOVE && !order.contains(&cell.as_str()) {
                        order.push(cell);
                    }
                }
            }
            for text in order {
                let holders: Vec<usize> = (0..self.rows.len())
                    .filter(|&i| self.rows[i].get(col).map(String::as_str) == Some(text))
                    .collect();
                if holders.len() < 2 {
                    continue;
                }
                let mark = format!("[{}]", notes.len() + 1);
                let names = holders
                    .iter()
                    .map(|&i| {
                        self.rows[i]
                            .get(self.name_column)
                            .cloned()
                            .unwrap_or_default()
                    })
                    .collect();
                for &i in &holders {
                    rows[i][col] = mark.clone();
                }
                notes.push((text.to_string(), names));
            }
        }
        let mut out = layout(&self.header, &rows);
        for (i, (text, names)) in notes.iter().enumerate() {
            out.push_str(&format!("[{}] {}: {}\n", i + 1, names.join(", "), text));
        }
        out
    }
}

/// Left-aligned columns separated by two spaces; no trailing blanks.
pub fn layout<S: AsRef<str>>(header: &[S], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.as_ref().chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, w) in widths.iter().enumerate() {
            let cell = cells.get(i).copied().unwrap_or("");
            if i + 1 == widths.len() {
                s.push_str(cell);
            } else {
                s.push_str(cell);
                let pad = w.saturating_sub(cell.chars().count()) + 2;
                s.push_str(&" ".repeat(pad));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(header.iter().map(|h| h.as_ref()).collect());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(cells: &[&str]) -> Vec<String> {
        cells.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn a_shared_long_note_is_printed_once_naming_its_rows() {
        let long = "fabric unreadable: the tree read is not a mounted sysfs";
        let mut t = Table::new(&["PCI", "NOTE"]);
        t.row(r(&["a", long]))
            .row(r(&["b", "-"]))
            .row(r(&["c", long]))
            .row(r(&["d", "a note only this row has, kept"]))
            .notes_in(1);
        assert_eq!(
            t.render(),
            format!("PCI  NOTE\na    [1]\nb    -\nc    [1]\nd    a note only this row has, kept\n[1] a, c: {long}\n")
        );
    }

    #[test]
    fn short_shared_cells_stay_in_place() {
        let mut t = Table::new(&["A", "B"]);
        t.row(r(&["x", "Active"]))
            .row(r(&["y", "Active"]))
            .notes_in(1);
        assert_eq!(t.render(), "A  B\nx  Active\ny  Active\n");
    }
}
