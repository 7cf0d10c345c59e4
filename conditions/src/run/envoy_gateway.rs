//! Mode `envoy-gateway`: the hook's index and its gRPC service over the
//! shared plumbing (`run`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::envoy_gateway::native_lb::NativeLbMetrics;
use crate::envoy_gateway::service::{
    FilesReread, HookConfig, HookMetrics, HookService, KubeReread, Reread, Shared,
};
use crate::envoy_gateway::{consume, Args, DEFAULT_MANAGE_SELECTOR};
use crate::model::selector::LabelSelector;
use crate::run::{self, Plumbing, Slices, Telemetry};
use crate::source::kube::Selection;

/// Runs the mode until `shutdown`.
pub async fn run(
    args: Args,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    check(&args)?;
    let selector = args
        .manage
        .as_ref()
        .map_or(DEFAULT_MANAGE_SELECTOR, LabelSelector::as_str)
        .to_string();
    // The xDS group is registered (at zero) so that both modes export the
    // same names; this mode has no xDS server.
    let Telemetry {
        mut metrics,
        source: source_metrics,
        publish: publish_metrics,
        xds: _,
    } = Telemetry::new();
    let hook_metrics = HookMetrics::register(metrics.registry_mut());
    let native_lb_metrics = NativeLbMetrics::register(metrics.registry_mut());
    // Every label value at zero before the metrics port answers its first
    // scrape (an alert on increase() sees the first event).
    hook_metrics.zero_results();
    native_lb_metrics.zero();
    let plumbing = Plumbing::start(
        args.listen,
        args.metrics_listen,
        &args.tls,
        &args.limits,
        metrics,
    )
    .await?;
    let metrics = plumbing.metrics.clone();
    tracing::info!(
        listen = %args.listen,
        metrics = %args.metrics_listen,
        manage = %args.slices_dir.as_ref().map(|_| "every Service in the directory".to_string()).unwrap_or_else(|| selector.clone()),
        tiered_output = args.output.tiered(),
        native_lb_policy = args.native_lb_policy,
        source = %run::source_name(args.slices_dir.as_ref()),
        "serving-picker-conditions envoy-gateway starting"
    );

    let shared = Arc::new(Shared::default());
    let (updates_tx, updates_rx) = mpsc::channel(1024);
    tokio::spawn(consume(
        shared.clone(),
        updates_rx,
        metrics.clone(),
        publish_metrics,
        args.output.tiered(),
    ));
    let (slices, reread): (Slices, Arc<dyn Reread>) = match args.slices_dir.clone() {
        Some(dir) => (
            Slices::Files(dir.clone(), None),
            Arc::new(FilesReread::new(dir, source_metrics.clone())),
        ),
        None => {
            let client = run::kube_client().await?;
            let selection = Selection {
                namespace: None,
                label_selector: selector.clone(),
                keep: None,
            };
            (
                Slices::Kube {
                    client: client.clone(),
                    selection,
                },
                Arc::new(KubeReread { client, selector }),
            )
        }
    };
    let source_task = run::spawn_source(slices, updates_tx, source_metrics);

    let hook = HookService::new(shared, hook_config(&args), Some(reread), hook_metrics)
        .with_native_lb_metrics(native_lb_metrics)
        .with_connections(plumbing.connections.clone(), metrics.clone());
    // Requests counted in --max-bytes-held as they arrive, refused over
    // --max-message-size or --receive-timeout-ms (`intake`).
    let svc = hook.into_server();
    // Streams per connection bounded: requests being received hold at
    // most this many times --max-message-size; calls beyond
    // --max-concurrent-calls among them are answered unchanged at once.
    let streams = u32::try_from(args.max_concurrent_calls.saturating_mul(2))
        .unwrap_or(u32::MAX)
        .min(
            args.limits
                .grpc
                .max_streams_per_connection
                .saturating_add(1),
        );
    let router = plumbing
        .grpc_server()
        .max_concurrent_streams(streams)
        .add_service(svc);
    plumbing
        .serve(router, "extension server", shutdown, source_task)
        .await
}

/// The flags that must agree, checked before anything starts.
fn check(args: &Args) -> anyhow::Result<()> {
    if args.slices_dir.is_some() && args.manage.is_some() {
        anyhow::bail!("--manage selects Services in the Kubernetes API; with --slices-dir every Service in the directory is managed");
    }
    if args.native_lb_policy && args.native_lb_max_clusters == 0 {
        anyhow::bail!("--native-lb-max-clusters must be at least 1 with --native-lb-policy");
    }
    if args.receive_timeout_ms == 0 {
        anyhow::bail!("--receive-timeout-ms must be at least 1");
    }
    let one_verdict = crate::envoy_gateway::verdicts::MAX_KEY_BYTES
        + crate::envoy_gateway::verdicts::ENTRY_OVERHEAD_BYTES;
    if args.native_lb_policy && args.native_lb_max_verdict_bytes < one_verdict {
        anyhow::bail!(
            "--native-lb-max-verdict-bytes {} is less than one verdict of the longest name ({one_verdict})",
            args.native_lb_max_verdict_bytes
        );
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
    Ok(())
}

/// The hook's settings from the flags.
fn hook_config(args: &Args) -> HookConfig {
    HookConfig {
        output: args.output.clone(),
        reread_timeout: Duration::from_millis(args.reread_timeout_ms),
        reread_budget: Duration::from_millis(args.reread_budget_ms),
        max_calls: args.max_concurrent_calls,
        max_bytes_held: args.max_bytes_held,
        max_message_size: args.max_message_size,
        receive_timeout: Duration::from_millis(args.receive_timeout_ms),
        native_lb: args.native_lb_policy,
        native_lb_max_clusters: args.native_lb_max_clusters,
        native_lb_max_verdict_bytes: args.native_lb_max_verdict_bytes,
        ..HookConfig::default()
    }
}
