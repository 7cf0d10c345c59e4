//! serving-picker-conditions: EndpointSlices -> endpoint conditions for Envoy.
//!
//! `serving-picker-conditions eds --listen ADDR:PORT --cluster NAME=NAMESPACE/SERVICE:PORT_NAME
//! [--cluster ...] [--slices-dir DIR] [--tls-cert FILE --tls-key FILE [--client-ca FILE
//! [--client-san NAME ...]]]`: an xDS (EDS/ADS) server; without
//! `--slices-dir` it watches the Kubernetes API (in-cluster config, or
//! KUBECONFIG / ~/.kube/config).
//!
//! `serving-picker-conditions envoy-gateway --listen ADDR:PORT [--manage SELECTOR]
//! [--slices-dir DIR] [--priorities]`: Envoy Gateway's PostEndpointsModify hook
//! (`envoy_gateway`).
//!
//! `serving-picker-conditions preflight [--mode eds|envoy-gateway] [--kubeconfig FILE]`:
//! checks a cluster before installing (`preflight`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use tokio::sync::{mpsc, watch};

use serving_picker_conditions::assignment::Output;
use serving_picker_conditions::cluster::{check_unique, ClusterSpec};
use serving_picker_conditions::eds::Names;
use serving_picker_conditions::index::IpFamily;
use serving_picker_conditions::limits::{ServeLimits, XdsLimits};
use serving_picker_conditions::listener::Connections;
use serving_picker_conditions::metrics::{self, Metrics};
use serving_picker_conditions::publish::{self, Publisher, Snapshot};
use serving_picker_conditions::serve;
use serving_picker_conditions::source;
use serving_picker_conditions::tls;
use serving_picker_conditions::xds::XdsServer;

#[derive(Parser, Debug)]
#[command(
    name = "serving-picker-conditions",
    version,
    about = "Watches EndpointSlices and gives Envoy each endpoint's exact conditions"
)]
struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Family {
    /// IPv4 when a Service port has IPv4 slices, else IPv6.
    Auto,
    Ipv4,
    Ipv6,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve EDS (gRPC, state of the world, ADS or plain EDS) to Envoy.
    Eds(EdsArgs),
    /// Answer Envoy Gateway's PostEndpointsModify hook (an EG extension server).
    EnvoyGateway(serving_picker_conditions::envoy_gateway::Args),
    /// Check a cluster before installing: API, RBAC, CRDs, Envoy Gateway's
    /// settings, certificates, labelled Services; prints each fix (exit 1 on
    /// a failed check).
    Preflight(serving_picker_conditions::preflight::gather::Args),
}

#[derive(clap::Args, Debug)]
struct EdsArgs {
    /// gRPC listen address for Envoy's xDS streams.
    #[arg(long, value_name = "ADDR:PORT")]
    listen: SocketAddr,
    /// An Envoy cluster (EDS resource name) and the Service port it serves.
    #[arg(
        long = "cluster",
        value_name = "NAME=NAMESPACE/SERVICE:PORT_NAME",
        required = true
    )]
    clusters: Vec<ClusterSpec>,
    /// Read EndpointSlices from this directory of kubectl YAML/JSON files
    /// (watched) instead of the Kubernetes API.
    #[arg(long, value_name = "DIR")]
    slices_dir: Option<PathBuf>,
    /// Priority output for Envoys without serving-picker: ready endpoints at
    /// priority 0, serving+terminating at 1, not serving left out.
    #[arg(long)]
    priorities: bool,
    /// Metrics (/metrics), /healthz and /readyz listen address.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:9102")]
    metrics_listen: SocketAddr,
    /// filter_metadata namespace of the conditions.
    #[arg(long, default_value = serving_picker_core::config::DEFAULT_METADATA_NAMESPACE)]
    metadata_namespace: String,
    /// Address family served per Service port.
    #[arg(long, value_enum, default_value_t = Family::Auto)]
    ip_family: Family,
    #[command(flatten)]
    limits: ServeLimits,
    #[command(flatten)]
    xds: XdsLimits,
    #[command(flatten)]
    tls: tls::TlsArgs,
}

/// What an xDS client may send before the companion reads it, per stream
/// and per connection: requests are read at once, so a small window costs
/// nothing but caps what a connection can park in the companion's memory.
const XDS_RECEIVE_WINDOW: u32 = 64 * 1024;

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

async fn run_eds(args: EdsArgs) -> anyhow::Result<()> {
    check_unique(&args.clusters).map_err(anyhow::Error::msg)?;
    args.xds.check().map_err(anyhow::Error::msg)?;
    let family = match args.ip_family {
        Family::Auto => IpFamily::Auto,
        Family::Ipv4 => IpFamily::Ipv4,
        Family::Ipv6 => IpFamily::Ipv6,
    };
    let output = Output {
        metadata_namespace: args.metadata_namespace.clone(),
        priorities: args.priorities,
    };
    let mut metrics = Metrics::new();
    let tls = tls::start(&args.tls, args.listen, metrics.registry_mut())?;
    let metrics = Arc::new(metrics);
    let (grpc, http) = serve::bind_listeners(args.listen, args.metrics_listen).await?;
    tracing::info!(
        listen = %args.listen,
        metrics = %args.metrics_listen,
        clusters = ?args.clusters.iter().map(ToString::to_string).collect::<Vec<_>>(),
        priorities = args.priorities,
        source = %args.slices_dir.as_ref().map(|d| d.display().to_string()).unwrap_or_else(|| "kubernetes".into()),
        "serving-picker-conditions eds starting"
    );

    let (updates_tx, updates_rx) = mpsc::channel(1024);
    let (snap_tx, snap_rx) = watch::channel(Arc::new(Snapshot::empty()));
    let publisher = Publisher::new(args.clusters.clone(), family, output);
    tokio::spawn(publish::run(
        publisher,
        updates_rx,
        snap_tx,
        metrics.clone(),
    ));
    tokio::spawn(metrics::serve(
        http,
        metrics.clone(),
        args.limits.http.clone(),
    ));

    let source_metrics = metrics.clone();
    let clusters = args.clusters.clone();
    let source_task = match args.slices_dir.clone() {
        Some(dir) => {
            tokio::spawn(async move { source::files::run(dir, updates_tx, source_metrics).await })
        }
        None => {
            let client = serve::kube_client().await?;
            tokio::spawn(async move {
                source::kube::run(
                    client,
                    &clusters,
                    updates_tx,
                    source_metrics,
                    source::kube::ExpBackoff::default(),
                )
                .await;
                Ok(())
            })
        }
    };

    let connections = Connections::new(&args.limits.grpc, metrics.clone());
    let xds = XdsServer::new(
        snap_rx,
        Names::new(args.clusters.iter().map(|c| c.name.clone())),
        args.xds.clone(),
        metrics.clone(),
        Some(connections.clone()),
    );
    tokio::spawn(xds.clone().run_fanout());
    let (ads, eds) = xds.services();
    let server = serve::grpc_server(&args.limits.grpc, &connections)
        .initial_stream_window_size(XDS_RECEIVE_WINDOW)
        .initial_connection_window_size(XDS_RECEIVE_WINDOW)
        .add_service(ads)
        .add_service(eds)
        .serve_with_incoming_shutdown(
            tls::incoming(
                tls,
                serve::incoming(grpc, connections),
                args.limits.grpc.handshake_timeout,
            ),
            serve::serving_until(metrics.clone(), shutdown_signal()),
        );
    serve::until_source_ends(server, "xDS server", source_task).await
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logs(cli.log_format);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("serving-picker-conditions: tokio runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let limits = match &cli.command {
        Command::Eds(args) => Some(&args.limits),
        Command::EnvoyGateway(args) => Some(&args.limits),
        Command::Preflight(_) => None,
    };
    if let Some(limits) = limits {
        serve::raise_fd_limit(limits);
    }
    // Ok(false): ran, and found the cluster not ready (preflight).
    let result = rt.block_on(async {
        match cli.command {
            Command::Eds(args) => run_eds(args).await.map(|()| true),
            Command::EnvoyGateway(args) => {
                serving_picker_conditions::envoy_gateway::run(args, shutdown_signal())
                    .await
                    .map(|()| true)
            }
            Command::Preflight(args) => serving_picker_conditions::preflight::run(args).await,
        }
    });
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "serving-picker-conditions failed");
            eprintln!("serving-picker-conditions: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
