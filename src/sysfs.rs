//! Bounded, root-confined reads of a sysfs tree.
//!
//! Every read of the host goes through [`SysRoot`]. A sysfs path is a chain of
//! symlinks (`class/net/eth0/device` → `../../../devices/pci0000:00/…`), so each
//! read resolves the whole chain first and refuses a path that lands outside the
//! root. That is what lets a captured tree under `/tmp/node` read exactly like the
//! live `/sys`, and what stops a hostile link in a captured tree from making us
//! read `/etc/shadow`. One attribute read is capped at [`MAX_ATTR_BYTES`].
//!
//! Paths and names cross this module as text, each name escaped as
//! [`crate::escape`] writes it: a netdev may be named with bytes that are not
//! UTF-8, and its text must lead back to exactly those bytes. Every name
//! read from the kernel (a listing, a link's text, a resolved path) is
//! escaped here, and every path handed to the kernel is its bytes again.

use crate::escape::{escape, path_text as text_of, text_path, unescape};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The largest attribute we read; sysfs attributes are a page at most, so a
/// larger file is not an attribute and is refused rather than truncated.
pub const MAX_ATTR_BYTES: u64 = 64 * 1024;

/// Why a sysfs path could not be read; every variant names the path.
#[derive(Debug, thiserror::Error)]
pub enum SysError {
    /// The symlink chain resolves to a place outside the tree root.
    #[error("{path}: resolves outside the sysfs root")]
    Escapes {
        /// The path as asked for, relative to the root.
        path: String,
        /// Where the chain landed.
        target: String,
        /// The root it must stay inside.
        root: String,
    },
    /// The attribute is larger than [`MAX_ATTR_BYTES`].
    #[error("{path}: larger than {max} bytes, refused", max = MAX_ATTR_BYTES)]
    TooLarge {
        /// The path as asked for, relative to the root.
        path: String,
    },
    /// The path is a symlink whose target does not exist: something is there
    /// but cannot be read, which is not the same as "no such attribute".
    #[error("{path}: dangling link (its target does not exist)")]
    Dangling {
        /// The path as asked for, relative to the root.
        path: String,
    },
    /// Something other than a regular file stands where an attribute belongs
    /// (a FIFO or a device would block or never end; a folder is no value).
    #[error("{path}: is a {kind}, not a regular file")]
    NotRegular {
        /// The path as asked for, relative to the root.
        path: String,
        /// What it is instead (`folder`, `FIFO`, `character device` …).
        kind: &'static str,
    },
    /// Any other I/O failure: missing, permission denied, not a directory …
    /// The OS error is part of the message and deliberately not a `source`,
    /// so an error chain prints it once, not once per layer.
    #[error("{path}: {cause}")]
    Io {
        /// The path as asked for, relative to the root.
        path: String,
        /// The underlying error.
        cause: std::io::Error,
    },
}

impl SysError {
    /// True when the path simply does not exist (as opposed to existing and
    /// being unreadable), which callers treat as "the kernel has no such
    /// attribute". A dangling link is not "not found": see [`SysError::Dangling`].
    pub fn is_not_found(&self) -> bool {
        matches!(self, SysError::Io { cause, .. } if cause.kind() == std::io::ErrorKind::NotFound)
    }
}

/// A sysfs tree: the live `/sys` or a captured copy of one.
#[derive(Debug, Clone)]
pub struct SysRoot {
    root: PathBuf,
    /// When capturing, every entry a read touched (see [`SysRoot::recording`]).
    recorder: Option<Arc<Mutex<Recorded>>>,
    /// Paths already resolved, by the path they were asked for, to their
    /// canonical path under the root: one pass reads many attributes of each
    /// device folder and follows the same links more than once, and
    /// re-walking the symlink chain for each was most of its cost.
    folders: Arc<Mutex<HashMap<String, String, BuildPathHash>>>,
    /// The root opened as a directory handle, for `openat2(2)` with
    /// `RESOLVE_BENEATH`: the kernel then walks an attribute's links and
    /// keeps the walk inside the root in one call. `None` where the kernel
    /// or a seccomp filter refuses it (the resolving path is used instead).
    beneath: Option<Arc<std::os::fd::OwnedFd>>,
    /// The root opened as a directory handle whether or not `openat2(2)`
    /// answers: links are read relative to it, so the kernel walks only
    /// the path under the root, not the root's own path again each time.
    handle: Option<Arc<std::os::fd::OwnedFd>>,
    /// The root is a live sysfs, where everything is a regular file, a
    /// folder or a link (kernfs makes nothing else): a read that the kernel
    /// keeps on this mount (`RESOLVE_NO_XDEV`) needs no type check of what
    /// it opened, and a folder answers its read with EISDIR. A copy of a
    /// tree (tmpfs, a disk) can hold anything, so there each read checks.
    kernfs: bool,
}

/// A word-at-a-time hash (rustc's "Fx") for the resolution cache: its keys
/// are sysfs paths of a hundred bytes or so, which SipHash took a visible
/// part of a pass to hash. The paths come from the tree being read; a tree
/// built to collide them only slows its own pass down.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BuildPathHash;

/// The running state of [`BuildPathHash`].
pub(crate) struct PathHash(u64);

impl PathHash {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl std::hash::Hasher for PathHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        let mut tail = [0u8; 8];
        tail[..words.remainder().len()].copy_from_slice(words.remainder());
        self.add(u64::from_le_bytes(tail));
    }
}

impl std::hash::BuildHasher for BuildPathHash {
    type Hasher = PathHash;
    fn build_hasher(&self) -> PathHash {
        PathHash(0)
    }
}

/// One entry of the tree as a read saw it, keyed by its path under the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A directory that was walked through or listed.
    Dir,
    /// A symlink and its target text, exactly as stored.
    Link(String),
    /// A file that was read: its bytes, at most one past [`MAX_ATTR_BYTES`]
    /// so an oversized file stays oversized.
    File(Vec<u8>),
    /// A file that was tested for existence but never read: only its name is taken.
    Placeholder,
}

/// Everything a recording [`SysRoot`] touched, by the text of its path
/// (link targets are text too; see [`crate::escape`]).
pub type Recorded = BTreeMap<String, Entry>;

/// What one pass's resolutions know of a path (see [`SysRoot::resolve`]).
enum Known {
    /// It was resolved, and is itself canonical: the asker's own text is
    /// the answer (no copy is made here).
    Canonical,
    /// It was resolved: to this other, canonical path.
    Resolved(String),
    /// Only its folder was resolved: the path's last name joined to where
    /// that folder resolved (canonical if that name is no link).
    Under(String),
    /// Neither it nor its folder.
    Neither,
}

impl SysRoot {
    /// Opens a tree; the root itself is canonicalised so that containment
    /// checks compare like with like.
    pub fn new(root: impl AsRef<Path>) -> Result<Self, SysError> {
        let root = root.as_ref();
        let canonical = fs::canonicalize(root).map_err(|cause| SysError::Io {
            path: root.display().to_string(),
            cause,
        })?;
        let handle = open_dir(&canonical).map(Arc::new);
        let beneath = handle.clone().filter(|fd| openat2_works(fd));
        // Room for a small node's folders (an 8-GPU node remembers about
        // 130), grown as a larger one needs: a larger table up front made
        // every pass touch pages it mostly left empty (the kernel zeroes
        // each on first touch), which cost more than the few growths (each
        // hashes every path again).
        let folders = Arc::new(Mutex::new(HashMap::with_capacity_and_hasher(
            192,
            BuildPathHash,
        )));
        let kernfs = handle.as_deref().is_some_and(is_sysfs);
        Ok(SysRoot {
            root: canonical,
            recorder: None,
            folders,
            beneath,
            handle,
            kernfs,
        })
    }

    /// The same tree, remembering every entry each read touches, so that
    /// `capture` can copy exactly what discovery read and nothing else.
    pub fn recording(root: impl AsRef<Path>) -> Result<Self, SysError> {
        let mut r = SysRoot::new(root)?;
        r.recorder = Some(Arc::new(Mutex::new(Recorded::new())));
        Ok(r)
    }

    /// What a recording tree has touched so far (empty when not recording).
    pub fn recorded(&self) -> Recorded {
        self.recorder
            .as_ref()
            .map(|r| r.lock().expect("recorder lock").clone())
            .unwrap_or_default()
    }

    fn note(&self, path: &Path, entry: Entry) {
        let Some(rec) = &self.recorder else { return };
        let key = text_of(path).into_owned();
        let mut map = rec.lock().expect("recorder lock");
        match (map.get(&key), &entry) {
            // Content wins over a placeholder, never the other way round.
            (Some(Entry::File(_)), Entry::Placeholder) => {}
            _ => {
                map.insert(key, entry);
            }
        }
    }

    /// True while capturing: the recording calls cost syscalls, so they are
    /// skipped entirely otherwise.
    fn recording_on(&self) -> bool {
        self.recorder.is_some()
    }

    /// Records every symlink and directory on the way from the root to `rel`,
    /// the way the kernel would walk it, up to where the walk stops. A walk
    /// that reaches the end gives where it landed (relative to the root,
    /// and inside it: a climb above the root stops the walk), so a capture
    /// walks each path once; `None` leaves the error to the resolving walk.
    fn note_chain(&self, rel: &str) -> Option<PathBuf> {
        let mut pending: Vec<PathBuf> = on_disk(rel.trim_start_matches('/'))
            .ok()?
            .components()
            .rev()
            .map(|c| PathBuf::from(c.as_os_str()))
            .collect();
        let mut cur = PathBuf::new();
        let mut hops = 0;
        // Each `return` below is a walk the read itself refuses or fails on;
        // what was walked until then is all a replay needs to fail the same way.
        while let Some(c) = pending.pop() {
            match c.to_str() {
                Some(".") => continue,
                Some("..") => {
                    if !cur.pop() {
                        return None; // above the root: an escape
                    }
                    continue;
                }
                _ => {}
            }
            let next = cur.join(&c);
            let Ok(meta) = fs::symlink_metadata(self.root.join(&next)) else {
                return None;
            };
            if meta.file_type().is_symlink() {
                let Ok(target) = fs::read_link(self.root.join(&next)) else {
                    return None;
                };
                self.note(&next, Entry::Link(text_of(&target).into_owned()));
                hops += 1;
                if target.is_absolute() || hops > 40 {
                    return None;
                }
                pending.extend(
                    target
                        .components()
                        .rev()
                        .map(|c| PathBuf::from(c.as_os_str())),
                );
            } else {
                if meta.is_dir() {
                    self.note(&next, Entry::Dir);
                } else if !pending.is_empty() {
                    return None; // a file in the middle of a path: ENOTDIR
                }
                cur = next;
            }
        }
        Some(cur)
    }

    /// `abs` (inside the root, as [`Self::resolve_abs`] returns it) relative to the root.
    fn relative<'a>(&self, abs: &'a Path) -> &'a Path {
        abs.strip_prefix(&self.root)
            .expect("resolve_abs checked containment")
    }

    /// The canonical root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves `rel` (relative to the root) through every symlink and returns
    /// the canonical path, relative to the root, with `/` separators.
    pub fn resolve(&self, rel: &str) -> Result<String, SysError> {
        // The cached walk gives the relative path itself: no root to join
        // and strip again, which cost as much as the walk.
        let abs = match self.recording_on() {
            false => match self.resolve_hops(rel, 0, false) {
                Ok(p) => return Ok(p),
                Err(Some(cause)) => {
                    return Err(SysError::Io {
                        path: rel.to_string(),
                        cause,
                    })
                }
                Err(None) => self.resolve_walk(rel)?,
            },
            true => self.resolve_abs(rel)?,
        };
        Ok(text_of(self.relative(&abs)).into_owned())
    }

    /// The one place every access resolves a path, and so the one place a
    /// capture records the links and folders on the way.
    fn resolve_abs(&self, rel: &str) -> Result<PathBuf, SysError> {
        if self.recording_on() {
            return match self.note_chain(rel) {
                Some(landed) => Ok(self.root.join(landed)),
                None => self.resolve_walk(rel),
            };
        }
        self.resolve_cached(rel)
    }

    /// Resolves `rel` from its parent folder's cached resolution: a plain
    /// entry under a canonical folder inside the root is itself canonical and
    /// inside the root, so it costs one `readlink` (which fails with EINVAL
    /// on anything but a link); only a link (or `.`/`..`) takes more. Errors
    /// are the full walk's, naming `rel`.
    fn resolve_cached(&self, rel: &str) -> Result<PathBuf, SysError> {
        match self.resolve_hops(rel, 0, false) {
            Ok(p) => Ok(self.root.join(p)),
            // The last name is simply not in its (resolved) folder: the
            // kernel has no such attribute. Nothing on the way can dangle.
            Err(Some(cause)) => Err(SysError::Io {
                path: rel.to_string(),
                cause,
            }),
            Err(None) => self.resolve_walk(rel),
        }
    }

    /// [`Self::resolve_cached`]'s work, giving the canonical path relative to
    /// the root. `Err(None)` sends the caller to the full walk, which then
    /// gives the error in its own words; `Err(Some(e))` is `rel`'s own last
    /// name missing from a folder that resolved. A link is followed by reading
    /// its text once and resolving the target the same way (sysfs links are
    /// relative, climbing with leading `..` only), at most 40 hops deep as the
    /// kernel allows. Every canonical path met is remembered for the pass,
    /// and so is a link met as a folder on the way (`parent` true), so what
    /// is asked for again costs nothing; a link asked for once is not kept.
    fn resolve_hops(
        &self,
        rel: &str,
        hops: u32,
        parent: bool,
    ) -> Result<String, Option<std::io::Error>> {
        let rel_t = rel.trim_start_matches('/');
        let (folder, name) = match split_last(rel_t) {
            Some((p, n)) => (Some(p), n),
            None => (None, rel_t),
        };
        // One look answers most asks: the path itself, else a name under a
        // folder resolved before.
        let known = match self.known(rel_t) {
            Known::Canonical => return Ok(rel_t.to_string()),
            Known::Resolved(out) => return Ok(out),
            Known::Under(candidate) => Some(candidate),
            Known::Neither => None,
        };
        if hops > 40
            || name.is_empty()
            || name == "."
            || name == ".."
            || folder.is_some_and(|p| p.is_empty())
        {
            return Err(None);
        }
        let candidate = match (known, folder) {
            (Some(c), _) => c,
            (None, None) => name.to_string(),
            (None, Some(p)) => join(&self.resolve_hops(p, hops, true).map_err(|_| None)?, name),
        };
        let mut link = [0u8; 512];
        let text = match self.read_link_under(&candidate, &mut link) {
            Ok(t) => t,
            // Not a link: the entry is there, and canonical under its folder.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.remember(rel_t, &candidate);
                return Ok(candidate);
            }
            Err(e) if hops == 0 && e.kind() == std::io::ErrorKind::NotFound => return Err(Some(e)),
            Err(_) => return Err(None),
        };
        // The text as sysfs writes it: `../` climbs, then plain names. Anything
        // else (absolute, `.`, `..` or an empty name after a name) is the
        // full walk's to resolve. A name that is not UTF-8 is escaped like
        // every other path here, which keeps its `/` and dots where they are.
        let text = escape(text);
        let mut base = &candidate[..candidate.len() - name.len()];
        base = base.strip_suffix('/').unwrap_or(base);
        let mut rest: &str = &text;
        while let Some(r) = rest.strip_prefix("../") {
            // Climbing above the root is an escape: the walk names it.
            if base.is_empty() {
                return Err(None);
            }
            base = split_last(base).map_or("", |(folder, _)| folder);
            rest = r;
        }
        // A bare climb (`../..`, the kernel's `device` link of a netdev two
        // folders below its PCI function) names a folder above the link:
        // an ancestor of a canonical path, so canonical itself.
        if rest == ".." {
            if base.is_empty() {
                return Err(None);
            }
            base = split_last(base).map_or("", |(folder, _)| folder);
            rest = "";
        }
        if rest.is_empty() {
            // The root itself is the full walk's to name.
            if base.is_empty() {
                return Err(None);
            }
            return Ok(self.answered(rel_t, parent, base.to_string()));
        }
        if !plain_names(rest) {
            return Err(None);
        }
        let target = join(base, rest);
        // Several names past what is known: one call checks them all. A
        // target this pass has resolved is answered by the same look.
        let target = match rest.as_bytes().contains(&b'/') {
            false => target,
            true => match self.known(&target) {
                Known::Canonical => return Ok(self.answered(rel_t, parent, target)),
                Known::Resolved(out) => return Ok(self.answered(rel_t, parent, out)),
                Known::Neither if self.all_plain(base, &target) => {
                    return Ok(self.answered(rel_t, parent, target))
                }
                Known::Under(_) | Known::Neither => target,
            },
        };
        // A target that does not resolve is a dangling link: the walk says so.
        let out = self
            .resolve_hops(&target, hops + 1, false)
            .map_err(|_| None)?;
        Ok(self.answered(rel_t, parent, out))
    }

    /// What this pass knows of `rel` (see [`Known`]): one lock, at most two
    /// looks, and a folder's path joined while the cache is held, so it is
    /// not copied out first.
    fn known(&self, rel: &str) -> Known {
        let cache = self.folders.lock().expect("folder cache lock");
        if let Some(hit) = cache.get(rel) {
            return if hit.is_empty() {
                Known::Canonical
            } else {
                Known::Resolved(hit.clone())
            };
        }
        match split_last(rel)
            .and_then(|(folder, name)| cache.get(folder).map(|hit| (folder, hit, name)))
        {
            Some((folder, hit, name)) => {
                Known::Under(join(if hit.is_empty() { folder } else { hit }, name))
            }
            None => Known::Neither,
        }
    }

    /// True when `rel` exists beneath the root with no link anywhere on its
    /// way, so it is canonical; `known` is a canonical folder it lies under.
    /// One `openat2(2)` refusing every link checks all the names past
    /// `known` at once, where a `readlink` per name would walk the path
    /// once per name. Each folder on the way is remembered as canonical.
    /// False (nothing learnt) where the call is refused for any reason: a
    /// link on the way, a missing name, or a kernel without `openat2`.
    fn all_plain(&self, known: &str, rel: &str) -> bool {
        let Some(dir) = &self.beneath else {
            return false;
        };
        let checked = with_c_path(rel, |path| {
            openat2_c(
                dir,
                path,
                libc::O_PATH,
                libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
            )
        });
        if checked.is_err() {
            return false;
        }
        // `rel` itself, then each folder back towards `known`, under one
        // lock, until one this pass already holds as canonical: the folders
        // above it were remembered with it (a sibling's walk, most often).
        let mut cache = self.folders.lock().expect("folder cache lock");
        let mut path = rel;
        while path.len() > known.len() {
            if cache.get(path).is_some_and(String::is_empty) {
                break;
            }
            cache.insert(path.to_string(), String::new());
            match split_last(path) {
                Some((folder, _)) => path = folder,
                None => break,
            }
        }
        true
    }

    /// The text of the link at `rel`, a path under the root with no link
    /// before its last name (a canonical folder and a name), read into
    /// `buf`; not a link: EINVAL. sysfs link texts are short: one that
    /// fills `buf` is refused (ENAMETOOLONG), for the full walk to follow.
    fn read_link_under<'b>(&self, rel: &str, buf: &'b mut [u8; 512]) -> std::io::Result<&'b [u8]> {
        use std::os::fd::AsRawFd;
        use std::os::unix::ffi::OsStrExt;
        let n = match &self.handle {
            Some(dir) => with_c_path(rel, |path| {
                // SAFETY: a valid directory fd, a NUL-terminated path and a buffer
                // of the length passed; the kernel writes at most that many bytes.
                let n = unsafe {
                    libc::readlinkat(
                        dir.as_raw_fd(),
                        path.as_ptr(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                    )
                };
                if n < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(n as usize)
            })?,
            None => {
                let text = fs::read_link(self.root.join(on_disk(rel)?))?;
                let bytes = text.as_os_str().as_bytes();
                let n = bytes.len().min(buf.len());
                buf[..n].copy_from_slice(&bytes[..n]);
                n
            }
        };
        if n == buf.len() {
            return Err(std::io::Error::from_raw_os_error(libc::ENAMETOOLONG));
        }
        Ok(&buf[..n])
    }

    /// `out`, the answer for `rel`, remembered first when `rel` was met as
    /// a folder on the way (see [`Self::resolve_hops`]).
    fn answered(&self, rel: &str, parent: bool, out: String) -> String {
        if parent {
            self.remember(rel, &out);
        }
        out
    }

    /// Remembers that `rel` resolves to `canonical` for the rest of the pass.
    /// Drops every resolution this tree remembers and their table, so that
    /// a caller done with the walk does not hold them through what follows.
    pub fn forget_resolutions(&self) {
        let mut cache = self.folders.lock().expect("folder cache lock");
        *cache = HashMap::with_hasher(BuildPathHash);
    }

    fn remember(&self, rel: &str, canonical: &str) {
        // A canonical path maps to itself, stored as "" (the root is never
        // a key): one string per entry, not two.
        let value = if rel == canonical {
            String::new()
        } else {
            canonical.to_string()
        };
        self.folders
            .lock()
            .expect("folder cache lock")
            .insert(rel.to_string(), value);
    }

    /// True when the folder holding `rel` is known, from this pass, to be
    /// canonical: no link on the way to it, and inside the root. Then the
    /// kernel need not follow `rel`'s last name to confine it, and a name
    /// missing there is the answer at once, since nothing on the way can
    /// dangle.
    fn in_canonical_folder(&self, rel: &str) -> bool {
        match split_last(rel) {
            None => true,
            Some((folder, _)) => self
                .folders
                .lock()
                .expect("folder cache lock")
                .get(folder)
                .is_some_and(|v| v.is_empty()),
        }
    }

    /// Resolves `rel` by walking its whole symlink chain, then checks that
    /// it lands inside the root.
    fn resolve_walk(&self, rel: &str) -> Result<PathBuf, SysError> {
        let joined = on_disk(rel.trim_start_matches('/'))
            .map(|p| self.root.join(p))
            .map_err(|cause| SysError::Io {
                path: rel.to_string(),
                cause,
            })?;
        let target = fs::canonicalize(&joined).map_err(|cause| {
            if cause.kind() == std::io::ErrorKind::NotFound && self.dangles(&joined) {
                return SysError::Dangling {
                    path: rel.to_string(),
                };
            }
            SysError::Io {
                path: rel.to_string(),
                cause,
            }
        })?;
        if !target.starts_with(&self.root) {
            return Err(SysError::Escapes {
                path: rel.to_string(),
                target: target.display().to_string(),
                root: self.root.display().to_string(),
            });
        }
        Ok(target)
    }

    /// True when a path that failed to resolve as "not found" has a link on
    /// the way whose target is missing: the path was there to read and could
    /// not be, which must not read as the kernel having no such attribute.
    /// Only called on a miss, so the common case costs nothing.
    fn dangles(&self, joined: &Path) -> bool {
        let mut p = joined;
        while p != self.root {
            match fs::symlink_metadata(p) {
                // The deepest entry that exists: a link here points nowhere.
                Ok(m) => return m.file_type().is_symlink() && fs::metadata(p).is_err(),
                Err(_) => match p.parent() {
                    Some(parent) => p = parent,
                    None => return false,
                },
            }
        }
        false
    }

    /// Reads an attribute whole, refusing one over [`MAX_ATTR_BYTES`] and
    /// anything that is not a regular file. The open never blocks (a FIFO
    /// planted where an attribute belongs would otherwise hang the pass), and
    /// the type is checked on the opened descriptor, so nothing can be swapped
    /// in between the check and the read.
    pub fn read(&self, rel: &str) -> Result<String, SysError> {
        use std::os::unix::fs::OpenOptionsExt;
        let io = |cause| SysError::Io {
            path: rel.to_string(),
            cause,
        };
        // The kernel resolves and confines in one call; any refusal (a
        // missing file, an escape, a dangling link) is asked again the long
        // way, which names the fault exactly as before.
        let beneath = match (&self.beneath, self.recording_on()) {
            (Some(fd), false) => {
                let rel_t = rel.trim_start_matches('/');
                let flags = libc::O_NONBLOCK | libc::O_NOCTTY;
                // The last name is not followed at first (sysfs attributes
                // are files, not links). Then a name missing from a folder
                // known canonical is the answer at once: nothing on the way
                // can dangle. A last name that is a link (ELOOP) is followed
                // in a second call.
                // On a live sysfs the walk stays on its mount, so that what
                // it opens is kernfs's (another mount answers EXDEV, and is
                // read the long way).
                let resolve = if self.kernfs {
                    CONFINED | libc::RESOLVE_NO_XDEV
                } else {
                    CONFINED
                };
                let open = |flags| with_c_path(rel_t, |path| openat2_c(fd, path, flags, resolve));
                match open(flags | libc::O_NOFOLLOW) {
                    Ok(f) => Some(f),
                    Err(e) if e.raw_os_error() == Some(libc::ELOOP) => open(flags).ok(),
                    Err(e)
                        if e.kind() == std::io::ErrorKind::NotFound
                            && self.in_canonical_folder(rel_t) =>
                    {
                        return Err(io(e))
                    }
                    Err(_) => None,
                }
            }
            _ => None,
        };
        let (file, abs) = match beneath {
            Some(f) => (f, None),
            None => {
                let abs = self.resolve_abs(rel)?;
                let f = fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
                    .open(&abs)
                    .map_err(io)?;
                (f, Some(abs))
            }
        };
        // Only kernfs's regular files, folders and links can be open here on
        // a live sysfs, and a folder says so when read. Elsewhere the type
        // is asked of the open file (which cannot change under us) only
        // when the read gave nothing or failed: that is how a FIFO, a device
        // or a folder answers a non-blocking read, and one system call per
        // attribute is saved. What does answer with bytes is still bounded
        // by the cap and was opened without blocking.
        let trusted = self.kernfs && abs.is_none();
        let read = read_capped(&file);
        if !trusted && !matches!(&read, Ok(buf) if !buf.is_empty()) {
            let ft = file.metadata().map_err(io)?.file_type();
            if !ft.is_file() {
                return Err(SysError::NotRegular {
                    path: rel.to_string(),
                    kind: crate::input::kind_of(ft),
                });
            }
        }
        let buf = match read {
            Ok(buf) => buf,
            Err(e) if trusted && e.raw_os_error() == Some(libc::EISDIR) => {
                return Err(SysError::NotRegular {
                    path: rel.to_string(),
                    kind: "folder",
                });
            }
            Err(e) => return Err(io(e)),
        };
        // A recording tree always takes the resolving path, so `abs` is there.
        if let (true, Some(abs)) = (self.recording_on(), &abs) {
            self.note(self.relative(abs), Entry::File(buf.clone()));
        }
        if buf.len() as u64 > MAX_ATTR_BYTES {
            return Err(SysError::TooLarge {
                path: rel.to_string(),
            });
        }
        // Valid UTF-8 (every attribute we read) is taken as it is, uncopied.
        Ok(String::from_utf8(buf)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    /// Reads an attribute and trims the kernel's trailing newline.
    pub fn read_trimmed(&self, rel: &str) -> Result<String, SysError> {
        let mut v = self.read(rel)?;
        // In place: one allocation per attribute, not two.
        v.truncate(v.trim_end().len());
        let lead = v.len() - v.trim_start().len();
        v.drain(..lead);
        Ok(v)
    }

    /// Lists a directory's entry names, sorted, after resolving the
    /// directory's own symlink chain.
    pub fn list(&self, rel: &str) -> Result<Vec<String>, SysError> {
        // As for reads: the kernel resolves and confines in one call, and
        // any refusal is asked again the long way, which names the fault.
        if let (Some(fd), false) = (&self.beneath, self.recording_on()) {
            let rel_t = rel.trim_start_matches('/');
            // As for reads: in a folder known canonical, the last name is
            // not followed, and a missing one is the answer at once.
            let last = rel_t.rsplit('/').next().unwrap_or("");
            let settled = !matches!(last, "" | "." | "..") && self.in_canonical_folder(rel_t);
            match list_beneath(fd, rel_t, if settled { libc::O_NOFOLLOW } else { 0 }) {
                // What is listed is not remembered: a listed folder is read
                // through the kernel's own walk, and only a read that fails
                // asks which folders are canonical.
                Ok(mut names) => {
                    // Names in a folder are unique, so an unstable sort gives
                    // one order; it sorts in place, with no buffer to allocate.
                    names.sort_unstable();
                    return Ok(names);
                }
                Err(e) if settled && e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(SysError::Io {
                        path: rel.to_string(),
                        cause: e,
                    });
                }
                Err(_) => {}
            }
        }
        let abs = self.resolve_abs(rel)?;
        let io = |cause| SysError::Io {
            path: rel.to_string(),
            cause,
        };
        let mut found: Vec<OsString> = Vec::new();
        for entry in fs::read_dir(&abs).map_err(io)? {
            found.push(entry.map_err(io)?.file_name());
        }
        let mut names: Vec<String> = found
            .iter()
            .map(|n| escape(n.as_bytes()).into_owned())
            .collect();
        names.sort_unstable();
        if self.recording_on() {
            let dir = self.relative(&abs);
            // Listed links and folders must exist on replay, with their type.
            // Plain files are left out: nothing decides on a listed file's
            // name alone (the replay test on every fixture holds this), and
            // their names can be host data too.
            for name in &found {
                let path = dir.join(name);
                match fs::symlink_metadata(self.root.join(&path)) {
                    Ok(m) if m.file_type().is_symlink() => {
                        if let Ok(t) = fs::read_link(self.root.join(&path)) {
                            self.note(&path, Entry::Link(text_of(&t).into_owned()));
                        }
                    }
                    Ok(m) if m.is_dir() => self.note(&path, Entry::Dir),
                    _ => {}
                }
            }
        }
        Ok(names)
    }

    /// The text of the symlink at `rel`, unresolved (the last component is
    /// not followed): what a link says even when its target is gone.
    pub fn link_text(&self, rel: &str) -> Result<String, SysError> {
        let parent = Path::new(rel).parent().and_then(Path::to_str).unwrap_or("");
        let dir = if parent.is_empty() {
            self.root.clone()
        } else {
            self.resolve_abs(parent)?
        };
        let io = |cause| SysError::Io {
            path: rel.to_string(),
            cause,
        };
        let name = Path::new(rel)
            .file_name()
            .ok_or_else(|| io(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
        let name = on_disk(name.to_str().expect("a name of text is text")).map_err(io)?;
        fs::read_link(dir.join(name))
            .map(|t| text_of(&t).into_owned())
            .map_err(io)
    }

    /// True when `rel` exists (after resolving links) inside the root.
    pub fn exists(&self, rel: &str) -> bool {
        if !self.recording_on() {
            return self.resolve(rel).is_ok();
        }
        let Ok(abs) = self.resolve_abs(rel) else {
            return false;
        };
        if self.recording_on() && abs.is_file() {
            self.note(self.relative(&abs), Entry::Placeholder);
        }
        true
    }
}

/// Reads a regular file whole, to one byte past [`MAX_ATTR_BYTES`] so that
/// "exactly 64 KiB" and "more" differ. A regular file answers a read short
/// only at its end, so a short read ends it without asking again: a sysfs
/// attribute (one page at most) costs a single `read`.
fn read_capped(mut file: &fs::File) -> std::io::Result<Vec<u8>> {
    // A first read into the stack: most attributes are a few bytes, and a
    // page-sized heap buffer per read cost more than the read itself.
    let mut first = [0u8; 512];
    let n = loop {
        match file.read(&mut first) {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    };
    let mut buf = first[..n].to_vec();
    if n < first.len() {
        return Ok(buf);
    }
    // Filled: there may be more. Read one byte past the cap at most.
    file.take(MAX_ATTR_BYTES + 1 - n as u64)
        .read_to_end(&mut buf)?;
    Ok(buf)
}

/// The entry names of the folder `rel` beneath `dir`, opened as
/// [`openat2_raw`] opens a file (with `flags` added). Read until getdents64
/// says the end: a short buffer is not the end, since the kernel stops
/// filling one early when a signal is pending.
fn list_beneath(
    dir: &std::os::fd::OwnedFd,
    rel: &str,
    flags: libc::c_int,
) -> std::io::Result<Vec<String>> {
    use std::os::fd::AsRawFd;
    let folder = openat2_raw(
        dir,
        if rel.is_empty() { "." } else { rel },
        libc::O_DIRECTORY | libc::O_NONBLOCK | flags,
    )?;
    // getdents64(2) straight into a buffer: `opendir` would add an fstat
    // and an fcntl to every listing, a third of its cost here. On the
    // stack and left unwritten: a heap buffer per listing (and zeroing it)
    // cost more than the listing. Only what the kernel wrote is read.
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); 8 * 1024];
    let mut names = Vec::new();
    loop {
        // SAFETY: an open directory fd and a writable buffer of the length given.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                folder.as_raw_fd(),
                space.as_mut_ptr(),
                space.len(),
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            return Ok(names);
        }
        // SAFETY: the kernel initialised the first `n` bytes.
        let buf = unsafe { std::slice::from_raw_parts(space.as_ptr().cast::<u8>(), n as usize) };
        // Each record: d_ino u64, d_off i64, d_reclen u16, d_type u8, then
        // the NUL-terminated name, padded to d_reclen.
        let mut at = 0usize;
        while at < buf.len() {
            let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
            if reclen < 20 || at + reclen > buf.len() {
                // Not what the kernel writes: ask the long way.
                return Err(std::io::Error::from(std::io::ErrorKind::InvalidData));
            }
            let raw = &buf[at + 19..at + reclen];
            let name = &raw[..raw.iter().position(|b| *b == 0).unwrap_or(raw.len())];
            if name != b"." && name != b".." {
                // A name that is not UTF-8 is listed as its text, which
                // leads back to it (see [`crate::escape`]).
                names.push(escape(name).into_owned());
            }
            at += reclen;
        }
    }
}

/// Opens `root` as a directory handle for [`openat2_raw`].
fn open_dir(root: &Path) -> Option<std::os::fd::OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(root)
        .ok()?;
    Some(dir.into())
}

/// True when `openat2(2)` answers here: kernels before 5.6 say ENOSYS, and
/// a container's seccomp filter may say EPERM; both keep the resolving path.
fn openat2_works(dir: &std::os::fd::OwnedFd) -> bool {
    openat2_raw(dir, ".", libc::O_DIRECTORY).is_ok()
}

/// The path on disk that the text `rel` names (see [`crate::escape`]); text
/// that no path escapes to is refused, naming it.
fn on_disk(rel: &str) -> std::io::Result<Cow<'_, Path>> {
    text_path(rel).ok_or_else(|| not_a_path(rel))
}

/// The error for text that is no path's (see [`on_disk`]).
fn not_a_path(rel: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("{rel:?} is not the text of any path"),
    )
}

/// Calls `f` with the path `rel` is the text of (see [`on_disk`]) as a
/// NUL-terminated C string, built on the stack when it fits (every sysfs
/// path does): one heap allocation less per call.
fn with_c_path<T>(
    rel: &str,
    f: impl FnOnce(&std::ffi::CStr) -> std::io::Result<T>,
) -> std::io::Result<T> {
    let invalid = || std::io::Error::from(std::io::ErrorKind::InvalidInput);
    // Most paths hold no escape and are their own bytes.
    let bytes = match rel.as_bytes().contains(&b'\\') {
        false => Cow::Borrowed(rel.as_bytes()),
        true => unescape(rel).ok_or_else(|| not_a_path(rel))?,
    };
    let bytes = &bytes[..];
    // A NUL inside would end the path early: refused, as `CString` would.
    if bytes.contains(&0) {
        return Err(invalid());
    }
    // Left unwritten past the path and its NUL: zeroing the buffer on every
    // call cost as much as the copy.
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 512];
    if bytes.len() >= buf.len() {
        return f(&std::ffi::CString::new(bytes).map_err(|_| invalid())?);
    }
    // SAFETY: `bytes` fits in `buf` with a byte to spare (checked above),
    // and the two do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.as_mut_ptr().cast::<u8>(), bytes.len())
    };
    buf[bytes.len()].write(0);
    // SAFETY: the first `len + 1` bytes were just written: the path, which
    // holds no NUL (checked above), and its terminating NUL.
    let path = unsafe {
        std::ffi::CStr::from_bytes_with_nul_unchecked(std::slice::from_raw_parts(
            buf.as_ptr().cast::<u8>(),
            bytes.len() + 1,
        ))
    };
    f(path)
}

/// Opens `rel` beneath `dir` read-only with `flags` added, the kernel
/// resolving every link and refusing any walk that leaves `dir` (or uses a
/// `/proc` magic link).
fn openat2_raw(
    dir: &std::os::fd::OwnedFd,
    rel: &str,
    flags: libc::c_int,
) -> std::io::Result<fs::File> {
    with_c_path(rel, |path| openat2_c(dir, path, flags, CONFINED))
}

/// How every read resolves beneath the root: never above it, never
/// through a `/proc` magic link.
const CONFINED: u64 = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;

/// `openat2(2)` of `path` beneath `dir`, read-only with `flags` added,
/// resolving as `resolve` allows.
fn openat2_c(
    dir: &std::os::fd::OwnedFd,
    path: &std::ffi::CStr,
    flags: libc::c_int,
    resolve: u64,
) -> std::io::Result<fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: `open_how` is plain data; zeroed is its valid empty value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_CLOEXEC | flags) as u64;
    how.resolve = resolve;
    // SAFETY: a valid directory fd, a NUL-terminated path and a pointer to
    // an `open_how` of the size passed; the kernel returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just handed us this fd, owned by nobody else.
    Ok(unsafe { fs::File::from_raw_fd(fd as libc::c_int) })
}

/// True when `root` is on a sysfs mount (see [`SysRoot`]'s `kernfs`).
fn is_sysfs(root: &std::os::fd::OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid fd and a pointer to a `statfs` the kernel fills.
    sysfs_by(|fs| unsafe { libc::fstatfs(root.as_raw_fd(), fs) })
}

/// True when `path` is on a sysfs mount: this host's own devices, wherever
/// it is mounted (`/sys`, or `/host/sys` in a pod), and not a copy of
/// another node's tree. Only such a tree is described by this host's NVML
/// and `nvidia-smi`.
pub fn is_mounted_sysfs(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path and a pointer to a `statfs` the kernel fills.
    sysfs_by(|fs| unsafe { libc::statfs(c.as_ptr(), fs) })
}

/// Whether the filesystem `statfs` (the call that fills it) describes is
/// sysfs; a failed call is "no".
fn sysfs_by(statfs: impl FnOnce(&mut libc::statfs) -> libc::c_int) -> bool {
    const SYSFS_MAGIC: u32 = 0x6265_6572;
    // SAFETY: `statfs` is plain data; zeroed is a valid value to be overwritten.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // The magic is 32 bits wide whatever the field's width.
    statfs(&mut fs) == 0 && fs.f_type as u32 == SYSFS_MAGIC
}

/// `path` split at its last `/` into folder and last name; `None` for a
/// single name. Scans back from the end byte by byte: a sysfs path's last
/// name is a few bytes long, and this runs several times per access, where
/// a general reverse search cost more to start than to finish.
fn split_last(path: &str) -> Option<(&str, &str)> {
    let slash = path.bytes().rposition(|b| b == b'/')?;
    Some((&path[..slash], &path[slash + 1..]))
}

/// True when `path` is one or more plain names joined by single `/`: no
/// empty name (a leading, trailing or doubled `/`), no `.` and no `..`.
fn plain_names(path: &str) -> bool {
    // One pass over the bytes: a `split` iterator cost more than the walk
    // it guards.
    let bytes = path.as_bytes();
    let mut start = 0;
    for end in 0..=bytes.len() {
        if end == bytes.len() || bytes[end] == b'/' {
            if matches!(&bytes[start..end], b"" | b"." | b"..") {
                return false;
            }
            start = end + 1;
        }
    }
    true
}

/// Parses a hex attribute as the kernel prints it (`0x10de`, `0x1003`).
pub fn parse_hex(s: &str) -> Option<u32> {
    u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

/// Joins sysfs path pieces with `/`, for building relative paths.
pub fn join(base: &str, name: &str) -> String {
    if base.is_empty() {
        return name.to_string();
    }
    // Sized once: this builds every path a pass reads.
    let mut out = String::with_capacity(base.len() + 1 + name.len());
    out.push_str(base);
    out.push('/');
    out.push_str(name);
    out
}

/// The last path component of a resolved path (`devices/…/0000:03:00.0` → `0000:03:00.0`).
pub fn basename(rel: &str) -> &str {
    Path::new(rel)
        .components()
        .next_back()
        .and_then(|c| match c {
            Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tree at `dir` opened each way a host may allow: with
    /// `openat2(2)`, without it (a kernel before 5.6, or a seccomp filter
    /// refusing it), and without even a root handle. Each must answer alike.
    fn every_way(dir: &Path) -> Vec<(&'static str, SysRoot)> {
        let full = SysRoot::new(dir).unwrap();
        assert!(full.beneath.is_some(), "openat2 answers on this kernel");
        let no_openat2 = SysRoot {
            beneath: None,
            ..SysRoot::new(dir).unwrap()
        };
        let no_handle = SysRoot {
            beneath: None,
            handle: None,
            ..SysRoot::new(dir).unwrap()
        };
        vec![
            ("openat2", full),
            ("no openat2", no_openat2),
            ("no root handle", no_handle),
        ]
    }

    #[test]
    fn a_read_through_a_link_out_of_the_root_is_refused_by_either_path() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("mtu"), "1500\n").unwrap();
        fs::create_dir(dir.path().join("net")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("net/evil")).unwrap();
        std::os::unix::fs::symlink("../../..", dir.path().join("net/up")).unwrap();
        for (way, root) in every_way(dir.path()) {
            for rel in ["net/evil/mtu", "net/up/etc/hostname"] {
                match root.read(rel) {
                    Err(SysError::Escapes { .. }) => {}
                    other => panic!("{way}: {rel}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn a_fifo_attribute_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        crate::input::make_fifo(&dir.path().join("state"));
        for (way, root) in every_way(dir.path()) {
            assert!(
                matches!(
                    root.read("state"),
                    Err(SysError::NotRegular { kind: "FIFO", .. })
                ),
                "{way}"
            );
        }
    }

    #[test]
    fn reads_past_the_first_buffer_and_refuses_past_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let long = "x".repeat(600);
        fs::write(dir.path().join("long"), &long).unwrap();
        fs::write(dir.path().join("full"), "y".repeat(MAX_ATTR_BYTES as usize)).unwrap();
        fs::write(
            dir.path().join("over"),
            "z".repeat(MAX_ATTR_BYTES as usize + 1),
        )
        .unwrap();
        fs::write(dir.path().join("short"), " 7\n").unwrap();
        for (way, root) in every_way(dir.path()) {
            assert_eq!(root.read("long").unwrap(), long, "{way}");
            assert_eq!(
                root.read("full").unwrap().len(),
                MAX_ATTR_BYTES as usize,
                "{way}"
            );
            assert!(
                matches!(root.read("over"), Err(SysError::TooLarge { .. })),
                "{way}"
            );
            assert_eq!(root.read_trimmed("short").unwrap(), "7", "{way}");
        }
    }

    #[test]
    fn listing_follows_links_inside_and_refuses_them_outside() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("devices/dev0/ports")).unwrap();
        for p in ["2", "1", "10"] {
            fs::create_dir(dir.path().join("devices/dev0/ports").join(p)).unwrap();
        }
        fs::create_dir(dir.path().join("class")).unwrap();
        std::os::unix::fs::symlink("../devices/dev0", dir.path().join("class/dev0")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("class/evil")).unwrap();
        std::os::unix::fs::symlink("../devices/gone", dir.path().join("class/gone")).unwrap();
        for (way, root) in every_way(dir.path()) {
            assert_eq!(
                root.list("class/dev0/ports").unwrap(),
                ["1", "10", "2"],
                "{way}"
            );
            assert!(
                matches!(root.list("class/evil"), Err(SysError::Escapes { .. })),
                "{way}"
            );
            assert!(
                matches!(root.list("class/gone"), Err(SysError::Dangling { .. })),
                "{way}"
            );
            assert!(root.list("class/none").unwrap_err().is_not_found(), "{way}");
            // Listed from a canonical folder, a climb back up is still a listing
            // of the folder it lands in, and nothing under it is taken as canonical.
            assert_eq!(
                root.list("devices/dev0/ports/..").unwrap(),
                ["ports"],
                "{way}"
            );
            assert_eq!(
                root.resolve("devices/dev0/ports/../ports/1").unwrap(),
                "devices/dev0/ports/1",
                "{way}"
            );
            // A link asked for twice resolves the same, the second time from the cache.
            for _ in 0..2 {
                assert_eq!(
                    root.resolve("class/dev0/ports/1").unwrap(),
                    "devices/dev0/ports/1",
                    "{way}"
                );
                assert!(
                    matches!(root.resolve("class/gone"), Err(SysError::Dangling { .. })),
                    "{way}"
                );
                assert!(!root.exists("class/dev0/nothing"), "{way}");
            }
        }
    }

    #[test]
    fn a_folder_of_many_buffers_lists_whole() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("class/net");
        fs::create_dir_all(&big).unwrap();
        // Names of every length up to NAME_MAX, so buffers end at every
        // distance from their end, several buffers' worth in all.
        let mut want: Vec<String> = (0..1500)
            .map(|i| format!("{i:05}{}", "x".repeat(i % 251)))
            .collect();
        for name in &want {
            fs::create_dir(big.join(name)).unwrap();
        }
        want.sort();
        for (way, root) in every_way(dir.path()) {
            assert_eq!(root.list("class/net").unwrap(), want, "{way}");
        }
    }

    #[test]
    fn the_live_sysfs_reads_untyped_as_it_reads_typed() {
        // This host's own /sys: every machine the tests run on has one.
        let live = SysRoot::new("/sys").unwrap();
        assert!(live.kernfs, "/sys is a sysfs mount");
        let typed = SysRoot {
            kernfs: false,
            ..SysRoot::new("/sys").unwrap()
        };
        for attr in [
            "devices/system/cpu/online",
            "devices/system/cpu/possible",
            "kernel/mm/transparent_hugepage/enabled",
            "class/net/lo/mtu",
        ] {
            let (a, b) = (live.read(attr), typed.read(attr));
            assert_eq!(a.as_ref().ok(), b.as_ref().ok(), "{attr}");
            assert_eq!(a.is_ok(), b.is_ok(), "{attr}");
        }
        // A folder where an attribute belongs, a missing one, and one through a link.
        for way in [&live, &typed] {
            assert!(matches!(
                way.read("devices/system/cpu"),
                Err(SysError::NotRegular { kind: "folder", .. })
            ));
            assert!(way
                .read("devices/system/cpu/no-such-attribute")
                .unwrap_err()
                .is_not_found());
            assert!(way.read("class/net/lo/operstate").is_ok());
        }
        // A tree copied to tmpfs is not trusted so.
        let copy =
            tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
        assert!(!SysRoot::new(copy.path()).unwrap().kernfs);
    }

    #[test]
    fn a_listing_under_a_storm_of_signals_is_whole() {
        // The kernel stops filling a getdents64 buffer early when a signal is
        // pending; a listing that took a short buffer for the end would drop
        // names. Signals rain on the listing thread while it lists.
        extern "C" fn ignore(_: libc::c_int) {}
        let dir = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
        let big = dir.path().join("class/net");
        fs::create_dir_all(&big).unwrap();
        let want: Vec<String> = (0..3000).map(|i| format!("enp{i:05}s0np0")).collect();
        for name in &want {
            fs::create_dir(big.join(name)).unwrap();
        }
        // SAFETY: a handler that does nothing, installed with SA_RESTART for
        // a signal nothing else in the test binary uses.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = ignore as *const () as usize;
            act.sa_flags = libc::SA_RESTART;
            assert_eq!(
                libc::sigaction(libc::SIGUSR2, &act, std::ptr::null_mut()),
                0
            );
        }
        // SAFETY: the calling thread's own id.
        let me = unsafe { libc::pthread_self() };
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let storm = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // SAFETY: `me` lives until `stop` is set and this thread joined.
                    unsafe { libc::pthread_kill(me, libc::SIGUSR2) };
                }
            })
        };
        let root = SysRoot::new(dir.path()).unwrap();
        for _ in 0..20 {
            assert_eq!(root.list("class/net").unwrap(), want);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        storm.join().unwrap();
    }

    #[test]
    fn a_link_target_of_several_names_with_a_link_midway_is_followed_or_refused() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::create_dir_all(outside.path().join("net/eth0")).unwrap();
        fs::write(outside.path().join("net/eth0/mtu"), "9000\n").unwrap();
        fs::create_dir_all(dir.path().join("devices/real/net/eth0")).unwrap();
        fs::write(dir.path().join("devices/real/net/eth0/mtu"), "1500\n").unwrap();
        // `devices/alias` is a link: the targets below pass through it.
        std::os::unix::fs::symlink("real", dir.path().join("devices/alias")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("devices/away")).unwrap();
        fs::create_dir(dir.path().join("class")).unwrap();
        std::os::unix::fs::symlink("../devices/alias/net/eth0", dir.path().join("class/inside"))
            .unwrap();
        std::os::unix::fs::symlink("../devices/away/net/eth0", dir.path().join("class/outside"))
            .unwrap();
        std::os::unix::fs::symlink("../devices/real/net/eth0", dir.path().join("class/plain"))
            .unwrap();
        for (way, root) in every_way(dir.path()) {
            for _ in 0..2 {
                assert_eq!(
                    root.resolve("class/inside").unwrap(),
                    "devices/real/net/eth0",
                    "{way}"
                );
                assert_eq!(
                    root.resolve("class/plain").unwrap(),
                    "devices/real/net/eth0",
                    "{way}"
                );
                assert!(
                    matches!(root.resolve("class/outside"), Err(SysError::Escapes { .. })),
                    "{way}"
                );
                assert!(
                    matches!(
                        root.read("class/outside/mtu"),
                        Err(SysError::Escapes { .. })
                    ),
                    "{way}"
                );
                assert_eq!(
                    root.read_trimmed("class/inside/mtu").unwrap(),
                    "1500",
                    "{way}"
                );
            }
        }
    }

    #[test]
    fn a_bare_climb_link_resolves_to_the_folder_above_it() {
        let dir = tempfile::tempdir().unwrap();
        let function = "devices/pci0000:00/0000:3b:00.0";
        fs::create_dir_all(dir.path().join(function).join("net/eth0")).unwrap();
        fs::write(dir.path().join(function).join("vendor"), "0x15b3\n").unwrap();
        // As the kernel writes a netdev's `device` link, with and without a
        // trailing slash; and one that climbs out of the root.
        let eth0 = dir.path().join(function).join("net/eth0");
        std::os::unix::fs::symlink("../..", eth0.join("device")).unwrap();
        std::os::unix::fs::symlink("../../", eth0.join("slashed")).unwrap();
        std::os::unix::fs::symlink("../../../../../..", eth0.join("away")).unwrap();
        fs::create_dir_all(dir.path().join("class/net")).unwrap();
        std::os::unix::fs::symlink(
            format!("../../{function}/net/eth0"),
            dir.path().join("class/net/eth0"),
        )
        .unwrap();
        for (way, root) in every_way(dir.path()) {
            for _ in 0..2 {
                for link in ["device", "slashed"] {
                    let rel = format!("class/net/eth0/{link}");
                    assert_eq!(root.resolve(&rel).unwrap(), function, "{way} {link}");
                    assert_eq!(
                        root.read_trimmed(&format!("{rel}/vendor")).unwrap(),
                        "0x15b3",
                        "{way} {link}"
                    );
                }
                assert!(
                    root.resolve("class/net/eth0/away").is_err(),
                    "{way}: a climb out of the root is not the root"
                );
            }
        }
    }

    #[test]
    fn a_link_text_longer_than_the_link_buffer_resolves_the_long_way() {
        let dir = tempfile::tempdir().unwrap();
        // Five names of 120 bytes: a link text of over 600 bytes, more than
        // the stack buffer a link is first read into.
        let deep: Vec<String> = (0..5).map(|i| format!("{i}{}", "n".repeat(119))).collect();
        let folder = format!("devices/{}", deep.join("/"));
        fs::create_dir_all(dir.path().join(&folder)).unwrap();
        fs::write(dir.path().join(&folder).join("mtu"), "1500\n").unwrap();
        fs::create_dir(dir.path().join("class")).unwrap();
        let text = format!("../{folder}");
        assert!(text.len() > 512);
        std::os::unix::fs::symlink(&text, dir.path().join("class/long")).unwrap();
        for (way, root) in every_way(dir.path()) {
            for _ in 0..2 {
                assert_eq!(root.resolve("class/long").unwrap(), folder, "{way}");
                assert_eq!(
                    root.read_trimmed("class/long/mtu").unwrap(),
                    "1500",
                    "{way}"
                );
            }
        }
    }

    #[test]
    fn split_last_and_plain_names_read_paths_as_the_kernel_does() {
        assert_eq!(
            split_last("devices/pci0000:00/0000:00:01.0"),
            Some(("devices/pci0000:00", "0000:00:01.0"))
        );
        assert_eq!(split_last("class"), None);
        assert_eq!(split_last("class/"), Some(("class", "")));
        for ok in ["a", "devices/pci0000:00/x", "a/.b/..c/...", "é/ü"] {
            assert!(plain_names(ok), "{ok}");
        }
        for bad in [
            "", "/", "a/", "/a", "a//b", ".", "..", "a/./b", "a/../b", "a/..",
        ] {
            assert!(!plain_names(bad), "{bad}");
        }
    }

    #[test]
    fn basename_of_nested_path() {
        assert_eq!(basename("devices/pci0000:00/0000:00:01.0"), "0000:00:01.0");
        assert_eq!(basename("x"), "x");
    }

    #[test]
    fn join_skips_empty_base() {
        assert_eq!(join("", "a"), "a");
        assert_eq!(join("a", "b"), "a/b");
    }
}
