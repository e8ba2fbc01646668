//! Wakes a plugin's loop when, and only when, something it serves from may
//! have changed: one of the files it names (a spec, `kubelet.sock`, its own
//! sockets) created, removed, renamed in or out, or closed after writing;
//! and on a poll tick, the fallback where inotify misses or is unavailable.
//!
//! inotify also reports opens, reads and writes in progress; a plugin's own
//! reads of its inputs are among them, so waking on every event would make
//! each reload cause the next. Those are filtered out here, on notify's
//! thread, before anything is sent.
//!
//! Each folder's parent is watched too, and a folder's watch is re-armed
//! when the folder is replaced (`rm -rf` then `mkdir`), which inotify does
//! not follow by itself.

use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
use notify::{Event, EventKind, RecursiveMode, Watcher};
use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{Interval, MissedTickBehavior};
use tracing::debug;

/// How long a burst of file events (a rename, a kubelet restart) may take
/// to settle before the loop looks.
const DEBOUNCE: Duration = Duration::from_millis(50);

/// What ended a wait in [`FolderWatch::next`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// A relevant file event; [`FolderWatch::settle`] lets its burst end.
    Event,
    /// The poll tick (the first one at once).
    Tick,
}

/// A folder to keep watched, with the identity of the one watched now.
#[derive(Debug)]
struct Armed {
    path: PathBuf,
    /// `(device, inode)` of the folder under watch; `None` when none is.
    identity: Option<(u64, u64)>,
}

/// The inotify watch of a plugin's folders (and their parents), with the
/// poll tick that backs it up.
pub struct FolderWatch {
    watcher: Option<notify::RecommendedWatcher>,
    folders: Vec<Armed>,
    /// One message per relevant event burst (capacity 1: a burst coalesces).
    wake: mpsc::Receiver<()>,
    tick: Interval,
    /// Set by the event handler when a watched folder itself was created,
    /// removed or renamed. The identity check alone is not enough: a folder
    /// recreated at once often gets the inode number of the one deleted.
    replaced: Arc<AtomicBool>,
    /// The named files created (or renamed in) since [`Self::take_created`]
    /// last asked: a file made anew may carry the inode number of the one
    /// it replaced, so its creation is the sure sign.
    created: Arc<Mutex<BTreeSet<PathBuf>>>,
}

impl FolderWatch {
    /// Watches `folders` for changes to the file names in `files` (full
    /// paths) and to the folders themselves, and ticks every `poll`; where
    /// inotify is unavailable (the error returned) the tick does the work.
    pub fn new(
        folders: &[&Path],
        files: Vec<PathBuf>,
        poll: Duration,
    ) -> (FolderWatch, Option<notify::Error>) {
        let (wake, wake_rx) = mpsc::channel::<()>(1);
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut relevant: BTreeSet<PathBuf> = files.into_iter().collect();
        let watched: BTreeSet<PathBuf> = folders.iter().map(|f| f.to_path_buf()).collect();
        relevant.extend(watched.iter().cloned());
        let replaced = Arc::new(AtomicBool::new(false));
        let flag = replaced.clone();
        let created = Arc::new(Mutex::new(BTreeSet::new()));
        let born = created.clone();
        let handler = move |res: notify::Result<Event>| {
            let Ok(event) = res else { return };
            if !matters(&event.kind) {
                return;
            }
            if !matches!(event.kind, EventKind::Access(_))
                && event.paths.iter().any(|p| watched.contains(p))
            {
                flag.store(true, Ordering::SeqCst);
            }
            if event.paths.iter().any(|p| relevant.contains(p)) {
                debug!(?event, "file event");
                if creates(&event.kind) {
                    let mut born = born.lock().unwrap_or_else(|e| e.into_inner());
                    born.extend(
                        event
                            .paths
                            .iter()
                            .filter(|p| relevant.contains(*p))
                            .cloned(),
                    );
                }
                // Full means a wake is already pending: nothing is lost.
                let _ = wake.try_send(());
            }
        };
        let (watcher, error) = match notify::recommended_watcher(handler) {
            Ok(w) => (Some(w), None),
            Err(e) => (None, Some(e)),
        };
        let mut parents: Vec<Armed> = Vec::new();
        for f in folders {
            if let Some(parent) = f.parent().filter(|p| !p.as_os_str().is_empty()) {
                if !parents.iter().any(|a| a.path == parent) {
                    parents.push(Armed {
                        path: parent.to_path_buf(),
                        identity: None,
                    });
                }
            }
        }
        let mut all = parents;
        all.extend(folders.iter().map(|f| Armed {
            path: f.to_path_buf(),
            identity: None,
        }));
        let mut watch = FolderWatch {
            watcher,
            folders: all,
            wake: wake_rx,
            tick,
            replaced,
            created,
        };
        watch.rearm();
        (watch, error)
    }

    /// Watches again every folder that was replaced or has appeared since it
    /// was last watched. Costs one stat per folder; call it on every wake.
    pub fn rearm(&mut self) {
        let Some(watcher) = self.watcher.as_mut() else {
            return;
        };
        let replaced = self.replaced.swap(false, Ordering::SeqCst);
        for armed in &mut self.folders {
            let now = std::fs::metadata(&armed.path)
                .ok()
                .filter(|m| m.is_dir())
                .map(|m| (m.dev(), m.ino()));
            if now == armed.identity && !replaced {
                continue;
            }
            // notify drops a watch whose folder was deleted, but may still
            // list it; forget it either way, then watch what is there now.
            let _ = watcher.unwatch(&armed.path);
            armed.identity = None;
            if now.is_some() {
                match watcher.watch(&armed.path, RecursiveMode::NonRecursive) {
                    Ok(()) => {
                        debug!(folder = %armed.path.display(), "watching");
                        armed.identity = now;
                    }
                    Err(e) => debug!(folder = %armed.path.display(), "cannot watch yet: {e}"),
                }
            }
        }
    }
}

impl FolderWatch {
    /// Waits for a relevant file event or the poll tick. Cancel-safe, so it
    /// can race a shutdown or a retry timer in `select!`.
    pub async fn next(&mut self) -> Wake {
        tokio::select! {
            _ = self.tick.tick() => Wake::Tick,
            Some(()) = self.wake.recv() => Wake::Event,
        }
    }

    /// True when `path` (one of the named files) was created or renamed in
    /// since the last call for it; forgets that it was.
    pub fn take_created(&self, path: &Path) -> bool {
        self.created
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(path)
    }

    /// Lets a burst of events end, then forgets the wakes it left, so one
    /// burst costs one look.
    pub async fn settle(&mut self) {
        tokio::time::sleep(DEBOUNCE).await;
        while self.wake.try_recv().is_ok() {}
    }
}

/// True for the events that put a new file under a name.
fn creates(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::Create(_)
            | EventKind::Modify(ModifyKind::Name(
                RenameMode::To | RenameMode::Both | RenameMode::Any
            ))
    )
}

/// True for the events that can change a file's content or presence.
fn matters(kind: &EventKind) -> bool {
    match kind {
        EventKind::Create(_) | EventKind::Remove(_) => true,
        // Renames in or out, and permission or owner changes.
        EventKind::Modify(ModifyKind::Name(_) | ModifyKind::Metadata(_)) => true,
        // A write is complete when the writer closes the file.
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        // Opens, reads, closes after reading, writes still in progress.
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A poll period no test reaches, so every wake is a file event.
    const NEVER: Duration = Duration::from_secs(3600);

    async fn watch(folders: &[&Path], files: Vec<PathBuf>) -> FolderWatch {
        let (mut w, err) = FolderWatch::new(folders, files, NEVER);
        assert!(err.is_none());
        assert_eq!(w.next().await, Wake::Tick, "the first tick comes at once");
        w
    }

    async fn woke(w: &mut FolderWatch) -> bool {
        tokio::time::timeout(Duration::from_millis(500), w.next())
            .await
            .is_ok_and(|wake| wake == Wake::Event)
    }

    #[tokio::test]
    async fn reading_a_served_file_does_not_wake_and_replacing_it_does() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cdi");
        std::fs::create_dir(&dir).unwrap();
        let spec = dir.join("spec.json");
        std::fs::write(&spec, "{}").unwrap();
        let mut w = watch(&[&dir], vec![spec.clone()]).await;
        for _ in 0..20 {
            std::fs::read(&spec).unwrap();
        }
        std::fs::write(dir.join("unrelated.json"), "{}").unwrap();
        assert!(
            !woke(&mut w).await,
            "our own reads and other files must not wake the loop"
        );
        std::fs::write(dir.join(".tmp"), "[]").unwrap();
        std::fs::rename(dir.join(".tmp"), &spec).unwrap();
        assert!(woke(&mut w).await);
    }

    #[tokio::test]
    async fn a_folder_deleted_and_recreated_is_watched_again() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cdi");
        std::fs::create_dir(&dir).unwrap();
        let spec = dir.join("spec.json");
        let mut w = watch(&[&dir], vec![spec.clone()]).await;
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(woke(&mut w).await, "the parent's watch sees the folder go");
        std::fs::create_dir(&dir).unwrap();
        assert!(woke(&mut w).await, "and come back");
        w.rearm();
        std::fs::write(&spec, "{}").unwrap();
        assert!(
            woke(&mut w).await,
            "a spec written into the new folder is seen"
        );
    }

    #[tokio::test]
    async fn a_socket_bound_again_at_a_named_path_is_reported_created_once() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("kubelet");
        std::fs::create_dir(&dir).unwrap();
        let sock = dir.join("kubelet.sock");
        let first = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let mut w = watch(&[&dir], vec![sock.clone()]).await;
        assert!(!w.take_created(&sock), "there before the watch");
        drop(first);
        std::fs::remove_file(&sock).unwrap();
        let _second = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert!(woke(&mut w).await);
        w.settle().await;
        assert!(w.take_created(&sock));
        assert!(!w.take_created(&sock), "taken once");
    }
}
