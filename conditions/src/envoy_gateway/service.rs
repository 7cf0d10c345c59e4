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
//!
//! The parts: `admission` (a call within the limits, the calls being
//! answered), `reread` (the sources re-read on a doubt), `native`
//! (PostTranslateModify and its verdicts), `hook_metrics`; this file holds
//! the service, its configuration and the PostEndpointsModify answer.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::Semaphore;

use super::hook::{self, Modified};
use super::intake::{ByteBudget, Held, Intake, IntakeLimits, IntakeMetrics, Received};
use super::native_lb;
use super::prepared::PreparedIndex;
use super::proto::{
    EnvoyGatewayExtension, EnvoyGatewayExtensionServer, RawPostEndpointsModifyRequest,
    RawPostEndpointsModifyResponse, RawPostTranslateModifyRequest, RawPostTranslateModifyResponse,
};
use super::reread_budget::RereadBudget;
use super::verdicts::{self, ConnKey};
use crate::eds::assignment::Output;
use crate::model::slice::ServiceKey;
use crate::telemetry::ratelog::PerKey;

mod admission;
mod hook_metrics;
mod native;
mod reread;

use admission::{Arrival, Outstanding};
use native::NativeLb;

pub use hook_metrics::HookMetrics;
pub use reread::{replace_service, FilesReread, KubeReread, Reread, RereadError};

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
            native_lb: NativeLb::new(&config),
            shared,
            config,
            reread,
            attempted: Mutex::new(HashMap::new()),
            metrics,
            too_big_log: Mutex::new(PerKey::new(Duration::from_secs(60), 1)),
            outstanding: Mutex::new(Outstanding::default()),
        }
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
