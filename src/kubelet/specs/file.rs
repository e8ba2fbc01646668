//! Reading one CDI spec file as untrusted input: regular files only, size
//! capped, never a blocking open or read; then parsing its bytes.
//!
//! The CDI folder is shared with other tools and with whoever has root on
//! the node, so what sits under a spec's name may be a FIFO (an open or read
//! would block forever), a link to `/dev/zero` (a read never ends) or a file
//! far larger than any spec. Each is refused with its cause, and the caller
//! keeps what it served: an unreadable spec is never an empty one.

use crate::cdi::{Family, Spec};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The default size cap, sized to the device plugin's 64 MiB memory limit
/// (deploy/device-plugin.yaml): reading and parsing a spec at the cap peaks
/// near 25 MiB (docs/benchmarks.md), where 16 MiB once peaked over 600 MiB.
/// A spec for 512 endpoints is about 300 KiB, and 2 MiB holds more
/// endpoints than kubelet's 4 MiB message takes as shared tokens (about
/// 1,700), so no real node is refused.
pub const DEFAULT_MAX_BYTES: u64 = 2 * 1024 * 1024;

/// Why a spec file could not be taken. Each names the path; [`Self::cause`]
/// is the short, stable word the metrics and the log de-duplication use.
#[derive(Debug, thiserror::Error)]
pub enum SpecReadError {
    /// The CDI folder itself is missing or not a folder: unreadable, not empty.
    #[error("{path}: the CDI folder is missing ({detail})")]
    FolderMissing {
        /// The CDI folder.
        path: PathBuf,
        /// What stat said.
        detail: String,
    },
    /// The CDI folder was deleted on the host while this container's mount
    /// holds it (see [`crate::mounts`]): unreadable, and only a restart
    /// sees the folder the publisher writes to now.
    #[error("{}", crate::mounts::stale_reason("the CDI folder", path))]
    FolderDeleted {
        /// The CDI folder.
        path: PathBuf,
    },
    /// The name is a symbolic link whose target does not exist.
    #[error("{path}: dangling symbolic link")]
    Dangling {
        /// The spec file.
        path: PathBuf,
    },
    /// The name is (or links to) a FIFO, socket or device.
    #[error("{path}: not a regular file but a {kind}")]
    NotRegular {
        /// The spec file.
        path: PathBuf,
        /// What it is instead.
        kind: &'static str,
    },
    /// The file is larger than the cap.
    #[error("{path}: larger than the {cap}-byte cap (--max-spec-bytes)")]
    TooLarge {
        /// The spec file.
        path: PathBuf,
        /// The cap in bytes.
        cap: u64,
    },
    /// Opening, stating or reading failed.
    #[error("{path}: {source}")]
    Io {
        /// The spec file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The bytes are not a CDI spec of the expected kind.
    #[error("{path}: {reason}")]
    Malformed {
        /// The spec file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

impl SpecReadError {
    /// A stable one-word cause, for the `cause` metric label.
    pub fn cause(&self) -> &'static str {
        match self {
            SpecReadError::FolderMissing { .. } => super::FOLDER_MISSING,
            SpecReadError::FolderDeleted { .. } => super::FOLDER_DELETED,
            SpecReadError::Dangling { .. } => "dangling_link",
            SpecReadError::NotRegular { .. } => "not_regular",
            SpecReadError::TooLarge { .. } => "too_large",
            SpecReadError::Io { .. } => "io",
            SpecReadError::Malformed { .. } => "malformed",
        }
    }
}

/// What identifies a file's content without reading it: a rename, a write or
/// a truncation changes at least one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Fingerprint {
    /// The fingerprint of the file `m` describes (`stat`, not `lstat`, for
    /// a name that may be a link).
    pub fn of(m: &std::fs::Metadata) -> Fingerprint {
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Fingerprint {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        }
    }
}

/// What stat says is at a spec's name, before anything is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// No such name: the family has no spec (zero devices).
    Absent,
    /// A regular file (after following links) with this fingerprint.
    File(Fingerprint),
}

/// Looks at `path` without opening it: absent, a regular file, or the
/// reason it cannot be a spec. `dir` is checked first so that a missing
/// folder reads as unreadable rather than as "no spec".
pub fn probe(dir: &Path, path: &Path) -> Result<Presence, SpecReadError> {
    match std::fs::metadata(dir) {
        Ok(m) if crate::mounts::deleted(dir, &m) => {
            return Err(SpecReadError::FolderDeleted { path: dir.into() })
        }
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(SpecReadError::FolderMissing {
                path: dir.into(),
                detail: "not a folder".into(),
            })
        }
        Err(e) => {
            return Err(SpecReadError::FolderMissing {
                path: dir.into(),
                detail: e.to_string(),
            })
        }
    }
    let link = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Presence::Absent),
        Err(source) => {
            return Err(SpecReadError::Io {
                path: path.into(),
                source,
            })
        }
    };
    let target = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && link.file_type().is_symlink() => {
            return Err(SpecReadError::Dangling { path: path.into() })
        }
        Err(source) => {
            return Err(SpecReadError::Io {
                path: path.into(),
                source,
            })
        }
    };
    check_regular(path, &target)?;
    Ok(Presence::File(Fingerprint::of(&target)))
}

/// Reads the regular file at `path`, at most `cap` bytes, without blocking
/// on a FIFO or device swapped in after [`probe`]; returns the bytes and the
/// fingerprint of what was actually read.
pub fn read(path: &Path, cap: u64) -> Result<(Vec<u8>, Fingerprint), SpecReadError> {
    use crate::input::InputError;
    // The operator-input reader: the type asked before opening (a device is
    // refused unopened) and again of the open file, a non-blocking open
    // (a FIFO must not wait for a writer), a file past the cap refused
    // unread and one growing past it caught.
    match crate::input::read_file(path, cap, "a CDI spec") {
        Ok((bytes, meta)) => Ok((bytes, Fingerprint::of(&meta))),
        Err(InputError::NotAFile { kind, .. }) => Err(SpecReadError::NotRegular {
            path: path.into(),
            kind,
        }),
        Err(InputError::TooLarge { .. }) => Err(SpecReadError::TooLarge {
            path: path.into(),
            cap,
        }),
        Err(InputError::Io { cause, .. }) => Err(SpecReadError::Io {
            path: path.into(),
            source: cause,
        }),
        // Neither text nor pipes are asked for, so these are not given.
        Err(e @ (InputError::NotText { .. } | InputError::Stalled { .. })) => {
            Err(SpecReadError::Io {
                path: path.into(),
                source: std::io::Error::other(e.to_string()),
            })
        }
    }
}

/// Parses spec bytes read from `path` and checks the kind is `family`'s.
pub fn parse(bytes: &[u8], path: &Path, family: Family) -> Result<Spec, SpecReadError> {
    let spec: Spec = serde_json::from_slice(bytes).map_err(|e| SpecReadError::Malformed {
        path: path.into(),
        reason: format!("not a CDI spec: {e}"),
    })?;
    if spec.kind != family.kind() {
        return Err(SpecReadError::Malformed {
            path: path.into(),
            reason: format!("kind is {:?}, expected {:?}", spec.kind, family.kind()),
        });
    }
    Ok(spec)
}

fn check_regular(path: &Path, m: &std::fs::Metadata) -> Result<(), SpecReadError> {
    let t = m.file_type();
    if t.is_file() {
        return Ok(());
    }
    Err(SpecReadError::NotRegular {
        path: path.into(),
        kind: crate::input::kind_of(t),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("spec.json");
        crate::input::make_fifo(&fifo);
        assert!(matches!(
            probe(dir.path(), &fifo),
            Err(SpecReadError::NotRegular { kind: "FIFO", .. })
        ));
        // Even past probe (a swap between probe and open), the read refuses it.
        assert!(matches!(
            read(&fifo, 1024),
            Err(SpecReadError::NotRegular { kind: "FIFO", .. })
        ));
    }

    #[test]
    fn a_link_to_dev_zero_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("spec.json");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(matches!(
            probe(dir.path(), &link),
            Err(SpecReadError::NotRegular {
                kind: "character device",
                ..
            })
        ));
        assert!(matches!(
            read(&link, 1024),
            Err(SpecReadError::NotRegular { .. })
        ));
    }

    #[test]
    fn a_file_over_the_cap_is_refused_and_one_at_the_cap_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spec.json");
        std::fs::write(&path, vec![b' '; 101]).unwrap();
        let err = read(&path, 100).unwrap_err();
        assert!(matches!(err, SpecReadError::TooLarge { cap: 100, .. }));
        assert!(err.to_string().contains(path.to_str().unwrap()), "{err}");
        assert_eq!(read(&path, 101).unwrap().0.len(), 101);
    }

    #[test]
    fn a_dangling_link_is_unreadable_not_absent() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("spec.json");
        std::os::unix::fs::symlink(dir.path().join("gone.json"), &link).unwrap();
        assert!(matches!(
            probe(dir.path(), &link),
            Err(SpecReadError::Dangling { .. })
        ));
        assert_eq!(
            probe(dir.path(), &dir.path().join("other.json")).unwrap(),
            Presence::Absent
        );
    }

    #[test]
    fn a_missing_folder_is_unreadable_not_empty() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("cdi");
        let err = probe(&gone, &gone.join("spec.json")).unwrap_err();
        assert_eq!(err.cause(), "folder_missing");
        assert!(err.to_string().contains(gone.to_str().unwrap()), "{err}");
    }

    #[test]
    fn a_deleted_folder_still_reachable_is_deleted_not_empty() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cdi");
        std::fs::create_dir(&dir).unwrap();
        // Held open, as a container's bind mount holds a host folder.
        let (_held, still) = crate::mounts::held(&dir);
        std::fs::remove_dir(&dir).unwrap();
        let err = probe(&still, &still.join("spec.json")).unwrap_err();
        assert_eq!(err.cause(), "folder_deleted");
        assert!(
            err.to_string()
                .contains("deleted on the host while mounted here"),
            "{err}"
        );
    }

    #[test]
    fn a_rewrite_changes_the_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spec.json");
        std::fs::write(&path, "a").unwrap();
        let Presence::File(before) = probe(dir.path(), &path).unwrap() else {
            panic!()
        };
        std::fs::write(dir.path().join(".tmp"), "b").unwrap();
        std::fs::rename(dir.path().join(".tmp"), &path).unwrap();
        let Presence::File(after) = probe(dir.path(), &path).unwrap() else {
            panic!()
        };
        assert_ne!(before, after);
        assert_eq!(read(&path, 10).unwrap().1, after);
    }
}
