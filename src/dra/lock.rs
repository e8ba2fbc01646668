//! One driver per node: an advisory lock (`flock(2)`) on a file in the
//! state folder, held for the life of the process. A second
//! `nodefabric-dra` on the same `--state-dir` (a rolling update that
//! overlaps two pods, a hand-started copy) waits for it within a bound, or
//! exits naming the holder, so two drivers never interleave Prepare and
//! Unprepare or write the checkpoint at once. The kernel drops the lock
//! when the holder exits, however it exits, so no stale lock outlives it.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// The lock file's name in the state folder.
pub const FILE: &str = "dra.lock";

/// How often a waiting driver tries the lock again.
const RETRY: Duration = Duration::from_millis(200);

/// Why the lock was not taken; each names the lock file.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The lock file cannot be opened or locked.
    #[error("{path}: {cause}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// What the file system said.
        cause: std::io::Error,
    },
    /// Another driver held the lock for the whole wait.
    #[error("{path} is held by {holder}: another nodefabric-dra serves this state folder; still held after waiting {waited:?} (--lock-wait)")]
    Held {
        /// The lock file.
        path: PathBuf,
        /// The holder as it wrote itself into the file.
        holder: String,
        /// How long this driver was to wait (`--lock-wait`).
        waited: Duration,
    },
}

/// The held lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct StateLock {
    _file: File,
}

impl StateLock {
    /// Takes the lock in `dir`, waiting at most `wait` for a holder to let
    /// go, then writes this process's pid and host name into the file for
    /// the next one to name.
    pub async fn acquire(dir: &Path, wait: Duration) -> Result<StateLock, LockError> {
        let path = dir.join(FILE);
        let io = |cause| LockError::Io {
            path: path.clone(),
            cause,
        };
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        let started = Instant::now();
        let mut said = false;
        while !try_lock(&file).map_err(io)? {
            let holder = holder(&mut file);
            if started.elapsed() >= wait {
                return Err(LockError::Held {
                    path,
                    holder,
                    waited: wait,
                });
            }
            if !said {
                warn!(
                    "{} is held by {holder}: waiting up to {wait:?} (--lock-wait) for it to stop",
                    path.display()
                );
                said = true;
            }
            tokio::time::sleep(RETRY.min(wait.saturating_sub(started.elapsed()))).await;
        }
        let me = format!("pid {} on host {}", std::process::id(), hostname());
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        file.write_all(format!("{me}\n").as_bytes()).map_err(io)?;
        if said {
            info!("{} taken after {:?}", path.display(), started.elapsed());
        }
        Ok(StateLock { _file: file })
    }
}

/// True when the exclusive lock was taken, false when another holds it.
fn try_lock(file: &File) -> std::io::Result<bool> {
    // SAFETY: flock on a descriptor this File owns for the call's duration.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Ok(false),
        Some(libc::EINTR) => Ok(false),
        _ => Err(e),
    }
}

/// What the holder wrote into the lock file, or words saying it wrote
/// nothing yet (it is between taking the lock and writing).
fn holder(file: &mut File) -> String {
    let mut text = String::new();
    let read = file
        .rewind()
        .and_then(|_| file.take(256).read_to_string(&mut text));
    match read.map(|_| text.trim()) {
        Ok(t) if !t.is_empty() => t.to_string(),
        _ => "another process (which has not named itself yet)".to_string(),
    }
}

/// This host's name (in a pod, the pod's name), for the holder line.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "an unknown host".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_held_lock_is_refused_naming_the_holder_and_taken_once_released() {
        let dir = tempfile::tempdir().unwrap();
        let first = StateLock::acquire(dir.path(), Duration::ZERO)
            .await
            .unwrap();
        // flock locks belong to the open file description: a second open in
        // this process contends exactly as another process would.
        let e = StateLock::acquire(dir.path(), Duration::from_millis(300))
            .await
            .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains(&format!("pid {}", std::process::id()))
                && text.contains(&dir.path().join(FILE).display().to_string()),
            "{text}"
        );
        drop(first);
        StateLock::acquire(dir.path(), Duration::ZERO)
            .await
            .unwrap();
    }
}
