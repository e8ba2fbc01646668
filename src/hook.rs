//! `nodefabric` as NFD's `source.d` hook: where nfd-worker finds the host's
//! sysfs when it runs the binary bare, and the install and removal of the
//! binary in that folder, done by the binary itself because the image has
//! no shell to copy with.
//!
//! nfd-worker (v0.12 to v0.16) runs every regular, non-hidden file of
//! `source.d` each pass, so the one thing an install must never leave under a
//! visible name is a half-copied binary: the copy goes to a dot-named temp
//! file in the same folder and is renamed into place.

use anyhow::{Context, Result};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The name the hook has in `source.d`, which nfd-worker also logs its
/// stderr under.
pub const HOOK_NAME: &str = "nodefabric";

/// Where NFD's worker DaemonSet (its manifests and its Helm chart) mounts
/// the host's `/sys`: a hook run bare reads it there when it exists.
pub const HOST_SYS: &str = "/host-sys";

/// The host's `source.d` folder, the default of `--dest`.
pub const SOURCE_D: &str = "/etc/kubernetes/node-feature-discovery/source.d";

/// The mode of the installed hook: nfd-worker executes it, whatever uid it
/// runs as; nobody but root may change it.
pub const HOOK_MODE: u32 = 0o755;

/// The sysfs tree a bare run reads when `NODEFABRIC_SYSFS_ROOT` does not
/// name one: `/host-sys` inside nfd-worker's container, `/sys` elsewhere.
pub fn bare_sysfs_root() -> PathBuf {
    let host = Path::new(HOST_SYS);
    if host.is_dir() {
        host.to_path_buf()
    } else {
        PathBuf::from("/sys")
    }
}

/// Copies the running binary into `dir` as [`HOOK_NAME`], replacing any
/// previous one atomically: nfd-worker sees the old hook or the new one,
/// never a partial file, and a hook it is running at that moment keeps
/// running (the rename swaps names; nothing writes into the running inode).
pub fn install(dir: &Path) -> Result<PathBuf> {
    let source = std::env::current_exe().context("finding this binary to install it")?;
    install_from(&source, dir)
}

/// [`install`] of the binary at `source`.
pub fn install_from(source: &Path, dir: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let target = dir.join(HOOK_NAME);
    if !dir.is_dir() {
        anyhow::bail!(
            "{} is not a folder (the host's NFD source.d must be mounted there)",
            dir.display()
        );
    }
    // An install killed between copy and rename left its temp file; it is
    // hidden, so NFD never ran it, and the next install clears it.
    crate::publish::remove_stale_temps(dir, &[HOOK_NAME]);
    let mut from =
        fs::File::open(source).with_context(|| format!("opening {}", source.display()))?;
    // Hidden (a leading dot): nfd-worker skips it while it is incomplete.
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{HOOK_NAME}."))
        .tempfile_in(dir)
        .with_context(|| format!("creating a temp file in {}", dir.display()))?;
    std::io::copy(&mut from, &mut tmp)
        .and_then(|_| tmp.flush())
        .and_then(|_| {
            tmp.as_file()
                .set_permissions(fs::Permissions::from_mode(HOOK_MODE))
        })
        .and_then(|_| tmp.as_file().sync_all())
        .with_context(|| format!("copying {} to {}", source.display(), target.display()))?;
    tmp.persist(&target)
        .map_err(|e| e.error)
        .with_context(|| format!("renaming into {}", target.display()))?;
    sync_folder(dir);
    Ok(target)
}

/// Removes the hook from `dir`, so nfd-worker stops running it and drops
/// its labels at its next pass. A hook already gone is no error: a
/// `preStop` may run after a node restart cleared nothing, or twice.
pub fn remove(dir: &Path) -> Result<Option<PathBuf>> {
    let target = dir.join(HOOK_NAME);
    match fs::symlink_metadata(&target) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", target.display())),
        // Only a file of ours is removed: a folder there is someone else's.
        Ok(m) if !m.is_file() => {
            anyhow::bail!("{} is not a regular file: not removed", target.display())
        }
        Ok(_) => {}
    }
    fs::remove_file(&target).with_context(|| format!("removing {}", target.display()))?;
    sync_folder(dir);
    Ok(Some(target))
}

/// Makes a rename or removal in `dir` durable; failing that is not worth
/// failing the command, whose change is already visible.
fn sync_folder(dir: &Path) {
    if let Err(e) = fs::File::open(dir).and_then(|d| d.sync_all()) {
        tracing::warn!("fsync of {} failed: {e}", dir.display());
    }
}

/// The signals the kubelet (SIGTERM) and a person at a terminal (SIGINT)
/// stop the holding process with.
fn termination_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set before sigaddset reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        set
    }
}

/// Blocks SIGTERM and SIGINT before the install, so one sent while the
/// binary copies is kept pending for [`wait_for_termination`], not lost.
pub fn block_termination() -> Result<()> {
    let set = termination_signals();
    // SAFETY: a valid set; this process has one thread, whose mask it is.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc)).context("blocking SIGTERM");
    }
    Ok(())
}

/// Blocks until SIGTERM or SIGINT arrives and returns its number: the
/// holding process of the hook's pod, which has no shell or `sleep` to run.
/// As PID 1 of its container a signal's default action would be ignored
/// (the kubelet would wait out the grace period and kill it), so the
/// signals are blocked and waited for instead.
pub fn wait_for_termination() -> Result<i32> {
    block_termination()?;
    let set = termination_signals();
    let mut signal = 0;
    // SAFETY: a valid set, blocked above, as sigwait requires.
    let rc = unsafe { libc::sigwait(&set, &mut signal) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc)).context("waiting for SIGTERM");
    }
    Ok(signal)
}
