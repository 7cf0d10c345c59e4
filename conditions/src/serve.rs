//! Server plumbing shared by the modes (`eds`, `envoy-gateway`): the
//! listeners, the gRPC server's settings, the Kubernetes client, and
//! running until shutdown or the end of the EndpointSlice source.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

use crate::metrics::{self, Metrics};

/// Binds the gRPC listener (`--listen`) and the metrics, `/healthz` and
/// `/readyz` one (`--metrics-listen`), in that order.
pub async fn bind_listeners(
    listen: SocketAddr,
    metrics_listen: SocketAddr,
) -> anyhow::Result<(TcpListener, TcpListener)> {
    let grpc = TcpListener::bind(listen)
        .await
        .with_context(|| format!("--listen {listen}"))?;
    let http = metrics::bind(metrics_listen)
        .await
        .with_context(|| format!("--metrics-listen {metrics_listen}"))?;
    Ok((grpc, http))
}

/// The Kubernetes client of the API source.
pub async fn kube_client() -> anyhow::Result<kube::Client> {
    kube::Client::try_default()
        .await
        .context("Kubernetes client (in-cluster config, KUBECONFIG or ~/.kube/config); use --slices-dir for files")
}

/// A gRPC server with the companion's HTTP/2 keepalives.
pub fn grpc_server() -> Server {
    Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
}

/// The gRPC listener's connections, with TCP_NODELAY: without it, a
/// response's last segment waits for the peer's delayed ACK (Nagle), 40 ms
/// on some calls.
pub fn incoming(grpc: TcpListener) -> TcpIncoming {
    TcpIncoming::from(grpc).with_nodelay(Some(true))
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
