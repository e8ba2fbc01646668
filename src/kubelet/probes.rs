//! `/livez`, `/readyz` and `/metrics` over HTTP/1, served by the plugin's
//! one runtime: a probe that gets an answer has proven the runtime is not
//! stalled. What each answers is the plugin's, through [`Probes`].
//!
//! `/livez` is the name the cluster side (`observe`, `publish --interval`)
//! serves liveness under; `/healthz` answers the same, for the probes of
//! manifests written before.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::net::SocketAddr;
use std::sync::Arc;
use tracing::{info, warn};

/// Every path the probe server answers, for the docs that must name them.
pub const ENDPOINTS: [&str; 4] = ["/livez", "/healthz", "/readyz", "/metrics"];

/// The content type of the OpenMetrics text format, which Prometheus reads.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What a plugin reports to its probes; each plugin implements it over its
/// own state, so the server is shared and the answers are not.
pub trait Probes: Send + Sync + 'static {
    /// Why the plugin is not alive, typed by the plugin; it becomes text
    /// only in `/livez`'s answer.
    type Unhealthy: std::fmt::Display;
    /// `Ok` while the plugin is alive; `Err(why)` makes `/livez` fail and
    /// kubelet restart the container, so only for what a restart mends.
    fn healthy(&self) -> Result<(), Self::Unhealthy>;
    /// `Ok` when the plugin serves all it should; otherwise every reason it
    /// does not, one per line of `/readyz`.
    fn ready(&self) -> Result<(), Vec<String>>;
    /// The metrics in the OpenMetrics text format.
    fn metrics(&self) -> String;
}

/// The probe address could not be listened on; names the address (the
/// plugin adds its flag's name).
#[derive(Debug, thiserror::Error)]
#[error("{addr}: cannot listen: {cause}")]
pub struct ProbeError {
    /// The address asked for.
    pub addr: SocketAddr,
    /// What bind said.
    pub cause: std::io::Error,
}

/// Binds `addr` now (so a taken port fails the start, naming it) and serves
/// the three endpoints in the background.
pub async fn serve<P: Probes>(
    addr: SocketAddr,
    probes: Arc<P>,
) -> Result<tokio::task::JoinHandle<()>, ProbeError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|cause| ProbeError { addr, cause })?;
    let app = Router::new()
        .route("/livez", get(livez::<P>))
        .route("/healthz", get(livez::<P>))
        .route("/readyz", get(readyz::<P>))
        .route("/metrics", get(metrics::<P>))
        .with_state(probes);
    info!(%addr, "serving /healthz, /readyz and /metrics");
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            warn!("the metrics server stopped: {e}");
        }
    }))
}

async fn livez<P: Probes>(State(p): State<Arc<P>>) -> impl IntoResponse {
    match p.healthy() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn readyz<P: Probes>(State(p): State<Arc<P>>) -> impl IntoResponse {
    match p.ready() {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why.join("\n") + "\n"),
    }
}

async fn metrics<P: Probes>(State(p): State<Arc<P>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, OPENMETRICS)], p.metrics())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A plugin's own state: alive, not ready for one reason.
    struct Stub;

    impl Probes for Stub {
        type Unhealthy = std::convert::Infallible;
        fn healthy(&self) -> Result<(), Self::Unhealthy> {
            Ok(())
        }
        fn ready(&self) -> Result<(), Vec<String>> {
            Err(vec!["a/b is not registered".into(), "x.json: torn".into()])
        }
        fn metrics(&self) -> String {
            "stub_up 1\n# EOF\n".into()
        }
    }

    /// A plugin whose kubelet folder was deleted under its mount.
    struct Stale;

    /// Stale's one reason not to be alive.
    #[derive(Debug, thiserror::Error)]
    #[error("the kubelet folder was deleted")]
    struct FolderDeleted;

    impl Probes for Stale {
        type Unhealthy = FolderDeleted;
        fn healthy(&self) -> Result<(), FolderDeleted> {
            Err(FolderDeleted)
        }
        fn ready(&self) -> Result<(), Vec<String>> {
            Err(vec!["a/b is not registered".into(), "x.json: torn".into()])
        }
        fn metrics(&self) -> String {
            "stub_up 1\n# EOF\n".into()
        }
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn the_plugin_s_state_answers_and_a_taken_address_is_named() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let e = serve(addr, Arc::new(Stub)).await.unwrap_err();
        assert!(
            e.to_string().starts_with(&format!("{addr}: cannot listen")),
            "{e}"
        );
        drop(taken);

        let server = serve(addr, Arc::new(Stub)).await.unwrap();
        for path in ENDPOINTS {
            let answer = get(addr, path).await;
            assert!(!answer.starts_with("HTTP/1.1 404"), "{path}: {answer}");
        }
        assert!(get(addr, "/nothing").await.starts_with("HTTP/1.1 404"));
        assert!(get(addr, "/livez").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        let ready = get(addr, "/readyz").await;
        assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
        assert!(
            ready.ends_with("a/b is not registered\nx.json: torn\n"),
            "{ready}"
        );
        let metrics = get(addr, "/metrics").await;
        assert!(metrics.contains(OPENMETRICS) && metrics.ends_with("stub_up 1\n# EOF\n"));
        server.abort();
    }

    #[tokio::test]
    async fn livez_and_healthz_give_the_same_liveness_verdict() {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let server = serve(addr, Arc::new(Stale)).await.unwrap();
        for path in ["/livez", "/healthz"] {
            let answer = get(addr, path).await;
            assert!(answer.starts_with("HTTP/1.1 503"), "{path}: {answer}");
            assert!(
                answer.ends_with("\r\n\r\nthe kubelet folder was deleted\n"),
                "{path}: {answer}"
            );
        }
        server.abort();
    }
}
