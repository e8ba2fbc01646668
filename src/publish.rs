//! The only code that writes: atomic file replacement and the state folder.
//!
//! A write goes to a dot-named temp file in the target folder (NFD ignores
//! dot-files, and the rename stays on one filesystem), is fsynced, renamed over
//! the target, and the folder is fsynced so the rename survives a crash. A
//! reader sees the old file or the new one, never a partial one.

use crate::cdi::{self, Family};
use crate::record::NodeRecord;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use tracing::{info, warn};

/// Why a write did not happen; each names the file or folder.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// A file-system step failed: `{step} {path}`, with the cause beneath.
    #[error("{step} {}", path.display())]
    Io {
        /// What was being done (`creating`, `writing`, `renaming into` …).
        step: &'static str,
        /// The file or folder it was done to.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A folder that takes nothing until this process restarts.
    #[error("{0}; nothing published")]
    StaleFolder(String),
    /// A folder that refuses new files: nothing was written anywhere.
    #[error("{} does not take new files; nothing published", path.display())]
    Refused {
        /// The folder.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// CDI families whose spec could not be generated (each previous file kept).
    #[error("CDI specs not written: {}", .0.join(" | "))]
    CdiNotWritten(Vec<String>),
}

/// A `PublishError::Io` for `step` on `path`, for `map_err`.
fn io<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> PublishError + 'a {
    move |source| PublishError::Io {
        step,
        path: path.to_path_buf(),
        source,
    }
}

/// The result of a write.
pub type Result<T, E = PublishError> = std::result::Result<T, E>;

/// The file in `--state-dir` holding the last published record.
pub const STATE_FILE: &str = "record.json";

/// The mode of every file written: readable by the unprivileged readers
/// (nfd-worker's image, CDI loaders), writable by none of them.
pub const FILE_MODE: u32 = 0o644;

/// Replaces `dir/name` with `bytes` atomically, as a [`FILE_MODE`] file.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let target = dir.join(name);
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .tempfile_in(dir)
        .map_err(io("creating a temp file in", dir))?;
    // The temp file is created 0600; the mode is set before the rename, so
    // the published name never points at a file its readers cannot open.
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(FILE_MODE))
        .and_then(|_| tmp.write_all(bytes))
        .and_then(|_| tmp.as_file().sync_all())
        .map_err(io("writing", tmp.path()))?;
    tmp.persist(&target)
        .map_err(|e| io("renaming into", &target)(e.error))?;
    // Make the rename itself durable; a failure here is not worth failing the pass.
    if let Err(e) = fs::File::open(dir).and_then(|d| d.sync_all()) {
        warn!("fsync of {} failed: {e}", dir.display());
    }
    Ok(target)
}

/// Makes sure every folder a pass will write into exists and takes a new
/// file, before anything is written: a pass that would fail on its second
/// folder must not have replaced the first folder's file already.
pub fn check_folders(dirs: &[(&str, &Path)]) -> Result<()> {
    if let Some(why) = stale_folder(dirs) {
        return Err(PublishError::StaleFolder(why));
    }
    for (_, dir) in dirs {
        fs::create_dir_all(dir).map_err(io("creating", dir))?;
        tempfile::Builder::new()
            .prefix(".nodefabric-check.")
            .tempfile_in(dir)
            .map_err(|source| PublishError::Refused {
                path: dir.to_path_buf(),
                source,
            })?;
    }
    Ok(())
}

/// Why one of `dirs` (each with what it is for: "the CDI folder") can take
/// nothing until this process restarts: it was deleted on the host while
/// mounted here (see [`crate::mounts`]).
pub fn stale_folder(dirs: &[(&str, &Path)]) -> Option<String> {
    dirs.iter()
        .find(|(_, d)| crate::mounts::deleted_in_place(d))
        .map(|(what, d)| crate::mounts::stale_reason(what, d))
}

/// The largest file of our own (a record, a spec, the feature file) read
/// back: far past what 10,000 endpoints write, and a bound on what a file
/// planted in our place can cost.
pub const MAX_OWN_FILE: u64 = 256 << 20;

/// Reads the previous record from the state folder; a missing or unreadable
/// one is logged and treated as none (it only carries `firstSeen` times).
pub fn load_previous(state_dir: Option<&Path>) -> Option<NodeRecord> {
    let path = state_dir?.join(STATE_FILE);
    // Bounded, and never a FIFO: something planted there must not stall
    // every later pass.
    let text = match crate::input::read_text(
        &path,
        MAX_OWN_FILE,
        "a node record",
        crate::input::Pipes::Refuse,
    ) {
        Ok(t) => t,
        Err(crate::input::InputError::Io { cause, .. })
            if cause.kind() == std::io::ErrorKind::NotFound =>
        {
            return None
        }
        Err(e) => {
            // The error names the path.
            warn!("ignoring the previous record: {e}");
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
    // What cannot be read as a file (a FIFO, a folder, something huge) is
    // simply replaced.
    let old = crate::input::read_bytes(
        &dir.join(name),
        MAX_OWN_FILE,
        "a file of ours",
        crate::input::Pipes::Refuse,
    );
    if old.is_ok_and(|old| old == bytes) {
        return Ok(false);
    }
    write_atomic(dir, name, bytes)?;
    Ok(true)
}

/// Writes one CDI spec per family into `dir`: changed specs are replaced
/// atomically, a family with no endpoints has its file removed, and a family
/// that cannot be generated keeps its previous file (the pass then fails).
/// Files of other tools are never touched: only our own names are written.
pub fn publish_cdi(dir: &Path, record: &NodeRecord) -> Result<()> {
    fs::create_dir_all(dir).map_err(io("creating", dir))?;
    let mut failed = Vec::new();
    for family in Family::ALL {
        let name = family.file_name();
        match cdi::spec(record, family) {
            Ok(Some(spec)) => {
                if write_if_changed(dir, name, &cdi::to_bytes(&spec))? {
                    info!("wrote {}", dir.join(name).display());
                }
            }
            Ok(None) => match fs::remove_file(dir.join(name)) {
                Ok(()) => info!("removed {}: no endpoints left", dir.join(name).display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("removing", &dir.join(name))(e)),
            },
            // Reported once, by the pass's error; the previous file stays.
            Err(e) => failed.push(format!("{} kept: {e}", dir.join(name).display())),
        }
    }
    if !failed.is_empty() {
        return Err(PublishError::CdiNotWritten(failed));
    }
    Ok(())
}
