//! Ascend super pods over the UB fabric, read from a JSON file.
//!
//! The file holds the driver's super-pod answer per NPU, as a site script
//! collects it from the DCMI super-pod query (one entry per NPU, keyed by PCI
//! address). It is parsed strictly: an unknown key, shape or a malformed
//! endpoint fails the read rather than publishing half an answer.
//!
//! ```json
//! {"npus": [{"pciBusId": "0000:c1:00.0", "superPodType": "server-8p",
//!            "superPodId": 7, "superPodSize": 64, "serverIndex": 3, "rackId": 1,
//!            "endpoints": ["000102030405060708090a0b0c0d0e0f"]}]}
//! ```

use crate::pci;
use crate::record::Fabric;
use serde::Deserialize;
use std::collections::BTreeMap;

/// The driver's "invalid" marker for an unset id, size, index or rack.
pub const INVALID: u32 = u32::MAX;

/// The whole input file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    npus: Vec<Answer>,
}

/// One NPU's super-pod answer.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Answer {
    /// The NPU's PCI address.
    pub pci_bus_id: String,
    /// The shape word.
    pub super_pod_type: Shape,
    /// Super-pod id; [`INVALID`] when unset.
    pub super_pod_id: u32,
    /// Members in the super pod; [`INVALID`] when unset.
    pub super_pod_size: u32,
    /// This server's index; [`INVALID`] when unset.
    pub server_index: u32,
    /// This server's rack; [`INVALID`] when unset.
    pub rack_id: u32,
    /// UB endpoint ids, 32 lowercase hex characters each.
    #[serde(default)]
    pub endpoints: Vec<String>,
}

/// The super-pod shapes the driver reports.
#[derive(Debug, Clone, Copy, Deserialize, serde::Serialize, PartialEq, Eq)]
pub enum Shape {
    /// A one-dimensional pod.
    #[serde(rename = "pod-1d")]
    Pod1d,
    /// A two-dimensional pod.
    #[serde(rename = "pod-2d")]
    Pod2d,
    /// An 8-NPU server ("super server" when it has a valid id and size).
    #[serde(rename = "server-8p")]
    Server8p,
    /// A 16-NPU server: never in a super pod.
    #[serde(rename = "server-16p")]
    Server16p,
    /// A 32-NPU server: never in a super pod.
    #[serde(rename = "server-32p")]
    Server32p,
    /// A single-NPU card.
    #[serde(rename = "card-1p")]
    Card1p,
    /// A four-NPU card.
    #[serde(rename = "card-4p")]
    Card4p,
}

impl Shape {
    fn as_str(self) -> &'static str {
        match self {
            Shape::Pod1d => "pod-1d",
            Shape::Pod2d => "pod-2d",
            Shape::Server8p => "server-8p",
            Shape::Server16p => "server-16p",
            Shape::Server32p => "server-32p",
            Shape::Card1p => "card-1p",
            Shape::Card4p => "card-4p",
        }
    }
}

/// Parses the file into answers keyed by normalised PCI address.
pub fn parse(text: &str) -> Result<BTreeMap<String, Answer>, String> {
    let input: Input = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut out = BTreeMap::new();
    for a in input.npus {
        let addr = pci::normalize(&a.pci_bus_id)
            .ok_or_else(|| format!("pciBusId {:?} is not a PCI address", a.pci_bus_id))?;
        if let Some(bad) = a
            .endpoints
            .iter()
            .find(|e| e.len() != 32 || !e.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')))
        {
            return Err(format!(
                "{addr}: endpoint {bad:?} is not 32 lowercase hex characters"
            ));
        }
        if out.insert(addr.clone(), a).is_some() {
            return Err(format!("{addr} appears twice"));
        }
    }
    Ok(out)
}

/// The vendor's membership rule, then each field behind its own check.
/// Returns the fabric (kind, type and endpoints travel either way) and a note
/// when the NPU is in no super pod.
pub fn fabric(a: &Answer) -> (Fabric, Option<String>) {
    let valid = |v: u32| (v != INVALID).then_some(v);
    let in_pod = match a.super_pod_type {
        Shape::Pod1d | Shape::Pod2d => true,
        Shape::Server8p | Shape::Card1p | Shape::Card4p => {
            valid(a.super_pod_id).is_some() && valid(a.super_pod_size).is_some()
        }
        Shape::Server16p | Shape::Server32p => false,
    };
    let mut f = Fabric {
        kind: "ub".into(),
        shape: Some(a.super_pod_type.as_str().into()),
        endpoints: a.endpoints.clone(),
        ..Default::default()
    };
    if !in_pod {
        let note = format!(
            "{} with super-pod id {:#x} and size {:#x} is in no super pod",
            a.super_pod_type.as_str(),
            a.super_pod_id,
            a.super_pod_size
        );
        return (f, Some(note));
    }
    f.id = valid(a.super_pod_id).map(|v| v.to_string());
    if f.id.is_none() {
        return (f, Some("the super-pod id is the invalid marker".into()));
    }
    f.member_count = valid(a.super_pod_size).filter(|n| *n > 0);
    f.node_index = valid(a.server_index);
    f.rack_id = valid(a.rack_id);
    (f, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(shape: Shape, id: u32, size: u32) -> Answer {
        Answer {
            pci_bus_id: "0000:c1:00.0".into(),
            super_pod_type: shape,
            super_pod_id: id,
            super_pod_size: size,
            server_index: 3,
            rack_id: INVALID,
            endpoints: vec![],
        }
    }

    #[test]
    fn membership_rules() {
        assert_eq!(
            fabric(&answer(Shape::Pod1d, 7, 64)).0.id.as_deref(),
            Some("7")
        );
        assert_eq!(
            fabric(&answer(Shape::Server8p, 7, 64)).0.id.as_deref(),
            Some("7")
        );
        assert_eq!(fabric(&answer(Shape::Server8p, INVALID, 64)).0.id, None);
        assert_eq!(fabric(&answer(Shape::Card4p, 7, INVALID)).0.id, None);
        assert_eq!(fabric(&answer(Shape::Server16p, 7, 64)).0.id, None);
        assert_eq!(
            fabric(&answer(Shape::Server32p, 7, 64)).0.member_count,
            None
        );
        let (f, note) = fabric(&answer(Shape::Pod2d, 9, 128));
        assert_eq!(
            (f.member_count, f.node_index, f.rack_id, note),
            (Some(128), Some(3), None, None)
        );
        assert_eq!(f.shape.as_deref(), Some("pod-2d"));
    }

    #[test]
    fn strict_parse() {
        assert!(parse(r#"{"npus":[{"pciBusId":"0000:c1:00.0","superPodType":"server-64p","superPodId":1,"superPodSize":1,"serverIndex":0,"rackId":0}]}"#).is_err());
        assert!(parse(r#"{"npus":[],"extra":1}"#).is_err());
        assert!(parse(r#"{"npus":[{"pciBusId":"0000:c1:00.0","superPodType":"pod-1d","superPodId":1,"superPodSize":1,"serverIndex":0,"rackId":0,"endpoints":["ABC"]}]}"#).is_err());
    }
}
