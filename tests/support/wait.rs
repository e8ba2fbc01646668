//! The one way a test waits: it polls what it observes until that holds,
//! and fails at a deadline naming what it awaited and the last value it
//! saw, so a busy machine neither flakes a test nor lets it pass without
//! having looked. The deadline guards against a hang; it measures nothing.
//! A test that asserts nothing happens first waits for the component to
//! have provably done its work again (a pass counter, a request in the
//! API log), then looks.

#![allow(dead_code)] // each test binary uses a different part

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

/// How long any wait may take before the test fails instead of hanging.
pub const WAIT: Duration = Duration::from_secs(60);

/// How often an observation is taken again.
const POLL: Duration = Duration::from_millis(20);

/// Polls `look` until `done` holds of what it returns, and gives that back;
/// fails after [`WAIT`] naming `what` and the last value seen.
pub fn until<T: Debug>(what: &str, look: impl FnMut() -> T, done: impl FnMut(&T) -> bool) -> T {
    until_by(WAIT, what, look, done)
}

/// [`until`] with a deadline of `limit`, for a test whose claim is that it
/// happens within that time.
pub fn until_by<T: Debug>(
    limit: Duration,
    what: &str,
    mut look: impl FnMut() -> T,
    mut done: impl FnMut(&T) -> bool,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(seen) = observe(started, limit, what, &mut look, &mut done) {
            return seen;
        }
        std::thread::sleep(POLL);
    }
}

/// [`until`] in an async test: the runtime's other tasks (a kubelet
/// stand-in, a stream reader) run while it waits.
pub async fn until_async<T: Debug>(
    what: &str,
    mut look: impl FnMut() -> T,
    mut done: impl FnMut(&T) -> bool,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(seen) = observe(started, WAIT, what, &mut look, &mut done) {
            return seen;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Awaits one answer (a message on a stream, a call's reply), failing
/// after [`WAIT`] instead of hanging; there is no value to show until it
/// comes.
pub async fn within<T>(what: &str, answer: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, answer)
        .await
        .unwrap_or_else(|_| panic!("timed out after {WAIT:?} waiting for {what}"))
}

/// One look: what was seen, if `done` holds of it; fails once `limit` has
/// passed since `started`, with the value seen last.
fn observe<T: Debug>(
    started: Instant,
    limit: Duration,
    what: &str,
    look: &mut impl FnMut() -> T,
    done: &mut impl FnMut(&T) -> bool,
) -> Option<T> {
    let seen = look();
    if done(&seen) {
        return Some(seen);
    }
    if started.elapsed() > limit {
        panic!("timed out after {limit:?} waiting until {what}; last seen: {seen:#?}");
    }
    None
}
