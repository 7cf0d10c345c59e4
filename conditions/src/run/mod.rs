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

use crate::limits::{GrpcLimits, ServeLimits};
use crate::net::admin;
use crate::net::listener::{self, Connections};
use crate::net::tls::{self, TlsArgs, TlsServer};
use crate::source::{self, Update};
use crate::telemetry::metrics::Metrics;

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
            Some(c) if c.over_cap() => Err(self.0.over_cap_status()),
            _ => Ok(req),
        }
    }
}

/// The gRPC server as both modes run it.
pub type GrpcServer = Server<Stack<InterceptorLayer<RefuseOverCap>, Identity>>;

/// A gRPC server with the companion's HTTP/2 settings: keepalive PINGs,
/// and one stream over `--max-streams-per-connection` let through so that
/// a service can refuse it with a clear status (more are REFUSED_STREAM).
fn grpc_server(limits: &GrpcLimits, connections: &Arc<Connections>) -> GrpcServer {
    Server::builder()
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
    pub metrics: Arc<Metrics>,
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
        client: kube::Client,
        selection: source::kube::Selection,
    },
}

/// Starts the source: its updates go to `updates`.
pub fn spawn_source(
    slices: Slices,
    updates: mpsc::Sender<Update>,
    metrics: Arc<Metrics>,
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
