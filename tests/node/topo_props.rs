//! Property tests of the `nvidia-smi topo -m` parser over the corpus in
//! `tests/data/topo`: a TAB dump re-spaced the way copies re-space it reads
//! the same; a mutated dump never panics and, when accepted, is a square
//! matrix with header-many cells in every row; a lost TAB inside the device
//! cells is always refused, never read as shifted cells.

use nodefabric::rails::topo::{parse_topo, Topo};
use proptest::prelude::*;
use std::path::Path;

/// The corpus dumps printed with TABs that parse as they are.
const TAB_DUMPS: [&str; 8] = [
    "ac922-power9",
    "dgx-a100-tabs",
    "dgx-spark",
    "dgx1-v100-rdma-names",
    "dual-socket-pcie",
    "gb200-tray-all-sys",
    "hgx-b200-crlf",
    "kvm-guest-numa-na",
];

fn dump(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/topo")
        .join(format!("{name}.txt"));
    std::fs::read_to_string(p).unwrap()
}

/// What any accepted matrix must satisfy.
fn assert_square(t: &Topo) {
    assert_eq!(t.rows.len(), t.columns.len(), "one row per device column");
    for row in &t.rows {
        assert_eq!(
            row.cells.len(),
            t.columns.len(),
            "{}: header-many device cells",
            row.label
        );
        assert!(
            row.affinity.is_empty() || row.affinity.len() == t.affinity_columns.len(),
            "{}",
            row.label
        );
        for (col, cell) in t.columns.iter().zip(&row.cells) {
            assert_eq!(
                cell == "X",
                *col == row.label,
                "{}: X only under its own column",
                row.label
            );
        }
    }
    for (gpu, nics) in &t.gpu_to_nic {
        assert!(t.columns.contains(&format!("GPU{gpu}")));
        assert_eq!(
            nics.len(),
            t.columns.iter().filter(|c| !c.starts_with("GPU")).count()
        );
    }
}

/// Replaces every TAB with 1 to 8 spaces (chosen per TAB from `widths`),
/// optionally drops the header's leading blanks and pads every line.
fn respace(text: &str, widths: &[usize], unindent: bool, pad: usize) -> String {
    let mut n = 0;
    let lines: Vec<String> = text
        .split('\n')
        .map(|line| {
            let mut out = String::new();
            for c in line.chars() {
                if c == '\t' {
                    out.push_str(&" ".repeat(widths[n % widths.len()]));
                    n += 1;
                } else {
                    out.push(c);
                }
            }
            out.push_str(&" ".repeat(pad));
            out
        })
        .collect();
    let mut text = lines.join("\n");
    if unindent {
        text = text.trim_start_matches(' ').to_string();
    }
    text
}

proptest! {
    // Failures print their minimal input; nothing is written beside the sources.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn respacing_a_tab_dump_never_changes_what_is_read(
        which in 0..TAB_DUMPS.len(),
        widths in prop::collection::vec(1usize..=8, 1..16),
        unindent: bool,
        pad in 0usize..4,
    ) {
        let text = dump(TAB_DUMPS[which]);
        let tabs = parse_topo(&text, "tabs").unwrap();
        let spaced = parse_topo(&respace(&text, &widths, unindent, pad), "spaces").unwrap();
        prop_assert_eq!(&spaced.gpu_to_nic, &tabs.gpu_to_nic);
        prop_assert_eq!(&spaced.gpu_numa, &tabs.gpu_numa);
        prop_assert_eq!(&spaced.legend, &tabs.legend);
        prop_assert_eq!(spaced.rows.iter().map(|r| (&r.cells, &r.affinity)).collect::<Vec<_>>(),
                        tabs.rows.iter().map(|r| (&r.cells, &r.affinity)).collect::<Vec<_>>());
    }

    #[test]
    fn a_lost_tab_in_device_cells_is_refused_and_any_other_changes_nothing(
        which in 0..TAB_DUMPS.len(),
        row_pick: prop::sample::Index,
        tab_pick: prop::sample::Index,
    ) {
        let text = dump(TAB_DUMPS[which]);
        let good = parse_topo(&text, "good").unwrap();
        let row = &good.rows[row_pick.index(good.rows.len())];
        let lines: Vec<&str> = text.split('\n').collect();
        let line = lines[row.line - 1];
        let tabs: Vec<usize> = line.match_indices('\t').map(|(i, _)| i).collect();
        let k = tab_pick.index(tabs.len());
        let mut damaged = lines.iter().map(|l| l.to_string()).collect::<Vec<_>>();
        damaged[row.line - 1] = format!("{}{}", &line[..tabs[k]], &line[tabs[k] + 1..]);
        let result = parse_topo(&damaged.join("\n"), "damaged");
        // TAB k ends cell k of the row (0: the label); merging two of the
        // label and the D device cells must be refused. The TAB after the last
        // device cell may be followed by an empty cell, whose loss is harmless.
        if k < good.columns.len() {
            let e = result.expect_err("a lost TAB among device cells must be refused");
            prop_assert_eq!(e.line, Some(row.line));
        } else if let Ok(t) = result {
            prop_assert_eq!(&t.gpu_to_nic, &good.gpu_to_nic);
            prop_assert_eq!(&t.gpu_numa, &good.gpu_numa);
        }
    }

    #[test]
    fn mutated_dumps_never_panic_and_accepted_ones_are_square(
        which in 0..TAB_DUMPS.len(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..6, prop::sample::select(vec!["\t", " ", "\n", "X", "PIX", "GPU1", "NIC0", "0-7", ",", ":", "N/A", "NIC Legend:", "\u{1b}["])), 1..6),
    ) {
        let mut text = dump(TAB_DUMPS[which]);
        for (at, op, piece) in edits {
            let mut i = at.index(text.len() + 1);
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            match op {
                0 => text.insert_str(i, piece),
                1 => { if i < text.len() { let c = text[i..].chars().next().unwrap(); text.replace_range(i..i + c.len_utf8(), ""); } }
                2 => text.truncate(i),
                3 => {
                    // duplicate the line holding i
                    let start = text[..i].rfind('\n').map_or(0, |p| p + 1);
                    let end = text[i..].find('\n').map_or(text.len(), |p| i + p);
                    let line = text[start..end].to_string();
                    text.insert_str(start, &format!("{line}\n"));
                }
                4 => { let end = text[i..].find('\n').map_or(text.len(), |p| i + p); let start = text[..i].rfind('\n').map_or(0, |p| p + 1); text.replace_range(start..end, ""); }
                _ => text = text.replacen('\t', piece, 1),
            }
        }
        if let Ok(t) = parse_topo(&text, "mutated") {
            assert_square(&t);
        }
    }

    #[test]
    fn arbitrary_token_soup_never_panics(
        tokens in prop::collection::vec(prop::sample::select(vec!["\t", " ", "  ", "\n", "\r\n", " X ", "X", "GPU0", "GPU1", "NIC0", "mlx5_0", "PIX", "SYS", "NV12", "0-7", "0", "N/A", "CPU Affinity", "NUMA", "Affinity", "NIC Legend:", "NIC0: mlx5_0", "Legend:", "é"]), 0..200),
    ) {
        let text: String = tokens.concat();
        if let Ok(t) = parse_topo(&text, "soup") {
            assert_square(&t);
        }
    }
}
