//! The prepared claims, kept in `--state-dir` so a restarted driver still
//! answers Unprepare, and answers a repeated Prepare with what it answered
//! before. Written whole and atomically after every change.

use super::claims::Prepared;
use crate::publish::{self, PublishError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tracing::warn;

/// The checkpoint's file name in the state folder.
pub const FILE: &str = "dra-checkpoint.json";

/// The format of the checkpoint file; another is not read.
pub const FORMAT: &str = "dra.nodefabric.gpustack.ai/v1";

/// A checkpoint larger than this is not read: thousands of claims fit in
/// far less, and the driver's memory limit is small.
pub const MAX_BYTES: u64 = 8 << 20;

/// Claim UID → the claim as prepared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// [`FORMAT`].
    pub format: String,
    /// The prepared claims by UID.
    pub claims: BTreeMap<String, Prepared>,
}

/// A checkpoint that cannot be written; the claim that needed it fails.
#[derive(Debug, thiserror::Error)]
#[error("saving the prepared claims: {0}")]
pub struct CheckpointError(#[from] PublishError);

impl Checkpoint {
    /// The checkpoint in `dir`: empty when there is none. One that cannot
    /// be read or parsed is moved aside (named in the log) and an empty one
    /// taken, so the driver starts: kubelet's next Prepare of each claim
    /// then reads it from the API again.
    pub fn load(dir: &Path) -> Checkpoint {
        let path = dir.join(FILE);
        let bytes = match crate::input::read_bytes(
            &path,
            MAX_BYTES,
            "the DRA checkpoint",
            crate::input::Pipes::Refuse,
        ) {
            Ok(b) => b,
            // None yet: the first start on this node.
            Err(_) if !path.exists() => return Checkpoint::empty(),
            Err(e) => return set_aside(&path, &e.to_string()),
        };
        match serde_json::from_slice::<Checkpoint>(&bytes) {
            Ok(c) if c.format == FORMAT => c,
            Ok(c) => set_aside(
                &path,
                &format!("its format is {:?}, not {FORMAT:?}", c.format),
            ),
            Err(e) => set_aside(&path, &format!("not a checkpoint: {e}")),
        }
    }

    /// A checkpoint with no claims.
    pub fn empty() -> Checkpoint {
        Checkpoint {
            format: FORMAT.to_string(),
            claims: BTreeMap::new(),
        }
    }

    /// Writes the whole checkpoint atomically.
    pub fn save(&self, dir: &Path) -> Result<(), CheckpointError> {
        let mut bytes = serde_json::to_vec_pretty(self).expect("a checkpoint serialises");
        bytes.push(b'\n');
        publish::write_if_changed(dir, FILE, &bytes)?;
        Ok(())
    }
}

fn set_aside(path: &Path, why: &str) -> Checkpoint {
    let aside = PathBuf::from(format!("{}.unreadable", path.display()));
    let moved = std::fs::rename(path, &aside)
        .map(|_| format!("moved to {}", aside.display()))
        .unwrap_or_else(|e| format!("could not be moved aside: {e}"));
    warn!(
        "{}: {why}; starting with no prepared claims ({moved}); kubelet's next Prepare reads each claim again",
        path.display()
    );
    Checkpoint::empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_checkpoint_loads_back_and_a_damaged_one_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Checkpoint::load(dir.path()), Checkpoint::empty());
        let mut c = Checkpoint::empty();
        c.claims.insert(
            "uid-1".into(),
            Prepared {
                namespace: "team".into(),
                name: "a".into(),
                devices: vec![],
                rdma_devices: vec!["mlx5_0".into()],
            },
        );
        c.save(dir.path()).unwrap();
        assert_eq!(Checkpoint::load(dir.path()), c);
        std::fs::write(dir.path().join(FILE), b"{\"format\":").unwrap();
        assert_eq!(Checkpoint::load(dir.path()), Checkpoint::empty());
        assert!(dir.path().join("dra-checkpoint.json.unreadable").exists());
    }
}
