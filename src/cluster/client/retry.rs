//! The one retry policy for API requests: which failures are worth another
//! try, and how long to wait before it.
//!
//! Retried: 429 (too many requests), 503 (unavailable), 504 (gateway
//! timeout), any other 5xx that says when to come back (`Retry-After`, as
//! client-go retries), and a connection that could not be made or was
//! reset. Not retried: any other answer (a 4xx is the request's own fault; a
//! plain 500 or 502 is no promise that the next try differs, and the pass
//! fails naming it), and a wait that ran past the timeout (the server may
//! hang again; the timeout is the caller's bound).
//!
//! Every request nodefabric sends can be repeated safely: merge patches and
//! server-side applies set the same value again, deletes and the observer's
//! test-and-remove carry preconditions, and a repeated create meets 409.

use axum::http::{Request, Response};
use kube::client::Body;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;
use tower::BoxError;

/// Exponential backoff with "equal jitter": the wait before retry `n`
/// (from 0) is drawn from `[d/2, d]`, where `d = base · 2ⁿ` capped at
/// `cap`. The jitter spreads the retries of many brokers after one API
/// server hiccup; the lower half bound keeps each wait meaningful.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first wait's upper bound.
    pub base: Duration,
    /// No wait is longer.
    pub cap: Duration,
}

impl Backoff {
    /// The policy every API request and the Node watch use.
    pub const API: Backoff = Backoff {
        base: Duration::from_millis(200),
        cap: Duration::from_secs(30),
    };

    /// The upper bound of the wait before retry `n`: `base · 2ⁿ`, at most `cap`.
    pub fn ceiling(&self, n: u32) -> Duration {
        self.base
            .checked_mul(1u32.checked_shl(n).unwrap_or(u32::MAX))
            .map_or(self.cap, |d| d.min(self.cap))
    }

    /// The wait before retry `n`, given `unit` in `[0, 1)`: in `[d/2, d]`.
    pub fn delay_at(&self, n: u32, unit: f64) -> Duration {
        let d = self.ceiling(n);
        d / 2 + (d / 2).mul_f64(unit.clamp(0.0, 1.0))
    }

    /// The wait before retry `n`, jittered.
    pub fn delay(&self, n: u32) -> Duration {
        self.delay_at(n, random_unit())
    }

    /// The endless waits of a watch that keeps failing (the watch starts
    /// over from the first one after any event comes through).
    pub fn endless(self) -> Waits {
        Waits {
            backoff: self,
            n: 0,
        }
    }
}

/// A number in `[0, 1)` from std's per-process random hasher keys: jitter
/// needs spread, not cryptographic randomness.
fn random_unit() -> f64 {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// The waits of [`Backoff::endless`], for kube-runtime's watcher.
#[derive(Debug, Clone)]
pub struct Waits {
    backoff: Backoff,
    n: u32,
}

impl Iterator for Waits {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let d = self.backoff.delay(self.n);
        self.n = self.n.saturating_add(1);
        Some(d)
    }
}

impl kube::runtime::utils::Backoff for Waits {
    fn reset(&mut self) {
        self.n = 0;
    }
}

/// What one attempt came to, as far as retrying goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// An answer with this status; `retry_after` when the server said when.
    Answer {
        /// The HTTP status code.
        status: u16,
        /// The `Retry-After` seconds the server sent, if any.
        retry_after: Option<u64>,
    },
    /// No connection: refused, unreachable, reset or closed by the peer.
    Connection,
    /// Anything else (a timed-out wait, a TLS or decoding failure).
    Other,
}

impl Attempt {
    /// Whether this outcome is transient, so worth another try.
    pub fn transient(&self) -> bool {
        match *self {
            Attempt::Answer {
                status: 429 | 503 | 504,
                ..
            } => true,
            Attempt::Answer {
                status,
                retry_after,
            } => (500..600).contains(&status) && retry_after.is_some(),
            Attempt::Connection => true,
            Attempt::Other => false,
        }
    }

    fn of<B>(result: &Result<Response<B>, BoxError>) -> Attempt {
        match result {
            Ok(r) => Attempt::Answer {
                status: r.status().as_u16(),
                retry_after: r
                    .headers()
                    .get("Retry-After")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse().ok()),
            },
            Err(e) if connection_failed(e.as_ref()) => Attempt::Connection,
            Err(_) => Attempt::Other,
        }
    }
}

/// Whether any error in the chain says the connection failed (and not that
/// a wait timed out: the timeout connector reports that as `TimedOut`).
fn connection_failed(e: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind::*;
    let mut next = Some(e);
    while let Some(e) = next {
        if e.downcast_ref::<hyper_util::client::legacy::Error>()
            .is_some_and(|e| e.is_connect())
        {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                ConnectionRefused | ConnectionReset | ConnectionAborted | BrokenPipe | NotConnected
            );
        }
        next = e.source();
    }
    false
}

/// The tower retry policy of the client: [`Attempt::transient`] outcomes
/// are tried again after [`Backoff::API`] waits (or the server's
/// `Retry-After`, up to the cap), at most [`Policy::MAX_RETRIES`] times.
#[derive(Debug, Clone)]
pub struct Policy {
    backoff: Backoff,
    retries: u32,
}

impl Policy {
    /// Retries per request: the waits add up to at most 3 s, well inside a
    /// publishing interval, and a server down for longer fails the pass.
    pub const MAX_RETRIES: u32 = 4;

    /// The wait before the next try after `attempt`, or `None` to stop.
    pub fn next_wait(&mut self, attempt: Attempt) -> Option<Duration> {
        if !attempt.transient() || self.retries >= Policy::MAX_RETRIES {
            return None;
        }
        let mut wait = self.backoff.delay(self.retries);
        if let Attempt::Answer {
            retry_after: Some(s),
            ..
        } = attempt
        {
            wait = wait.max(Duration::from_secs(s).min(self.backoff.cap));
        }
        self.retries += 1;
        Some(wait)
    }
}

impl Default for Policy {
    /// [`Backoff::API`], no retry spent.
    fn default() -> Policy {
        Policy {
            backoff: Backoff::API,
            retries: 0,
        }
    }
}

impl<B> tower::retry::Policy<Request<Body>, Response<B>, BoxError> for Policy {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        req: &mut Request<Body>,
        result: &mut Result<Response<B>, BoxError>,
    ) -> Option<Self::Future> {
        let attempt = Attempt::of(result);
        let wait = self.next_wait(attempt)?;
        tracing::debug!(
            "{} {}: {attempt:?}; trying again in {wait:?}",
            req.method(),
            req.uri().path()
        );
        Some(tokio::time::sleep(wait))
    }

    fn clone_request(&mut self, req: &Request<Body>) -> Option<Request<Body>> {
        // A streamed body cannot be sent twice; kube-rs's requests are whole.
        let body = req.body().try_clone()?;
        let mut again = Request::new(body);
        *again.method_mut() = req.method().clone();
        *again.uri_mut() = req.uri().clone();
        *again.version_mut() = req.version();
        *again.headers_mut() = req.headers().clone();
        *again.extensions_mut() = req.extensions().clone();
        Some(again)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_base_up_to_the_cap_and_jitters_within_the_upper_half() {
        let b = Backoff::API;
        assert_eq!(b.ceiling(0), Duration::from_millis(200));
        assert_eq!(b.ceiling(1), Duration::from_millis(400));
        assert_eq!(b.ceiling(3), Duration::from_millis(1600));
        assert_eq!(b.ceiling(20), b.cap);
        assert_eq!(b.ceiling(u32::MAX), b.cap, "no overflow");
        for n in [0, 1, 4, 10, 64] {
            let d = b.ceiling(n);
            assert_eq!(b.delay_at(n, 0.0), d / 2);
            assert_eq!(b.delay_at(n, 1.0), d);
            for _ in 0..200 {
                let w = b.delay(n);
                assert!(
                    d / 2 <= w && w <= d,
                    "retry {n}: {w:?} outside [{:?}, {d:?}]",
                    d / 2
                );
            }
        }
        // Jitter: draws differ (200 equal draws would be a broken source).
        let draws: std::collections::BTreeSet<Duration> = (0..200).map(|_| b.delay(3)).collect();
        assert!(draws.len() > 100, "{} distinct of 200", draws.len());
    }

    #[test]
    fn transient_failures_retry_and_the_rest_do_not() {
        let answer = |status, retry_after| Attempt::Answer {
            status,
            retry_after,
        };
        for status in [429, 503, 504] {
            assert!(answer(status, None).transient(), "{status}");
        }
        assert!(answer(500, Some(1)).transient(), "a 5xx that says when");
        assert!(Attempt::Connection.transient());
        for status in [200, 400, 401, 403, 404, 409, 410, 422, 500, 502] {
            assert!(!answer(status, None).transient(), "{status}");
        }
        assert!(!answer(404, Some(1)).transient(), "a 4xx never");
        assert!(!Attempt::Other.transient(), "a timed-out wait");
    }

    #[test]
    fn connection_failures_are_told_from_timeouts_through_the_error_chain() {
        let io = |kind| -> BoxError { Box::new(std::io::Error::new(kind, "x")) };
        let of = |e: BoxError| Attempt::of::<()>(&Err(e));
        assert_eq!(
            of(io(std::io::ErrorKind::ConnectionRefused)),
            Attempt::Connection
        );
        assert_eq!(
            of(io(std::io::ErrorKind::ConnectionReset)),
            Attempt::Connection
        );
        assert_eq!(of(io(std::io::ErrorKind::TimedOut)), Attempt::Other);
        // Wrapped, as hyper and the buffer wrap what the socket said.
        #[derive(Debug, thiserror::Error)]
        #[error("wrapped")]
        struct Wrap(#[source] std::io::Error);
        let wrapped: BoxError = Box::new(Wrap(std::io::Error::from(
            std::io::ErrorKind::ConnectionAborted,
        )));
        assert_eq!(of(wrapped), Attempt::Connection);
        let retry_after = Response::builder()
            .status(503)
            .header("Retry-After", "2")
            .body(())
            .unwrap();
        assert_eq!(
            Attempt::of(&Ok(retry_after)),
            Attempt::Answer {
                status: 503,
                retry_after: Some(2)
            }
        );
    }

    #[test]
    fn a_request_is_retried_at_most_max_retries_times_and_retry_after_is_capped() {
        let mut p = Policy::default();
        let unavailable = Attempt::Answer {
            status: 503,
            retry_after: None,
        };
        let waits: Vec<Duration> = std::iter::from_fn(|| p.next_wait(unavailable)).collect();
        assert_eq!(waits.len(), Policy::MAX_RETRIES as usize);
        assert!(waits.iter().sum::<Duration>() <= Duration::from_secs(3));
        let mut p = Policy::default();
        let later = Attempt::Answer {
            status: 429,
            retry_after: Some(5),
        };
        assert_eq!(p.next_wait(later), Some(Duration::from_secs(5)));
        let forever = Attempt::Answer {
            status: 429,
            retry_after: Some(u64::MAX),
        };
        assert_eq!(p.next_wait(forever), Some(Backoff::API.cap));
        let mut p = Policy::default();
        assert_eq!(
            p.next_wait(Attempt::Answer {
                status: 500,
                retry_after: None
            }),
            None
        );
    }

    #[test]
    fn the_watch_waits_never_end_and_start_over_on_reset() {
        use kube::runtime::utils::Backoff as _;
        let mut w = Backoff::API.endless();
        let late = w.by_ref().take(50).last().unwrap();
        assert!(late >= Backoff::API.cap / 2);
        w.reset();
        assert!(w.next().unwrap() <= Backoff::API.base);
    }
}
