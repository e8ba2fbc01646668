//! NVIDIA NVLink fabric from `nvidia-smi -q`: the per-GPU "Fabric" block.
//!
//! ```text
//! GPU 00000000:0F:01.0
//!     Fabric
//!         State                             : Completed
//!         Status                            : Success
//!         CliqueId                          : 32766
//!         ClusterUUID                       : 5b0e1122-3344-5566-7788-99aabbccddef
//! ```
//!
//! The fabric manager fills these in; a fabric is published only once
//! registration completed successfully with a non-zero cluster UUID, because
//! the id is compared across machines and every unregistered GPU reports the
//! same zeros.

use crate::pci;
use crate::record::Fabric;
use std::collections::BTreeMap;

/// One GPU's Fabric block, as printed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FabricInfo {
    /// `State` (`Completed`, `In Progress`, `Not Started`, `Not Supported`, `N/A`).
    pub state: Option<String>,
    /// `Status` (`Success`, an error text, or `N/A`).
    pub status: Option<String>,
    /// `CliqueId`.
    pub clique_id: Option<String>,
    /// `ClusterUUID`.
    pub cluster_uuid: Option<String>,
}

/// A malformed `nvidia-smi -q` text.
#[derive(Debug, thiserror::Error)]
#[error("nvidia-smi -q line {line}: {why}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What was wrong.
    pub why: String,
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Parses the whole `nvidia-smi -q` text into Fabric blocks keyed by the
/// GPU's normalised PCI address. GPUs without a Fabric block are absent.
pub fn parse(text: &str) -> Result<BTreeMap<String, FabricInfo>, ParseError> {
    let mut out = BTreeMap::new();
    let mut gpu: Option<String> = None;
    let mut in_fabric: Option<usize> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        if indent(line) == 0 {
            in_fabric = None;
            if let Some(addr) = trimmed.strip_prefix("GPU ") {
                let norm = pci::normalize(addr).ok_or_else(|| ParseError {
                    line: n,
                    why: format!("{addr:?} is not a PCI address"),
                })?;
                gpu = Some(norm);
            }
            continue;
        }
        if trimmed == "Fabric" {
            let Some(g) = &gpu else {
                return Err(ParseError { line: n, why: "Fabric block outside a GPU section".into() });
            };
            out.insert(g.clone(), FabricInfo::default());
            in_fabric = Some(indent(line));
            continue;
        }
        let Some(fabric_indent) = in_fabric else { continue };
        if indent(line) <= fabric_indent {
            in_fabric = None;
            continue;
        }
        let Some((key, value)) = trimmed.split_once(':') else {
            continue; // a nested heading such as "Health"
        };
        let info = out.get_mut(gpu.as_ref().expect("in a GPU section")).expect("inserted above");
        let value = Some(value.trim().to_string());
        match key.trim() {
            "State" => info.state = value,
            "Status" => info.status = value,
            "CliqueId" | "Clique ID" => info.clique_id = value,
            "ClusterUUID" | "Cluster UUID" => info.cluster_uuid = value,
            _ => {}
        }
    }
    Ok(out)
}

/// Applies the publication rules to one GPU's block: the fabric, or why none.
pub fn fabric(info: &FabricInfo) -> Result<Fabric, String> {
    let state = info.state.as_deref().unwrap_or("absent");
    if state != "Completed" {
        return Err(format!("NVLink fabric registration state is {state:?}, not Completed"));
    }
    let status = info.status.as_deref().unwrap_or("absent");
    if status != "Success" {
        return Err(format!("NVLink fabric registration completed with status {status:?}"));
    }
    let uuid = info.cluster_uuid.as_deref().unwrap_or("");
    let hex: String = uuid.chars().filter(|c| *c != '-').collect::<String>().to_ascii_lowercase();
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!("NVLink cluster UUID {uuid:?} is not a UUID"));
    }
    if hex.chars().all(|c| c == '0') {
        return Err("NVLink cluster UUID is all zeros: no cluster assigned".into());
    }
    let clique = info.clique_id.as_deref().map(str::trim).filter(|c| !c.is_empty() && *c != "N/A");
    if let Some(c) = clique {
        if !c.chars().all(|ch| ch.is_ascii_digit()) {
            return Err(format!("NVLink clique id {c:?} is not a number"));
        }
    }
    Ok(Fabric {
        kind: "nvlink".into(),
        id: Some(hex),
        clique_id: clique.map(str::to_string),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_blocks_and_nested_headings() {
        let text = "\
==============NVSMI LOG==============

Attached GPUs                             : 1
GPU 00000000:0F:01.0
    Product Name                          : NVIDIA GB200
    Fabric
        State                             : Completed
        Status                            : Success
        CliqueId                          : 7
        ClusterUUID                       : 5B0E1122-3344-5566-7788-99AABBCCDDEF
        Health
            Bandwidth                     : Full
    Processes                             : None
";
        let m = parse(text).unwrap();
        let info = &m["0000:0f:01.0"];
        assert_eq!(info.state.as_deref(), Some("Completed"));
        let f = fabric(info).unwrap();
        assert_eq!(f.id.as_deref(), Some("5b0e112233445566778899aabbccddef"));
        assert_eq!(f.clique_id.as_deref(), Some("7"));
        assert!(parse("GPU nonsense\n").is_err());
    }
}
