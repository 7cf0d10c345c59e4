//! Server plumbing shared by the modes (`eds`, `envoy-gateway`): the
//! listeners, the gRPC server's settings and connection limits, the
//! Kubernetes client, and running until shutdown or the end of the
//! EndpointSlice source.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use futures::Stream;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::service::{Interceptor, InterceptorLayer};
use tonic::transport::Server;
use tower_layer::{Identity, Stack};

use crate::limits::{GrpcLimits, ServeLimits};
use crate::listener::{self, Connections, LimitedIo};
use crate::metrics::{self, Metrics};

/// Binds the gRPC listener (`--listen`) and the metrics, `/healthz` and
/// `/readyz` one (`--metrics-listen`), in that order.
pub async fn bind_listeners(
    listen: SocketAddr,
    metrics_listen: SocketAddr,
) -> anyhow::Result<(TcpListener, TcpListener)> {
    let grpc = listener::bind(listen).with_context(|| format!("--listen {listen}"))?;
    let http = metrics::bind(metrics_listen)
        .await
        .with_context(|| format!("--metrics-listen {metrics_listen}"))?;
    Ok((grpc, http))
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
pub fn grpc_server(limits: &GrpcLimits, connections: &Arc<Connections>) -> GrpcServer {
    Server::builder()
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        .max_concurrent_streams(limits.max_streams_per_connection.saturating_add(1))
        .layer(InterceptorLayer::new(RefuseOverCap(connections.clone())))
}

/// The gRPC listener's connections, counted and capped (`listener`), with
/// TCP_NODELAY: without it, a response's last segment waits for the peer's
/// delayed ACK (Nagle), 40 ms on some calls.
pub fn incoming(
    grpc: TcpListener,
    connections: Arc<Connections>,
) -> impl Stream<Item = std::io::Result<LimitedIo>> + Send + 'static {
    listener::incoming(grpc, connections)
}

/// Marks the gRPC server as taking calls (`/serving`) now, and as not
/// taking them once `shutdown` completes (so that the Service stops
/// sending new connections while open ones drain); resolves then.
pub fn serving_until(
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
pub async fn until_source_ends(
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
