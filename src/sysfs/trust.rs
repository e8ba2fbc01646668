//! Link targets taken on trust for one pass, and their proof.
//!
//! A link whose target names several folders past what the pass knows is
//! checked with one `O_PATH` open beneath the root that refuses any link on
//! the way (two system calls with its close, for every `class/net` and
//! `class/infiniband` entry). Discovery reads beneath almost every such
//! target soon after, so while it reads the tree it may presume the target
//! plain instead: the first read beneath it opens with
//! `RESOLVE_NO_SYMLINKS`, which proves the whole path at no cost, and what
//! no read proved is checked by [`SysRoot::settle`] once the tree is read.
//! A presumption that fails means that what was built on it (a canonical
//! path, a link's text read against it) may be wrong, so the caller reads
//! the tree again without presuming: a damaged or hostile tree costs a
//! second pass, never a wrong answer.

use super::resolve::Place;
use super::SysRoot;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Whether a tree presumes, and how many of its presumptions stand unproved.
#[derive(Debug, Default)]
pub(super) struct Trust {
    /// Link targets are presumed plain, not checked (see [`SysRoot::presume`]).
    presuming: AtomicBool,
    /// Folders presumed and not yet proved: reads look for one to prove
    /// only while there is one.
    unproven: AtomicUsize,
}

impl SysRoot {
    /// Presume link targets plain until [`Self::settle`], proving each by
    /// the reads beneath it (see this module). Only where `openat2(2)`
    /// answers: without it nothing could prove them.
    pub fn presume(&self) {
        if self.beneath.is_some() && !self.recording_on() {
            self.trust.presuming.store(true, Ordering::Relaxed);
        }
    }

    /// True while link targets are presumed, not checked.
    pub(super) fn presuming(&self) -> bool {
        self.trust.presuming.load(Ordering::Relaxed)
    }

    /// Counts one more folder presumed, just stored as [`Place::Presumed`].
    pub(super) fn presumed_one(&self) {
        self.trust.unproven.fetch_add(1, Ordering::Relaxed);
    }

    /// True when `folder` is presumed and unproved, so a read beneath it
    /// should refuse links to prove it. One look in the cache, made only
    /// while some presumption stands.
    pub(super) fn to_prove(&self, folder: &str) -> bool {
        self.trust.unproven.load(Ordering::Relaxed) > 0
            && self
                .folders
                .lock()
                .expect("folder cache lock")
                .get(folder)
                .is_some_and(|v| matches!(v, Place::Presumed))
    }

    /// `folder` was proved plain: a read beneath it refused every link.
    pub(super) fn proved(&self, folder: &str) {
        let mut cache = self.folders.lock().expect("folder cache lock");
        if let Some(v) = cache
            .get_mut(folder)
            .filter(|v| matches!(v, Place::Presumed))
        {
            *v = Place::Canonical;
            let _ = self
                .trust
                .unproven
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    /// Drops the count of presumptions with the cache that held them.
    pub(super) fn forget_presumptions(&self) {
        self.trust.unproven.store(0, Ordering::Relaxed);
    }

    /// Ends presuming: checks each folder presumed and never proved by a
    /// read, as a resolution checks it when not presuming. False when one
    /// is not plain (a link on its way) or not there: what was read on it
    /// may be wrong, and the tree must be read again.
    pub fn settle(&self) -> bool {
        self.trust.presuming.store(false, Ordering::Relaxed);
        if self.trust.unproven.swap(0, Ordering::Relaxed) == 0 {
            return true;
        }
        let presumed: Vec<String> = self
            .folders
            .lock()
            .expect("folder cache lock")
            .iter()
            .filter(|(_, v)| matches!(v, Place::Presumed))
            .map(|(k, _)| k.clone())
            .collect();
        let mut held = true;
        for folder in presumed {
            let plain = self.plain_beneath(&folder);
            let mut cache = self.folders.lock().expect("folder cache lock");
            match plain {
                true => {
                    if let Some(v) = cache.get_mut(&folder) {
                        *v = Place::Canonical;
                    }
                }
                false => {
                    cache.remove(&folder);
                    held = false;
                }
            }
        }
        held
    }
}
