//! Pacing a retried operation: at once the first time, then after a wait
//! that doubles while it keeps failing. Kept apart from
//! [`super::restart::Retry`], which also tries again at once when kubelet's
//! socket changed: an API write or a socket bind has no kubelet to watch.

use std::time::Duration;
use tokio::time::Instant;

/// When to try again after failures: at once the first time and after a
/// success, otherwise after a wait that doubles from `first` up to `max`.
#[derive(Debug)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    backoff: Duration,
    next_attempt: Instant,
}

impl Backoff {
    /// A backoff whose waits double from `first` up to `max`.
    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max,
            backoff: first,
            next_attempt: Instant::now(),
        }
    }

    /// True when the wait after the last failure has passed (or none failed).
    pub fn due(&self) -> bool {
        Instant::now() >= self.next_attempt
    }

    /// Records a successful attempt: the next is due at once, and the next
    /// failure waits `first` again.
    pub fn succeeded(&mut self) {
        self.backoff = self.first;
        self.next_attempt = Instant::now();
    }

    /// Records a failed attempt: the next waits the current backoff, which
    /// doubles for the one after.
    pub fn failed(&mut self) {
        self.next_attempt = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(self.max);
    }

    /// Resolves when the wait after the last failure has passed.
    pub async fn wait(&self) {
        tokio::time::sleep_until(self.next_attempt).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_max_and_a_success_starts_over() {
        let minute = Duration::from_secs(60);
        let mut b = Backoff::new(minute, 3 * minute);
        assert!(b.due(), "the first attempt is due at once");
        b.failed();
        assert!(!b.due(), "a failure waits");
        assert_eq!(b.backoff, 2 * minute, "the next wait is twice the first");
        b.failed();
        b.failed();
        assert_eq!(b.backoff, 3 * minute, "no wait is longer than the max");
        b.succeeded();
        assert!(b.due(), "a success makes the next attempt due at once");
        assert_eq!(
            b.backoff, minute,
            "and the next failure waits the first again"
        );
    }
}
