//! Each mode's tasks wired together, one way for both (`eds`,
//! `envoy_gateway`): [`Plumbing`] starts the metrics, TLS, the listeners
//! and the admin server; [`spawn_source`] starts the EndpointSlice source;
//! the mode adds its consumer of updates and its gRPC service; then
//! [`Plumbing::serve`] runs until shutdown or the end of the source.
//!
//! ```text
//! Plumbing::start -> spawn_source -> (publisher | hook index) -> Plumbing::serve(router)
//! ```

pub mod eds;
pub mod envoy_gateway;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tonic::service::{Interceptor, InterceptorLayer};
use tonic::transport::server::Router;
use tonic::transport::Server;
use tower_layer::{Identity, Stack};

use crate::eds::metrics::PublishMetrics;
use crate::limits::{GrpcLimits, ServeLimits};
use crate::net::admin;
use crate::net::listener::{self, Connections};
use crate::net::tls::{self, TlsArgs, TlsServer};
use crate::source::metrics::SourceMetrics;
use crate::source::{self, Update};
use crate::telemetry::metrics::Metrics;
use crate::xds::metrics::XdsMetrics;

/// Every metric of the companion, registered in the order `/metrics` lists
/// them: the source's, the publisher's and the xDS server's groups, then
/// the plumbing's ([`Metrics`]: connections, limits, the admin port, the
/// status page); a mode adds its own after these. Both modes register all
/// of them, so both export the same names (mode `envoy-gateway`'s xDS
/// group stays at zero).
pub struct Telemetry {
    /// The registry, readiness and the plumbing's metrics.
    pub metrics: Metrics,
    /// The EndpointSlice source's (`source::metrics`).
    pub source: SourceMetrics,
    /// The index's and the publisher's (`eds::metrics`).
    pub publish: PublishMetrics,
    /// The xDS server's (`xds::metrics`).
    pub xds: XdsMetrics,
}

impl Telemetry {
    /// Registers every group, in order.
    pub fn new() -> Telemetry {
        let mut registry = Metrics::new_registry();
        let source = SourceMetrics::register(&mut registry);
        let publish = PublishMetrics::register(&mut registry);
        let xds = XdsMetrics::register(&mut registry);
        let metrics = Metrics::with_registry(registry, xds.refused.clone());
        Telemetry {
            metrics,
            source,
            publish,
            xds,
        }
    }
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry::new()
    }
}

/// Raises the open-file limit to its hard limit (a soft limit of 1024 is
/// common and below what `--max-connections` allows); warns when it stays
/// under what the limits need.
pub fn raise_fd_limit(limits: &ServeLimits) {
    let need = (limits.grpc.max_connections
        + limits.grpc.max_pending_handshakes
        + limits.http.metrics_max_connections
        + 64) as u64;
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) if n < need => tracing::warn!(
            open_files = n,
            need,
            "the open-file limit (ulimit -n) is below --max-connections plus --metrics-max-connections: accepts will fail before the limits bite"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "the open-file limit could not be read"),
    }
}

/// The Kubernetes client of the API source.
pub async fn kube_client() -> anyhow::Result<kube::Client> {
    kube::Client::try_default()
        .await
        .context("Kubernetes client (in-cluster config, KUBECONFIG or ~/.kube/config); use --slices-dir for files")
}

/// Every call on a connection over `--max-connections` is answered
/// RESOURCE_EXHAUSTED (`listener`).
#[derive(Clone)]
pub struct RefuseOverCap(Arc<Connections>);

impl Interceptor for RefuseOverCap {
    fn call(&mut self, req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        match self.0.of(&req) {
            Some(c) if c.over_cap() => Err(self.0.over_cap_status(&c)),
            Some(c) => {
                // A call: the connection met --preface-timeout.
                c.called();
                Ok(req)
            }
            None => Ok(req),
        }
    }
}

/// The gRPC server as both modes run it.
pub type GrpcServer = Server<Stack<InterceptorLayer<RefuseOverCap>, Identity>>;

/// A gRPC server with the companion's HTTP/2 settings: keepalive PINGs,
/// one stream over `--max-streams-per-connection` let through so that
/// a service can refuse it with a clear status (more are REFUSED_STREAM),
/// and a GOAWAY at `--max-connection-age` (the listener closes what is
/// still open `--max-connection-age-grace` later).
fn grpc_server(limits: &GrpcLimits, connections: &Arc<Connections>) -> GrpcServer {
    Server::builder()
        .max_connection_age(limits.max_connection_age)
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        .max_concurrent_streams(limits.max_streams_per_connection.saturating_add(1))
        .layer(InterceptorLayer::new(RefuseOverCap(connections.clone())))
}

/// Marks the gRPC server as taking calls (`/serving`) now, and as not
/// taking them once `shutdown` completes (so that the Service stops
/// sending new connections while open ones drain); resolves then.
fn serving_until(
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    metrics.set_serving(true);
    async move {
        shutdown.await;
        metrics.set_serving(false);
    }
}

/// Runs `server` (named `what` in its error) until it ends on shutdown, or
/// until the EndpointSlice source ends first, which is an error.
async fn until_source_ends(
    server: impl Future<Output = Result<(), tonic::transport::Error>>,
    what: &'static str,
    source_task: JoinHandle<anyhow::Result<()>>,
) -> anyhow::Result<()> {
    tokio::select! {
        r = server => {
            r.context(what)?;
            tracing::info!("shutting down");
        }
        r = source_task => {
            match r {
                Ok(Ok(())) => anyhow::bail!("the EndpointSlice source ended"),
                Ok(Err(e)) => return Err(e),
                Err(e) => anyhow::bail!("the EndpointSlice source failed: {e}"),
            }
        }
    }
    Ok(())
}

/// What both modes start first, in this order: TLS (its metrics), the gRPC
/// listener (`--listen`), the admin listener (`--metrics-listen`) and its
/// server, the gRPC connections' bookkeeping.
pub struct Plumbing {
    /// The companion's metrics, shared (the mode's own registered before).
    pub metrics: Arc<Metrics>,
    /// The gRPC listener's connections (for the per-connection stream limit).
    pub connections: Arc<Connections>,
    tls: Option<Arc<TlsServer>>,
    grpc: TcpListener,
    limits: GrpcLimits,
}

/// The gRPC server of a mode, its services added.
pub type GrpcRouter = Router<Stack<InterceptorLayer<RefuseOverCap>, Identity>>;

impl Plumbing {
    /// Starts them; `metrics` may hold a mode's own registrations.
    pub async fn start(
        listen: SocketAddr,
        metrics_listen: SocketAddr,
        tls_args: &TlsArgs,
        limits: &ServeLimits,
        mut metrics: Metrics,
    ) -> anyhow::Result<Plumbing> {
        let tls = tls::start(tls_args, listen, metrics.registry_mut())?;
        let metrics = Arc::new(metrics);
        let grpc = listener::bind(listen).with_context(|| format!("--listen {listen}"))?;
        let http = admin::bind(metrics_listen)
            .with_context(|| format!("--metrics-listen {metrics_listen}"))?;
        tokio::spawn(admin::serve(http, metrics.clone(), limits.http.clone()));
        let connections = Connections::new(&limits.grpc, metrics.clone());
        Ok(Plumbing {
            metrics,
            connections,
            tls,
            grpc,
            limits: limits.grpc.clone(),
        })
    }

    /// A gRPC server with the companion's settings (`grpc_server`).
    pub fn grpc_server(&self) -> GrpcServer {
        grpc_server(&self.limits, &self.connections)
    }

    /// Serves `router` on the gRPC listener (capped connections, TCP_NODELAY,
    /// TLS when configured) until `shutdown`, or until the EndpointSlice
    /// source ends first, which is an error (`what` names the server).
    pub async fn serve(
        self,
        router: GrpcRouter,
        what: &'static str,
        shutdown: impl Future<Output = ()> + Send + 'static,
        source_task: JoinHandle<anyhow::Result<()>>,
    ) -> anyhow::Result<()> {
        // TCP_NODELAY (`listener::incoming`): without it, a response's last
        // segment waits for the peer's delayed ACK (Nagle), 40 ms on some
        // calls, twenty times an EG hook call.
        let sockets = listener::incoming(self.grpc, self.connections);
        let server = router.serve_with_incoming_shutdown(
            tls::incoming(self.tls, sockets, self.limits.handshake_timeout),
            serving_until(self.metrics, shutdown),
        );
        until_source_ends(server, what, source_task).await
    }
}

/// Where EndpointSlices come from.
pub enum Slices {
    /// `--slices-dir`, and the slices kept from it (mode `eds`'s `--manage`).
    Files(PathBuf, Option<source::kube::Keep>),
    /// The Kubernetes API, the slices this selects.
    Kube {
        /// The API client.
        client: kube::Client,
        /// Which slices to watch.
        selection: source::kube::Selection,
    },
}

/// Starts the source: its updates go to `updates`.
pub fn spawn_source(
    slices: Slices,
    updates: mpsc::Sender<Update>,
    metrics: SourceMetrics,
) -> JoinHandle<anyhow::Result<()>> {
    match slices {
        Slices::Files(dir, select) => {
            tokio::spawn(async move { source::files::run(dir, updates, metrics, select).await })
        }
        Slices::Kube { client, selection } => tokio::spawn(async move {
            source::kube::run_selection(
                client,
                selection,
                updates,
                metrics,
                source::kube::ExpBackoff::default(),
            )
            .await;
            Ok(())
        }),
    }
}

/// Where a mode's slices come from (`--slices-dir`, else the API), as text
/// for its start-up line.
pub fn source_name(slices_dir: Option<&PathBuf>) -> String {
    slices_dir
        .map(|d| d.display().to_string())
        .unwrap_or_else(|| "kubernetes".into())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use std::time::Duration;

    use super::*;
    use crate::model::index::Index;
    use crate::xds::metrics::MetricsCallbacks;
    use crate::xds::Callbacks;

    #[test]
    fn renders_the_counters() {
        let Telemetry {
            metrics,
            source,
            publish,
            xds,
        } = Telemetry::new();
        let metrics = Arc::new(metrics);
        source.watch_event("apply");
        MetricsCallbacks::new(xds, metrics.clone()).nacked("node", "127.0.0.1:1", "1", "bad");
        publish.applied(1, &Index::new(), true, Duration::from_micros(10));
        metrics.set_ready(true);
        assert!(metrics.is_ready());
        let text = metrics.render();
        assert!(
            text.contains("serving_picker_conditions_watch_events_total{kind=\"apply\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("serving_picker_conditions_xds_nacks_total 1"),
            "{text}"
        );
        assert!(text.contains("serving_picker_conditions_ready 1"), "{text}");
    }

    /// The groups in the order `/metrics` has always listed them: the
    /// source's, the publisher's, the xDS server's, then the plumbing's.
    #[test]
    fn registers_every_group_in_order() {
        let text = Telemetry::new().metrics.render();
        let at = |name: &str| {
            text.find(&format!("# HELP serving_picker_conditions_{name} "))
                .unwrap_or_else(|| panic!("{name} missing: {text}"))
        };
        // Families with no series yet are not rendered: the plain metrics.
        let order = [
            "source_last_success_timestamp_seconds",
            "source_last_change_timestamp_seconds",
            "index_slices",
            "snapshot_build_seconds",
            "xds_streams",
            "xds_oldest_unsent_response_seconds",
            "programming_duration_seconds",
            "grpc_connections",
            "grpc_pending_handshakes",
            "metrics_connections",
        ];
        for pair in order.windows(2) {
            assert!(at(pair[0]) < at(pair[1]), "{} after {}", pair[0], pair[1]);
        }
    }
}
