//! The vendor answers one pass used (NVIDIA's fabric blocks, the Ascend
//! super-pod answers), or why each was unreadable: what a capture stores beside
//! the sysfs tree so that its replay reproduces the `fabric.*` labels byte
//! for byte on a machine with no GPU, no driver and no vendor tool.

use super::nvidia::FabricInfo;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The file inside a capture's `vendor/` folder.
pub const FILE: &str = "fabric.json";

/// One vendor's answer: the data the pass read, or the reason it could not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Answer<T> {
    /// What was read.
    Read(T),
    /// Why nothing could be read, word for word as the pass reported it.
    Unreadable(String),
}

impl<T: Clone> Answer<T> {
    /// Wraps a reader's result.
    pub fn from_result(r: &Result<T, Unreadable>) -> Self {
        match r {
            Ok(v) => Answer::Read(v.clone()),
            Err(e) => Answer::Unreadable(e.to_string()),
        }
    }

    /// The reader's result again.
    pub fn to_result(&self) -> Result<T, Unreadable> {
        match self {
            Answer::Read(v) => Ok(v.clone()),
            Answer::Unreadable(e) => Err(Unreadable::Recorded(e.clone())),
        }
    }
}

/// Why a vendor's fabric answer could not be read. The text is what a
/// capture records and what each accelerator's note says, so every variant
/// prints its cause itself rather than as a source.
#[derive(Debug, thiserror::Error)]
pub enum Unreadable {
    /// A replayed capture that holds no NVIDIA answer.
    #[error("the capture holds no NVIDIA answer")]
    NotCaptured,
    /// A replayed capture's unreadable answer, word for word.
    #[error("{0}")]
    Recorded(String),
    /// `nvidia-smi` could not be run or gave no answer.
    #[error("{0}")]
    Tool(crate::tool::ToolError),
    /// NVML could not be loaded or asked.
    #[error("{0}")]
    Nvml(super::nvml::NvmlError),
    /// A saved answer file could not be read.
    #[error("{0}")]
    Input(crate::input::InputError),
    /// NVIDIA's answer is not one `nvidia-smi -q` gives.
    #[error("{origin}: {reason}")]
    Nvidia {
        /// The command or file it came from.
        origin: String,
        /// Why it does not parse.
        reason: super::nvidia::ParseError,
    },
    /// The Ascend super-pod file is not one.
    #[error("{origin}: {reason}")]
    Ascend {
        /// The file.
        origin: String,
        /// Why it does not parse.
        reason: String,
    },
    /// Ascend accelerators, but no `--ascend-fabric` to read.
    #[error("no --ascend-fabric input given")]
    NoAscendInput,
    /// The tree read is not this host's sysfs, and no NVIDIA answer was named.
    #[error("the tree read is not a mounted sysfs, so this host's NVML and nvidia-smi were not asked: give its answer with --nvidia-smi-q (or --nvidia-smi, --nvml-lib)")]
    NotThisHost,
}

/// A capture's `vendor/fabric.json` that is not one.
#[derive(Debug, thiserror::Error)]
#[error("vendor/{FILE}: {0}")]
pub struct AnswersError(serde_json::Error);

/// Every vendor answer of one pass; a vendor the pass did not ask is absent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Answers {
    /// NVIDIA: every GPU's Fabric block by PCI address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvidia: Option<Answer<BTreeMap<String, FabricInfo>>>,
    /// Ascend: every NPU's super-pod answer by PCI address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ascend: Option<Answer<BTreeMap<String, super::ascend::Answer>>>,
}

impl Answers {
    /// The bytes a capture stores: pretty JSON, stable key order.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut s = serde_json::to_string_pretty(self).expect("answers serialise");
        s.push('\n');
        s.into_bytes()
    }

    /// Reads a capture's answers; the file comes from a stranger's archive,
    /// so anything that is not this exact shape is an error naming why.
    pub fn from_bytes(bytes: &[u8]) -> Result<Answers, AnswersError> {
        serde_json::from_slice(bytes).map_err(AnswersError)
    }
}

/// Where a pass notes the answers it used, for `capture`.
pub type Recorder = Arc<Mutex<Answers>>;
