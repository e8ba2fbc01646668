//! `/healthz`, `/readyz` and `/metrics` over HTTP/1 on `--metrics-addr`,
//! served by the plugin's one runtime: a probe that gets an answer has
//! proven the runtime is not stalled.

use super::metrics::Observed;
use anyhow::{Context, Result};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::net::SocketAddr;
use std::sync::Arc;
use tracing::{info, warn};

/// The content type of the OpenMetrics text format, which Prometheus reads.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `addr` now (so a taken port fails the start, naming it) and serves
/// the three endpoints in the background.
pub async fn serve(
    addr: SocketAddr,
    observed: Arc<Observed>,
) -> Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics-addr {addr}: cannot listen"))?;
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(observed);
    info!(%addr, "serving /healthz, /readyz and /metrics");
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            warn!("the metrics server stopped: {e}");
        }
    }))
}

async fn healthz(State(o): State<Arc<Observed>>) -> impl IntoResponse {
    match o.healthy() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn readyz(State(o): State<Arc<Observed>>) -> impl IntoResponse {
    match o.ready() {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why.join("\n") + "\n"),
    }
}

async fn metrics(State(o): State<Arc<Observed>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, OPENMETRICS)], o.encode())
}
