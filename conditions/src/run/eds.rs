//! Mode `eds`: the publisher and the xDS server over the shared
//! plumbing (`run`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::ValueEnum;
use tokio::sync::{mpsc, watch};

use crate::eds::assignment::Output;
use crate::eds::publish::{self, Publisher, Snapshot};
use crate::limits::{ServeLimits, XdsLimits};
use crate::model::cluster::{check_unique, ClusterSpec};
use crate::model::index::IpFamily;
use crate::model::selector::LabelSelector;
use crate::run::{self, Plumbing, Slices, Telemetry};
use crate::xds::metrics::MetricsCallbacks;
use crate::xds::Names;
use crate::xds::XdsServer;

/// `--ip-family`: the address family served per Service port.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Family {
    /// IPv4 when a Service port has IPv4 slices, else IPv6.
    Auto,
    /// IPv4 endpoints only.
    Ipv4,
    /// IPv6 endpoints only.
    Ipv6,
}

/// Mode `eds`'s flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// gRPC listen address for Envoy's xDS streams.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// An Envoy cluster (EDS resource name) and the Service port it serves.
    /// At least one --cluster, or --manage.
    #[arg(long = "cluster", value_name = "NAME=NAMESPACE/SERVICE:PORT_NAME")]
    pub clusters: Vec<ClusterSpec>,
    /// Also serve every port of every Service this label selector selects
    /// (on its EndpointSlices, which carry their Service's labels), as the
    /// EDS resource NAMESPACE/SERVICE:PORT (the port's name, or its number
    /// when it has none). '' selects every Service. With --slices-dir, the
    /// files' labels are matched.
    #[arg(long, value_name = "SELECTOR")]
    pub manage: Option<LabelSelector>,
    /// Read EndpointSlices from this directory of kubectl YAML/JSON files
    /// (watched) instead of the Kubernetes API.
    #[arg(long, value_name = "DIR")]
    pub slices_dir: Option<PathBuf>,
    /// Metrics (/metrics), /healthz and /readyz listen address.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:9102")]
    pub metrics_listen: SocketAddr,
    /// How endpoints are written (`--metadata-namespace`, `--flat-output`).
    #[command(flatten)]
    pub output: Output,
    /// Address family served per Service port.
    #[arg(long, value_enum, default_value_t = Family::Auto)]
    pub ip_family: Family,
    /// The limits of both listeners.
    #[command(flatten)]
    pub limits: ServeLimits,
    /// The xDS streams' limits.
    #[command(flatten)]
    pub xds: XdsLimits,
    /// TLS on the gRPC listener.
    #[command(flatten)]
    pub tls: crate::net::tls::TlsArgs,
}

/// What an xDS client may send before the companion reads it, per stream
/// and per connection: requests are read at once, so a small window costs
/// nothing but caps what a connection can park in the companion's memory.
const XDS_RECEIVE_WINDOW: u32 = 64 * 1024;

/// Runs the mode until `shutdown`.
pub async fn run(
    args: Args,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    check_unique(&args.clusters)?;
    args.xds.check()?;
    if args.clusters.is_empty() && args.manage.is_none() {
        anyhow::bail!("nothing to serve: give at least one --cluster, or --manage SELECTOR");
    }
    let selection = crate::source::kube::selection_for(&args.clusters, args.manage.as_ref());
    let family = match args.ip_family {
        Family::Auto => IpFamily::Auto,
        Family::Ipv4 => IpFamily::Ipv4,
        Family::Ipv6 => IpFamily::Ipv6,
    };
    let output = args.output.clone();
    let Telemetry {
        metrics,
        source: source_metrics,
        publish: publish_metrics,
        xds: xds_metrics,
    } = Telemetry::new();
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
        clusters = ?args.clusters.iter().map(ToString::to_string).collect::<Vec<_>>(),
        manage = ?args.manage.as_ref().map(LabelSelector::as_str),
        tiered_output = args.output.tiered(),
        source = %run::source_name(args.slices_dir.as_ref()),
        "serving-picker-conditions eds starting"
    );

    let (updates_tx, updates_rx) = mpsc::channel(1024);
    let (snap_tx, snap_rx) = watch::channel(Arc::new(Snapshot::empty()));
    let publisher =
        Publisher::new(args.clusters.clone(), family, output).managing(args.manage.is_some());
    tokio::spawn(publish::run(
        publisher,
        updates_rx,
        snap_tx,
        metrics.clone(),
        publish_metrics,
    ));
    let slices = match args.slices_dir.clone() {
        Some(dir) => {
            // With --manage, only the slices it selects (and the --cluster
            // Services'), as from the API.
            let select = args
                .manage
                .as_ref()
                .map(|m| crate::source::kube::Keep::of(&args.clusters, m));
            Slices::Files(dir, select)
        }
        None => Slices::Kube {
            client: run::kube_client().await?,
            selection,
        },
    };
    let source_task = run::spawn_source(slices, updates_tx, source_metrics);

    let xds = XdsServer::new(
        snap_rx,
        Names::new(args.clusters.iter().map(|c| c.name.clone())).managing(args.manage.is_some()),
        args.xds.clone(),
        Arc::new(MetricsCallbacks::new(xds_metrics, metrics)),
        Some(plumbing.connections.clone()),
    );
    tokio::spawn(xds.clone().run_fanout());
    let (ads, eds) = xds.services();
    let router = plumbing
        .grpc_server()
        .initial_stream_window_size(XDS_RECEIVE_WINDOW)
        .initial_connection_window_size(XDS_RECEIVE_WINDOW)
        .add_service(ads)
        .add_service(eds);
    plumbing
        .serve(router, "xDS server", shutdown, source_task)
        .await
}
