//! Where a path under the root leads: through every link, and never out
//! of the root. One pass resolves the same folders again and again, so
//! what it learns is kept for the pass; the kernel's links are read one at
//! a time where that is cheap, and a full walk names any fault.

use super::kernel::{on_disk, openat2_c, with_c_path};
use super::{join, SysError, SysRoot};
use crate::escape::{escape, path_text as text_of};
use std::fs;
use std::path::{Path, PathBuf};

/// A word-at-a-time hash (rustc's "Fx") of a path's length and last bytes,
/// for the resolution cache: its keys are sysfs paths of a hundred bytes or
/// so, which SipHash took a visible part of a pass to hash. The paths come
/// from the tree being read; a tree built to collide them only slows its
/// own pass down.
#[derive(Debug, Clone, Copy, Default)]
pub struct BuildPathHash;

/// The running state of [`BuildPathHash`].
pub struct PathHash(u64);

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
        // Paths in one table share long prefixes and differ in their last
        // names: their length and last 32 bytes tell them apart at a third
        // of the cost of every byte. Paths alike in both only share a
        // bucket, where the table compares them whole.
        let bytes = match bytes.len() {
            n if n > 32 => {
                self.add(n as u64);
                &bytes[n - 32..]
            }
            _ => bytes,
        };
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

/// Where a path this pass resolved leads: the resolution table's value.
#[derive(Debug)]
pub(crate) enum Place {
    /// The path itself is canonical: checked plain, or read as no link.
    Canonical,
    /// Canonical as far as this pass presumes, until a read proves it
    /// (see [`super::trust`]).
    Presumed,
    /// A link met as a folder on the way, leading to this canonical path.
    At(String),
}

impl Place {
    /// True when the path is its own canonical path, proved or presumed.
    fn canonical(&self) -> bool {
        !matches!(self, Place::At(_))
    }
}

/// The resolution table: each path resolved this pass, by its text.
pub(crate) type Places = hashbrown::HashMap<String, Place, BuildPathHash>;

/// What one pass's resolutions know of a path (see [`SysRoot::resolve`]).
enum Known<'a> {
    /// It was resolved, and is itself canonical: the asker's own text is
    /// the answer (no copy is made here).
    Canonical,
    /// It was resolved: to this other, canonical path.
    Resolved(String),
    /// Only its folder was resolved: the path's last name joined to where
    /// that folder resolved (canonical if that name is no link); the
    /// asker's own text where the folder is itself canonical.
    Under(std::borrow::Cow<'a, str>),
    /// Neither it nor its folder.
    Neither,
}

impl SysRoot {
    /// `abs` (inside the root, as [`Self::resolve_abs`] returns it) relative to the root.
    pub(super) fn relative<'a>(&self, abs: &'a Path) -> &'a Path {
        abs.strip_prefix(&self.root)
            .expect("resolve_abs checked containment")
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
    pub(super) fn resolve_abs(&self, rel: &str) -> Result<PathBuf, SysError> {
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
        let candidate: std::borrow::Cow<str> = match (known, folder) {
            (Some(c), _) => c,
            (None, None) => name.into(),
            (None, Some(p)) => {
                join(&self.resolve_hops(p, hops, true).map_err(|_| None)?, name).into()
            }
        };
        let mut link = [0u8; 512];
        let text = match self.read_link_under(&candidate, &mut link) {
            Ok(t) => t,
            // Not a link: the entry is there, and canonical under its folder.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.remember(rel_t, &candidate);
                return Ok(candidate.into_owned());
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
        // A target this pass has resolved is answered at once (a VF's
        // `physfn` names its PF, known since its own link was read).
        // Several names past what is known: one call checks them all.
        match self.known(&target) {
            Known::Canonical => return Ok(self.answered(rel_t, parent, target)),
            Known::Resolved(out) => return Ok(self.answered(rel_t, parent, out)),
            Known::Neither if rest.as_bytes().contains(&b'/') && self.all_plain(base, &target) => {
                return Ok(self.answered(rel_t, parent, target))
            }
            Known::Under(_) | Known::Neither => {}
        }
        // A target that does not resolve is a dangling link: the walk says so.
        let out = self
            .resolve_hops(&target, hops + 1, false)
            .map_err(|_| None)?;
        Ok(self.answered(rel_t, parent, out))
    }

    /// What this pass knows of `rel` (see [`Known`]): one lock, at most two
    /// looks, and a folder's path joined while the cache is held, so it is
    /// not copied out first.
    fn known<'a>(&self, rel: &'a str) -> Known<'a> {
        let cache = self.folders.lock().expect("folder cache lock");
        if let Some(hit) = cache.get(rel) {
            return match hit {
                Place::At(out) => Known::Resolved(out.clone()),
                _ => Known::Canonical,
            };
        }
        match split_last(rel)
            .and_then(|(folder, name)| cache.get(folder).map(|hit| (folder, hit, name)))
        {
            Some((_, Place::At(out), name)) => Known::Under(join(out, name).into()),
            Some(_) => Known::Under(rel.into()),
            None => Known::Neither,
        }
    }

    /// True when `rel` exists beneath the root with no link anywhere on its
    /// way, so it is canonical; `known` is a canonical folder it lies under.
    /// One `openat2(2)` refusing every link checks all the names past
    /// `known` at once, where a `readlink` per name would walk the path
    /// once per name; while the tree presumes (see [`super::trust`]) `rel`
    /// is taken as plain, for a read beneath it to prove. Each folder on
    /// the way is remembered as canonical, `rel` as presumed. False
    /// (nothing learnt) where the call is refused for any reason: a link
    /// on the way, a missing name, or a kernel without `openat2`.
    fn all_plain(&self, known: &str, rel: &str) -> bool {
        let presuming = self.presuming();
        if !presuming && !self.plain_beneath(rel) {
            return false;
        }
        // `rel` itself, then each folder back towards `known`, under one
        // lock, until one this pass already holds as canonical: the folders
        // above it were remembered with it (a sibling's walk, most often).
        // Presumed, `rel` alone carries the presumption: its folders are
        // plain if it is, and the tree is read again if it is not.
        let mut cache = self.folders.lock().expect("folder cache lock");
        let mut path = rel;
        let mut place = match presuming {
            true => Place::Presumed,
            false => Place::Canonical,
        };
        while path.len() > known.len() {
            let presumed = matches!(place, Place::Presumed);
            // One hash per folder: looked up and, where missing, added.
            match cache.entry_ref(path) {
                hashbrown::hash_map::EntryRef::Occupied(e) if e.get().canonical() => break,
                hashbrown::hash_map::EntryRef::Occupied(mut e) => {
                    e.insert(place);
                }
                hashbrown::hash_map::EntryRef::Vacant(e) => {
                    e.insert(place);
                }
            }
            if presumed {
                self.presumed_one();
            }
            place = Place::Canonical;
            match split_last(path) {
                Some((folder, _)) => path = folder,
                None => break,
            }
        }
        true
    }

    /// True when `rel` is there beneath the root with no link on its way:
    /// one `openat2(2)` that refuses every link. False where the kernel
    /// refuses it for any reason, or cannot be asked (no `openat2`).
    pub(super) fn plain_beneath(&self, rel: &str) -> bool {
        let Some(dir) = &self.beneath else {
            return false;
        };
        with_c_path(rel, |path| {
            openat2_c(
                dir,
                path,
                libc::O_PATH,
                libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
            )
        })
        .is_ok()
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

    /// Drops every resolution this tree remembers and their table, so that
    /// a caller done with the walk does not hold them through what follows.
    pub fn forget_resolutions(&self) {
        let mut cache = self.folders.lock().expect("folder cache lock");
        *cache = Places::with_hasher(BuildPathHash);
        self.forget_presumptions();
    }

    /// Makes room for `count` resolutions in all, for a caller that knows
    /// how many the pass will make.
    pub fn expect_resolutions(&self, count: usize) {
        let mut cache = self.folders.lock().expect("folder cache lock");
        let more = count.saturating_sub(cache.len());
        cache.reserve(more);
    }

    /// Remembers that `rel` resolves to `canonical` for the rest of the pass.
    fn remember(&self, rel: &str, canonical: &str) {
        // A canonical path maps to itself, stored as no path at all: one
        // string per entry, not two.
        let place = if rel == canonical {
            Place::Canonical
        } else {
            Place::At(canonical.to_string())
        };
        self.folders
            .lock()
            .expect("folder cache lock")
            .insert(rel.to_string(), place);
    }

    /// True when the folder holding `rel` is known, from this pass, to be
    /// canonical: no link on the way to it, and inside the root. Then the
    /// kernel need not follow `rel`'s last name to confine it, and a name
    /// missing there is the answer at once, since nothing on the way can
    /// dangle.
    pub(super) fn in_canonical_folder(&self, rel: &str) -> bool {
        match split_last(rel) {
            None => true,
            Some((folder, _)) => self
                .folders
                .lock()
                .expect("folder cache lock")
                .get(folder)
                .is_some_and(Place::canonical),
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
}

/// `path` split at its last `/` into folder and last name; `None` for a
/// single name. Scans back from the end byte by byte: a sysfs path's last
/// name is a few bytes long, and this runs several times per access, where
/// a general reverse search cost more to start than to finish.
pub(super) fn split_last(path: &str) -> Option<(&str, &str)> {
    let slash = path.bytes().rposition(|b| b == b'/')?;
    Some((&path[..slash], &path[slash + 1..]))
}

/// True when `path` is one or more plain names joined by single `/`: no
/// empty name (a leading, trailing or doubled `/`), no `.` and no `..`.
pub(super) fn plain_names(path: &str) -> bool {
    // A sysfs link's text past its climbs holds no `//` and no name that
    // starts with a dot: two vectorised searches settle it. Anything else
    // is looked at name by name.
    if !path.is_empty()
        && !path.starts_with(['/', '.'])
        && !path.ends_with('/')
        && !path.contains("//")
        && !path.contains("/.")
    {
        return true;
    }
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
