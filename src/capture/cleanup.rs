//! Removes replay folders when the process is told to stop.
//!
//! A temp folder's own `Drop` never runs when a signal ends the
//! process, so a replayed capture (a copy of a node's sysfs, maybe large)
//! would stay behind in `$TMPDIR`. One watcher thread, started on the first
//! replay, removes every folder still registered and then ends the process
//! the way the signal would have, so a parent still sees "killed by SIGTERM".
//!
//! The folder list's lock is also what the unpacking holds while it writes an
//! entry: a signal therefore never removes a folder half-way through a write
//! that then recreates part of it.

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

/// The folders to remove on a signal.
static FOLDERS: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// Whether the watcher thread started (once per process), or why it could not.
static WATCHER: OnceLock<Result<(), WatchError>> = OnceLock::new();

/// Why no watcher runs; kept for every later replay of the process, hence
/// the shared (cloneable) I/O error.
#[derive(Debug, Clone, thiserror::Error)]
enum WatchError {
    /// The signal handlers could not be installed.
    #[error("watching SIGHUP/SIGINT/SIGTERM")]
    Signals(#[source] Arc<io::Error>),
    /// The watcher thread could not be started.
    #[error("starting the cleanup thread")]
    Thread(#[source] Arc<io::Error>),
}

/// Holds the folder list; a signal's cleanup waits until it is dropped.
pub struct Hold {
    _held: MutexGuard<'static, BTreeSet<PathBuf>>,
}

/// Takes the folder list's lock (a panic elsewhere does not disable cleanup).
fn folders() -> MutexGuard<'static, BTreeSet<PathBuf>> {
    FOLDERS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts the watcher once; later calls return how the first one went.
fn watch() -> io::Result<()> {
    let started = WATCHER.get_or_init(|| {
        let mut signals = Signals::new([SIGHUP, SIGINT, SIGTERM])
            .map_err(|e| WatchError::Signals(Arc::new(e)))?;
        std::thread::Builder::new()
            .name("replay-cleanup".into())
            .spawn(move || {
                if let Some(signal) = signals.forever().next() {
                    // Kept locked until the process ends: nothing is written after this.
                    let held = folders();
                    for dir in held.iter() {
                        if let Err(e) = std::fs::remove_dir_all(dir) {
                            eprintln!(
                                "nodefabric: removing the replay folder {}: {e}",
                                dir.display()
                            );
                        }
                    }
                    let _ = signal_hook::low_level::emulate_default_handler(signal);
                }
            })
            .map(drop)
            .map_err(|e| WatchError::Thread(Arc::new(e)))
    });
    started.clone().map_err(io::Error::other)
}

/// A folder that is removed when this is dropped, or when SIGHUP, SIGINT or
/// SIGTERM ends the process first (a closed terminal, Ctrl-C, a stop).
#[derive(Debug)]
pub struct Folder {
    path: PathBuf,
}

impl Folder {
    /// Creates a fresh `<prefix>XXXXXX` folder in the temp folder (`$TMPDIR`)
    /// and registers it, with no moment in between where a signal could
    /// leave it behind.
    pub fn create(prefix: &str) -> io::Result<Folder> {
        watch()?;
        let mut held = folders();
        let path = tempfile::Builder::new().prefix(prefix).tempdir()?.keep();
        held.insert(path.clone());
        Ok(Folder { path })
    }

    /// The folder's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keeps a signal's cleanup waiting while the caller writes into the folder.
    pub fn hold(&self) -> Hold {
        Hold { _held: folders() }
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let mut held = folders();
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!("removing the replay folder {}: {e}", self.path.display());
            }
        }
        held.remove(&self.path);
    }
}
