//! Mode `envoy-gateway`: an Envoy Gateway extension server implementing
//! the PostEndpointsModify hook (EG >= 1.8) from the companion's index.
//!
//! ```text
//! source (kube API | files) --Update--> Shared index <--read-- PostEndpointsModify (tonic) <-- Envoy Gateway
//!                                            ^------ bounded re-read of one Service on a doubt
//! ```
//!
//! - `proto`: EG's extension service (hand-written against
//!   `conditions/proto/extension/service.proto`), server and client.
//! - `naming`: EG's locality metadata -> the Service.
//! - `hook`: the pure function, assignment in -> assignment out, edited
//!   on the wire (`wire`).
//! - `prepared`: the index plus each managed Service's endpoints with their
//!   conditions metadata encoded, made when its slices change.
//! - `service`: the gRPC service over it (re-reads, metrics).
//! - `testing` (tests and the `testing` feature only): what EG >= 1.6
//!   sends, for tests and benchmarks that play EG.
//!
//! **Which clusters are managed.** Those whose localities name a Service
//! selected by `--manage`, a label selector on EndpointSlices; default
//! `serving-picker.io/conditions=true`. The EndpointSlice controller copies
//! a Service's labels onto its slices (`setEndpointSliceLabels`, all but its
//! reserved keys; annotations are not copied), so labelling the Service is
//! enough, and the API server does the selecting: the companion lists and
//! watches only managed slices, needs no Service or route access (RBAC:
//! list/watch endpointslices), and "managed" is "has slices in the index".
//! Opt-in on purpose: a managed cluster's terminating pods become HEALTHY
//! with their conditions in metadata, which only serving-picker (either
//! form) or the priority output turns into the right choice; Envoy's own
//! balancer would spread load over them. `--manage ''` selects every
//! Service. With `--slices-dir`, every Service in the directory is managed
//! (the files carry the selection; `--manage` is refused there).

pub mod hook;
pub mod naming;
pub mod prepared;
pub mod proto;
pub mod service;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod wire;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::assignment::Output;
use crate::listener::Connections;
use crate::metrics::{self, Metrics};
use crate::publish::{next_batch, Change, Update};
use crate::serve;
use crate::source;
use service::{FilesReread, HookConfig, HookMetrics, HookService, KubeReread, Reread, Shared};

/// The default `--manage` selector.
pub const DEFAULT_MANAGE_SELECTOR: &str = "serving-picker.io/conditions=true";

/// `serving-picker-conditions envoy-gateway` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// gRPC listen address for Envoy Gateway's extension manager.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// Label selector of managed Services' EndpointSlices (slices carry
    /// their Service's labels). Default: serving-picker.io/conditions=true;
    /// '' for every Service. Not with --slices-dir.
    #[arg(long, value_name = "SELECTOR")]
    pub manage: Option<String>,
    /// Read EndpointSlices from this directory of kubectl YAML/JSON files
    /// (watched) instead of the Kubernetes API; every Service in it is managed.
    #[arg(long, value_name = "DIR")]
    pub slices_dir: Option<PathBuf>,
    /// Priority output for Envoys without serving-picker: ready endpoints at
    /// priority 0, serving+terminating at 1, not serving left out.
    #[arg(long)]
    pub priorities: bool,
    /// Metrics (/metrics), /healthz and /readyz listen address.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:9102")]
    pub metrics_listen: SocketAddr,
    /// filter_metadata namespace of the conditions.
    #[arg(long, default_value = serving_picker_core::config::DEFAULT_METADATA_NAMESPACE)]
    pub metadata_namespace: String,
    /// Bound on re-reading a Service's slices when the index and Envoy
    /// Gateway disagree (EG waits for the answer without a deadline).
    #[arg(long, value_name = "MS", default_value_t = 500)]
    pub reread_timeout_ms: u64,
    /// Largest request accepted and largest answer sent: set it to EG's
    /// extensionManager.maxMessageSize. The default is what EG accepts when
    /// that is unset (4 MiB, grpc-go's client default). A larger request is
    /// refused (RESOURCE_EXHAUSTED; with failOpen EG keeps its own); an
    /// edited answer that would be larger is replaced by EG's own.
    #[arg(long, value_name = "BYTES", default_value_t = service::EG_DEFAULT_MAX_MESSAGE_SIZE)]
    pub max_message_size: usize,
    /// Calls answered at once; a call over the limit gets EG's assignment
    /// back at once, unchanged (counted). Also bounds the HTTP/2 streams per
    /// connection (twice this).
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub max_concurrent_calls: usize,
    /// Bytes the calls being answered may hold (twice each request); a call
    /// over the limit gets EG's assignment back at once, unchanged (counted).
    /// At least twice --max-message-size.
    #[arg(long, value_name = "BYTES", default_value_t = 32 << 20)]
    pub max_bytes_held: usize,
    /// Connection and metrics-port limits (`limits`).
    #[command(flatten)]
    pub limits: crate::limits::ServeLimits,
    #[command(flatten)]
    pub tls: crate::tls::TlsArgs,
}

/// Applies a batch of source updates to the shared index; true once ready.
pub fn apply_updates(shared: &Shared, updates: Vec<Update>) -> bool {
    let full_list = updates
        .iter()
        .any(|u| matches!(u.change, Change::Replace(_)));
    let mut index = shared.write();
    index.edit(updates.into_iter().map(|u| u.change));
    if full_list {
        shared.ready.store(true, Ordering::SeqCst);
    }
    drop(index);
    shared.ready.load(Ordering::SeqCst)
}

async fn consume(shared: Arc<Shared>, mut updates: mpsc::Receiver<Update>, metrics: Arc<Metrics>) {
    while let Some(batch) = next_batch(&mut updates).await {
        let n = batch.len();
        let started = Instant::now();
        let was_ready = shared.ready.load(Ordering::SeqCst);
        let ready = apply_updates(&shared, batch);
        let index = shared.index.read().unwrap_or_else(|p| p.into_inner());
        metrics.applied(n, &index, ready, started.elapsed());
        if ready && !was_ready {
            tracing::info!(
                slices = index.slice_count(),
                endpoints = index.endpoint_count(),
                "first full list of EndpointSlices in: answering hook calls from the index"
            );
        }
    }
}

/// Runs the mode until `shutdown`.
pub async fn run(
    args: Args,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    if args.slices_dir.is_some() && args.manage.is_some() {
        anyhow::bail!("--manage selects Services in the Kubernetes API; with --slices-dir every Service in the directory is managed");
    }
    if args.max_concurrent_calls == 0 {
        anyhow::bail!("--max-concurrent-calls must be at least 1");
    }
    if args.max_bytes_held < args.max_message_size.saturating_mul(2) {
        anyhow::bail!(
            "--max-bytes-held {} is less than twice --max-message-size {}: a request of the largest size could never be answered",
            args.max_bytes_held,
            args.max_message_size
        );
    }
    let selector = args
        .manage
        .clone()
        .unwrap_or_else(|| DEFAULT_MANAGE_SELECTOR.to_string());
    let mut metrics = Metrics::new();
    let hook_metrics = HookMetrics::register(metrics.registry_mut());
    let tls = crate::tls::start(&args.tls, args.listen, metrics.registry_mut())?;
    let metrics = Arc::new(metrics);
    let (grpc, http) = serve::bind_listeners(args.listen, args.metrics_listen).await?;
    tracing::info!(
        listen = %args.listen,
        metrics = %args.metrics_listen,
        manage = %args.slices_dir.as_ref().map(|_| "every Service in the directory".to_string()).unwrap_or_else(|| selector.clone()),
        priorities = args.priorities,
        source = %args.slices_dir.as_ref().map(|d| d.display().to_string()).unwrap_or_else(|| "kubernetes".into()),
        "serving-picker-conditions envoy-gateway starting"
    );

    let shared = Arc::new(Shared::default());
    let (updates_tx, updates_rx) = mpsc::channel(1024);
    tokio::spawn(consume(shared.clone(), updates_rx, metrics.clone()));
    tokio::spawn(metrics::serve(
        http,
        metrics.clone(),
        args.limits.http.clone(),
    ));
    let connections = Connections::new(&args.limits.grpc, metrics.clone());

    let source_metrics = metrics.clone();
    let (source_task, reread): (tokio::task::JoinHandle<anyhow::Result<()>>, Arc<dyn Reread>) =
        match args.slices_dir.clone() {
            Some(dir) => {
                let reread = Arc::new(FilesReread::new(dir.clone(), metrics.clone()));
                (
                    tokio::spawn(async move {
                        source::files::run(dir, updates_tx, source_metrics).await
                    }),
                    reread,
                )
            }
            None => {
                let client = serve::kube_client().await?;
                let sel = source::kube::Selection {
                    namespace: None,
                    label_selector: selector.clone(),
                };
                let watch_client = client.clone();
                (
                    tokio::spawn(async move {
                        source::kube::run_selection(
                            watch_client,
                            sel,
                            updates_tx,
                            source_metrics,
                            source::kube::ExpBackoff::default(),
                        )
                        .await;
                        Ok(())
                    }),
                    Arc::new(KubeReread { client, selector }),
                )
            }
        };

    let config = HookConfig {
        output: Output {
            metadata_namespace: args.metadata_namespace.clone(),
            priorities: args.priorities,
        },
        reread_timeout: Duration::from_millis(args.reread_timeout_ms),
        max_calls: args.max_concurrent_calls,
        max_bytes_held: args.max_bytes_held,
        max_message_size: args.max_message_size,
        ..HookConfig::default()
    };
    let hook = HookService::new(shared, config, Some(reread), hook_metrics);
    let svc = proto::EnvoyGatewayExtensionServer::new(hook)
        .max_decoding_message_size(args.max_message_size)
        .max_encoding_message_size(args.max_message_size);
    // TCP_NODELAY (`serve::incoming`): without it, the answer's last segment
    // waits for EG's delayed ACK, twenty times the call itself. Streams per
    // connection bounded: requests being received hold at most this many
    // times --max-message-size; calls beyond --max-concurrent-calls among
    // them are answered unchanged at once.
    let streams = u32::try_from(args.max_concurrent_calls.saturating_mul(2))
        .unwrap_or(u32::MAX)
        .min(
            args.limits
                .grpc
                .max_streams_per_connection
                .saturating_add(1),
        );
    let server = serve::grpc_server(&args.limits.grpc, &connections)
        .max_concurrent_streams(streams)
        .add_service(svc)
        .serve_with_incoming_shutdown(
            crate::tls::incoming(
                tls,
                serve::incoming(grpc, connections),
                args.limits.grpc.handshake_timeout,
            ),
            serve::serving_until(metrics.clone(), shutdown),
        );
    serve::until_source_ends(server, "extension server", source_task).await
}
