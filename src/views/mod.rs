//! What people and scripts read of one pass, besides what is published: the
//! accelerator-to-NIC matrix (`topo`), its picture, and the rail map as a
//! table. Pure functions of the node record and the rail record, like every
//! other output, so a capture replays to the same bytes.

pub mod cluster;
pub mod graph;
pub mod rails;
pub mod svg;
pub mod topo;

/// Sorts names as people count: `mlx5_2` before `mlx5_10`.
pub(crate) fn natural_key(name: &str) -> (String, u64, String) {
    let digits_at = name
        .rfind(|c: char| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    let (head, tail) = name.split_at(digits_at);
    let n = tail.parse::<u64>().unwrap_or(0);
    (head.to_string(), n, name.to_string())
}
