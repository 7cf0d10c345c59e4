//! Re-reads of the Services in doubt from the source (Kubernetes API, or
//! the slice directory), bounded by `--reread-timeout-ms`, the
//! translation's `--reread-budget-ms` and `--reread-min-interval`.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::HookService;
use crate::envoy_gateway::hook::{self, Modified};
use crate::envoy_gateway::prepared::PreparedIndex;
use crate::model::slice::{ServiceKey, Slice, SliceKey};
use crate::source::metrics::SourceMetrics;
use crate::source::Change;

/// Makes the index's slices of `service` exactly `slices`.
pub fn replace_service(index: &mut PreparedIndex, service: &ServiceKey, slices: Vec<Slice>) {
    let keep: BTreeSet<SliceKey> = slices.iter().map(|s| s.key.clone()).collect();
    let gone: Vec<Change> = index
        .slices_of(service)
        .map(|s| s.key.clone())
        .filter(|k| !keep.contains(k))
        .map(Change::Delete)
        .collect();
    index.edit(
        gone.into_iter()
            .chain(slices.into_iter().map(Change::Apply)),
    );
}

/// Why a Service's slices could not be re-read.
#[derive(Debug, thiserror::Error)]
pub enum RereadError {
    /// The Kubernetes API's list failed.
    #[error("{0}")]
    Api(#[from] kube::Error),
    /// The slice directory could not be scanned.
    #[error("{0}")]
    Directory(#[from] std::io::Error),
    /// The re-read ended before its answer (its task panicked or was cancelled).
    #[error("{0}")]
    Ended(#[from] tokio::task::JoinError),
}

/// Reads one Service's slices from the source, now.
#[tonic::async_trait]
pub trait Reread: Send + Sync + 'static {
    /// `service`'s slices as the source has them now, or why they could not be read.
    async fn reread(&self, service: &ServiceKey) -> Result<Vec<Slice>, RereadError>;
}

/// From the Kubernetes API: a list of the Service's slices (a quorum read)
/// with the `--manage` selector (a Service no longer selected has none).
pub struct KubeReread {
    /// The API client.
    pub client: kube::Client,
    /// The label selector of the managed Services (`--manage`, or its default).
    pub selector: String,
}

#[tonic::async_trait]
impl Reread for KubeReread {
    async fn reread(&self, service: &ServiceKey) -> Result<Vec<Slice>, RereadError> {
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        let api: kube::Api<EndpointSlice> =
            kube::Api::namespaced(self.client.clone(), &service.namespace);
        let mut sel = format!(
            "{}={}",
            crate::model::slice::SERVICE_NAME_LABEL,
            service.name
        );
        if !self.selector.is_empty() {
            sel.push(',');
            sel.push_str(&self.selector);
        }
        let list = api
            .list(&kube::api::ListParams::default().labels(&sel))
            .await?;
        Ok(list
            .items
            .iter()
            .filter_map(|o| crate::source::read_slice(o, "api (re-read)"))
            .filter(|s| s.service == *service)
            .collect())
    }
}

/// From the slice directory: a rescan (a malformed file keeps its last good
/// content, as in the watcher).
pub struct FilesReread {
    dir: Arc<Mutex<crate::source::files::Directory>>,
}

impl FilesReread {
    /// Scans `dir` once now; its errors count in `metrics` as the
    /// watcher's do.
    pub fn new(dir: PathBuf, metrics: SourceMetrics) -> FilesReread {
        let mut d = crate::source::files::Directory::new(&dir, metrics);
        if let Err(e) = d.scan() {
            tracing::warn!(dir = %dir.display(), error = %e, "slice directory: first scan for re-reads failed");
        }
        FilesReread {
            dir: Arc::new(Mutex::new(d)),
        }
    }
}

#[tonic::async_trait]
impl Reread for FilesReread {
    async fn reread(&self, service: &ServiceKey) -> Result<Vec<Slice>, RereadError> {
        let dir = self.dir.clone();
        let service = service.clone();
        tokio::task::spawn_blocking(move || {
            let mut d = dir.lock().unwrap_or_else(|p| p.into_inner());
            d.scan()?;
            Ok(d.slices()
                .into_iter()
                .filter(|s| s.service == service)
                .collect())
        })
        .await?
    }
}

fn recent(
    map: &Mutex<HashMap<ServiceKey, Instant>>,
    now: Instant,
    within: Duration,
) -> BTreeSet<ServiceKey> {
    let mut m = map.lock().unwrap_or_else(|p| p.into_inner());
    m.retain(|_, t| now.duration_since(*t) < within);
    m.keys().cloned().collect()
}

fn mark(map: &Mutex<HashMap<ServiceKey, Instant>>, services: &BTreeSet<ServiceKey>, now: Instant) {
    let mut m = map.lock().unwrap_or_else(|p| p.into_inner());
    for s in services {
        m.insert(s.clone(), now);
    }
}

impl HookService {
    /// Re-reads `services` within the timeout; returns those re-read.
    async fn reread(&self, services: BTreeSet<ServiceKey>) -> BTreeSet<ServiceKey> {
        let Some(source) = self.reread.clone() else {
            return BTreeSet::new();
        };
        let Some(allowed) = self.budget.allowance(self.config.reread_timeout) else {
            self.metrics.reread("over_budget");
            tracing::debug!(
                services = services.len(),
                "re-read budget of this translation spent (--reread-budget-ms): doubtful endpoints keep Envoy Gateway's health"
            );
            return BTreeSet::new();
        };
        let now = Instant::now();
        mark(&self.attempted, &services, now);
        let reads = services.iter().map(|s| {
            let source = source.clone();
            async move { (s.clone(), source.reread(s).await) }
        });
        let results = tokio::time::timeout(allowed, futures::future::join_all(reads)).await;
        self.budget.spend(now.elapsed());
        self.metrics
            .reread_seconds
            .observe(now.elapsed().as_secs_f64());
        let Ok(results) = results else {
            self.metrics.reread("timeout");
            tracing::warn!(
                services = ?services.iter().map(ToString::to_string).collect::<Vec<_>>(),
                timeout_ms = self.config.reread_timeout.as_millis() as u64,
                "re-read of EndpointSlices timed out: doubtful endpoints keep Envoy Gateway's health"
            );
            return BTreeSet::new();
        };
        let mut done = BTreeSet::new();
        let mut index = self.shared.write();
        for (service, r) in results {
            match r {
                Ok(slices) => {
                    self.metrics.reread("ok");
                    tracing::info!(service = %service, slices = slices.len(), "re-read a Service's EndpointSlices on a doubt");
                    replace_service(&mut index, &service, slices);
                    done.insert(service);
                }
                Err(e) => {
                    self.metrics.reread("error");
                    tracing::warn!(service = %service, error = %e, "re-read of EndpointSlices failed: doubtful endpoints keep Envoy Gateway's health");
                }
            }
        }
        done
    }

    /// Re-reads the Services `answer` doubts (those not tried within
    /// `--reread-min-interval`) and edits `raw` again, trusting the index
    /// for them; `None` when nothing was re-read.
    pub(super) async fn settle_doubts(
        &self,
        raw: &[u8],
        answer: &hook::Answer,
        started: Instant,
    ) -> Option<Modified> {
        self.reread.as_ref()?;
        let attempted = recent(&self.attempted, started, self.config.reread_min_interval);
        let doubtful: BTreeSet<ServiceKey> = answer
            .doubts
            .iter()
            .map(|d| d.service().clone())
            .filter(|s| !attempted.contains(s))
            .collect();
        if doubtful.is_empty() {
            return None;
        }
        tracing::debug!(cluster = %hook::cluster_name(raw), doubts = ?answer.doubts, "index and Envoy Gateway disagree");
        let trusted = self.reread(doubtful).await;
        if trusted.is_empty() {
            return None;
        }
        self.modify(raw, &trusted)
    }
}
