//! The one reading of the published CDI specs every kubelet plugin shares:
//! each family's file read as untrusted input ([`file`]), opened only when
//! stat says it changed and parsed only when its bytes did. An idle plugin
//! so reads nothing, and a rewrite with the same bytes (the publisher's pass
//! every minute) reloads nothing.
//!
//! The [`Loader`] reports what changed as parsed [`Spec`]s; what a plugin
//! serves from them (device-plugin tokens, DRA devices) is the plugin's.

pub mod file;

pub use file::{SpecReadError, DEFAULT_MAX_BYTES};

use crate::cdi::{Family, Spec};
use file::Presence;
use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

/// How long a vanished spec is given before its absence is believed; see
/// [`look`]. Paid only when a spec disappears.
const VANISH_GRACE: std::time::Duration = std::time::Duration::from_millis(250);

/// What the loader remembers of one family's file.
#[derive(Debug, Clone, Default)]
struct Seen {
    /// What stat said last time; `None` forces a read.
    presence: Option<Presence>,
    /// The bytes last parsed, and the refusal if they were malformed.
    parsed: Option<Parsed>,
    /// The error the last look ended in, kept while nothing changes.
    error: Option<Refusal>,
}

/// The bytes of a family's file last parsed, by hash, so the same bytes are
/// not parsed again.
#[derive(Debug, Clone)]
struct Parsed {
    /// A hash of the bytes.
    hash: u64,
    /// Why they were refused, if they were malformed.
    refused: Option<Refusal>,
}

/// Why a family's file cannot be taken, as the metrics and the log need it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Refusal {
    /// The cause word ([`SpecReadError::cause`]), a metric label.
    cause: &'static str,
    /// The message, for the log and `/readyz`.
    message: String,
}

impl From<&SpecReadError> for Refusal {
    fn from(e: &SpecReadError) -> Refusal {
        Refusal {
            cause: e.cause(),
            message: e.to_string(),
        }
    }
}

/// A family whose spec is unreadable now, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// The family.
    pub family: Family,
    /// The cause word ([`SpecReadError::cause`]), a metric label.
    pub cause: &'static str,
    /// The message, for the log and `/readyz`.
    pub message: String,
}

/// What a family's spec became since the last look, when it changed.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// New bytes under the family's name, parsed; `path` is the file, for
    /// messages about its devices.
    Spec {
        /// The spec file.
        path: PathBuf,
        /// What it says now.
        spec: Spec,
    },
    /// No file under the family's name (the folder present): the publisher
    /// says the family has zero devices, unlike an unreadable file.
    Gone,
}

/// One look at the folder's specs. A family in neither `changed` nor
/// `unreadable` is as it was; an unreadable one keeps what the caller
/// served, since kubelet has checkpointed its IDs.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Families whose spec changed, in [`Family::ALL`] order.
    pub changed: Vec<(Family, Change)>,
    /// Families whose spec was parsed this time (a reload).
    pub reloaded: Vec<Family>,
    /// Families whose spec is unreadable now. Repeats every look while the
    /// cause lasts; the caller de-duplicates the log.
    pub unreadable: Vec<Unreadable>,
    /// Refusals that are new this look (family, cause word), for the
    /// read-error counter.
    pub new_errors: Vec<(Family, &'static str)>,
}

/// The cause word of [`SpecReadError::FolderMissing`].
pub const FOLDER_MISSING: &str = "folder_missing";

/// The cause word of [`SpecReadError::FolderDeleted`].
pub const FOLDER_DELETED: &str = "folder_deleted";

/// True for the causes that are the folder's, not one family's file.
pub fn folder_cause(cause: &str) -> bool {
    cause == FOLDER_MISSING || cause == FOLDER_DELETED
}

impl Outcome {
    /// Why the folder counts as deleted on the host under its mount, if this
    /// look found it so: it never comes back by itself, so a plugin's
    /// liveness fails on it and the kubelet's restart mounts the new one.
    pub fn folder_deleted(&self) -> Option<&str> {
        self.unreadable
            .iter()
            .find(|u| u.cause == FOLDER_DELETED)
            .map(|u| u.message.as_str())
    }
}

/// Logs each unreadable spec in `dir` once per cause, and once when it
/// reads again; `kept` names what a plugin keeps serving meanwhile
/// (`token`, `device`). A missing or deleted folder is one cause for both
/// families: one line, under the folder's name.
pub fn report(quiet: &mut crate::kubelet::quiet::Quiet, dir: &Path, outcome: &Outcome, kept: &str) {
    let folder = dir.display().to_string();
    match outcome.unreadable.iter().find(|u| folder_cause(u.cause)) {
        Some(Unreadable { cause, message, .. }) => {
            let restart = if *cause == FOLDER_DELETED {
                "; /healthz fails until the kubelet restarts the plugin"
            } else {
                ""
            };
            quiet.warn(
                &folder,
                format!("{message}; keeping every {kept} already served{restart}"),
            );
        }
        None => quiet.clear(&folder, || format!("{folder} is back")),
    }
    for family in Family::ALL {
        let subject = dir.join(family.file_name()).display().to_string();
        match outcome.unreadable.iter().find(|u| u.family == family) {
            Some(u) if folder_cause(u.cause) => {}
            Some(Unreadable { message, .. }) => {
                quiet.warn(
                    &subject,
                    format!(
                        "skipping CDI spec: {message}; keeping the {} {kept}s already served",
                        family.kind()
                    ),
                );
            }
            None => quiet.clear(&subject, || format!("{subject} is readable again")),
        }
    }
}

/// Reads the families' spec files from one folder, remembering enough to
/// skip work when nothing changed.
#[derive(Debug)]
pub struct Loader {
    dir: PathBuf,
    cap: u64,
    seen: BTreeMap<Family, Seen>,
}

impl Loader {
    /// A loader for `dir` refusing files over `cap` bytes.
    pub fn new(dir: PathBuf, cap: u64) -> Loader {
        Loader {
            dir,
            cap,
            seen: BTreeMap::new(),
        }
    }

    /// What changed in the folder since the last look (everything readable,
    /// the first time). Blocking file I/O: call it off the async runtime.
    pub fn load(&mut self) -> Outcome {
        let mut out = Outcome::default();
        for family in Family::ALL {
            let path = self.dir.join(family.file_name());
            let seen = self.seen.entry(family).or_default();
            let before = seen.error.clone();
            if let Some(change) = look(&self.dir, &path, family, self.cap, seen) {
                if matches!(change, Change::Spec { .. }) {
                    out.reloaded.push(family);
                }
                out.changed.push((family, change));
            }
            if let Some(error) = &seen.error {
                if seen.error != before {
                    out.new_errors.push((family, error.cause));
                }
            }
            if let Some(error) = &seen.error {
                out.unreadable.push(Unreadable {
                    family,
                    cause: error.cause,
                    message: error.message.clone(),
                });
            }
        }
        out
    }
}

/// One family: `None` when nothing changed, or what it changed to. Leaves
/// in `seen.error` why the file cannot be taken, if it cannot (the caller
/// then keeps what it served).
fn look(dir: &Path, path: &Path, family: Family, cap: u64, seen: &mut Seen) -> Option<Change> {
    let presence = match file::probe(dir, path) {
        Ok(p) => p,
        Err(e) => {
            // Look again next time: the cause may clear with no new fingerprint.
            seen.presence = None;
            seen.error = Some(Refusal::from(&e));
            return None;
        }
    };
    if seen.presence == Some(presence) {
        // Unchanged: the same spec, and a malformed file stays reported.
        return None;
    }
    if presence == Presence::Absent {
        if matches!(seen.presence, Some(Presence::File(_))) {
            // A spec that was there is gone. `rm -rf` of the folder unlinks
            // the files a moment before the folder itself: look again after
            // that moment, so a folder on its way out reads as missing
            // (what was served kept) rather than as "no devices" (withdrawn).
            std::thread::sleep(VANISH_GRACE);
            if let Err(e) = file::probe(dir, path) {
                seen.presence = None;
                seen.error = Some(Refusal::from(&e));
                return None;
            }
        }
        seen.presence = Some(presence);
        seen.parsed = None;
        seen.error = None;
        // No spec: the family has zero devices (the publisher removed it or
        // never wrote one), unlike an unreadable one.
        return Some(Change::Gone);
    }
    let (bytes, read_fp) = match file::read(path, cap) {
        Ok(r) => r,
        Err(e) => {
            seen.presence = None;
            seen.error = Some(Refusal::from(&e));
            return None;
        }
    };
    // Remember what was read, which may be newer than the probe.
    seen.presence = Some(Presence::File(read_fp));
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    let hash = h.finish();
    if let Some(parsed) = &seen.parsed {
        if parsed.hash == hash {
            // Same bytes as last parsed: what the caller serves already is
            // these bytes' (or, if they were malformed, still is refused).
            seen.error = parsed.refused.clone();
            return None;
        }
    }
    match file::parse(&bytes, path, family) {
        Ok(spec) => {
            seen.parsed = Some(Parsed {
                hash,
                refused: None,
            });
            seen.error = None;
            Some(Change::Spec {
                path: path.into(),
                spec,
            })
        }
        Err(e) => {
            let refused = Some(Refusal::from(&e));
            seen.parsed = Some(Parsed {
                hash,
                refused: refused.clone(),
            });
            seen.error = refused;
            None
        }
    }
}

/// What unit tests of spec readers share: a whole-interface spec text.
#[cfg(test)]
pub(crate) mod testing {
    /// A `gpustack.ai/rdma` spec whose devices `names` all carry `link`, as
    /// the publisher writes them (the same verbs node for each).
    pub(crate) fn spec(names: &[&str], link: &str) -> String {
        let devices: Vec<String> = names
            .iter()
            .map(|n| {
                format!(
                    r#"{{"name":"{n}","annotations":{{"rdma.gpustack.ai/rdma-device":"{n}","rdma.gpustack.ai/link":"{link}"}},"containerEdits":{{"deviceNodes":[{{"path":"/dev/infiniband/uverbs0","type":"c","major":231,"minor":192,"permissions":"rw"}}]}}}}"#
                )
            })
            .collect();
        format!(
            r#"{{"cdiVersion":"0.6.0","kind":"gpustack.ai/rdma","devices":[{}]}}"#,
            devices.join(",")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::testing::spec;
    use super::*;

    /// The whole-interface family's change: `None` when unchanged, its
    /// device names (none when gone) when changed.
    fn whole(out: &Outcome) -> Option<Vec<&str>> {
        out.changed
            .iter()
            .find(|(f, _)| *f == Family::Whole)
            .map(|(_, c)| match c {
                Change::Spec { spec, .. } => spec.devices.iter().map(|d| d.name.as_str()).collect(),
                Change::Gone => Vec::new(),
            })
    }

    /// Writes as the publisher does: a temp file, then a rename.
    fn replace(dir: &Path, body: &str) {
        std::fs::write(dir.join(".tmp"), body).unwrap();
        std::fs::rename(dir.join(".tmp"), dir.join("nodefabric-rdma.json")).unwrap();
    }

    #[test]
    fn a_changed_spec_is_reported_parsed_the_same_bytes_as_nothing_and_an_unreadable_file_with_its_cause(
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nodefabric-rdma.json");
        replace(dir.path(), &spec(&["mlx5_0", "mlx5_1"], "OK"));
        let mut loader = Loader::new(dir.path().into(), 1 << 20);
        let out = loader.load();
        let expected: crate::cdi::Spec =
            serde_json::from_str(&spec(&["mlx5_0", "mlx5_1"], "OK")).unwrap();
        assert_eq!(
            out.changed,
            [
                (
                    Family::Whole,
                    Change::Spec {
                        path: path.clone(),
                        spec: expected
                    }
                ),
                (Family::Partitioned, Change::Gone),
            ]
        );
        assert_eq!(out.reloaded, [Family::Whole]);

        replace(dir.path(), &spec(&["mlx5_0", "mlx5_1"], "OK"));
        let out = loader.load();
        assert!(
            out.changed.is_empty() && out.reloaded.is_empty() && out.unreadable.is_empty(),
            "the same bytes under a new inode: {out:?}"
        );

        std::fs::remove_file(&path).unwrap();
        crate::input::make_fifo(&path);
        let out = loader.load();
        assert!(out.changed.is_empty(), "unreadable is not gone: {out:?}");
        assert_eq!(out.unreadable.len(), 1);
        let Unreadable {
            family,
            cause,
            message,
        } = &out.unreadable[0];
        assert_eq!((*family, *cause), (Family::Whole, "not_regular"));
        assert_eq!(
            *message,
            format!("{}: not a regular file but a FIFO", path.display())
        );
        assert_eq!(out.new_errors, [(Family::Whole, "not_regular")]);
    }

    #[test]
    fn a_rewrite_with_the_same_bytes_reloads_nothing() {
        let dir = tempfile::tempdir().unwrap();
        replace(dir.path(), &spec(&["mlx5_0"], "OK"));
        let mut loader = Loader::new(dir.path().into(), 1 << 20);
        let out = loader.load();
        assert_eq!(
            (whole(&out), out.reloaded.clone()),
            (Some(vec!["mlx5_0"]), vec![Family::Whole])
        );
        let out = loader.load();
        assert!(
            out.reloaded.is_empty() && out.changed.is_empty(),
            "nothing changed: nothing read"
        );
        replace(dir.path(), &spec(&["mlx5_0"], "OK"));
        let out = loader.load();
        assert!(
            out.reloaded.is_empty() && out.changed.is_empty(),
            "same bytes under a new inode: not parsed again"
        );
        replace(dir.path(), &spec(&["mlx5_0"], "Failed"));
        let out = loader.load();
        assert_eq!(out.reloaded, [Family::Whole]);
        let Some((_, Change::Spec { spec, path })) = out.changed.first() else {
            panic!("{out:?}")
        };
        let read = spec.devices[0].endpoint(&spec.kind, path).unwrap();
        assert_eq!(read.link, crate::record::LinkState::Failed);
    }

    #[test]
    fn a_dangling_link_or_a_missing_folder_is_unreadable_not_gone() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cdi");
        std::fs::create_dir(&dir).unwrap();
        replace(&dir, &spec(&["mlx5_0", "mlx5_1"], "Failed"));
        let mut loader = Loader::new(dir.clone(), 1 << 20);
        assert_eq!(whole(&loader.load()), Some(vec!["mlx5_0", "mlx5_1"]));

        std::fs::remove_file(dir.join("nodefabric-rdma.json")).unwrap();
        std::os::unix::fs::symlink(dir.join("elsewhere.json"), dir.join("nodefabric-rdma.json"))
            .unwrap();
        let out = loader.load();
        assert!(out.changed.is_empty(), "nothing withdrawn: {out:?}");
        assert_eq!(out.unreadable[0].cause, "dangling_link");
        assert_eq!(out.new_errors, [(Family::Whole, "dangling_link")]);
        let out = loader.load();
        assert!(out.new_errors.is_empty(), "the same cause is not new");

        std::fs::remove_dir_all(&dir).unwrap();
        let out = loader.load();
        assert!(out.changed.is_empty(), "nothing withdrawn: {out:?}");
        assert_eq!(
            out.unreadable.iter().map(|u| u.cause).collect::<Vec<_>>(),
            ["folder_missing", "folder_missing"]
        );

        // The folder comes back with the same spec: readable again, nothing reparsed.
        std::fs::create_dir(&dir).unwrap();
        replace(&dir, &spec(&["mlx5_0", "mlx5_1"], "Failed"));
        let out = loader.load();
        assert_eq!(whole(&out), None);
        assert!(
            out.unreadable.is_empty() && out.reloaded.is_empty(),
            "{out:?}"
        );

        // Removing the spec (the folder present) is the publisher saying zero devices.
        std::fs::remove_file(dir.join("nodefabric-rdma.json")).unwrap();
        let out = loader.load();
        assert_eq!(whole(&out), Some(vec![]));
        assert!(out.unreadable.is_empty());
    }

    #[test]
    fn a_malformed_spec_stays_reported_until_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        replace(dir.path(), "{\"kind\":");
        let mut loader = Loader::new(dir.path().into(), 1 << 20);
        let out = loader.load();
        assert_eq!(whole(&out), None);
        assert_eq!(
            (out.unreadable[0].cause, out.new_errors.clone()),
            ("malformed", vec![(Family::Whole, "malformed")])
        );
        let out = loader.load();
        assert_eq!(out.unreadable.len(), 1, "still unreadable for readiness");
        assert!(out.new_errors.is_empty(), "but not counted again");
        replace(dir.path(), &spec(&["mlx5_3"], "OK"));
        let out = loader.load();
        assert_eq!(whole(&out), Some(vec!["mlx5_3"]));
        assert!(out.unreadable.is_empty());
    }
}
