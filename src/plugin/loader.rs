//! Keeps the catalog current from the CDI folder at the least cost: a spec
//! is opened only when stat says it changed, and parsed only when its bytes
//! did. An idle plugin so reads nothing, and a rewrite with the same bytes
//! (the publisher's pass every minute) reloads nothing.

use super::catalog::{self, Catalog};
use super::specfile::{self, Presence};
use crate::cdi::Family;
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
    /// A hash of the bytes last parsed, and the refusal if they were malformed.
    parsed: Option<(u64, Option<(&'static str, String)>)>,
    /// The error the last look ended in, kept while nothing changes.
    error: Option<(&'static str, String)>,
}

/// One look at the folder's specs.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Families whose spec was parsed this time (a reload).
    pub reloaded: Vec<Family>,
    /// Families whose spec is unreadable now: (family, cause word, message).
    /// Repeats every look while the cause lasts; the caller de-duplicates
    /// the log.
    pub unreadable: Vec<(Family, &'static str, String)>,
    /// Refusals that are new this look (family, cause word), for the
    /// read-error counter.
    pub new_errors: Vec<(Family, &'static str)>,
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

    /// The catalog as the folder describes it now, starting from `served`:
    /// a family whose spec cannot be read keeps the endpoints it had, since
    /// kubelet has checkpointed their IDs. Blocking file I/O: call it off the
    /// async runtime.
    pub fn load(&mut self, served: &Catalog) -> (Catalog, Outcome) {
        let mut catalog = served.clone();
        let mut out = Outcome::default();
        for family in Family::ALL {
            let path = self.dir.join(family.file_name());
            let seen = self.seen.entry(family).or_default();
            let before = seen.error.clone();
            if let Some(endpoints) = look(&self.dir, &path, family, self.cap, seen) {
                if seen.presence != Some(Presence::Absent) {
                    out.reloaded.push(family);
                }
                catalog = catalog.with_family(family, endpoints);
            }
            if let Some((cause, _)) = &seen.error {
                if seen.error != before {
                    out.new_errors.push((family, cause));
                }
            }
            if let Some((cause, msg)) = &seen.error {
                out.unreadable.push((family, cause, msg.clone()));
            }
        }
        (catalog, out)
    }
}

/// One family: `None` when nothing changed, or the new endpoints. Leaves
/// in `seen.error` why the file cannot be taken, if it cannot (the family
/// then keeps its tokens).
fn look(
    dir: &Path,
    path: &Path,
    family: Family,
    cap: u64,
    seen: &mut Seen,
) -> Option<Vec<catalog::Endpoint>> {
    let presence = match specfile::probe(dir, path) {
        Ok(p) => p,
        Err(e) => {
            // Look again next time: the cause may clear with no new fingerprint.
            seen.presence = None;
            seen.error = Some((e.cause(), e.to_string()));
            return None;
        }
    };
    if seen.presence == Some(presence) {
        // Unchanged: same endpoints, and a malformed file stays reported.
        return None;
    }
    if presence == Presence::Absent {
        if matches!(seen.presence, Some(Presence::File(_))) {
            // A spec that was there is gone. `rm -rf` of the folder unlinks
            // the files a moment before the folder itself: look again after
            // that moment, so a folder on its way out reads as missing
            // (tokens kept) rather than as "no endpoints" (tokens withdrawn).
            std::thread::sleep(VANISH_GRACE);
            if let Err(e) = specfile::probe(dir, path) {
                seen.presence = None;
                seen.error = Some((e.cause(), e.to_string()));
                return None;
            }
        }
        seen.presence = Some(presence);
        seen.parsed = None;
        seen.error = None;
        // No spec: the family has zero devices (the publisher removed it or
        // never wrote one), unlike an unreadable one.
        return Some(Vec::new());
    }
    let (bytes, read_fp) = match specfile::read(path, cap) {
        Ok(r) => r,
        Err(e) => {
            seen.presence = None;
            seen.error = Some((e.cause(), e.to_string()));
            return None;
        }
    };
    // Remember what was read, which may be newer than the probe.
    seen.presence = Some(Presence::File(read_fp));
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    let hash = h.finish();
    if let Some((last, error)) = &seen.parsed {
        if *last == hash {
            // Same bytes as last parsed: the served endpoints already are
            // these bytes' (or, if they were malformed, still are refused).
            seen.error = error.clone();
            return None;
        }
    }
    match catalog::parse(&bytes, path, family) {
        Ok(spec) => {
            seen.parsed = Some((hash, None));
            seen.error = None;
            Some(catalog::endpoints_of(&spec, path))
        }
        Err(e) => {
            let error = Some((e.cause(), e.to_string()));
            seen.parsed = Some((hash, error.clone()));
            seen.error = error;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(names: &[&str], link: &str) -> String {
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

    fn names(c: &Catalog) -> Vec<&str> {
        c.endpoints(Family::Whole)
            .iter()
            .map(|e| e.name.as_str())
            .collect()
    }

    /// Writes as the publisher does: a temp file, then a rename.
    fn replace(dir: &Path, body: &str) {
        std::fs::write(dir.join(".tmp"), body).unwrap();
        std::fs::rename(dir.join(".tmp"), dir.join("nodefabric-rdma.json")).unwrap();
    }

    #[test]
    fn a_rewrite_with_the_same_bytes_reloads_nothing() {
        let dir = tempfile::tempdir().unwrap();
        replace(dir.path(), &spec(&["mlx5_0"], "OK"));
        let mut loader = Loader::new(dir.path().into(), 1 << 20);
        let (c, out) = loader.load(&Catalog::default());
        assert_eq!(
            (names(&c), out.reloaded.clone()),
            (vec!["mlx5_0"], vec![Family::Whole])
        );
        let (c2, out) = loader.load(&c);
        assert!(
            out.reloaded.is_empty() && c2 == c,
            "nothing changed: nothing read"
        );
        replace(dir.path(), &spec(&["mlx5_0"], "OK"));
        let (c3, out) = loader.load(&c2);
        assert!(
            out.reloaded.is_empty() && c3 == c,
            "same bytes under a new inode: not parsed again"
        );
        replace(dir.path(), &spec(&["mlx5_0"], "Failed"));
        let (c4, out) = loader.load(&c3);
        assert_eq!(out.reloaded, [Family::Whole]);
        assert!(!c4.endpoints(Family::Whole)[0].healthy);
    }

    #[test]
    fn a_dangling_link_or_a_missing_folder_keeps_the_tokens() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cdi");
        std::fs::create_dir(&dir).unwrap();
        replace(&dir, &spec(&["mlx5_0", "mlx5_1"], "Failed"));
        let mut loader = Loader::new(dir.clone(), 1 << 20);
        let (served, _) = loader.load(&Catalog::default());

        std::fs::remove_file(dir.join("nodefabric-rdma.json")).unwrap();
        std::os::unix::fs::symlink(dir.join("elsewhere.json"), dir.join("nodefabric-rdma.json"))
            .unwrap();
        let (c, out) = loader.load(&served);
        assert_eq!(c, served, "Failed tokens included, nothing withdrawn");
        assert_eq!(out.unreadable[0].1, "dangling_link");
        assert_eq!(out.new_errors, [(Family::Whole, "dangling_link")]);
        let (_, out) = loader.load(&served);
        assert!(out.new_errors.is_empty(), "the same cause is not new");

        std::fs::remove_dir_all(&dir).unwrap();
        let (c, out) = loader.load(&served);
        assert_eq!(c, served);
        assert_eq!(
            out.unreadable.iter().map(|u| u.1).collect::<Vec<_>>(),
            ["folder_missing", "folder_missing"]
        );

        // The folder comes back with the same spec: readable again, nothing reparsed.
        std::fs::create_dir(&dir).unwrap();
        replace(&dir, &spec(&["mlx5_0", "mlx5_1"], "Failed"));
        let (c, out) = loader.load(&served);
        assert_eq!(c, served);
        assert!(
            out.unreadable.is_empty() && out.reloaded.is_empty(),
            "{out:?}"
        );

        // Removing the spec (the folder present) is the publisher saying zero devices.
        std::fs::remove_file(dir.join("nodefabric-rdma.json")).unwrap();
        let (c, out) = loader.load(&served);
        assert!(names(&c).is_empty() && out.unreadable.is_empty());
    }

    #[test]
    fn a_malformed_spec_stays_reported_until_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        replace(dir.path(), "{\"kind\":");
        let mut loader = Loader::new(dir.path().into(), 1 << 20);
        let (c, out) = loader.load(&Catalog::default());
        assert!(names(&c).is_empty());
        assert_eq!(
            (out.unreadable[0].1, out.new_errors.clone()),
            ("malformed", vec![(Family::Whole, "malformed")])
        );
        let (_, out) = loader.load(&c);
        assert_eq!(out.unreadable.len(), 1, "still unreadable for readiness");
        assert!(out.new_errors.is_empty(), "but not counted again");
        replace(dir.path(), &spec(&["mlx5_3"], "OK"));
        let (c, out) = loader.load(&c);
        assert_eq!(names(&c), ["mlx5_3"]);
        assert!(out.unreadable.is_empty());
    }

    #[test]
    fn a_device_name_outside_the_cdi_grammar_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        replace(
            dir.path(),
            &spec(&["mlx5_0,nvidia.com/gpu=all", "mlx5_1", "a=b"], "OK"),
        );
        let (c, _) = Loader::new(dir.path().into(), 1 << 20).load(&Catalog::default());
        assert_eq!(names(&c), ["mlx5_1"]);
    }
}
