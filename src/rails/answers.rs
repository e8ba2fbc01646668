//! What a rail record is built from besides the node record, as the node
//! read it: the tool answers (the LLDP neighbour table, nvidia-smi's GPU
//! identities and `topo -m` matrix), each with where it came from and what
//! it printed or why it gave nothing, and the sysfs `device` links those
//! answers name. A capture stores the tool answers as `vendor/rails.json`
//! (the links are in its sysfs tree), so that a replay rebuilds the rail
//! record byte for byte on a machine without lldpd, GPU or nvidia-smi.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The file inside a capture's `vendor/` folder.
pub const FILE: &str = "rails.json";

/// Where one answer came from, as errors about it name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Origin {
    /// A command run on the node (`lldpctl`, `nvidia-smi topo -m`).
    Command(String),
    /// A saved output named on the command line, by its path.
    File(String),
    /// A command run in another pod through the API server's exec (the
    /// GPU Operator's pod on this node, `gpuSource`), naming the pod and command.
    Exec(String),
}

impl Origin {
    /// The command or path.
    pub fn name(&self) -> &str {
        match self {
            Origin::Command(s) | Origin::File(s) | Origin::Exec(s) => s,
        }
    }
}

/// What one tool (or saved output) gave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Output {
    /// The text printed (exit status 0), or the file's text.
    Printed(String),
    /// The command is not installed: nothing there to start.
    NotInstalled,
    /// Why there is no text (a non-zero exit status with the tool's stderr,
    /// a timeout, an unreadable file), word for word as the read reported it.
    Failed(String),
}

/// One tool answer: its origin and its output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Answer {
    /// Where it came from.
    pub origin: Origin,
    /// What it gave.
    pub output: Output,
}

impl Answer {
    /// An answer with text.
    pub fn printed(origin: Origin, text: impl Into<String>) -> Answer {
        Answer {
            origin,
            output: Output::Printed(text.into()),
        }
    }

    /// An answer that is only a failure.
    pub fn failed(origin: Origin, why: impl Into<String>) -> Answer {
        Answer {
            origin,
            output: Output::Failed(why.into()),
        }
    }

    /// The text, where there is one.
    pub fn text(&self) -> Option<&str> {
        match &self.output {
            Output::Printed(t) => Some(t),
            Output::NotInstalled | Output::Failed(_) => None,
        }
    }
}

/// nvidia-smi's two answers. `topo -m` is asked only once `--query-gpu`
/// printed, so it is absent when the query did not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NvidiaAnswers {
    /// `--query-gpu=index,uuid,pci.bus_id --format=csv,noheader`.
    pub query: Answer,
    /// `topo -m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topo: Option<Answer>,
}

/// Every tool answer of one rail read; one not asked is absent: LLDP with
/// the `interface-name` rail source, nvidia-smi with `--sysfs-paths` or on
/// a node without NVIDIA GPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RailAnswers {
    /// The LLDP neighbour table (`lldpctl -f json` or a saved one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lldp: Option<Answer>,
    /// nvidia-smi's answers (run, or saved files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvidia: Option<NvidiaAnswers>,
}

/// A capture's `vendor/rails.json` that is not one.
#[derive(Debug, thiserror::Error)]
#[error("vendor/{FILE}: {0}")]
pub struct AnswersError(serde_json::Error);

impl RailAnswers {
    /// The bytes a capture stores: pretty JSON, stable key order.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut s = serde_json::to_string_pretty(self).expect("answers serialise");
        s.push('\n');
        s.into_bytes()
    }

    /// Reads a capture's rail answers; the file comes from a stranger's
    /// archive, so anything that is not this exact shape is refused.
    pub fn from_bytes(bytes: &[u8]) -> Result<RailAnswers, AnswersError> {
        serde_json::from_slice(bytes).map_err(AnswersError)
    }
}

/// Where a sysfs `device` link leads: a PCI function, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceLink {
    /// The normalised PCI address it resolves to.
    Pci(String),
    /// Why it does not (missing, outside the tree, not a PCI device), naming the link.
    Unresolved(String),
}

/// Everything [`super::build`] reads: the tool answers and the sysfs facts
/// they point at, so that the build itself reads nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inputs {
    /// The tool answers.
    pub answers: RailAnswers,
    /// Netdev name → its `class/net/NAME/device` link, for every interface
    /// the LLDP answer lists.
    pub netdev_pci: BTreeMap<String, DeviceLink>,
    /// RDMA device name → its `class/infiniband/NAME/device` link, for every
    /// NIC the `topo -m` answer has a GPU path to.
    pub rdma_pci: BTreeMap<String, DeviceLink>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_round_trip_and_a_stranger_key_is_refused() {
        let a = RailAnswers {
            lldp: Some(Answer::printed(Origin::Command("lldpctl".into()), "{}")),
            nvidia: Some(NvidiaAnswers {
                query: Answer {
                    origin: Origin::Command("nvidia-smi --query-gpu".into()),
                    output: Output::NotInstalled,
                },
                topo: None,
            }),
        };
        assert_eq!(RailAnswers::from_bytes(&a.to_bytes()).unwrap(), a);
        let err = RailAnswers::from_bytes(b"{\"lldp\": null, \"surprise\": 1}").unwrap_err();
        assert!(err.to_string().contains("vendor/rails.json"), "{err}");
        assert!(err.to_string().contains("surprise"), "{err}");
        assert_eq!(
            RailAnswers::from_bytes(b"{}").unwrap(),
            RailAnswers::default()
        );
    }
}
