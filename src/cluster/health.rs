//! Liveness and readiness over HTTP for the long-running parts: the Node
//! Observer and the interval-mode publisher (`GET /livez`, `GET /readyz`:
//! 200 `ok`, or 503 naming what is wrong), for the pods' probes. Served by
//! axum, as the device plugin's probes are.

use axum::http::{StatusCode, Uri};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Shared health flags; cheap to clone, set from anywhere.
#[derive(Debug, Clone, Default)]
pub struct Health {
    live: Arc<AtomicBool>,
    ready: Arc<AtomicBool>,
    /// Why the process, though running, cannot do its work until restarted
    /// (a folder deleted under its mount): liveness fails, naming it.
    broken: Arc<Mutex<Option<String>>>,
    /// For a process that works in passes: how long one may take at most,
    /// and when the last one completed. Past that, liveness fails: a pass
    /// stuck on something no timeout bounds needs a restart.
    passes: Arc<Mutex<Option<(Duration, Instant)>>>,
}

impl Health {
    /// Both flags false: not live until started, not ready until a pass succeeded.
    pub fn new() -> Health {
        Health::default()
    }

    /// Marks the process live (it has started its work) or not.
    pub fn set_live(&self, v: bool) {
        self.live.store(v, Ordering::SeqCst);
    }

    /// Marks the last pass as succeeded (ready) or failed.
    pub fn set_ready(&self, v: bool) {
        self.ready.store(v, Ordering::SeqCst);
    }

    /// Marks the process as unable to work until restarted (`Some(why)`),
    /// or able again.
    pub fn set_broken(&self, why: Option<String>) {
        *self.broken.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }

    /// From now on, liveness fails whenever no pass has completed (see
    /// [`Health::pass_completed`]) for `window`.
    pub fn expect_passes_within(&self, window: Duration) {
        *self.passes.lock().unwrap_or_else(|e| e.into_inner()) = Some((window, Instant::now()));
    }

    /// Records that a pass completed, whether it succeeded or failed.
    pub fn pass_completed(&self) {
        if let Some((_, at)) = self
            .passes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            *at = Instant::now();
        }
    }

    /// Whether live: started, not broken, and passes completing.
    pub fn live(&self) -> bool {
        self.live.load(Ordering::SeqCst) && self.broken().is_none()
    }

    /// Why the process cannot work until restarted: a folder deleted under
    /// it, or a pass that has not completed in its window.
    fn broken(&self) -> Option<String> {
        let why = self
            .broken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        why.or_else(|| {
            let (window, at) = (*self.passes.lock().unwrap_or_else(|e| e.into_inner()))?;
            let since = at.elapsed();
            (since > window).then(|| {
                format!(
                    "no pass completed for {} (at most {} expected): a pass is stuck",
                    humantime::format_duration(Duration::from_secs(since.as_secs())),
                    humantime::format_duration(window)
                )
            })
        })
    }

    /// Whether ready.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// The answer to one probe request.
    pub fn answer(&self, path: &str) -> (StatusCode, String) {
        let (code, body) = match path {
            "/livez" | "/healthz" => match self.broken() {
                Some(why) => return (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
                // The flag itself: broken was just read, once.
                None if self.live.load(Ordering::SeqCst) => (StatusCode::OK, "ok\n"),
                None => (StatusCode::SERVICE_UNAVAILABLE, "not started\n"),
            },
            "/readyz" if self.ready() => (StatusCode::OK, "ok\n"),
            "/readyz" => (
                StatusCode::SERVICE_UNAVAILABLE,
                "the last pass failed or none has finished yet\n",
            ),
            _ => (StatusCode::NOT_FOUND, "not found: /livez or /readyz\n"),
        };
        (code, body.to_string())
    }

    /// Binds `addr` now (so a taken port is an error at start) and serves
    /// probes on a thread of its own for the life of the process.
    pub fn serve(&self, addr: SocketAddr) -> std::io::Result<SocketAddr> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let bound = listener.local_addr()?;
        let health = self.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // Its own thread and runtime: the publisher is synchronous and the
        // observer's runtime may be busy; a probe must be answered anyway.
        std::thread::Builder::new()
            .name("health".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => return tracing::error!("health endpoint {bound}: {e}"),
                    };
                    // Every path goes to answer(), which knows the two probes.
                    let app = axum::Router::new().fallback(move |uri: Uri| {
                        let (code, body) = health.answer(uri.path());
                        async move { (code, body) }
                    });
                    if let Err(e) = axum::serve(listener, app).await {
                        tracing::error!("health endpoint {bound} stopped: {e}");
                    }
                })
            })?;
        Ok(bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_follows_the_last_pass_and_liveness_the_start() {
        let h = Health::new();
        assert_eq!(h.answer("/livez").0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(h.answer("/readyz").0, StatusCode::SERVICE_UNAVAILABLE);
        h.set_live(true);
        h.set_ready(true);
        assert_eq!(h.answer("/livez").0, StatusCode::OK);
        assert_eq!(h.answer("/readyz").0, StatusCode::OK);
        h.set_ready(false);
        assert_eq!(h.answer("/readyz").0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(h.answer("/other").0, StatusCode::NOT_FOUND);
        h.set_broken(Some("the CDI folder /x was deleted".into()));
        assert_eq!(
            h.answer("/livez"),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the CDI folder /x was deleted\n".into()
            )
        );
        h.set_broken(None);
        assert_eq!(h.answer("/livez").0, StatusCode::OK);
    }

    #[test]
    fn hung_credential_command_liveness_fails_once_no_pass_completed_within_its_window() {
        let h = Health::new();
        h.set_live(true);
        h.expect_passes_within(Duration::from_millis(200));
        assert_eq!(h.answer("/livez").0, StatusCode::OK);
        std::thread::sleep(Duration::from_millis(120));
        h.pass_completed();
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(
            h.answer("/livez").0,
            StatusCode::OK,
            "a pass completed in time"
        );
        std::thread::sleep(Duration::from_millis(150));
        let (code, body) = h.answer("/livez");
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            body.contains("no pass completed") && body.contains("200ms"),
            "{body}"
        );
        assert!(!h.live());
        h.pass_completed();
        assert_eq!(h.answer("/livez").0, StatusCode::OK);
    }
}
