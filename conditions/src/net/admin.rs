//! The admin HTTP server on `--metrics-listen`: `/metrics` (Prometheus),
//! `/healthz`, `/readyz` (ready after the first full list of
//! EndpointSlices), `/serving` (the gRPC server takes calls, whatever the
//! index holds: the envoy-gateway mode's readiness, since the hook answers
//! in every state) and the status page (`/debug/services`, `.html`), on
//! one small HTTP/1 listener, bounded (`--metrics-max-connections`,
//! `--metrics-header-timeout`).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::Notify;

use crate::limits::{names as limit, HttpLimits};
use crate::telemetry::metrics::Metrics;
use crate::telemetry::ratelog::LogBudget;

fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn route(metrics: &Metrics, path: &str) -> Response<Full<Bytes>> {
    match path {
        "/metrics" => respond(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.render(),
        ),
        // the status page (telemetry::status)
        "/debug/services" => respond(
            StatusCode::OK,
            "application/json",
            metrics.status().json().to_string(),
        ),
        "/debug/services.html" => respond(
            StatusCode::OK,
            "text/html; charset=utf-8",
            metrics.status().html(),
        ),
        "/healthz" => respond(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" if metrics.is_ready() => respond(StatusCode::OK, "text/plain", "ready\n".into()),
        "/readyz" => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not ready: no full list of EndpointSlices yet\n".into(),
        ),
        "/serving" if metrics.is_serving() => {
            respond(StatusCode::OK, "text/plain", "serving\n".into())
        }
        "/serving" => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not serving: the gRPC server is not taking calls\n".into(),
        ),
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

static HTTP_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));

/// The metrics port's open connections, oldest first, each closable.
#[derive(Default)]
struct HttpConnections {
    next: AtomicUsize,
    open: Mutex<BTreeMap<usize, Arc<Notify>>>,
}

impl HttpConnections {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, Arc<Notify>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Serves `/metrics`, `/healthz`, `/readyz`, `/debug/services` on `listener` until the process
/// ends. Bounded: headers must arrive within `--metrics-header-timeout`, and
/// past `--metrics-max-connections` a new connection closes the oldest, so
/// half-sent requests cannot keep the probes out.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, limits: HttpLimits) {
    metrics.set_limit(
        limit::METRICS_MAX_CONNECTIONS,
        limits.metrics_max_connections as i64,
    );
    metrics.set_limit(
        limit::METRICS_HEADER_TIMEOUT,
        limits.metrics_header_timeout.as_secs() as i64,
    );
    let conns = Arc::new(HttpConnections::default());
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.metrics_header_timeout)
        .max_buf_size(16 * 1024);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "metrics listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let id = conns.next.fetch_add(1, Ordering::SeqCst);
        let close = Arc::new(Notify::new());
        {
            let mut open = conns.lock();
            while open.len() >= limits.metrics_max_connections.max(1) {
                let Some((_, oldest)) = open.pop_first() else {
                    break;
                };
                oldest.notify_one();
                metrics.limit_hit(limit::METRICS_MAX_CONNECTIONS);
                if let Some(left_out) = HTTP_LOG.allow() {
                    tracing::warn!(peer = %peer, left_out, "metrics port over --metrics-max-connections: the oldest connection is closed");
                }
            }
            open.insert(id, close.clone());
            metrics.set_http_connections(open.len());
        }
        let metrics = metrics.clone();
        let conns = conns.clone();
        let http = http.clone();
        tokio::spawn(async move {
            let m = metrics.clone();
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let r = route(&m, req.uri().path());
                async move { Ok::<_, Infallible>(r) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            tokio::select! {
                r = http.serve_connection(io, service) => {
                    if let Err(e) = r {
                        if e.is_timeout() {
                            metrics.limit_hit(limit::METRICS_HEADER_TIMEOUT);
                            if let Some(left_out) = HTTP_LOG.allow() {
                                tracing::warn!(peer = %peer, left_out, "metrics port: headers not in within --metrics-header-timeout: closed");
                            }
                        }
                    }
                }
                _ = close.notified() => {}
            }
            let mut open = conns.lock();
            open.remove(&id);
            metrics.set_http_connections(open.len());
        });
    }
}

/// Binds the admin listener (`--metrics-listen`).
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    crate::net::listener::bind(addr)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn routes_and_readiness_follow_the_index() {
        let m = Metrics::with_registry(Metrics::new_registry(), Default::default());
        assert_eq!(
            route(&m, "/readyz").status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(route(&m, "/healthz").status(), StatusCode::OK);
        m.set_ready(true);
        assert_eq!(route(&m, "/readyz").status(), StatusCode::OK);
        // /serving is the gRPC server's state, not the index's.
        assert_eq!(
            route(&m, "/serving").status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        m.set_serving(true);
        assert_eq!(route(&m, "/serving").status(), StatusCode::OK);
        assert_eq!(route(&m, "/metrics").status(), StatusCode::OK);
        assert_eq!(
            route(&m, "/debug/services").headers()[hyper::header::CONTENT_TYPE],
            "application/json"
        );
        assert_eq!(route(&m, "/nope").status(), StatusCode::NOT_FOUND);
    }
}
