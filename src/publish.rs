//! The only code that writes: atomic file replacement and the state folder.
//!
//! A write goes to a dot-named temp file in the target folder (NFD ignores
//! dot-files, and the rename stays on one filesystem), is fsynced, renamed over
//! the target, and the folder is fsynced so the rename survives a crash. A
//! reader sees the old file or the new one, never a partial one.

use crate::record::NodeRecord;
use anyhow::{Context, Result};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use tracing::warn;

/// The file in `--state-dir` holding the last published record.
pub const STATE_RECORD: &str = "record.json";

/// Replaces `dir/name` with `bytes` atomically.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf> {
    let target = dir.join(name);
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .tempfile_in(dir)
        .with_context(|| format!("creating a temp file in {}", dir.display()))?;
    tmp.write_all(bytes)
        .and_then(|_| tmp.as_file().sync_all())
        .with_context(|| format!("writing {}", tmp.path().display()))?;
    tmp.persist(&target)
        .with_context(|| format!("renaming into {}", target.display()))?;
    // Make the rename itself durable; a failure here is not worth failing the pass.
    if let Err(e) = fs::File::open(dir).and_then(|d| d.sync_all()) {
        warn!("fsync of {} failed: {e}", dir.display());
    }
    Ok(target)
}

/// Reads the previous record from the state folder; a missing or unreadable
/// one is logged and treated as none (it only carries `firstSeen` times).
pub fn load_previous(state_dir: Option<&Path>) -> Option<NodeRecord> {
    let path = state_dir?.join(STATE_RECORD);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            warn!("ignoring previous record {}: {e}", path.display());
            return None;
        }
    };
    match serde_json::from_str(&text) {
        Ok(r) => Some(r),
        Err(e) => {
            warn!("ignoring previous record {}: {e}", path.display());
            None
        }
    }
}

/// Writes bytes only when they differ from what the file holds; returns
/// whether it wrote.
pub fn write_if_changed(dir: &Path, name: &str, bytes: &[u8]) -> Result<bool> {
    if fs::read(dir.join(name)).is_ok_and(|old| old == bytes) {
        return Ok(false);
    }
    write_atomic(dir, name, bytes)?;
    Ok(true)
}
