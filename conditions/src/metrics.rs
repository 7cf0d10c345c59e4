//! Prometheus metrics, `/healthz`, `/readyz` (ready after the first full
//! list of EndpointSlices) and `/serving` (the gRPC server takes calls,
//! whatever the index holds: the envoy-gateway mode's readiness, since the
//! hook answers in every state), on one small HTTP/1 listener.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Metric, Registry};
use tokio::net::TcpListener;

use crate::index::Index;

type Labels = Vec<(&'static str, &'static str)>;

/// Every metric the companion exports (prefix `serving_picker_conditions_`).
pub struct Metrics {
    registry: Registry,
    ready: AtomicBool,
    serving: AtomicBool,
    watch_events: Family<Labels, Counter>,
    source_errors: Family<Labels, Counter>,
    index_slices: Gauge,
    index_endpoints: Gauge,
    ready_gauge: Gauge,
    updates: Counter,
    snapshots: Counter,
    build_seconds: Histogram,
    streams: Gauge,
    pushes: Counter,
    pushed_resources: Counter,
    acks: Counter,
    nacks: Counter,
    push_lag_seconds: Histogram,
    ack_seconds: Histogram,
}

fn seconds_buckets() -> Histogram {
    // 50 us .. ~13 s.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 19))
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// `metric`, registered in `registry` as `name` with `help` (the registry
/// keeps a handle to the same metric).
pub fn registered<M: Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("serving_picker_conditions");
        let r = &mut registry;
        // Registered (and so rendered) in this order.
        let watch_events = registered(
            r,
            "watch_events",
            "Events from the source, by kind (apply, delete, init, init_apply, init_done, files_reload)",
            Family::default(),
        );
        let source_errors = registered(
            r,
            "source_errors",
            "Source errors, by kind (watch, file)",
            Family::default(),
        );
        let index_slices = registered(
            r,
            "index_slices",
            "EndpointSlices in the index",
            Gauge::default(),
        );
        let index_endpoints = registered(
            r,
            "index_endpoints",
            "Endpoints over all indexed slices",
            Gauge::default(),
        );
        let ready_gauge = registered(
            r,
            "ready",
            "1 once the first full list of EndpointSlices is in",
            Gauge::default(),
        );
        let updates = registered(
            r,
            "updates",
            "Source updates applied to the index",
            Counter::default(),
        );
        let snapshots = registered(r, "snapshots", "Snapshots published", Counter::default());
        let build_seconds = registered(
            r,
            "snapshot_build_seconds",
            "Time to apply a batch of updates and rebuild the changed assignments",
            seconds_buckets(),
        );
        let streams = registered(r, "xds_streams", "Connected xDS streams", Gauge::default());
        let pushes = registered(r, "xds_pushes", "xDS responses sent", Counter::default());
        let pushed_resources = registered(
            r,
            "xds_pushed_resources",
            "ClusterLoadAssignments sent (over all responses)",
            Counter::default(),
        );
        let acks = registered(
            r,
            "xds_acks",
            "xDS responses Envoy accepted",
            Counter::default(),
        );
        let nacks = registered(
            r,
            "xds_nacks",
            "xDS responses Envoy rejected",
            Counter::default(),
        );
        let push_lag_seconds = registered(
            r,
            "xds_push_lag_seconds",
            "From a source change to the assignment it produced handed to a stream",
            seconds_buckets(),
        );
        let ack_seconds = registered(
            r,
            "xds_ack_seconds",
            "From a response sent to Envoy's ACK (Envoy's time to apply it, plus the round trip)",
            seconds_buckets(),
        );
        Metrics {
            registry,
            ready: AtomicBool::new(false),
            serving: AtomicBool::new(false),
            watch_events,
            source_errors,
            index_slices,
            index_endpoints,
            ready_gauge,
            updates,
            snapshots,
            build_seconds,
            streams,
            pushes,
            pushed_resources,
            acks,
            nacks,
            push_lag_seconds,
            ack_seconds,
        }
    }

    /// For a mode's own metrics, registered before the Metrics is shared
    /// (`envoy_gateway::service::HookMetrics`).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    pub fn watch_event(&self, kind: &'static str) {
        self.watch_events.get_or_create(&vec![("kind", kind)]).inc();
    }

    pub fn source_error(&self, kind: &'static str) {
        self.source_errors
            .get_or_create(&vec![("kind", kind)])
            .inc();
    }

    /// After the publisher applied `n` updates.
    pub fn applied(&self, n: usize, index: &Index, ready: bool, took: Duration) {
        self.updates.inc_by(n as u64);
        self.index_slices.set(index.slice_count() as i64);
        self.index_endpoints.set(index.endpoint_count() as i64);
        self.ready_gauge.set(i64::from(ready));
        self.ready.store(ready, Ordering::SeqCst);
        self.build_seconds.observe(took.as_secs_f64());
    }

    pub fn published(&self) {
        self.snapshots.inc();
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// The gRPC server takes calls (true) or is shutting down (false).
    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::SeqCst);
    }

    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::SeqCst)
    }

    pub fn stream_opened(&self) {
        self.streams.inc();
    }

    pub fn stream_closed(&self) {
        self.streams.dec();
    }

    /// A response with `resources` assignments, `lags` from each one's change.
    pub fn pushed(&self, resources: usize, lags: impl Iterator<Item = Duration>) {
        self.pushes.inc();
        self.pushed_resources.inc_by(resources as u64);
        for l in lags {
            self.push_lag_seconds.observe(l.as_secs_f64());
        }
    }

    pub fn acked(&self, after: Option<Duration>) {
        self.acks.inc();
        if let Some(d) = after {
            self.ack_seconds.observe(d.as_secs_f64());
        }
    }

    pub fn nacked(&self) {
        self.nacks.inc();
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut s = String::new();
        if encode(&mut s, &self.registry).is_err() {
            s.clear();
        }
        s
    }
}

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

/// Serves `/metrics`, `/healthz`, `/readyz` on `listener` until the process ends.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let (stream, _peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "metrics listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let r = route(&metrics, req.uri().path());
                async move { Ok::<_, Infallible>(r) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
}

/// Binds the metrics listener.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn renders_and_readiness_follows_the_index() {
        let m = Metrics::new();
        assert_eq!(
            route(&m, "/readyz").status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(route(&m, "/healthz").status(), StatusCode::OK);
        m.watch_event("apply");
        m.nacked();
        m.applied(1, &Index::new(), true, Duration::from_micros(10));
        assert_eq!(route(&m, "/readyz").status(), StatusCode::OK);
        // /serving is the gRPC server's state, not the index's.
        assert_eq!(
            route(&m, "/serving").status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        m.set_serving(true);
        assert_eq!(route(&m, "/serving").status(), StatusCode::OK);
        let text = m.render();
        assert!(
            text.contains("serving_picker_conditions_watch_events_total{kind=\"apply\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("serving_picker_conditions_xds_nacks_total 1"),
            "{text}"
        );
        assert!(text.contains("serving_picker_conditions_ready 1"), "{text}");
        assert_eq!(route(&m, "/nope").status(), StatusCode::NOT_FOUND);
    }
}
