//! Mode `envoy-gateway`: an Envoy Gateway extension server implementing
//! the PostEndpointsModify hook (EG >= 1.8) from the companion's index.
//!
//! ```text
//! source (kube API | files) --Update--> Shared index <--read-- PostEndpointsModify (tonic) <-- Envoy Gateway
//!                                            ^------ bounded re-read of one Service on a doubt
//! ```
//!
//! - `proto`: EG's extension service, the PostEndpointsModify and
//!   PostTranslateModify rpcs, generated at build time from
//!   `conditions/proto/extension/hooks.proto` (protox, tonic-prost-build),
//!   and a client.
//! - `naming`: EG's locality metadata -> the Service.
//! - `hook`: the pure function, assignment in -> assignment out, edited
//!   on the wire (`field_edit`).
//! - `prepared`: the index plus each managed Service's endpoints with their
//!   conditions metadata encoded, made when its slices change.
//! - `service`: the gRPC service over it (re-reads, metrics).
//! - `native_lb`: PostTranslateModify, the native form's load-balancing
//!   policy on the clusters whose assignments the hook wrote
//!   (`--native-lb-policy`).
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
//! with their conditions in metadata (at the priority after the ready ones,
//! with the tiered output), which serving-picker (either form) and Envoy's
//! own balancer alike turn into the right choice. `--manage ''` selects every
//! Service. With `--slices-dir`, every Service in the directory is managed
//! (the files carry the selection; `--manage` is refused there).

pub mod field_edit;
#[cfg(test)]
mod fuzz;
pub mod hook;
pub mod intake;
pub mod naming;
pub mod native_lb;
pub mod prepared;
pub mod proto;
pub mod reread_budget;
pub mod service;
pub mod team_policy;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod verdicts;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;

use crate::eds::assignment::Output;
use crate::eds::metrics::PublishMetrics;
use crate::model::cluster::ClusterSpec;
use crate::model::endpoint::Endpoint;
use crate::model::index::{Index, IpFamily};
use crate::model::selector::LabelSelector;
use crate::model::slice::ServiceKey;
use crate::source::{next_batch, Change, Update};
use crate::telemetry::metrics::Metrics;
use crate::telemetry::status::PortSource;
use service::Shared;

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
    pub manage: Option<LabelSelector>,
    /// Read EndpointSlices from this directory of kubectl YAML/JSON files
    /// (watched) instead of the Kubernetes API; every Service in it is managed.
    #[arg(long, value_name = "DIR")]
    pub slices_dir: Option<PathBuf>,
    /// Metrics (/metrics), /healthz and /readyz listen address.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:9102")]
    pub metrics_listen: SocketAddr,
    /// How endpoints are written (`--metadata-namespace`, `--flat-output`).
    #[command(flatten)]
    pub output: Output,
    /// Bound on re-reading a Service's slices when the index and Envoy
    /// Gateway disagree (EG waits for the answer without a deadline).
    #[arg(long, value_name = "MS", default_value_t = 500)]
    pub reread_timeout_ms: u64,
    /// Re-read time one translation of Envoy Gateway's may spend in all
    /// (EG calls once per cluster, one call after the other): past it, calls
    /// are answered from the index at once, counted as
    /// eg_rereads_total{result="over_budget"}.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub reread_budget_ms: u64,
    /// Largest request accepted and largest answer sent: set it to EG's
    /// extensionManager.maxMessageSize. The default is what EG accepts when
    /// that is unset (4 MiB, grpc-go's client default). A larger request is
    /// refused from its 5-byte prefix, before it is buffered
    /// (RESOURCE_EXHAUSTED; with failOpen EG keeps its own); an
    /// edited answer that would be larger is replaced by EG's own.
    #[arg(long, value_name = "BYTES", default_value_t = service::EG_DEFAULT_MAX_MESSAGE_SIZE)]
    pub max_message_size: usize,
    /// Time a hook request may take to arrive whole; a slower one is
    /// refused (DEADLINE_EXCEEDED; with failOpen EG keeps its own) and the
    /// bytes it held are given back.
    #[arg(long, value_name = "MS", default_value_t = service::DEFAULT_RECEIVE_TIMEOUT.as_millis() as u64)]
    pub receive_timeout_ms: u64,
    /// Calls answered at once; a call over the limit gets EG's assignment
    /// back at once, unchanged (counted). Also bounds the HTTP/2 streams per
    /// connection (twice this).
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub max_concurrent_calls: usize,
    /// Bytes the calls being answered may hold (twice each request); a call
    /// over the limit gets EG's assignment back at once, unchanged (counted).
    /// Requests count in it as their bytes arrive, before they are
    /// buffered: one whose next chunk does not fit is refused
    /// (RESOURCE_EXHAUSTED; with failOpen EG keeps its own). At least twice
    /// --max-message-size.
    #[arg(long, value_name = "BYTES", default_value_t = 32 << 20)]
    pub max_bytes_held: usize,
    /// Answer PostTranslateModify by putting the native module's
    /// load-balancing policy on the clusters whose assignments this hook
    /// wrote (every locality a managed Service of one backendRef, every
    /// endpoint annotated). Only where the Gateways' EnvoyProxy mounts the
    /// module: Envoy refuses a cluster whose module it cannot load. Off:
    /// PostTranslateModify sends every resource back unchanged.
    #[arg(long)]
    pub native_lb_policy: bool,
    /// Cluster verdicts remembered for PostTranslateModify; a cluster over
    /// the limit keeps Envoy Gateway's policy (counted).
    #[arg(long, value_name = "N", default_value_t = native_lb::DEFAULT_MAX_VERDICTS)]
    pub native_lb_max_clusters: usize,
    /// Bytes the cluster verdicts waiting for PostTranslateModify may hold
    /// (each name plus 64); a verdict over the limit is not kept and its
    /// cluster keeps Envoy Gateway's policy (counted).
    #[arg(long, value_name = "BYTES", default_value_t = verdicts::DEFAULT_MAX_BYTES)]
    pub native_lb_max_verdict_bytes: usize,
    /// Connection and metrics-port limits (`limits`).
    #[command(flatten)]
    pub limits: crate::limits::ServeLimits,
    /// TLS on the gRPC listener.
    #[command(flatten)]
    pub tls: crate::net::tls::TlsArgs,
}

/// Applies a batch of source updates to the shared index; true once ready.
pub fn apply_updates(shared: &Shared, updates: Vec<Update>) -> bool {
    apply_updates_changed(shared, updates).0
}

/// As [`apply_updates`], with the Services whose slices changed.
pub fn apply_updates_changed(
    shared: &Shared,
    updates: Vec<Update>,
) -> (bool, BTreeSet<ServiceKey>) {
    let full_list = updates
        .iter()
        .any(|u| matches!(u.change, Change::Replace(_)));
    let mut index = shared.write();
    let changed = index.edit(updates.into_iter().map(|u| u.change));
    if full_list {
        shared.ready.store(true, Ordering::SeqCst);
    }
    drop(index);
    (shared.ready.load(Ordering::SeqCst), changed)
}

/// The status page's ports in this mode, read from the index when the
/// page is asked for (nothing is rebuilt per change: at 10,000 Services a
/// batch costs its own Services only).
struct IndexPorts {
    shared: Arc<Shared>,
    tiered: bool,
}

impl PortSource for IndexPorts {
    fn ports(&self, max: usize) -> (bool, Vec<(ClusterSpec, Vec<Endpoint>)>, usize) {
        let index = self.shared.index.read().unwrap_or_else(|p| p.into_inner());
        let mut services: Vec<&ServiceKey> = index.services().collect();
        services.sort();
        let mut out = Vec::new();
        let mut left_out = 0;
        for service in services {
            if out.len() >= max {
                left_out += port_names(&index, service).len();
                continue;
            }
            out.extend(service_ports_of(&index, service));
        }
        left_out += out.len().saturating_sub(max);
        out.truncate(max);
        (self.tiered, out, left_out)
    }
}

/// Applies every batch of updates to the index, and shows it in the
/// metrics and the status page (the changed Services' gauges; the page
/// reads the index); the mode's consumer of the source.
pub async fn consume(
    shared: Arc<Shared>,
    mut updates: mpsc::Receiver<Update>,
    metrics: Arc<Metrics>,
    counts: PublishMetrics,
    tiered: bool,
) {
    metrics.status().set_source(Arc::new(IndexPorts {
        shared: shared.clone(),
        tiered,
    }));
    let mut known: HashMap<ServiceKey, BTreeSet<String>> = HashMap::new();
    let mut batches: u64 = 0;
    while let Some(batch) = next_batch(&mut updates).await {
        batches += 1;
        let n = batch.len();
        let started = Instant::now();
        let was_ready = shared.ready.load(Ordering::SeqCst);
        let (ready, changed) = apply_updates_changed(&shared, batch);
        let index = shared.index.read().unwrap_or_else(|p| p.into_inner());
        counts.applied(n, &index, ready, started.elapsed());
        metrics.set_ready(ready);
        for service in &changed {
            let ports = service_ports_of(&index, service);
            let now: BTreeSet<String> = ports.iter().map(|(c, _)| c.name.clone()).collect();
            for gone in known.remove(service).unwrap_or_default().difference(&now) {
                metrics.status().remove_port(gone);
            }
            for (spec, eps) in &ports {
                let serving = eps.iter().filter(|e| e.conditions.serving).count();
                metrics.status().set_port_serving(&spec.name, serving);
            }
            if !now.is_empty() {
                known.insert(service.clone(), now);
            }
        }
        metrics.status().set_version(&format!("index-{batches}"));
        if ready && !was_ready {
            tracing::info!(
                slices = index.slice_count(),
                endpoints = index.endpoint_count(),
                "first full list of EndpointSlices in: answering hook calls from the index"
            );
        }
    }
}

/// A Service's port names in the index.
fn port_names<'a>(index: &'a Index, service: &'a ServiceKey) -> BTreeSet<&'a str> {
    index
        .slices_of(service)
        .flat_map(|s| s.ports.iter().map(|p| p.name.as_str()))
        .collect()
}

/// One Service's ports, named `namespace/service:port`, with their
/// endpoints as the hook writes their conditions.
fn service_ports_of(index: &Index, service: &ServiceKey) -> Vec<(ClusterSpec, Vec<Endpoint>)> {
    port_names(index, service)
        .into_iter()
        .map(|port_name| {
            (
                ClusterSpec {
                    name: format!("{service}:{port_name}"),
                    service: service.clone(),
                    port_name: port_name.to_string(),
                },
                index.endpoints(service, port_name, IpFamily::Auto),
            )
        })
        .collect()
}

/// Every managed Service port, named `namespace/service:port` (the hook
/// learns EG's cluster names only when EG calls), with its endpoints as
/// the hook writes their conditions: the status page's rows in this mode,
/// all at once (the page reads them port by port: `IndexPorts`).
#[cfg(test)]
fn service_ports(index: &Index) -> Vec<(ClusterSpec, Vec<Endpoint>)> {
    let mut out = Vec::new();
    for service in index.services() {
        out.extend(service_ports_of(index, service));
    }
    out.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::model::fixtures::{endpoint, slice};

    #[test]
    fn the_status_rows_are_each_managed_service_port() {
        let mut index = Index::new();
        let mut terminating = endpoint("10.0.0.2");
        terminating.ready = Some(false);
        terminating.serving = Some(true);
        terminating.terminating = Some(true);
        index.apply(slice(
            "web-1",
            "web",
            &[("http", 8080), ("admin", 9000)],
            vec![endpoint("10.0.0.1"), terminating],
        ));
        index.apply(slice(
            "api-1",
            "api",
            &[("", 80)],
            vec![endpoint("10.0.1.1")],
        ));
        let rows = service_ports(&index);
        let names: Vec<&str> = rows.iter().map(|(c, _)| c.name.as_str()).collect();
        assert_eq!(names, ["ns/api:", "ns/web:admin", "ns/web:http"]);
        let (_, web_http) = &rows[2];
        assert_eq!(web_http.len(), 2);
        assert_eq!(web_http[0].addr.to_string(), "10.0.0.1:8080");
        assert!(web_http[1].conditions.terminating && web_http[1].conditions.serving);
    }
}
