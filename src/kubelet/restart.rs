//! Noticing that kubelet restarted, and pacing registration attempts while
//! it does not answer.
//!
//! A restarted kubelet creates its socket anew and may remove the plugins'
//! sockets, so a plugin compares the socket's identity with the one it
//! registered with, and checks that its own sockets are still there (see
//! [`super::socket::OwnedSocket::is_present`]). The inode number alone does
//! not tell a new socket: ext4 hands a freed inode out again at once, so a
//! kubelet that binds right after its old socket went gets the same number.
//! The identity therefore includes the inode's change time, which a new
//! bind sets (to the nanosecond on ext4, xfs, tmpfs and overlayfs); the
//! folder watch's creation event for `kubelet.sock` backs it up where
//! timestamps are coarse. A socket that is missing means kubelet is on its
//! way back: there is nothing to register with yet.

use super::backoff::Backoff;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::time::Duration;

/// Which socket file stands at a path: its `(device, inode)` and the
/// inode's change time, so a socket recreated at the same path is told from
/// the one seen before even when it got the same inode number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    dev: u64,
    ino: u64,
    ctime: (i64, i64),
}

impl Identity {
    /// The identity of the socket at `path`, or `None` when no socket is
    /// there (kubelet is restarting or not started).
    pub fn of(path: &Path) -> Option<Identity> {
        let m = std::fs::symlink_metadata(path).ok()?;
        m.file_type().is_socket().then(|| Identity {
            dev: m.dev(),
            ino: m.ino(),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

/// When to try registering again: at once the first time and whenever
/// kubelet's socket is a different one than at the last failure; otherwise
/// when the [`Backoff`] after that failure has passed. An operation with no
/// kubelet behind it (an API write, a socket bind) takes a plain [`Backoff`].
#[derive(Debug)]
pub struct Retry {
    backoff: Backoff,
    /// kubelet's socket at the last failed attempt, `None` after a success.
    failed_with: Option<Option<Identity>>,
}

impl Retry {
    /// A retry whose waits double from `first` up to `max`.
    pub fn new(first: Duration, max: Duration) -> Retry {
        Retry {
            backoff: Backoff::new(first, max),
            failed_with: None,
        }
    }

    /// True when an attempt with kubelet's socket now being `kubelet` is due.
    pub fn due(&self, kubelet: Option<Identity>) -> bool {
        self.backoff.due() || self.failed_with != Some(kubelet)
    }

    /// Records a successful attempt: the next failure waits `first` again.
    pub fn succeeded(&mut self) {
        self.backoff.succeeded();
        self.failed_with = None;
    }

    /// Records an attempt that failed while kubelet's socket was `kubelet`.
    pub fn failed(&mut self, kubelet: Option<Identity>) {
        self.failed_with = Some(kubelet);
        self.backoff.failed();
    }

    /// Resolves when the backoff after the last failure has passed.
    pub async fn wait(&self) {
        self.backoff.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_recreated_socket_has_a_new_identity_and_is_tried_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("kubelet.sock");
        assert_eq!(Identity::of(&path), None);
        let first = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let before = Identity::of(&path).unwrap();
        // Held open so the new socket cannot reuse the old inode.
        std::fs::remove_file(&path).unwrap();
        let _second = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let after = Identity::of(&path).unwrap();
        assert_ne!(before, after);
        drop(first);

        let mut retry = Retry::new(Duration::from_secs(60), Duration::from_secs(120));
        assert!(retry.due(Some(before)), "the first attempt is due at once");
        retry.failed(Some(before));
        assert!(
            !retry.due(Some(before)),
            "the same kubelet waits the backoff"
        );
        assert!(
            retry.due(Some(after)),
            "a new kubelet.sock is tried at once"
        );
        assert!(retry.due(None), "and so is its disappearance");
        retry.succeeded();
        assert!(retry.due(Some(after)));
    }

    #[test]
    fn a_socket_recreated_on_the_same_inode_has_a_new_identity() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("kubelet.sock");
        let mut same_inode = 0;
        for _ in 0..5 {
            let first = std::os::unix::net::UnixListener::bind(&path).unwrap();
            let before = Identity::of(&path).unwrap();
            // Closed and unlinked first, as when kubelet exits: ext4 then
            // hands its inode number to the next bind.
            drop(first);
            std::fs::remove_file(&path).unwrap();
            let second = std::os::unix::net::UnixListener::bind(&path).unwrap();
            let after = Identity::of(&path).unwrap();
            same_inode += usize::from(before.ino == after.ino);
            assert_ne!(before, after);
            drop(second);
            std::fs::remove_file(&path).unwrap();
        }
        eprintln!("{same_inode} of 5 rebinds reused the inode number");
    }

    #[test]
    fn a_regular_file_is_no_socket() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("kubelet.sock");
        std::fs::write(&path, "").unwrap();
        assert_eq!(Identity::of(&path), None);
    }
}
