//! Unpacking a capture for `--sysfs-root FILE.tar.gz`, treating the archive
//! as hostile: it comes from a bug report, not from this machine.
//!
//! Only folders, regular files and symlinks are unpacked, all under the
//! archive's `sysfs/` folder; every link must lead somewhere inside the unpack
//! folder; entries and bytes are capped before anything is written; and the
//! folder goes away on every exit path, SIGINT and SIGTERM included.

use super::cleanup::Folder;
use super::errors::{Fault, ReplayError, VendorError};
use super::limits::{Limits, MAX_HEADER_BYTES};
use super::links::{self, LinkFault};
use super::{TOP, TOPS, VENDOR};
use flate2::read::GzDecoder;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

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

    /// The vendor answers the captured pass used; `Ok(None)` for an archive
    /// from before captures held them, an error for a file that is not one.
    pub fn answers(&self) -> Result<Option<crate::fabric::answers::Answers>, VendorError> {
        self.vendor_file(crate::fabric::answers::FILE)?
            .map(|bytes| crate::fabric::answers::Answers::from_bytes(&bytes))
            .transpose()
            .map_err(VendorError::Fabric)
    }

    /// The rail answers the captured pass read; `Ok(None)` for an archive
    /// from before captures held them (its replay reads the rail inputs
    /// afresh), an error for a file that is not one.
    pub fn rail_answers(&self) -> Result<Option<crate::rails::RailAnswers>, VendorError> {
        self.vendor_file(crate::rails::answers::FILE)?
            .map(|bytes| crate::rails::RailAnswers::from_bytes(&bytes))
            .transpose()
            .map_err(VendorError::Rails)
    }

    /// The bytes of `vendor/FILE`; `Ok(None)` where the archive has none.
    fn vendor_file(&self, file: &'static str) -> Result<Option<Vec<u8>>, VendorError> {
        let path = self.folder.path().join(VENDOR).join(file);
        match fs::symlink_metadata(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(reason) => return Err(VendorError::Read { file, reason }),
            // Unpack wrote only folders, files and checked links; a link here
            // is still not an answer.
            Ok(m) if !m.is_file() => return Err(VendorError::NotAFile(file)),
            Ok(_) => {}
        }
        fs::read(&path)
            .map(Some)
            .map_err(|reason| VendorError::Read { file, reason })
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
    /// The stream ended, or the gzip stream was cut short: inside the tar
    /// archive (before its end marker) either means a truncated archive.
    ended: Cell<bool>,
    /// The gzip stream stopped before its own end.
    cut: Cell<bool>,
}

impl<R: Read> Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.meter.limit.get().saturating_sub(self.meter.read.get());
        if left == 0 && !buf.is_empty() {
            self.meter.tripped.set(true);
            return Err(io::Error::other("entry header over the size bound"));
        }
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want]).inspect_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                self.meter.cut.set(true);
            }
        })?;
        if n == 0 && want > 0 {
            self.meter.ended.set(true);
        }
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
        meter: Rc::new(Meter::default()),
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
    /// The decompressed stream's meter, shared with the reader.
    meter: Rc<Meter>,
}

impl Unpacker<'_> {
    fn refused(&self, entry: &str, fault: Fault) -> ReplayError {
        ReplayError::Refused {
            archive: self.archive.to_path_buf(),
            entry: entry.to_string(),
            fault,
        }
    }

    /// A stream that failed: truncated when it ran out early, else not a
    /// capture at all.
    fn not_a_capture(&self, source: io::Error) -> ReplayError {
        if self.ran_out() {
            return self.truncated();
        }
        ReplayError::NotACapture {
            archive: self.archive.to_path_buf(),
            source,
        }
    }

    /// Whether the stream ran out inside the archive. Before any tar byte
    /// came out (a file too short for a gzip header, say) it was never a
    /// capture, truncated or not.
    fn ran_out(&self) -> bool {
        (self.meter.ended.get() || self.meter.cut.get()) && self.meter.read.get() > 0
    }

    fn truncated(&self) -> ReplayError {
        ReplayError::Truncated {
            archive: self.archive.to_path_buf(),
        }
    }

    fn run(&mut self, file: fs::File) -> Result<(), ReplayError> {
        let meter = self.meter.clone();
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
            let name = crate::escape::path_text(&path).into_owned();
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
        self.end(tar.into_inner())
    }

    /// Checks that the archive really ended rather than stopped: the tar
    /// reader ends quietly at the end of the stream and at the first zero
    /// block alike, so a capture cut at an entry boundary would otherwise
    /// replay as a smaller node. Requires the second zero block of the
    /// end-of-archive marker, then reads the rest of the gzip stream so its
    /// length and checksum are checked too.
    fn end<R: Read>(&self, mut stream: Metered<R>) -> Result<(), ReplayError> {
        if self.meter.ended.get() {
            // The stream ran out where a header or the end marker belonged.
            return Err(self.not_a_capture(io::Error::from(io::ErrorKind::UnexpectedEof)));
        }
        // Room for the second zero block and a tar writer's record padding.
        let meter = &self.meter;
        meter.limit.set(meter.read.get() + 512 + MAX_HEADER_BYTES);
        let mut block = [0u8; 512];
        match stream.read_exact(&mut block) {
            Ok(()) if block.iter().all(|b| *b == 0) => {}
            Ok(()) => {
                return Err(self
                    .not_a_capture(io::Error::other("a lone zero block inside the tar archive")))
            }
            Err(e) => return Err(self.not_a_capture(e)),
        }
        io::copy(&mut stream, &mut io::sink()).map_err(|e| match meter.tripped.get() {
            true => self.not_a_capture(io::Error::other(format!(
                "more than {MAX_HEADER_BYTES} bytes after the end-of-archive marker"
            ))),
            false => self.not_a_capture(e),
        })?;
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
        let first = path.components().next().map(|c| c.as_os_str());
        if !TOPS
            .iter()
            .any(|top| first == Some(std::ffi::OsStr::new(top)))
        {
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
        if path.components().count() == 1 && kind != Kind::Folder {
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
        let failed = |source| match self.ran_out() {
            // The copy failed reading, not writing: the archive ran out.
            true => self.truncated(),
            false => ReplayError::Write {
                archive: self.archive.to_path_buf(),
                entry: name.to_string(),
                path: dest.clone(),
                source,
            },
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
        let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::fast(),
        ));
        for (name, text) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(if text.is_some() {
                tar::EntryType::Regular
            } else {
                tar::EntryType::Directory
            });
            h.set_size(text.map_or(0, |t| t.len() as u64));
            h.set_mode(0o000);
            tar.append_data(&mut h, name, text.unwrap_or("").as_bytes())
                .unwrap();
        }
        let path = dir.join("a.tar.gz");
        fs::write(&path, tar.into_inner().unwrap().finish().unwrap()).unwrap();
        path
    }

    #[test]
    fn a_folder_named_after_its_contents_is_not_a_duplicate() {
        let dir = tempfile::tempdir().unwrap();
        let a = archive(
            dir.path(),
            &[
                ("sysfs/class/net/x", Some("1\n")),
                ("sysfs", None),
                ("sysfs/class", None),
            ],
        );
        let replay = unpack(&a, &Limits::default()).unwrap();
        assert_eq!(
            fs::read_to_string(replay.tree().join("class/net/x")).unwrap(),
            "1\n"
        );
    }

    #[test]
    fn archive_modes_are_not_applied_to_the_replayed_tree() {
        // Every header says mode 000: kept, a non-root replay could neither
        // read the tree nor remove its folder.
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let a = archive(
            dir.path(),
            &[
                ("sysfs", None),
                ("sysfs/class", None),
                ("sysfs/class/x", Some("1")),
            ],
        );
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
}
