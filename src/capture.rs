//! `nodefabric capture`: the sysfs entries one discovery pass read, packed
//! into a tar.gz that `--sysfs-root` reads back, so a node's view can be
//! attached to a bug report and replayed byte for byte.
//!
//! Only what the pass touched goes in: the files it read (their bytes), the
//! symlinks it followed or listed (their target text), the directories it
//! walked or listed, and, for a file it only tested for, an empty file of the
//! same name. Nothing else of the host is copied.

use crate::sysfs::{Entry, Recorded};
use anyhow::{bail, Context, Result};
use flate2::{read::GzDecoder, write::GzEncoder, Compression};
use std::collections::BTreeSet;
use std::path::{Component, Path};

/// The archive's top folder; replay reads the tree under it.
pub const TOP: &str = "sysfs";

/// Packs the recorded entries into gzip-compressed tar bytes. Entries are
/// sorted with their parent folders first, and every header carries fixed
/// owner, mode and time, so the same tree gives the same bytes.
pub fn pack(recorded: &Recorded) -> Result<Vec<u8>> {
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
    tar.mode(tar::HeaderMode::Deterministic);
    let header = |kind: tar::EntryType, mode: u32, size: u64| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        h
    };
    let mut h = header(tar::EntryType::Directory, 0o755, 0);
    tar.append_data(&mut h, TOP, std::io::empty())?;
    for d in &dirs {
        let mut h = header(tar::EntryType::Directory, 0o755, 0);
        tar.append_data(&mut h, format!("{TOP}/{d}"), std::io::empty())?;
    }
    for (path, entry) in recorded {
        let name = format!("{TOP}/{path}");
        match entry {
            Entry::Dir => {}
            Entry::Link(target) => {
                let mut h = header(tar::EntryType::Symlink, 0o777, 0);
                tar.append_link(&mut h, &name, target).with_context(|| format!("archiving link {path}"))?;
            }
            Entry::File(bytes) => {
                let mut h = header(tar::EntryType::Regular, 0o444, bytes.len() as u64);
                tar.append_data(&mut h, &name, bytes.as_slice()).with_context(|| format!("archiving {path}"))?;
            }
            Entry::Placeholder => {
                let mut h = header(tar::EntryType::Regular, 0o444, 0);
                tar.append_data(&mut h, &name, std::io::empty())?;
            }
        }
    }
    let gz = tar.into_inner()?;
    Ok(gz.finish()?)
}

/// True for a path `--sysfs-root` should treat as a capture archive.
pub fn is_archive(path: &Path) -> bool {
    path.is_file()
}

/// Unpacks a capture into a fresh temporary folder and returns it with the
/// tree's path. Entries that would land outside the folder are refused.
pub fn unpack(archive: &Path) -> Result<(tempfile::TempDir, std::path::PathBuf)> {
    let file = std::fs::File::open(archive).with_context(|| format!("opening {}", archive.display()))?;
    let dir = tempfile::Builder::new().prefix("nodefabric-replay.").tempdir()?;
    let mut tar = tar::Archive::new(GzDecoder::new(file));
    for entry in tar.entries().with_context(|| format!("{} is not a tar.gz capture", archive.display()))? {
        let mut entry = entry.with_context(|| format!("{} is not a tar.gz capture", archive.display()))?;
        let path = entry.path()?.into_owned();
        if path.components().any(|c| !matches!(c, Component::Normal(_))) {
            bail!("{}: entry {} is not a plain relative path", archive.display(), path.display());
        }
        entry.unpack_in(dir.path()).with_context(|| format!("unpacking {}", path.display()))?;
    }
    let tree = dir.path().join(TOP);
    if !tree.is_dir() {
        bail!("{}: no {TOP}/ folder: not a nodefabric capture", archive.display());
    }
    Ok((dir, tree))
}
