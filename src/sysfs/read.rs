//! Reading what a path names: an attribute whole and bounded, a folder's
//! names, a link's text, whether something is there. The kernel resolves
//! and confines in one call where it can; any refusal is asked again the
//! long way, through [`super::resolve`], which names the fault.

use super::kernel::{on_disk, openat2_c, openat2_raw, with_c_path, CONFINED};
use super::record::Entry;
use super::{SysError, SysRoot, MAX_ATTR_BYTES};
use crate::escape::{escape, path_text as text_of};
use std::ffi::OsString;
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

impl SysRoot {
    /// Reads an attribute whole, refusing one over [`MAX_ATTR_BYTES`] and
    /// anything that is not a regular file. The open never blocks (a FIFO
    /// planted where an attribute belongs would otherwise hang the pass), and
    /// the type is checked on the opened descriptor, so nothing can be swapped
    /// in between the check and the read.
    pub fn read(&self, rel: &str) -> Result<String, SysError> {
        self.read_beneath(rel, None)
    }

    /// Reads `name` (one name or several) in `folder`: as [`Self::read`]
    /// reads the two joined, joined on the stack instead of the heap (every
    /// attribute of every device is read so).
    pub fn read_in(&self, folder: &str, name: &str) -> Result<String, SysError> {
        super::with_joined(folder, name, |rel| self.read_beneath(rel, None))
    }

    /// [`Self::read_in`] trimmed as [`Self::read_trimmed`] trims.
    pub fn read_trimmed_in(&self, folder: &str, name: &str) -> Result<String, SysError> {
        let mut v = self.read_in(folder, name)?;
        trim_in_place(&mut v);
        Ok(v)
    }

    /// [`Self::read_trimmed_in`] of `name` beneath `folder`, a path that
    /// [`Self::resolve`] answered: the read also proves `folder` where that
    /// is only presumed (see [`super::trust`]). Discovery reads so the
    /// first attribute beneath each link target it resolves.
    pub fn read_trimmed_proving(&self, folder: &str, name: &str) -> Result<String, SysError> {
        let folder_t = folder.trim_start_matches('/');
        let mut v = super::with_joined(folder, name, |rel| self.read_beneath(rel, Some(folder_t)))?;
        trim_in_place(&mut v);
        Ok(v)
    }

    /// [`Self::read`] of `rel`, which lies beneath `folder` if one is
    /// named: the read proves `folder` when it is presumed.
    fn read_beneath(&self, rel: &str, folder: Option<&str>) -> Result<String, SysError> {
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
                // A presumed folder is proved by refusing every link on the
                // way: the read that succeeds so shows the path plain.
                let proving = folder.filter(|f| self.to_prove(f));
                let first = match proving {
                    Some(_) => resolve | libc::RESOLVE_NO_SYMLINKS,
                    None => resolve,
                };
                let open =
                    |flags, resolve| with_c_path(rel_t, |path| openat2_c(fd, path, flags, resolve));
                match open(flags | libc::O_NOFOLLOW, first) {
                    Ok(f) => {
                        if let Some(folder) = proving {
                            self.proved(folder);
                        }
                        Some(f)
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ELOOP) => open(flags, resolve).ok(),
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
        trim_in_place(&mut v);
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

    /// Whether the folder holding `rel` has an entry of `rel`'s last name,
    /// which is not followed (a link there is an entry, dangling or not).
    /// One call where the kernel confines it: for learning where a
    /// numbered run of entries ends without listing their folder. Ask in a
    /// folder just read from: the kernel's "no such entry" is taken as the
    /// name's, though it would say the same of a folder gone since.
    pub fn has_entry(&self, rel: &str) -> Result<bool, SysError> {
        let io = |cause| SysError::Io {
            path: rel.to_string(),
            cause,
        };
        let rel_t = rel.trim_start_matches('/');
        let Some((folder, name)) = rel_t.rsplit_once('/') else {
            return Err(io(std::io::ErrorKind::InvalidInput.into()));
        };
        if let (Some(fd), false) = (&self.beneath, self.recording_on()) {
            match openat2_raw(fd, rel_t, libc::O_PATH | libc::O_NOFOLLOW) {
                Ok(_) => return Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
                // An escape or a refusal: the long way names it.
                Err(_) => {}
            }
        }
        let dir = self.resolve_abs(folder)?;
        match fs::symlink_metadata(dir.join(on_disk(name).map_err(io)?)) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io(e)),
        }
    }

    /// How many folders the folder `rel` holds, from its link count (2, and
    /// one for each folder in it, on sysfs, tmpfs and the usual disk
    /// formats), without listing it: one `fstatat(2)`, which finds what is
    /// there where asking for the next name finds what is not (a name that
    /// is not there costs a tmpfs lookup twice what one that is does).
    /// `rel` must lie in a folder known canonical, and its last name is not
    /// followed, so the answer is of a folder inside the root. `None` where
    /// the count says nothing (a link, not a folder, a count under 2, a
    /// recording tree, no root handle): the caller lists the folder.
    pub fn folders_in(&self, rel: &str) -> Option<u64> {
        use std::os::fd::AsRawFd;
        let dir = self.handle.as_ref().filter(|_| !self.recording_on())?;
        let rel_t = rel.trim_start_matches('/');
        if !self.in_canonical_folder(rel_t) {
            return None;
        }
        let stat = with_c_path(rel_t, |path| {
            let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
            // SAFETY: a valid directory fd, a NUL-terminated path and room
            // for one `stat`, which the kernel fills when it answers 0.
            let rc = unsafe {
                libc::fstatat(
                    dir.as_raw_fd(),
                    path.as_ptr(),
                    st.as_mut_ptr(),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            if rc != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: filled by the kernel, which answered 0.
            Ok(unsafe { st.assume_init() })
        })
        .ok()?;
        let folder = stat.st_mode & libc::S_IFMT == libc::S_IFDIR;
        (folder && stat.st_nlink >= 2).then(|| stat.st_nlink as u64 - 2)
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

/// Trims `v`'s white space in place: one allocation per attribute, not two.
fn trim_in_place(v: &mut String) {
    v.truncate(v.trim_end().len());
    let lead = v.len() - v.trim_start().len();
    v.drain(..lead);
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
