//! Log de-duplication: a warning about one subject (a spec path, kubelet)
//! is logged when its cause first appears or changes, and once more, at
//! info, when it clears. A plugin left hours beside a broken file or a
//! stopped kubelet so logs a few lines, not one per wake.

use std::collections::BTreeMap;
use tracing::{info, warn};

/// The current cause of each subject's trouble.
#[derive(Debug, Default)]
pub struct Quiet {
    causes: BTreeMap<String, String>,
}

impl Quiet {
    /// Logs `message` unless it is already the subject's logged cause.
    /// Returns whether it was logged.
    pub fn warn(&mut self, subject: &str, message: String) -> bool {
        if self.causes.get(subject) == Some(&message) {
            return false;
        }
        warn!("{message}");
        self.causes.insert(subject.to_string(), message);
        true
    }

    /// Forgets the subject's cause, logging `resolved` if there was one.
    pub fn clear(&mut self, subject: &str, resolved: impl FnOnce() -> String) {
        if self.causes.remove(subject).is_some() {
            info!("{}", resolved());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Quiet;

    #[test]
    fn the_same_cause_is_logged_once_and_again_when_it_changes_or_clears() {
        let mut q = Quiet::default();
        assert!(q.warn("a", "gone".into()));
        assert!(!q.warn("a", "gone".into()));
        assert!(q.warn("b", "gone".into()), "another subject is its own");
        assert!(q.warn("a", "too large".into()));
        q.clear("a", || "a is back".into());
        assert!(
            q.warn("a", "too large".into()),
            "after clearing, the cause is news again"
        );
    }
}
