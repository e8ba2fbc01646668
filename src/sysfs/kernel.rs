//! The system calls under every read: the root as a directory handle,
//! `openat2(2)` beneath it, a path's text as the C string the kernel
//! takes, and `statfs(2)` to tell a live sysfs from a copy.

use crate::escape::{text_path, unescape};
use std::borrow::Cow;
use std::fs;
use std::path::Path;

/// Opens `root` as a directory handle for [`openat2_raw`].
pub(super) fn open_dir(root: &Path) -> Option<std::os::fd::OwnedFd> {
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
pub(super) fn openat2_works(dir: &std::os::fd::OwnedFd) -> bool {
    openat2_raw(dir, ".", libc::O_DIRECTORY).is_ok()
}

/// The path on disk that the text `rel` names (see [`crate::escape`]); text
/// that no path escapes to is refused, naming it.
pub(super) fn on_disk(rel: &str) -> std::io::Result<Cow<'_, Path>> {
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
pub(super) fn with_c_path<T>(
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
pub(super) fn openat2_raw(
    dir: &std::os::fd::OwnedFd,
    rel: &str,
    flags: libc::c_int,
) -> std::io::Result<fs::File> {
    with_c_path(rel, |path| openat2_c(dir, path, flags, CONFINED))
}

/// How every read resolves beneath the root: never above it, never
/// through a `/proc` magic link.
pub(super) const CONFINED: u64 = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;

/// `openat2(2)` of `path` beneath `dir`, read-only with `flags` added,
/// resolving as `resolve` allows.
pub(super) fn openat2_c(
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
pub(super) fn is_sysfs(root: &std::os::fd::OwnedFd) -> bool {
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
