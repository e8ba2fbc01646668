//! What a recording [`SysRoot`] keeps: every entry a read touched, so
//! that `capture` copies exactly what discovery read and nothing else.

use super::kernel::on_disk;
use super::{SysError, SysRoot};
use crate::escape::path_text as text_of;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// One entry of the tree as a read saw it, keyed by its path under the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A directory that was walked through or listed.
    Dir,
    /// A symlink and its target text, exactly as stored.
    Link(String),
    /// A file that was read: its bytes, at most one past [`super::MAX_ATTR_BYTES`]
    /// so an oversized file stays oversized.
    File(Vec<u8>),
    /// A file that was tested for existence but never read: only its name is taken.
    Placeholder,
}

/// Everything a recording [`SysRoot`] touched, by the text of its path
/// (link targets are text too; see [`crate::escape`]).
pub type Recorded = BTreeMap<String, Entry>;

impl SysRoot {
    /// The same tree, remembering every entry each read touches, so that
    /// `capture` can copy exactly what discovery read and nothing else.
    pub fn recording(root: impl AsRef<Path>) -> Result<Self, SysError> {
        let mut r = SysRoot::new(root)?;
        r.recorder = Some(Arc::new(Mutex::new(Recorded::new())));
        Ok(r)
    }

    /// What a recording tree has touched so far (empty when not recording).
    pub fn recorded(&self) -> Recorded {
        self.recorder
            .as_ref()
            .map(|r| r.lock().expect("recorder lock").clone())
            .unwrap_or_default()
    }

    pub(super) fn note(&self, path: &Path, entry: Entry) {
        let Some(rec) = &self.recorder else { return };
        let key = text_of(path).into_owned();
        let mut map = rec.lock().expect("recorder lock");
        match (map.get(&key), &entry) {
            // Content wins over a placeholder, never the other way round.
            (Some(Entry::File(_)), Entry::Placeholder) => {}
            _ => {
                map.insert(key, entry);
            }
        }
    }

    /// True while capturing: the recording calls cost syscalls, so they are
    /// skipped entirely otherwise.
    pub(super) fn recording_on(&self) -> bool {
        self.recorder.is_some()
    }

    /// Records every symlink and directory on the way from the root to `rel`,
    /// the way the kernel would walk it, up to where the walk stops. A walk
    /// that reaches the end gives where it landed (relative to the root,
    /// and inside it: a climb above the root stops the walk), so a capture
    /// walks each path once; `None` leaves the error to the resolving walk.
    pub(super) fn note_chain(&self, rel: &str) -> Option<PathBuf> {
        let mut pending: Vec<PathBuf> = on_disk(rel.trim_start_matches('/'))
            .ok()?
            .components()
            .rev()
            .map(|c| PathBuf::from(c.as_os_str()))
            .collect();
        let mut cur = PathBuf::new();
        let mut hops = 0;
        // Each `return` below is a walk the read itself refuses or fails on;
        // what was walked until then is all a replay needs to fail the same way.
        while let Some(c) = pending.pop() {
            match c.to_str() {
                Some(".") => continue,
                Some("..") => {
                    if !cur.pop() {
                        return None; // above the root: an escape
                    }
                    continue;
                }
                _ => {}
            }
            let next = cur.join(&c);
            let Ok(meta) = fs::symlink_metadata(self.root.join(&next)) else {
                return None;
            };
            if meta.file_type().is_symlink() {
                let Ok(target) = fs::read_link(self.root.join(&next)) else {
                    return None;
                };
                self.note(&next, Entry::Link(text_of(&target).into_owned()));
                hops += 1;
                if target.is_absolute() || hops > 40 {
                    return None;
                }
                pending.extend(
                    target
                        .components()
                        .rev()
                        .map(|c| PathBuf::from(c.as_os_str())),
                );
            } else {
                if meta.is_dir() {
                    self.note(&next, Entry::Dir);
                } else if !pending.is_empty() {
                    return None; // a file in the middle of a path: ENOTDIR
                }
                cur = next;
            }
        }
        Some(cur)
    }
}
