//! The PostEndpointsModify service: thin over `hook::modify`, plus what
//! needs I/O: the bounded re-read of a Service's slices when the index and
//! EG disagree, metrics and logs.
//!
//! Per call:
//! 1. Before the first full list of slices, or when the assignment (or a
//!    managed endpoint of it) does not decode: EG's bytes back, untouched.
//! 2. `hook::modify` with the index, on EG's encoded bytes. Nothing
//!    managed: EG's bytes back, untouched (byte-identical, not a
//!    re-encoding).
//! 3. Doubts (an endpoint the index lacks, or conditions EG's health
//!    contradicts): the Services concerned are re-read from the source
//!    (Kubernetes API list, or the slice directory), all together within
//!    `reread_timeout` (EG sets no deadline of its own and waits, holding
//!    up its whole translation, so the bound is ours: 500 ms by default).
//!    Each Service is re-read at most once per `reread_min_interval`
//!    (200 ms: at most 5 lists a second per Service while doubts last).
//!    After a successful re-read the index settles disagreements (it was
//!    just read from the source, after EG's translation began), and the
//!    assignment is modified again from EG's bytes.
//! 4. Re-read failed or timed out: the first answer stands (doubtful
//!    endpoints as EG sent them).
//!
//! Bounds (EG waits for every answer, so none may wait on the companion):
//! at most `max_calls` calls are answered at once and they hold at most
//! `max_bytes_held` bytes (twice each request: the request and its answer);
//! a call over either limit gets EG's bytes back at once, counted. Over
//! gRPC ([`HookService::into_server`]) the request's bytes are counted in
//! that budget as they arrive, before tonic buffers them (`intake`), and
//! the call keeps them until answered. An edited answer larger than
//! `max_message_size` (what EG accepts) is replaced by EG's own bytes,
//! counted.
//!
//! PostTranslateModify (`native_lb`): with `--native-lb-policy`, each
//! admitted PostEndpointsModify answer leaves a verdict for its cluster on
//! its connection (`verdicts`), and the connection's next
//! PostTranslateModify takes them and puts the module's policy on the
//! clusters whose verdict says so and whose load balancer is EG's default
//! (`team_policy`); every other resource goes back as EG sent it. Without
//! the flag, and over the same limits, every resource goes back unchanged.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use tokio::sync::{Semaphore, SemaphorePermit};

use super::hook::{self, Modified};
use super::intake::{ByteBudget, Held, Intake, IntakeLimits, IntakeMetrics, Received};
use super::native_lb::{self, ClusterOutcome, NativeLbMetrics, NativePolicy};
use super::prepared::PreparedIndex;
use super::proto::{
    EnvoyGatewayExtension, EnvoyGatewayExtensionServer, RawPostEndpointsModifyRequest,
    RawPostEndpointsModifyResponse, RawPostTranslateModifyRequest, RawPostTranslateModifyResponse,
};
use super::reread_budget::RereadBudget;
use super::team_policy::Shape;
use super::verdicts::{self, ConnKey, Recorded, Verdicts};
use crate::eds::assignment::Output;
use crate::model::slice::{ServiceKey, Slice, SliceKey};
use crate::net::listener::Connections;
use crate::source::metrics::SourceMetrics;
use crate::source::Change;
use crate::telemetry::metric_group;
use crate::telemetry::metrics::{unix_now, Labels, Metrics};
use crate::telemetry::ratelog::{LogBudget, PerKey};

/// A cluster that keeps a team's load balancer: logged at most 5 at once,
/// then one a minute (every translation sends them again; counted by shape).
static TEAM_POLICY_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(60));

/// The index the source fills and the hook reads.
#[derive(Debug, Default)]
pub struct Shared {
    /// Every managed Service's slices, prepared for the hook (`prepared`).
    pub index: RwLock<PreparedIndex>,
    /// Set once the first full list is in.
    pub ready: AtomicBool,
}

impl Shared {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, PreparedIndex> {
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The index, for the source's updates and re-reads.
    pub fn write(&self) -> std::sync::RwLockWriteGuard<'_, PreparedIndex> {
        self.index.write().unwrap_or_else(|p| p.into_inner())
    }
}

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

/// Reads one Service's slices from the source, now.
#[tonic::async_trait]
pub trait Reread: Send + Sync + 'static {
    /// `service`'s slices as the source has them now, or why they could not be read.
    async fn reread(&self, service: &ServiceKey) -> Result<Vec<Slice>, String>;
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
    async fn reread(&self, service: &ServiceKey) -> Result<Vec<Slice>, String> {
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
            .await
            .map_err(|e| e.to_string())?;
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
    async fn reread(&self, service: &ServiceKey) -> Result<Vec<Slice>, String> {
        let dir = self.dir.clone();
        let service = service.clone();
        tokio::task::spawn_blocking(move || {
            let mut d = dir.lock().unwrap_or_else(|p| p.into_inner());
            d.scan().map_err(|e| e.to_string())?;
            Ok(d.slices()
                .into_iter()
                .filter(|s| s.service == service)
                .collect())
        })
        .await
        .map_err(|e| e.to_string())?
    }
}

metric_group! {
    /// The hook's metrics (prefix `serving_picker_conditions_eg_`).
    #[derive(Clone)]
    pub struct HookMetrics {
        calls: Family<Labels, Counter> = ("eg_hook_calls", "PostEndpointsModify calls, by result (managed, unmanaged, not_ready, undecodable, \
             over_calls, over_bytes: answered unchanged at once; answer_too_big: \
             EG's assignment sent back)"),
        endpoints: Family<Labels, Counter> = ("eg_hook_endpoints", "Endpoints of managed assignments, by outcome (annotated, unknown, disagreed, overruled, dropped)"),
        rereads: Family<Labels, Counter> = ("eg_rereads", "Re-reads of a Service's slices on a doubt, by result (ok, error, timeout; over_budget: not done, the translation's --reread-budget-ms spent)"),
        // 20 us .. ~5 s.
        seconds: Histogram = ("eg_hook_seconds", "Time to answer one PostEndpointsModify call", Histogram::new(exponential_buckets(0.000_02, 2.0, 18))),
        reread_seconds: Histogram = ("eg_reread_seconds", "Time of one re-read round (all the Services in doubt of a call)", Histogram::new(exponential_buckets(0.000_5, 2.0, 12))),
        in_flight: Gauge = ("eg_hook_calls_in_flight", "PostEndpointsModify calls being answered (limit: eg_hook_max_calls)"),
        bytes_held: Gauge = ("eg_hook_bytes_held", "Bytes held by the calls being answered, twice each request (limit: eg_hook_max_bytes_held)"),
        max_calls: Gauge = ("eg_hook_max_calls", "Calls answered at once (--max-concurrent-calls); more are answered unchanged"),
        max_bytes_held: Gauge = ("eg_hook_max_bytes_held", "Bytes the calls being answered may hold (--max-bytes-held); more are answered unchanged"),
        refused: Family<Labels, Counter> = ("eg_hook_refused", "Hook calls (either rpc) refused while their request arrived, by reason (too_large: announces more than --max-message-size, RESOURCE_EXHAUSTED; over_bytes: its bytes do not fit in --max-bytes-held, RESOURCE_EXHAUSTED; receive_timeout: not received whole within --receive-timeout-ms, DEADLINE_EXCEEDED)"),
        receiving: Gauge = ("eg_hook_requests_receiving", "Hook requests being received (their bytes count in eg_hook_bytes_held as they arrive)"),
        receive_timeout: Gauge<f64, AtomicU64> = ("eg_hook_receive_timeout_seconds", "Time a hook request may take to arrive whole (--receive-timeout-ms)"),
        last_call: Gauge<f64, AtomicU64> = ("eg_hook_last_call_timestamp_seconds", "Unix time of Envoy Gateway's last hook call (any result); 0 before the first"),
        oldest_call: Gauge<f64, AtomicU64> = ("eg_hook_oldest_call_timestamp_seconds", "Unix time the oldest hook call still being answered arrived; 0 when none is"),
    }
}

/// The calls being answered, by arrival order, with their arrival (Unix
/// seconds): the first is the oldest, its arrival the `oldest_call` gauge.
#[derive(Debug, Default)]
struct Outstanding {
    next: u64,
    arrived: BTreeMap<u64, f64>,
}

impl Outstanding {
    fn oldest(&self) -> f64 {
        self.arrived.first_key_value().map_or(0.0, |(_, t)| *t)
    }
}

/// A call being answered: counted as outstanding until dropped.
struct Arrival<'a> {
    outstanding: &'a Mutex<Outstanding>,
    metrics: &'a HookMetrics,
    id: u64,
}

impl<'a> Arrival<'a> {
    fn new(outstanding: &'a Mutex<Outstanding>, metrics: &'a HookMetrics) -> Arrival<'a> {
        let now = unix_now();
        metrics.last_call.set(now);
        let mut o = outstanding.lock().unwrap_or_else(|p| p.into_inner());
        let id = o.next;
        o.next += 1;
        o.arrived.insert(id, now);
        metrics.oldest_call.set(o.oldest());
        Arrival {
            outstanding,
            metrics,
            id,
        }
    }
}

impl Drop for Arrival<'_> {
    fn drop(&mut self) {
        let mut o = self.outstanding.lock().unwrap_or_else(|p| p.into_inner());
        o.arrived.remove(&self.id);
        self.metrics.oldest_call.set(o.oldest());
    }
}

/// The `result` label values of `eg_hook_calls_total`.
const CALL_RESULTS: [&str; 7] = [
    "managed",
    "unmanaged",
    "not_ready",
    "undecodable",
    "over_calls",
    "over_bytes",
    "answer_too_big",
];

impl HookMetrics {
    /// Every result of `eg_hook_calls_total` and reason of
    /// `eg_hook_refused_total` from 0, so that an alert on increase() sees
    /// the first one.
    pub fn zero_results(&self) {
        for result in CALL_RESULTS {
            drop(self.calls.get_or_create(&vec![("result", result)]));
        }
        for reason in super::intake::REFUSED_REASONS {
            drop(self.refused.get_or_create(&vec![("reason", reason)]));
        }
    }

    fn call(&self, result: &'static str) {
        self.calls.get_or_create(&vec![("result", result)]).inc();
    }

    fn endpoints(&self, outcome: &'static str, n: usize) {
        if n > 0 {
            self.endpoints
                .get_or_create(&vec![("outcome", outcome)])
                .inc_by(n as u64);
        }
    }

    fn reread(&self, result: &'static str) {
        self.rereads.get_or_create(&vec![("result", result)]).inc();
    }
}

/// What Envoy Gateway accepts when its `extensionManager.maxMessageSize`
/// is unset: EG then passes no size option and grpc-go's client default
/// applies to what it receives, 4 MiB (EG's API documents it as "4M").
pub const EG_DEFAULT_MAX_MESSAGE_SIZE: usize = 4 << 20;

/// The default of `--receive-timeout-ms`: EG sends a request at once (a
/// message of the shipped 16 MB takes well under a second within a
/// cluster), so a request still arriving after this is stuck or slowed on
/// purpose.
pub const DEFAULT_RECEIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Knobs of the hook.
#[derive(Clone, Debug)]
pub struct HookConfig {
    /// How the hook writes the endpoints (tiered or flat, the metadata namespace).
    pub output: Output,
    /// How long a call's re-reads may take (`--reread-timeout-ms`).
    pub reread_timeout: Duration,
    /// Re-read time one translation may spend in all (`reread_budget`).
    pub reread_budget: Duration,
    /// A Service is re-read at most once this often.
    pub reread_min_interval: Duration,
    /// Calls answered at once; more get EG's bytes back at once.
    pub max_calls: usize,
    /// Bytes the calls being answered may hold (twice each request).
    pub max_bytes_held: usize,
    /// Largest answer EG accepts: a larger edited answer is replaced by
    /// EG's own bytes. Over gRPC, also the largest request (`intake`).
    pub max_message_size: usize,
    /// Time a request may take to arrive whole over gRPC (`intake`).
    pub receive_timeout: Duration,
    /// PostTranslateModify sets the native policy (`--native-lb-policy`).
    pub native_lb: bool,
    /// Cluster verdicts remembered at most (`--native-lb-max-clusters`).
    pub native_lb_max_clusters: usize,
    /// Bytes the verdicts may hold (`--native-lb-max-verdict-bytes`).
    pub native_lb_max_verdict_bytes: usize,
}

impl Default for HookConfig {
    fn default() -> Self {
        HookConfig {
            output: Output::default(),
            reread_timeout: Duration::from_millis(500),
            reread_budget: Duration::from_millis(1000),
            reread_min_interval: Duration::from_millis(200),
            max_calls: 8,
            max_bytes_held: 32 << 20,
            max_message_size: EG_DEFAULT_MAX_MESSAGE_SIZE,
            receive_timeout: DEFAULT_RECEIVE_TIMEOUT,
            native_lb: false,
            native_lb_max_clusters: native_lb::DEFAULT_MAX_VERDICTS,
            native_lb_max_verdict_bytes: verdicts::DEFAULT_MAX_BYTES,
        }
    }
}

/// PostTranslateModify's state: the policy it writes, the verdicts it
/// reads, its metrics (registered or not).
struct NativeLb {
    policy: NativePolicy,
    verdicts: Verdicts,
    metrics: Option<NativeLbMetrics>,
    /// EG sent its secrets: logged once (the shipped values leave them out).
    secrets_logged: AtomicBool,
    /// The listener's connections (a call's connection), and the
    /// plumbing's metrics (the status page).
    connections: Option<(Arc<Connections>, Arc<Metrics>)>,
}

/// A call's share of the limits, given back when the call is answered.
struct Admitted<'a> {
    _call: SemaphorePermit<'a>,
    _bytes: Held,
    metrics: &'a HookMetrics,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.metrics.in_flight.dec();
    }
}

/// The PostEndpointsModify implementation.
pub struct HookService {
    shared: Arc<Shared>,
    config: HookConfig,
    reread: Option<Arc<dyn Reread>>,
    /// When each Service was last re-read.
    attempted: Mutex<HashMap<ServiceKey, Instant>>,
    metrics: HookMetrics,
    calls: Semaphore,
    /// `--max-bytes-held`, shared with the requests being received.
    bytes: ByteBudget,
    /// `answer_too_big` is logged at most once a minute (EG asks again at
    /// every translation).
    too_big_log: Mutex<PerKey<()>>,
    native_lb: NativeLb,
    budget: RereadBudget,
    /// The calls being answered (the age of the oldest is watched).
    outstanding: Mutex<Outstanding>,
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
    /// The hook over `shared`, re-reading Services in doubt through `reread` (none: never), its
    /// metrics registered by the caller.
    pub fn new(
        shared: Arc<Shared>,
        config: HookConfig,
        reread: Option<Arc<dyn Reread>>,
        metrics: HookMetrics,
    ) -> HookService {
        metrics.zero_results();
        metrics.max_calls.set(config.max_calls as i64);
        metrics.max_bytes_held.set(config.max_bytes_held as i64);
        metrics
            .receive_timeout
            .set(config.receive_timeout.as_secs_f64());
        HookService {
            budget: RereadBudget::new(config.reread_budget),
            calls: Semaphore::new(config.max_calls.min(Semaphore::MAX_PERMITS)),
            bytes: ByteBudget::new(config.max_bytes_held, metrics.bytes_held.clone()),
            native_lb: NativeLb {
                policy: NativePolicy::new(&config.output.metadata_namespace),
                verdicts: Verdicts::new(
                    config.native_lb_max_clusters,
                    config.native_lb_max_verdict_bytes,
                ),
                metrics: None,
                secrets_logged: AtomicBool::new(false),
                connections: None,
            },
            shared,
            config,
            reread,
            attempted: Mutex::new(HashMap::new()),
            metrics,
            too_big_log: Mutex::new(PerKey::new(Duration::from_secs(60), 1)),
            outstanding: Mutex::new(Outstanding::default()),
        }
    }

    /// PostTranslateModify's metrics, registered by the caller.
    pub fn with_native_lb_metrics(mut self, metrics: NativeLbMetrics) -> HookService {
        metrics.zero();
        metrics
            .max_verdicts
            .set(self.config.native_lb_max_clusters as i64);
        metrics
            .max_verdict_bytes
            .set(self.config.native_lb_max_verdict_bytes as i64);
        self.native_lb.metrics = Some(metrics);
        self
    }

    /// Calls are told apart by the listener's connection (verdicts bound to
    /// it, `verdicts`); the status page shows the clusters that keep a
    /// team's load balancer.
    pub fn with_connections(
        mut self,
        connections: Arc<Connections>,
        metrics: Arc<Metrics>,
    ) -> HookService {
        self.native_lb.connections = Some((connections, metrics));
        self
    }

    /// The connection `request` came on: the listener's record of it, else
    /// its peer address, else (in process) the local caller.
    pub fn connection_of<T>(&self, request: &tonic::Request<T>) -> ConnKey {
        if let Some(conn) = self
            .native_lb
            .connections
            .as_ref()
            .and_then(|(c, _)| c.of(request))
        {
            return ConnKey::conn(&conn);
        }
        request
            .remote_addr()
            .map_or_else(ConnKey::local, ConnKey::peer)
    }

    fn verdict_gauges(&self) {
        let n = &self.native_lb;
        if let Some(m) = &n.metrics {
            m.verdicts.set(n.verdicts.len() as i64);
            m.verdict_bytes.set(n.verdicts.bytes() as i64);
            m.verdict_connections.set(n.verdicts.connections() as i64);
        }
    }

    /// Leaves the connection's next PostTranslateModify the verdict of the
    /// assignment `raw` (with `--native-lb-policy`): eligible when `answer`
    /// (the one sent) says so. A call not admitted (`admitted` false)
    /// records nothing, and turns a yes of the same batch to no.
    fn verdict(&self, conn: &ConnKey, raw: &[u8], answer: Option<&hook::Answer>, admitted: bool) {
        if !self.config.native_lb {
            return;
        }
        let name = hook::cluster_name(raw);
        if name.is_empty() {
            return;
        }
        let n = &self.native_lb;
        if !admitted {
            n.verdicts.revoke(conn, &name);
            return;
        }
        let eligible = answer.is_some_and(native_lb::eligible);
        let recorded = n.verdicts.record(conn, &name, eligible);
        if let Some(m) = &n.metrics {
            match recorded {
                Recorded::Kept => {}
                Recorded::Full => {
                    m.verdicts_refused.inc();
                }
                Recorded::KeyTooLong => {
                    m.verdict_keys_too_long.inc();
                }
            }
        }
        self.verdict_gauges();
    }

    /// A call of `request_len` bytes within the limits, or the limit it is
    /// over. `received`: the bytes its request took as it arrived (over
    /// gRPC, `intake`), kept as its share; else twice `request_len` taken now.
    fn admit(
        &self,
        request_len: usize,
        received: Option<Held>,
    ) -> Result<Admitted<'_>, &'static str> {
        let call = self.calls.try_acquire().map_err(|_| "over_calls")?;
        let bytes = match received {
            Some(held) => held,
            None => self
                .bytes
                .take(request_len.saturating_mul(2))
                .ok_or("over_bytes")?,
        };
        self.metrics.in_flight.inc();
        Ok(Admitted {
            _call: call,
            _bytes: bytes,
            metrics: &self.metrics,
        })
    }

    /// The gRPC service of the hook as the companion serves it: requests
    /// over `--max-message-size`, over the byte budget or slower than
    /// `--receive-timeout-ms` refused as they arrive (`intake`).
    pub fn into_server(self) -> Intake<EnvoyGatewayExtensionServer<HookService>> {
        let limits = IntakeLimits {
            max_message_size: self.config.max_message_size,
            receive_timeout: self.config.receive_timeout,
        };
        let metrics = IntakeMetrics {
            refused: self.metrics.refused.clone(),
            receiving: self.metrics.receiving.clone(),
        };
        let budget = self.bytes.clone();
        let max = self.config.max_message_size;
        let server = EnvoyGatewayExtensionServer::new(self)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max);
        Intake::new(server, budget, limits, metrics)
    }

    fn modify(&self, bytes: &[u8], trusted: &BTreeSet<ServiceKey>) -> Option<Modified> {
        hook::modify(bytes, &self.shared.read(), trusted, &self.config.output).ok()
    }

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

    /// One call: EG's request -> the answer: EG's assignment edited from
    /// the index, or sent back as it came when the hook cannot do better;
    /// each call counted by its result.
    pub async fn answer(
        &self,
        req: RawPostEndpointsModifyRequest,
    ) -> RawPostEndpointsModifyResponse {
        self.answer_on(&ConnKey::local(), req).await
    }

    /// [`HookService::answer`] for a call that came on `conn`.
    pub async fn answer_on(
        &self,
        conn: &ConnKey,
        req: RawPostEndpointsModifyRequest,
    ) -> RawPostEndpointsModifyResponse {
        self.answer_received(conn, req, None).await
    }

    /// [`Self::answer_on`], the request's bytes already taken from the
    /// budget as it arrived (`received`) or not.
    async fn answer_received(
        &self,
        conn: &ConnKey,
        req: RawPostEndpointsModifyRequest,
        received: Option<Held>,
    ) -> RawPostEndpointsModifyResponse {
        let started = Instant::now();
        self.budget.on_call(started);
        let _arrival = Arrival::new(&self.outstanding, &self.metrics);
        let Some(raw) = req.load_assignment else {
            self.metrics.call("undecodable");
            return RawPostEndpointsModifyResponse {
                load_assignment: None,
            };
        };
        let answer = match self.edit(&raw, started, received).await {
            Ok(modified) => {
                self.metrics.call("managed");
                self.verdict(conn, &raw, Some(&modified.answer), true);
                modified.assignment.map_or(raw, Bytes::from)
            }
            Err(result) => {
                self.metrics.call(result);
                let admitted = !matches!(result, "not_ready" | "over_calls" | "over_bytes");
                self.verdict(conn, &raw, None, admitted);
                raw
            }
        };
        RawPostEndpointsModifyResponse {
            load_assignment: Some(answer),
        }
    }

    /// EG's assignment `raw` edited from the index, the Services in doubt
    /// re-read first; its endpoints counted and the call timed. `Err`: the
    /// result with which EG's own assignment goes back (not ready, over a
    /// limit, undecodable, unmanaged, too big).
    async fn edit(
        &self,
        raw: &[u8],
        started: Instant,
        received: Option<Held>,
    ) -> Result<Modified, &'static str> {
        if !self.shared.ready.load(Ordering::SeqCst) {
            return Err("not_ready");
        }
        // Held until the answer is built, re-reads included.
        let _admitted = self.admit(raw.len(), received).inspect_err(|limit| {
            tracing::debug!(
                limit,
                bytes = raw.len(),
                "hook call over a limit: Envoy Gateway's assignment sent back"
            );
        })?;
        let Some(mut modified) = self.modify(raw, &BTreeSet::new()) else {
            tracing::warn!(
                "a ClusterLoadAssignment from Envoy Gateway does not decode: sent back untouched"
            );
            return Err("undecodable");
        };
        if !modified.answer.managed {
            self.metrics
                .seconds
                .observe(started.elapsed().as_secs_f64());
            return Err("unmanaged");
        }
        if let Some(again) = self.settle_doubts(raw, &modified.answer, started).await {
            modified = again;
        }
        if self.too_big(raw, &modified) {
            return Err("answer_too_big");
        }
        self.count_endpoints(raw, &modified.answer);
        self.metrics
            .seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(modified)
    }

    /// Re-reads the Services `answer` doubts (those not tried within
    /// `--reread-min-interval`) and edits `raw` again, trusting the index
    /// for them; `None` when nothing was re-read.
    async fn settle_doubts(
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

    /// The edited assignment is larger than EG accepts
    /// (`--max-message-size`); logged at most once a minute.
    fn too_big(&self, raw: &[u8], modified: &Modified) -> bool {
        let bytes = modified.assignment.as_ref().map_or(0, Vec::len);
        if bytes <= self.config.max_message_size {
            return false;
        }
        let log = self
            .too_big_log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .allow((), Instant::now());
        if let Some(quiet) = log {
            tracing::warn!(
                cluster = %hook::cluster_name(raw),
                bytes,
                max_message_size = self.config.max_message_size,
                not_logged_since_last = quiet,
                "the edited assignment is larger than Envoy Gateway accepts (--max-message-size): its own sent back (logged once a minute, counted as answer_too_big)"
            );
        }
        true
    }

    /// A managed answer's endpoints by outcome (`eg_hook_endpoints`), and a
    /// line when some are left as EG sent them.
    fn count_endpoints(&self, raw: &[u8], answer: &hook::Answer) {
        let disagreed = answer
            .doubts
            .iter()
            .filter(|d| matches!(d, hook::Doubt::Disagrees { .. }))
            .count();
        self.metrics.endpoints("annotated", answer.annotated);
        self.metrics
            .endpoints("unknown", answer.doubts.len() - disagreed);
        self.metrics.endpoints("disagreed", disagreed);
        self.metrics.endpoints("overruled", answer.overruled);
        self.metrics.endpoints("dropped", answer.dropped);
        if !answer.doubts.is_empty() {
            tracing::info!(
                cluster = %hook::cluster_name(raw),
                doubts = answer.doubts.len(),
                "endpoints left as Envoy Gateway sent them (the index does not know them, or disagrees without a fresh re-read)"
            );
        }
    }

    /// One PostTranslateModify call: EG's resources -> the final lists.
    /// `Err` only for a request with a field this version does not know
    /// (EG with `failOpen` then keeps its own resources).
    pub async fn translate(
        &self,
        req: RawPostTranslateModifyRequest,
    ) -> Result<RawPostTranslateModifyResponse, tonic::Status> {
        self.translate_on(&ConnKey::local(), req).await
    }

    /// [`HookService::translate`] for a call that came on `conn`: it takes
    /// the verdicts `conn` recorded since its last PostTranslateModify,
    /// whatever the answer.
    pub async fn translate_on(
        &self,
        conn: &ConnKey,
        req: RawPostTranslateModifyRequest,
    ) -> Result<RawPostTranslateModifyResponse, tonic::Status> {
        self.translate_received(conn, req, None).await
    }

    /// [`Self::translate_on`], the request's bytes already taken from the
    /// budget as it arrived (`received`) or not.
    async fn translate_received(
        &self,
        conn: &ConnKey,
        req: RawPostTranslateModifyRequest,
        received: Option<Held>,
    ) -> Result<RawPostTranslateModifyResponse, tonic::Status> {
        let n = &self.native_lb;
        let batch = n.verdicts.take(conn);
        self.verdict_gauges();
        let count = |result: &'static str| {
            if let Some(m) = &n.metrics {
                m.call(result);
            }
        };
        if !req.unknown_fields.is_empty() {
            count("refused");
            tracing::warn!(
                fields = ?req.unknown_fields,
                "PostTranslateModify request with fields this version does not know: refused (Envoy Gateway with failOpen keeps its own resources)"
            );
            return Err(tonic::Status::failed_precondition(format!(
                "serving-picker-conditions does not know fields {:?} of PostTranslateModifyRequest: its answer would drop them",
                req.unknown_fields
            )));
        }
        if !req.secrets.is_empty() && !n.secrets_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                secrets = req.secrets.len(),
                "Envoy Gateway sends its secrets to PostTranslateModify: set hooks.xdsTranslator.translation.secret.includeAll: false (sent back untouched; logged once)"
            );
        }
        let echo = |req: RawPostTranslateModifyRequest| RawPostTranslateModifyResponse {
            clusters: req.clusters,
            secrets: req.secrets,
            listeners: req.listeners,
            routes: req.routes,
        };
        if !self.config.native_lb {
            count("disabled");
            return Ok(echo(req));
        }
        let _admitted = match self.admit(prost::Message::encoded_len(&req), received) {
            Ok(a) => a,
            Err(limit) => {
                count(limit);
                return Ok(echo(req));
            }
        };
        let mut outcomes = [0u64; ClusterOutcome::ALL.len()];
        let mut teams: BTreeMap<Shape, (u64, Bytes)> = BTreeMap::new();
        let clusters: Vec<Bytes> = req
            .clusters
            .iter()
            .map(|c| {
                let (edited, outcome) = native_lb::apply(c, |name| batch.get(name), &n.policy);
                if let Some(k) = ClusterOutcome::ALL
                    .iter()
                    .position(|o| o.name() == outcome.name())
                {
                    outcomes[k] += 1;
                }
                if let ClusterOutcome::TeamPolicy(shape) = outcome {
                    teams.entry(shape).or_insert((0, c.clone())).0 += 1;
                }
                edited.map_or_else(|| c.clone(), Bytes::from)
            })
            .collect();
        self.team_policies(&teams);
        let set = outcomes[0];
        let answer = RawPostTranslateModifyResponse {
            clusters,
            secrets: req.secrets.clone(),
            listeners: req.listeners.clone(),
            routes: req.routes.clone(),
        };
        if prost::Message::encoded_len(&answer) > self.config.max_message_size {
            count("answer_too_big");
            tracing::warn!(
                max_message_size = self.config.max_message_size,
                "the PostTranslateModify answer is larger than Envoy Gateway accepts (--max-message-size): its resources sent back unchanged"
            );
            return Ok(echo(req));
        }
        if let Some(m) = &n.metrics {
            for (o, k) in ClusterOutcome::ALL.iter().zip(outcomes) {
                m.cluster(*o, k);
            }
            for (shape, (k, _)) in &teams {
                m.team_policy(*shape, *k);
            }
        }
        count(if set > 0 { "modified" } else { "unchanged" });
        tracing::debug!(
            clusters = req.clusters.len(),
            set,
            "PostTranslateModify answered"
        );
        Ok(answer)
    }
}

impl HookService {
    /// The clusters of a translation that keep a team's load balancer, by
    /// shape (with one of them): logged at a bounded rate and shown on the
    /// status page.
    fn team_policies(&self, teams: &BTreeMap<Shape, (u64, Bytes)>) {
        let rows: Vec<(&'static str, u64, String)> = teams
            .iter()
            .map(|(shape, (k, c))| (shape.name(), *k, native_lb::cluster_name(c)))
            .collect();
        if let Some((_, metrics)) = &self.native_lb.connections {
            metrics.status().set_team_policies(&rows);
        }
        if rows.is_empty() {
            return;
        }
        if let Some(left_out) = TEAM_POLICY_LOG.allow() {
            tracing::info!(
                shapes = ?rows,
                left_out,
                "clusters keep the load balancer a BackendTrafficPolicy (or a Service's topology setting) gave them: no native form on them (shape, clusters, one of them; counted in eg_native_lb_team_policies_total)"
            );
        }
    }
}

#[tonic::async_trait]
impl EnvoyGatewayExtension for HookService {
    async fn post_endpoints_modify(
        &self,
        request: tonic::Request<RawPostEndpointsModifyRequest>,
    ) -> Result<tonic::Response<RawPostEndpointsModifyResponse>, tonic::Status> {
        let conn = self.connection_of(&request);
        let received = request
            .extensions()
            .get::<Received>()
            .and_then(Received::take);
        Ok(tonic::Response::new(
            self.answer_received(&conn, request.into_inner(), received)
                .await,
        ))
    }

    async fn post_translate_modify(
        &self,
        request: tonic::Request<RawPostTranslateModifyRequest>,
    ) -> Result<tonic::Response<RawPostTranslateModifyResponse>, tonic::Status> {
        let conn = self.connection_of(&request);
        let received = request
            .extensions()
            .get::<Received>()
            .and_then(Received::take);
        self.translate_received(&conn, request.into_inner(), received)
            .await
            .map(tonic::Response::new)
    }
}
