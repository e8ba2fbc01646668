//! NVIDIA NVLink fabric from `nvidia-smi -q` (text) or `nvidia-smi -q -x`
//! (XML): the per-GPU "Fabric" block.
//!
//! Whatever the input, it must prove it is an answer: text needs the
//! `Attached GPUs` line and as many GPU sections as it announces, XML the
//! `nvidia_smi_log` root. Anything else (JSON, an empty file, a truncated
//! dump, another tool's output) is refused, so it can never read as "no GPU
//! has a fabric" and withdraw a published `fabric.domain`.
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
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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

/// An `nvidia-smi -q` answer that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// One line of the text is wrong.
    #[error("nvidia-smi -q line {line}: {why}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What was wrong.
        why: String,
    },
    /// The input as a whole is not an answer (empty, truncated, another format).
    #[error("not an nvidia-smi -q answer: {0}")]
    Input(String),
}

/// Parses either form of `nvidia-smi -q`, told apart by their first bytes.
pub fn parse_any(text: &str) -> Result<BTreeMap<String, FabricInfo>, ParseError> {
    let head = text.trim_start_matches('\u{feff}').trim_start();
    if head.is_empty() {
        return Err(ParseError::Input("the output is empty".into()));
    }
    if head.starts_with('<') {
        return parse_xml(text);
    }
    if head.starts_with('{') || head.starts_with('[') {
        return Err(ParseError::Input(
            "it is JSON; give the text of -q or the XML of -q -x".into(),
        ));
    }
    parse(text)
}

/// Lowercase with `_` removed, so `clusterUuid`, `cluster_uuid` and
/// `ClusterUUID` name one field: driver releases have spelled XML tags
/// differently, and the value is what matters.
fn tag_key(name: &str) -> String {
    name.chars()
        .filter(|c| *c != '_')
        .flat_map(char::to_lowercase)
        .collect()
}

/// Parses the XML of `nvidia-smi -q -x`: `<gpu id="…">` elements under
/// `<nvidia_smi_log>`, each with an optional `<fabric>` block.
pub fn parse_xml(text: &str) -> Result<BTreeMap<String, FabricInfo>, ParseError> {
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(text, opts)
        .map_err(|e| ParseError::Input(format!("malformed XML: {e}")))?;
    let root = doc.root_element();
    if root.tag_name().name() != "nvidia_smi_log" {
        return Err(ParseError::Input(format!(
            "XML root is <{}>, not <nvidia_smi_log>",
            root.tag_name().name()
        )));
    }
    let gpus: Vec<_> = root.children().filter(|n| n.has_tag_name("gpu")).collect();
    check_count(announced_xml(&root), gpus.len())?;
    let mut out = BTreeMap::new();
    for gpu in gpus {
        let id = gpu.attribute("id").unwrap_or_default();
        let addr = pci::normalize(id)
            .ok_or_else(|| ParseError::Input(format!("<gpu id={id:?}> is not a PCI address")))?;
        let Some(fabric) = gpu.children().find(|n| n.has_tag_name("fabric")) else {
            continue;
        };
        let mut info = FabricInfo::default();
        for field in fabric.children().filter(|n| n.is_element()) {
            let value = Some(field.text().unwrap_or_default().trim().to_string());
            match tag_key(field.tag_name().name()).as_str() {
                "state" => info.state = value,
                "status" => info.status = value,
                "cliqueid" => info.clique_id = value,
                "clusteruuid" => info.cluster_uuid = value,
                _ => {}
            }
        }
        out.insert(addr, info);
    }
    Ok(out)
}

/// `<attached_gpus>` of the XML, where present.
fn announced_xml(root: &roxmltree::Node) -> Option<usize> {
    root.children()
        .find(|n| n.has_tag_name("attached_gpus"))?
        .text()?
        .trim()
        .parse()
        .ok()
}

/// An answer announcing N GPUs must hold N GPU sections: fewer is a dump cut
/// short, whose missing GPUs would otherwise read as "no fabric".
fn check_count(announced: Option<usize>, found: usize) -> Result<(), ParseError> {
    match announced {
        None => Err(ParseError::Input(
            "no \"Attached GPUs\" count: not the output of nvidia-smi -q".into(),
        )),
        Some(n) if n != found => Err(ParseError::Input(format!(
            "it announces {n} attached GPUs but holds {found}: truncated"
        ))),
        Some(_) => Ok(()),
    }
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
    let mut announced = None;
    let mut sections = 0;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        if indent(line) == 0 {
            in_fabric = None;
            if let Some(addr) = trimmed.strip_prefix("GPU ") {
                let norm = pci::normalize(addr).ok_or_else(|| ParseError::Line {
                    line: n,
                    why: format!("{addr:?} is not a PCI address"),
                })?;
                gpu = Some(norm);
                sections += 1;
            } else if let Some((key, value)) = trimmed.split_once(':') {
                if key.trim() == "Attached GPUs" {
                    let count = value.trim().parse().map_err(|_| ParseError::Line {
                        line: n,
                        why: format!("Attached GPUs {:?} is not a number", value.trim()),
                    })?;
                    announced = Some(count);
                }
            }
            continue;
        }
        if trimmed == "Fabric" {
            let Some(g) = &gpu else {
                return Err(ParseError::Line {
                    line: n,
                    why: "Fabric block outside a GPU section".into(),
                });
            };
            out.insert(g.clone(), FabricInfo::default());
            in_fabric = Some(indent(line));
            continue;
        }
        let Some(fabric_indent) = in_fabric else {
            continue;
        };
        if indent(line) <= fabric_indent {
            in_fabric = None;
            continue;
        }
        let Some((key, value)) = trimmed.split_once(':') else {
            continue; // a nested heading such as "Health"
        };
        let info = out
            .get_mut(gpu.as_ref().expect("in a GPU section"))
            .expect("inserted above");
        let value = Some(value.trim().to_string());
        match key.trim() {
            "State" => info.state = value,
            "Status" => info.status = value,
            "CliqueId" | "Clique ID" => info.clique_id = value,
            "ClusterUUID" | "Cluster UUID" => info.cluster_uuid = value,
            _ => {}
        }
    }
    check_count(announced, sections)?;
    // A dump cut short can still hold every GPU heading; what it loses is the
    // end of the last sections. nvidia-smi ends every line, and closes every
    // Fabric block with the section's next field, and prints the block for
    // every GPU or for none.
    if !text.ends_with('\n') {
        return Err(ParseError::Input(
            "the last line has no newline: truncated".into(),
        ));
    }
    if in_fabric.is_some() {
        return Err(ParseError::Input(
            "it ends inside a Fabric block: truncated".into(),
        ));
    }
    if !out.is_empty() && out.len() != sections {
        return Err(ParseError::Input(format!(
            "{} of {sections} GPU sections have a Fabric block: truncated or spliced",
            out.len()
        )));
    }
    Ok(out)
}

/// Why a GPU's Fabric block publishes no fabric; the text is the GPU's note.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoFabric {
    /// The fabric manager has not finished registering the GPU.
    #[error("NVLink fabric registration state is {0:?}, not Completed")]
    NotRegistered(String),
    /// Registration finished with a failure.
    #[error("NVLink fabric registration completed with status {0:?}")]
    Failed(String),
    /// The cluster UUID is not 32 hex digits.
    #[error("NVLink cluster UUID {0:?} is not a UUID")]
    BadUuid(String),
    /// The all-zero UUID: registered, but in no cluster.
    #[error("NVLink cluster UUID is all zeros: no cluster assigned")]
    NoCluster,
    /// A clique id that is not a number.
    #[error("NVLink clique id {0:?} is not a number")]
    BadClique(String),
}

/// Applies the publication rules to one GPU's block: the fabric, or why none.
pub fn fabric(info: &FabricInfo) -> Result<Fabric, NoFabric> {
    let state = info.state.as_deref().unwrap_or("absent");
    if state != "Completed" {
        return Err(NoFabric::NotRegistered(state.to_string()));
    }
    let status = info.status.as_deref().unwrap_or("absent");
    if status != "Success" {
        return Err(NoFabric::Failed(status.to_string()));
    }
    let uuid = info.cluster_uuid.as_deref().unwrap_or("");
    let hex: String = uuid
        .chars()
        .filter(|c| *c != '-')
        .collect::<String>()
        .to_ascii_lowercase();
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(NoFabric::BadUuid(uuid.to_string()));
    }
    if hex.chars().all(|c| c == '0') {
        return Err(NoFabric::NoCluster);
    }
    let clique = info
        .clique_id
        .as_deref()
        .map(str::trim)
        .filter(|c| !c.is_empty() && *c != "N/A");
    if let Some(c) = clique {
        if !c.chars().all(|ch| ch.is_ascii_digit()) {
            return Err(NoFabric::BadClique(c.to_string()));
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
