//! The prepared claims, kept in `--state-dir` so a restarted driver still
//! answers Unprepare, and answers a repeated Prepare with what it answered
//! before. Written whole and atomically after every change.
//!
//! The file carries its format. [`FORMAT`] (v2) records with each claim
//! the driver that prepared it, which the stale-claim sweep checks the
//! claim's allocation against; [`FORMAT_V1`], written by earlier releases,
//! is read and upgraded in place (its claims were all this driver's).
//! [`FORMAT_SHARES`] (v3) is v2 plus devices' share IDs, written only
//! while a share of a shared NIC is prepared: a node that never holds a
//! share keeps writing v2, byte for byte as before, so a release without
//! shares still reads it after a downgrade, and one with shares prepared
//! stops it (it would hand the NIC out whole). A format this release does
//! not know (a newer release's, after a downgrade) stops the start, naming
//! the file: setting it aside would forget claims that running pods hold.

use super::claims::Prepared;
use crate::publish::{self, PublishError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tracing::{info, warn};

/// The checkpoint's file name in the state folder.
pub const FILE: &str = "dra-checkpoint.json";

/// The format this release writes.
pub const FORMAT: &str = "dra.nodefabric.gpustack.ai/v2";

/// The format of releases before the sweep: claims without their driver.
pub const FORMAT_V1: &str = "dra.nodefabric.gpustack.ai/v1";

/// [`FORMAT`] with share IDs: written only while a share is prepared.
pub const FORMAT_SHARES: &str = "dra.nodefabric.gpustack.ai/v3";

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

/// Only the format, read first: a newer format's claims may not parse.
#[derive(Deserialize)]
struct Header {
    format: String,
}

/// What is written: the format the claims need, then the claims, in the
/// field order of [`Checkpoint`], so a v2 file keeps its bytes.
#[derive(Serialize)]
struct Written<'a> {
    format: &'a str,
    claims: &'a BTreeMap<String, Prepared>,
}

/// A checkpoint that cannot be written; the claim that needed it fails.
#[derive(Debug, thiserror::Error)]
#[error("saving the prepared claims: {0}")]
pub struct CheckpointError(#[from] PublishError);

/// A checkpoint the driver must not start over: its claims would be lost.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Written in a format this release does not know.
    #[error("{path}: checkpoint format {found:?} is not one this nodefabric-dra reads ({FORMAT_V1:?}, {FORMAT:?} or {FORMAT_SHARES:?}); it was written by a newer release: run that release again, or, knowing that every claim in it is then forgotten, move the file away")]
    Unknown {
        /// The checkpoint file.
        path: PathBuf,
        /// Its format.
        found: String,
    },
}

impl Checkpoint {
    /// The checkpoint in `dir`: empty when there is none. A v1 checkpoint
    /// is upgraded in place, each claim taken as `driver`'s. One that
    /// cannot be read or parsed is moved aside (named in the log) and an
    /// empty one taken, so the driver starts: kubelet's next Prepare of
    /// each claim then reads it from the API again. One of an unknown
    /// format is an error.
    pub fn load(dir: &Path, driver: &str) -> Result<Checkpoint, LoadError> {
        let path = dir.join(FILE);
        let bytes = match crate::input::read_bytes(
            &path,
            MAX_BYTES,
            "the DRA checkpoint",
            crate::input::Pipes::Refuse,
        ) {
            Ok(b) => b,
            // None yet: the first start on this node.
            Err(_) if !path.exists() => return Ok(Checkpoint::empty()),
            Err(e) => return Ok(set_aside(&path, &e.to_string())),
        };
        let format = match serde_json::from_slice::<Header>(&bytes) {
            Ok(h) => h.format,
            Err(e) => return Ok(set_aside(&path, &format!("not a checkpoint: {e}"))),
        };
        if ![FORMAT, FORMAT_V1, FORMAT_SHARES].contains(&format.as_str()) {
            return Err(LoadError::Unknown {
                path,
                found: format,
            });
        }
        let mut c = match serde_json::from_slice::<Checkpoint>(&bytes) {
            Ok(c) => c,
            Err(e) => return Ok(set_aside(&path, &format!("not a {format} checkpoint: {e}"))),
        };
        if c.format == FORMAT_V1 {
            c.upgrade(driver);
            match c.save(dir) {
                Ok(()) => info!(
                    "{}: upgraded from {FORMAT_V1} to {FORMAT} ({} claims kept)",
                    path.display(),
                    c.claims.len()
                ),
                // Still upgraded in memory: the next change writes it.
                Err(e) => warn!(
                    "{}: read as {FORMAT_V1}, not yet written as {FORMAT}: {e}",
                    path.display()
                ),
            }
        }
        Ok(c)
    }

    /// v1 → v2: every v1 claim was prepared by this driver (v1 kept no
    /// other's).
    fn upgrade(&mut self, driver: &str) {
        for prepared in self.claims.values_mut() {
            if prepared.driver.is_empty() {
                prepared.driver = driver.to_string();
            }
        }
        self.format = FORMAT.to_string();
    }

    /// A checkpoint with no claims.
    pub fn empty() -> Checkpoint {
        Checkpoint {
            format: FORMAT.to_string(),
            claims: BTreeMap::new(),
        }
    }

    /// The format the claims need: [`FORMAT_SHARES`] while any device is
    /// a share, else [`FORMAT`].
    pub fn needed_format(&self) -> &'static str {
        let shared = self
            .claims
            .values()
            .flat_map(|c| &c.devices)
            .any(|d| d.share_id.is_some());
        if shared {
            FORMAT_SHARES
        } else {
            FORMAT
        }
    }

    /// Writes the whole checkpoint atomically, in the format its claims
    /// need.
    pub fn save(&self, dir: &Path) -> Result<(), CheckpointError> {
        let written = Written {
            format: self.needed_format(),
            claims: &self.claims,
        };
        let mut bytes = serde_json::to_vec_pretty(&written).expect("a checkpoint serialises");
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

    const DRIVER: &str = "rdma.gpustack.ai";

    #[test]
    fn a_saved_checkpoint_loads_back_and_a_damaged_one_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            Checkpoint::load(dir.path(), DRIVER).unwrap(),
            Checkpoint::empty()
        );
        let mut c = Checkpoint::empty();
        c.claims.insert(
            "uid-1".into(),
            Prepared {
                namespace: "team".into(),
                name: "a".into(),
                driver: DRIVER.into(),
                devices: vec![],
                rdma_devices: vec!["mlx5_0".into()],
                nccl_ib_hca: vec![],
            },
        );
        c.save(dir.path()).unwrap();
        assert_eq!(Checkpoint::load(dir.path(), DRIVER).unwrap(), c);
        std::fs::write(dir.path().join(FILE), b"{\"format\":").unwrap();
        assert_eq!(
            Checkpoint::load(dir.path(), DRIVER).unwrap(),
            Checkpoint::empty()
        );
        assert!(dir.path().join("dra-checkpoint.json.unreadable").exists());
    }

    #[test]
    fn the_checked_in_v1_checkpoint_is_upgraded_in_place_and_a_newer_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let v1 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/dra/checkpoint-v1.json");
        std::fs::copy(&v1, dir.path().join(FILE)).unwrap();
        let c = Checkpoint::load(dir.path(), DRIVER).unwrap();
        assert_eq!(c.format, FORMAT);
        let claim = &c.claims["0b6c7d8e-1111-4222-8333-444455556666"];
        assert_eq!(
            (claim.namespace.as_str(), claim.name.as_str()),
            ("team", "legacy")
        );
        assert_eq!(claim.driver, DRIVER);
        assert_eq!(claim.rdma_devices, ["mlx5_0"]);
        // Written back as v2, and read as such.
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert!(text.contains(FORMAT), "{text}");
        assert_eq!(Checkpoint::load(dir.path(), "another.driver").unwrap(), c);

        let newer = br#"{"format":"dra.nodefabric.gpustack.ai/v4","claims":[]}"#;
        std::fs::write(dir.path().join(FILE), newer).unwrap();
        let e = Checkpoint::load(dir.path(), DRIVER)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&dir.path().join(FILE).display().to_string()) && e.contains("/v4"),
            "{e}"
        );
        assert_eq!(std::fs::read(dir.path().join(FILE)).unwrap(), newer);
    }

    #[test]
    fn a_v2_checkpoint_keeps_its_bytes_and_only_a_prepared_share_writes_v3() {
        let dir = tempfile::tempdir().unwrap();
        let v2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/dra/checkpoint-v2.json");
        let before = std::fs::read(&v2).unwrap();
        std::fs::write(dir.path().join(FILE), &before).unwrap();
        let mut c = Checkpoint::load(dir.path(), DRIVER).unwrap();
        c.save(dir.path()).unwrap();
        assert_eq!(std::fs::read(dir.path().join(FILE)).unwrap(), before);

        let uid = "0b6c7d8e-1111-4222-8333-444455556666";
        c.claims.get_mut(uid).unwrap().devices[0].share_id = Some("s-1".into());
        c.save(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert!(
            text.contains(FORMAT_SHARES) && text.contains("\"shareId\": \"s-1\""),
            "{text}"
        );
        let shared = Checkpoint::load(dir.path(), DRIVER).unwrap();
        assert_eq!(
            shared.claims[uid].devices[0].share_id.as_deref(),
            Some("s-1")
        );
        // The share unprepared: back to v2, the bytes of before.
        c.claims.get_mut(uid).unwrap().devices[0].share_id = None;
        c.save(dir.path()).unwrap();
        assert_eq!(std::fs::read(dir.path().join(FILE)).unwrap(), before);
    }
}
