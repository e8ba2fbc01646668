//! The rail record `nodefabric publish --rails-file` writes, read by the
//! driver for the `rail` attribute: re-read only when its file changed, and
//! the last good record kept while the file cannot be read (a rail that
//! flickers with a half-written file would move devices between claims'
//! selectors).

use crate::kubelet::specs::file::Fingerprint;
use crate::rails::RailRecord;
use std::path::PathBuf;

/// A rail record larger than this is refused: a node's rails fit in far less.
pub const MAX_BYTES: u64 = 4 << 20;

/// One rail-record file and what was last read from it.
#[derive(Debug)]
pub struct RailsFile {
    path: PathBuf,
    /// The file's fingerprint at the last read: the one the CDI specs use,
    /// so a rewrite within one mtime tick is seen by its change time.
    seen: Option<Fingerprint>,
    record: Option<RailRecord>,
    error: Option<String>,
}

impl RailsFile {
    /// The rail record at `path`, not read yet.
    pub fn new(path: PathBuf) -> RailsFile {
        RailsFile {
            path,
            seen: None,
            record: None,
            error: None,
        }
    }

    /// Re-reads the file if it changed since the last look; true when the
    /// record taken from it changed. A missing file means no rails (the
    /// publisher found none or has not run yet). Blocking: call it off the
    /// async runtime.
    pub fn look(&mut self) -> bool {
        let meta = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.seen = None;
                self.error = None;
                return self.record.take().is_some();
            }
            Err(e) => {
                self.error = Some(format!("{}: {e}", self.path.display()));
                return false;
            }
        };
        let stamp = Fingerprint::of(&meta);
        if self.seen == Some(stamp) {
            return false;
        }
        let read = crate::input::read_bytes(
            &self.path,
            MAX_BYTES,
            "the rail record",
            crate::input::Pipes::Refuse,
        )
        .map_err(|e| e.to_string())
        .and_then(|bytes| {
            serde_json::from_slice::<RailRecord>(&bytes)
                .map_err(|e| format!("{}: not a rail record: {e}", self.path.display()))
        });
        self.seen = Some(stamp);
        match read {
            Ok(record) => {
                self.error = None;
                let changed = self.record.as_ref() != Some(&record);
                self.record = Some(record);
                changed
            }
            // The last good record stays.
            Err(e) => {
                self.error = Some(format!("{e}; keeping the rails last read"));
                false
            }
        }
    }

    /// The last good record, if any.
    pub fn record(&self) -> Option<&RailRecord> {
        self.record.as_ref()
    }

    /// Why the file could not be read at the last look.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_rail_record_keeps_the_last_good_one_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rails.json");
        let mut f = RailsFile::new(path.clone());
        assert!(!f.look());
        assert!(f.record().is_none() && f.error().is_none());
        let good = serde_json::json!({
            "version": crate::rails::RAIL_RECORD_FORMAT, "nodeUID": "", "railSource": "host-lldp",
            "nics": {"0000:3b:00.0": ["rail0"]}, "gpus": []
        });
        std::fs::write(&path, serde_json::to_vec(&good).unwrap()).unwrap();
        assert!(f.look());
        assert_eq!(f.record().unwrap().nics["0000:3b:00.0"], ["rail0"]);
        // Written before records carried `railIndex`: read, with no index.
        assert!(f.record().unwrap().rail_index.is_empty());
        std::fs::write(&path, b"{\"version\": ").unwrap();
        assert!(!f.look());
        assert_eq!(f.record().unwrap().nics["0000:3b:00.0"], ["rail0"]);
        assert!(f.error().unwrap().contains("rails.json"), "{:?}", f.error());
    }
}
