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
    pub fn from_result(r: &Result<T, String>) -> Self {
        match r {
            Ok(v) => Answer::Read(v.clone()),
            Err(e) => Answer::Unreadable(e.clone()),
        }
    }

    /// The reader's result again.
    pub fn to_result(&self) -> Result<T, String> {
        match self {
            Answer::Read(v) => Ok(v.clone()),
            Answer::Unreadable(e) => Err(e.clone()),
        }
    }
}

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
    pub fn from_bytes(bytes: &[u8]) -> Result<Answers, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("vendor/{FILE}: {e}"))
    }
}

/// Where a pass notes the answers it used, for `capture`.
pub type Recorder = Arc<Mutex<Answers>>;
