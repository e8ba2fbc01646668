//! Unpacking a capture for `--sysfs-root FILE.tar.gz`, treating the archive
//! as hostile: it comes from a bug report, not from this machine.
//!
//! Only folders, regular files and symlinks are unpacked, all under the
//! archive's `sysfs/` folder; every link must lead somewhere inside the unpack
//! folder; entries and bytes are capped before anything is written; and the
//! folder goes away on every exit path, SIGINT and SIGTERM included.

use super::cleanup::Folder;
use super::links::{self, LinkFault};
use super::TOP;
use flate2::read::GzDecoder;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

/// Default for `--replay-max-entries`: a large node's capture holds a few
/// thousand entries; a hundred thousand leaves room without inviting abuse.
pub const DEFAULT_MAX_ENTRIES: u64 = 100_000;

/// Default for `--replay-max-bytes`: captures are attributes of a page or
/// less each, so a real one is a few MiB at most.
pub const DEFAULT_MAX_BYTES: u64 = 256 * MIB;

/// The most header bytes (long names, pax records) one entry may carry: the
/// tar reader buffers them whole, so without a bound a tiny archive could
/// make it allocate gigabytes before any cap is checked.
pub const MAX_HEADER_BYTES: u64 = 64 * 1024;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

/// The range `--replay-max-entries` accepts.
const ENTRIES_RANGE: std::ops::RangeInclusive<u64> = 1..=10_000_000;

/// The range `--replay-max-bytes` accepts.
const BYTES_RANGE: std::ops::RangeInclusive<u64> = KIB..=64 * GIB;

/// How much of an archive a replay may unpack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most entries (folders, files, links).
    pub max_entries: u64,
    /// The most bytes, summed over every entry's size.
    pub max_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entries: DEFAULT_MAX_ENTRIES,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// Parses `--replay-max-entries`: a whole number in [`ENTRIES_RANGE`].
pub fn parse_max_entries(s: &str) -> Result<u64, String> {
    let n: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a whole number of entries"))?;
    in_range(n, &ENTRIES_RANGE, "entries")
}

/// Parses `--replay-max-bytes`: a whole number of bytes, optionally with a
/// binary unit (`B`, `KiB`, `MiB`, `GiB`), in [`BYTES_RANGE`].
pub fn parse_max_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let scale = match unit.trim() {
        "" | "B" => 1,
        "KiB" => KIB,
        "MiB" => MIB,
        "GiB" => GIB,
        _ => {
            return Err(format!(
                "{s:?}: expected a number of bytes with an optional unit B, KiB, MiB or GiB"
            ))
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a whole number of bytes"))?;
    let bytes = n
        .checked_mul(scale)
        .ok_or_else(|| format!("{s:?} is too large"))?;
    in_range(bytes, &BYTES_RANGE, "bytes")
}

fn in_range(n: u64, range: &std::ops::RangeInclusive<u64>, what: &str) -> Result<u64, String> {
    if range.contains(&n) {
        Ok(n)
    } else {
        Err(format!(
            "{n} {what} is out of range ({}..={})",
            range.start(),
            range.end()
        ))
    }
}

/// Why an entry was refused; the archive and entry are named by [`ReplayError`].
#[derive(Debug, thiserror::Error)]
pub enum Fault {
    /// An absolute name, or one with `..` or `.` components.
    #[error("not a plain relative path")]
    NotRelative,
    /// A name outside the archive's top folder.
    #[error("outside the {TOP}/ folder")]
    OutsideTop,
    /// The top folder itself as a file or link (`sysfs -> /sys`).
    #[error("the top {TOP} must be a folder")]
    TopNotFolder,
    /// A hard link: it could tie a replayed name to a file elsewhere.
    #[error("a hard link (to {target:?}), which a capture never holds")]
    HardLink {
        /// The name it links to.
        target: String,
    },
    /// A device node, FIFO or any other kind a capture never holds.
    #[error("{kind}, which a capture never holds (only folders, regular files and symlinks)")]
    Kind {
        /// The kind, in words.
        kind: String,
    },
    /// The same name twice (a folder named again is no harm and passes).
    #[error("appears twice")]
    Duplicate,
    /// An entry whose folder is a link or file in the archive: writing it
    /// would follow the link.
    #[error("lies under {parent:?}, which is not a folder")]
    UnderNonFolder {
        /// The archive's entry in the way.
        parent: String,
    },
    /// A symlink with an empty target.
    #[error("a symlink with an empty target")]
    EmptyTarget,
    /// A symlink that leads outside the unpack folder.
    #[error("a symlink that leaves the unpack folder: {0}")]
    Link(LinkFault),
}

/// Why a capture could not be replayed; each names the archive and, where
/// one is at fault, the entry.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The archive could not be opened.
    #[error("opening {}", archive.display())]
    Open {
        /// The archive.
        archive: PathBuf,
        /// The failure.
        source: io::Error,
    },
    /// Not gzip, not tar, or damaged.
    #[error("{} is not a tar.gz capture", archive.display())]
    NotACapture {
        /// The archive.
        archive: PathBuf,
        /// What the reader met.
        source: io::Error,
    },
    /// An entry refused for what it is.
    #[error("{}: entry {entry:?} refused: {fault}", archive.display())]
    Refused {
        /// The archive.
        archive: PathBuf,
        /// The entry's name as stored.
        entry: String,
        /// Why.
        fault: Fault,
    },
    /// More entries than `--replay-max-entries`.
    #[error("{}: more than {limit} entries (at {entry:?}); --replay-max-entries raises the limit", archive.display())]
    TooManyEntries {
        /// The archive.
        archive: PathBuf,
        /// The first entry past the limit.
        entry: String,
        /// The limit.
        limit: u64,
    },
    /// More bytes than `--replay-max-bytes`.
    #[error("{}: entry {entry:?} ({size} bytes) takes the unpacked size past {limit} bytes; --replay-max-bytes raises the limit", archive.display())]
    TooLarge {
        /// The archive.
        archive: PathBuf,
        /// The entry that went past the limit.
        entry: String,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// Header data (long names, pax records) over [`MAX_HEADER_BYTES`].
    #[error("{}: the header after entry {after:?} is over {MAX_HEADER_BYTES} bytes", archive.display())]
    HeaderTooLarge {
        /// The archive.
        archive: PathBuf,
        /// The last entry read before it ("" at the start).
        after: String,
    },
    /// The archive holds no top folder.
    #[error("{}: no {TOP}/ folder: not a nodefabric capture", archive.display())]
    NoTree {
        /// The archive.
        archive: PathBuf,
    },
    /// The temp folder could not be made.
    #[error("creating a replay folder in {}", dir.display())]
    TempFolder {
        /// The temp folder it was to go in.
        dir: PathBuf,
        /// The failure.
        source: io::Error,
    },
    /// Writing an entry failed.
    #[error("{}: entry {entry:?}: writing {}", archive.display(), path.display())]
    Write {
        /// The archive.
        archive: PathBuf,
        /// The entry.
        entry: String,
        /// Where it was being written.
        path: PathBuf,
        /// The failure.
        source: io::Error,
    },
}

/// An unpacked capture: the tree to read, and the folder that holds it,
/// removed when this is dropped (or when SIGINT/SIGTERM ends the process).
#[derive(Debug)]
pub struct Replay {
    folder: Folder,
}

impl Replay {
    /// The replayed sysfs tree (the archive's `sysfs/` folder).
    pub fn tree(&self) -> PathBuf {
        self.folder.path().join(TOP)
    }
}

/// The decompressed stream, cut off where the bytes the current entry may
/// still use run out: the tar reader reads a long name whole into memory, so
/// the bound has to sit below it.
struct Metered<R> {
    inner: R,
    meter: Rc<Meter>,
}

/// How far the stream was read and where it must stop.
#[derive(Default)]
struct Meter {
    read: Cell<u64>,
    limit: Cell<u64>,
    tripped: Cell<bool>,
}

impl<R: Read> Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.meter.limit.get().saturating_sub(self.meter.read.get());
        if left == 0 && !buf.is_empty() {
            self.meter.tripped.set(true);
            return Err(io::Error::other("entry header over the size bound"));
        }
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.meter.read.set(self.meter.read.get() + n as u64);
        Ok(n)
    }
}

/// What an unpacked name is, for checking later entries and links.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    Folder,
    File,
    Link(PathBuf),
}

/// Unpacks a capture into a fresh `nodefabric-replay.*` folder under the
/// temp folder, refusing anything a capture never holds, and returns it.
/// On any error the folder is already gone.
pub fn unpack(archive: &Path, limits: &Limits) -> Result<Replay, ReplayError> {
    let file = fs::File::open(archive).map_err(|source| ReplayError::Open {
        archive: archive.to_path_buf(),
        source,
    })?;
    let folder =
        Folder::create("nodefabric-replay.").map_err(|source| ReplayError::TempFolder {
            dir: std::env::temp_dir(),
            source,
        })?;
    let mut unpacker = Unpacker {
        archive,
        limits,
        folder: &folder,
        unpacked: BTreeMap::new(),
        bytes: 0,
    };
    unpacker.run(file)?;
    unpacker.check_links()?;
    if unpacker.unpacked.get(Path::new(TOP)) != Some(&Kind::Folder) {
        return Err(ReplayError::NoTree {
            archive: archive.to_path_buf(),
        });
    }
    Ok(Replay { folder })
}

/// One unpacking in progress.
struct Unpacker<'a> {
    archive: &'a Path,
    limits: &'a Limits,
    folder: &'a Folder,
    /// Every name written so far, relative to the folder.
    unpacked: BTreeMap<PathBuf, Kind>,
    /// Bytes counted against [`Limits::max_bytes`] so far.
    bytes: u64,
}

impl Unpacker<'_> {
    fn refused(&self, entry: &str, fault: Fault) -> ReplayError {
        ReplayError::Refused {
            archive: self.archive.to_path_buf(),
            entry: entry.to_string(),
            fault,
        }
    }

    fn not_a_capture(&self, source: io::Error) -> ReplayError {
        ReplayError::NotACapture {
            archive: self.archive.to_path_buf(),
            source,
        }
    }

    fn run(&mut self, file: fs::File) -> Result<(), ReplayError> {
        let meter = Rc::new(Meter::default());
        meter.limit.set(MAX_HEADER_BYTES);
        let stream = Metered {
            inner: GzDecoder::new(io::BufReader::new(file)),
            meter: meter.clone(),
        };
        let mut tar = tar::Archive::new(stream);
        let mut last = String::new();
        let mut count: u64 = 0;
        let entries = tar.entries().map_err(|e| self.not_a_capture(e))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| match meter.tripped.get() {
                true => ReplayError::HeaderTooLarge {
                    archive: self.archive.to_path_buf(),
                    after: last.clone(),
                },
                false => self.not_a_capture(e),
            })?;
            let path = entry
                .path()
                .map_err(|e| self.not_a_capture(e))?
                .into_owned();
            let name = path.to_string_lossy().into_owned();
            count += 1;
            if count > self.limits.max_entries {
                return Err(ReplayError::TooManyEntries {
                    archive: self.archive.to_path_buf(),
                    entry: name,
                    limit: self.limits.max_entries,
                });
            }
            // Every entry's size counts, whatever its kind: the reader skips
            // a refused entry's data, and that is decompression work too.
            let size = entry.size();
            if size > self.limits.max_bytes - self.bytes {
                return Err(ReplayError::TooLarge {
                    archive: self.archive.to_path_buf(),
                    entry: name,
                    size,
                    limit: self.limits.max_bytes,
                });
            }
            self.bytes += size;
            // This entry's data, its padding and the next entry's headers.
            meter
                .limit
                .set(meter.read.get() + size + 512 + MAX_HEADER_BYTES);
            self.one(&mut entry, &path, &name)?;
            last = name;
        }
        Ok(())
    }

    /// Checks one entry and writes it.
    fn one<R: Read>(
        &mut self,
        entry: &mut tar::Entry<R>,
        path: &Path,
        name: &str,
    ) -> Result<(), ReplayError> {
        if path.as_os_str().is_empty()
            || !path.components().all(|c| matches!(c, Component::Normal(_)))
        {
            return Err(self.refused(name, Fault::NotRelative));
        }
        if path.components().next() != Some(Component::Normal(std::ffi::OsStr::new(TOP))) {
            return Err(self.refused(name, Fault::OutsideTop));
        }
        let kind = match entry.header().entry_type() {
            tar::EntryType::Directory => Kind::Folder,
            tar::EntryType::Regular => Kind::File,
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(|e| self.not_a_capture(e))?
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                if target.as_os_str().is_empty() {
                    return Err(self.refused(name, Fault::EmptyTarget));
                }
                if target.has_root() {
                    let target = target.to_string_lossy().into_owned();
                    return Err(self.refused(name, Fault::Link(LinkFault::Absolute { target })));
                }
                Kind::Link(target)
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .ok()
                    .flatten()
                    .map(|t| t.to_string_lossy().into_owned())
                    .unwrap_or_default();
                return Err(self.refused(name, Fault::HardLink { target }));
            }
            other => {
                return Err(self.refused(
                    name,
                    Fault::Kind {
                        kind: kind_in_words(other),
                    },
                ))
            }
        };
        if path == Path::new(TOP) && kind != Kind::Folder {
            return Err(self.refused(name, Fault::TopNotFolder));
        }
        match self.unpacked.get(path) {
            // A folder named again (or after its contents) changes nothing.
            Some(Kind::Folder) if kind == Kind::Folder => return Ok(()),
            Some(_) => return Err(self.refused(name, Fault::Duplicate)),
            None => {}
        }
        // Folders the archive leaves out are made; a link or file in the way is refused.
        let _hold = self.folder.hold();
        let ancestors: Vec<&Path> = path
            .ancestors()
            .skip(1)
            .filter(|a| !a.as_os_str().is_empty())
            .collect();
        for dir in ancestors.into_iter().rev() {
            match self.unpacked.get(dir) {
                Some(Kind::Folder) => {}
                Some(_) => {
                    return Err(self.refused(
                        name,
                        Fault::UnderNonFolder {
                            parent: dir.to_string_lossy().into_owned(),
                        },
                    ));
                }
                None => {
                    self.write(name, dir, &Kind::Folder, entry)?;
                    self.unpacked.insert(dir.to_path_buf(), Kind::Folder);
                }
            }
        }
        self.write(name, path, &kind, entry)?;
        self.unpacked.insert(path.to_path_buf(), kind);
        Ok(())
    }

    /// Creates `path` (inside the folder, its parents already folders made
    /// here) as `kind`. Modes are fixed, never taken from the archive: the
    /// tree is read-only content, and its folders must stay removable.
    fn write<R: Read>(
        &self,
        name: &str,
        path: &Path,
        kind: &Kind,
        entry: &mut tar::Entry<R>,
    ) -> Result<(), ReplayError> {
        let dest = self.folder.path().join(path);
        let failed = |source| ReplayError::Write {
            archive: self.archive.to_path_buf(),
            entry: name.to_string(),
            path: dest.clone(),
            source,
        };
        match kind {
            Kind::Folder => fs::DirBuilder::new()
                .mode(0o755)
                .create(&dest)
                .map_err(failed),
            Kind::Link(target) => std::os::unix::fs::symlink(target, &dest).map_err(failed),
            Kind::File => {
                let mut out = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o444)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&dest)
                    .map_err(failed)?;
                let size = entry.size();
                let copied = io::copy(&mut entry.take(size), &mut out).map_err(failed)?;
                if copied != size {
                    return Err(failed(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("{copied} of {size} bytes in the archive"),
                    )));
                }
                Ok(())
            }
        }
    }

    /// Walks every unpacked link as the kernel would, now that all are in place.
    fn check_links(&self) -> Result<(), ReplayError> {
        let read_link = |p: &Path| match self.unpacked.get(p) {
            Some(Kind::Link(t)) => Some(t.clone()),
            _ => None,
        };
        for (path, kind) in &self.unpacked {
            if let Kind::Link(target) = kind {
                links::check(path, target, read_link)
                    .map_err(|f| self.refused(&path.to_string_lossy(), Fault::Link(f)))?;
            }
        }
        Ok(())
    }
}

/// An entry kind a capture never holds, in words for the error.
fn kind_in_words(kind: tar::EntryType) -> String {
    match kind {
        tar::EntryType::Char => "a character device".into(),
        tar::EntryType::Block => "a block device".into(),
        tar::EntryType::Fifo => "a FIFO".into(),
        tar::EntryType::Continuous => "a contiguous file".into(),
        tar::EntryType::GNUSparse => "a sparse file".into(),
        other => format!("an entry of type {:?}", char::from(other.as_byte())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tar.gz of `(name, Some(text))` files and `(name, None)` folders, in order.
    fn archive(dir: &Path, entries: &[(&str, Option<&str>)]) -> PathBuf {
        let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
        for (name, text) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(if text.is_some() { tar::EntryType::Regular } else { tar::EntryType::Directory });
            h.set_size(text.map_or(0, |t| t.len() as u64));
            h.set_mode(0o000);
            tar.append_data(&mut h, name, text.unwrap_or("").as_bytes()).unwrap();
        }
        let path = dir.join("a.tar.gz");
        fs::write(&path, tar.into_inner().unwrap().finish().unwrap()).unwrap();
        path
    }

    #[test]
    fn a_folder_named_after_its_contents_is_not_a_duplicate() {
        let dir = tempfile::tempdir().unwrap();
        let a = archive(dir.path(), &[("sysfs/class/net/x", Some("1\n")), ("sysfs", None), ("sysfs/class", None)]);
        let replay = unpack(&a, &Limits::default()).unwrap();
        assert_eq!(fs::read_to_string(replay.tree().join("class/net/x")).unwrap(), "1\n");
    }

    #[test]
    fn archive_modes_are_not_applied_to_the_replayed_tree() {
        // Every header says mode 000: kept, a non-root replay could neither
        // read the tree nor remove its folder.
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let a = archive(dir.path(), &[("sysfs", None), ("sysfs/class", None), ("sysfs/class/x", Some("1"))]);
        let replay = unpack(&a, &Limits::default()).unwrap();
        let mode = |p: PathBuf| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        // Compared under the umask's reach: owner bits only where it may bite.
        assert_eq!(mode(replay.tree()) & 0o700, 0o700);
        assert_eq!(mode(replay.tree().join("class")) & 0o700, 0o700);
        assert_eq!(mode(replay.tree().join("class/x")) & 0o7600, 0o400);
        let folder = replay.tree().parent().unwrap().to_path_buf();
        drop(replay);
        assert!(!folder.exists(), "{} left behind", folder.display());
    }

    #[test]
    fn an_archive_without_the_top_folder_is_not_a_capture() {
        let dir = tempfile::tempdir().unwrap();
        let a = archive(dir.path(), &[]);
        let err = unpack(&a, &Limits::default()).unwrap_err();
        assert!(matches!(err, ReplayError::NoTree { .. }), "{err}");
    }

    #[test]
    fn the_help_default_for_max_bytes_is_the_cap_the_code_uses() {
        // cli.rs spells the default as text for --help; it must mean this.
        assert_eq!(parse_max_bytes("256MiB"), Ok(DEFAULT_MAX_BYTES));
    }

    #[test]
    fn byte_sizes_take_binary_units() {
        assert_eq!(parse_max_bytes("4096"), Ok(4096));
        assert_eq!(parse_max_bytes("2 KiB"), Ok(2048));
        assert_eq!(parse_max_bytes("1GiB"), Ok(GIB));
    }

    #[test]
    fn zero_negative_overflowing_and_unknown_sizes_are_refused() {
        for bad in [
            "0",
            "-1",
            "12",
            "65GiB",
            "99999999999999999999",
            "18446744073709551615GiB",
            "1MB",
            "1.5MiB",
            "MiB",
            "",
        ] {
            assert!(parse_max_bytes(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn zero_and_absurd_entry_counts_are_refused() {
        assert_eq!(parse_max_entries("100000"), Ok(DEFAULT_MAX_ENTRIES));
        for bad in ["0", "-5", "10000001", "1e5", "many"] {
            assert!(parse_max_entries(bad).is_err(), "{bad:?} accepted");
        }
    }
}
