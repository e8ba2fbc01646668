//! `nodefabric capture`: the sysfs entries one discovery pass read, packed
//! into a tar.gz that `--sysfs-root` reads back, so a node's view can be
//! attached to a bug report and replayed byte for byte.
//!
//! Only what the pass touched goes in: the files it read (their bytes), the
//! symlinks it followed or listed (their target text), the directories it
//! walked or listed, and, for a file it only tested for, an empty file of the
//! same name. Nothing else of the host is copied.
//!
//! Replay ([`replay`]) treats an archive as hostile input.

mod cleanup;
pub mod errors;
pub mod limits;
pub mod links;
pub mod replay;

pub use errors::{Fault, PackError, ReplayError, VendorError};
pub use limits::Limits;
pub use replay::{unpack, Replay};

use crate::escape;
use crate::sysfs::{Entry, Recorded};
use flate2::{write::GzEncoder, Compression};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The archive's top folder; replay reads the tree under it.
pub const TOP: &str = "sysfs";

/// The archive's folder for the vendor answers the pass used
/// ([`crate::fabric::answers`]) and the rail answers it read
/// ([`crate::rails::answers`]), beside the tree.
pub const VENDOR: &str = "vendor";

/// The top folders a capture may hold; any other name is refused. Each must
/// be a folder, so that no top name can be a link to the host's own tree.
/// Here beside the names, not in `replay`, because `errors` names them too
/// and `replay` uses `errors`: no circle between the two.
pub(crate) const TOPS: &[&str] = &[TOP, VENDOR];

/// A packed capture, with what a replay's caps count.
#[derive(Debug)]
pub struct Packed {
    /// The gzip-compressed tar bytes.
    pub bytes: Vec<u8>,
    /// Its entries, as `--replay-max-entries` counts them.
    pub entries: u64,
    /// Its entries' sizes added up, as `--replay-max-bytes` counts them.
    pub unpacked: u64,
}

/// Packs the recorded entries, the vendor answers the pass used and its
/// rail answers into gzip-compressed tar bytes. Entries are sorted with their parent folders
/// first, and every header carries fixed owner, mode and time, so the same
/// tree gives the same bytes.
pub fn pack(
    recorded: &Recorded,
    answers: &crate::fabric::answers::Answers,
    rails: &crate::rails::RailAnswers,
) -> Result<Packed, PackError> {
    // Every ancestor of an entry must exist as a folder on replay.
    let mut dirs: BTreeSet<String> = BTreeSet::new();
    for (path, entry) in recorded {
        let mut p = Path::new(path).parent();
        while let Some(d) = p.filter(|d| !d.as_os_str().is_empty()) {
            dirs.insert(d.to_string_lossy().into_owned());
            p = d.parent();
        }
        if *entry == Entry::Dir {
            dirs.insert(path.clone());
        }
    }
    let mut tar = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::default()));
    let (mut entries, mut unpacked) = (0u64, 0u64);
    tar.mode(tar::HeaderMode::Deterministic);
    let mut header = |kind: tar::EntryType, mode: u32, size: u64| {
        entries += 1;
        unpacked += size;
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        h
    };
    let failed = |path: &str| {
        let path = path.to_string();
        move |source| PackError::Entry { path, source }
    };
    // The archive holds the names' bytes, not their text: a replay lists
    // them as the host did.
    let in_tree = |text: &str| match escape::text_path(text) {
        Some(p) => Ok(Path::new(TOP).join(p)),
        None => Err(failed(text)(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not the text of a path",
        ))),
    };
    let mut h = header(tar::EntryType::Directory, 0o755, 0);
    tar.append_data(&mut h, TOP, std::io::empty())
        .map_err(failed(TOP))?;
    for d in &dirs {
        let mut h = header(tar::EntryType::Directory, 0o755, 0);
        tar.append_data(&mut h, in_tree(d)?, std::io::empty())
            .map_err(failed(d))?;
    }
    for (path, entry) in recorded {
        let name = in_tree(path)?;
        match entry {
            Entry::Dir => {}
            Entry::Link(target) => {
                let mut h = header(tar::EntryType::Symlink, 0o777, 0);
                let target = stored_target(path, target, recorded);
                let link = |source| PackError::Link {
                    path: path.clone(),
                    source,
                };
                let target = escape::text_path(&target).ok_or_else(|| {
                    link(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("its target {target:?} is not the text of a path"),
                    ))
                })?;
                tar.append_link(&mut h, &name, target).map_err(link)?;
            }
            Entry::File(bytes) => {
                let mut h = header(tar::EntryType::Regular, 0o444, bytes.len() as u64);
                tar.append_data(&mut h, &name, bytes.as_slice())
                    .map_err(failed(path))?;
            }
            Entry::Placeholder => {
                let mut h = header(tar::EntryType::Regular, 0o444, 0);
                tar.append_data(&mut h, &name, std::io::empty())
                    .map_err(failed(path))?;
            }
        }
    }
    let mut h = header(tar::EntryType::Directory, 0o755, 0);
    tar.append_data(&mut h, VENDOR, std::io::empty())
        .map_err(failed(VENDOR))?;
    for (file, bytes) in [
        (crate::fabric::answers::FILE, answers.to_bytes()),
        (crate::rails::answers::FILE, rails.to_bytes()),
    ] {
        let mut h = header(tar::EntryType::Regular, 0o444, bytes.len() as u64);
        let name = format!("{VENDOR}/{file}");
        tar.append_data(&mut h, &name, bytes.as_slice())
            .map_err(failed(&name))?;
    }
    let gz = tar.into_inner().map_err(PackError::Finish)?;
    let bytes = gz.finish().map_err(PackError::Finish)?;
    Ok(Packed {
        bytes,
        entries,
        unpacked,
    })
}

/// The target a link is archived with: its own text when it stays inside the
/// tree, else `..` up to the archive's top, outside `sysfs/`. A replay
/// refuses links that leave the unpack folder, and this one does not, yet
/// reading through it still lands outside the sysfs root, as it did live.
fn stored_target(path: &str, target: &str, recorded: &Recorded) -> String {
    let read_link = |p: &Path| match recorded.get(p.to_str()?) {
        Some(Entry::Link(t)) => Some(PathBuf::from(t)),
        _ => None,
    };
    match links::check(Path::new(path), Path::new(target), read_link) {
        Ok(()) => target.to_string(),
        Err(fault) => {
            let depth = Path::new(path).components().count();
            tracing::warn!("{path}: {fault}; archived as a link out of the {TOP}/ folder");
            vec![".."; depth].join("/")
        }
    }
}

/// True for a path `--sysfs-root` should treat as a capture archive.
pub fn is_archive(path: &Path) -> bool {
    path.is_file()
}
