//! PostTranslateModify with `--native-lb-policy`: the verdicts each
//! admitted PostEndpointsModify answer leaves on its connection, and the
//! native policy put on the clusters whose verdict says so.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{HookConfig, HookService};
use crate::envoy_gateway::hook;
use crate::envoy_gateway::intake::Held;
use crate::envoy_gateway::native_lb::{self, ClusterOutcome, NativeLbMetrics, NativePolicy};
use crate::envoy_gateway::proto::{RawPostTranslateModifyRequest, RawPostTranslateModifyResponse};
use crate::envoy_gateway::team_policy::Shape;
use crate::envoy_gateway::verdicts::{ConnKey, Recorded, Verdicts};
use crate::net::listener::Connections;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::ratelog::LogBudget;

/// A cluster that keeps a team's load balancer: logged at most 5 at once,
/// then one a minute (every translation sends them again; counted by shape).
static TEAM_POLICY_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(60));

/// PostTranslateModify's state: the policy it writes, the verdicts it
/// reads, its metrics (registered or not).
pub(super) struct NativeLb {
    policy: NativePolicy,
    verdicts: Verdicts,
    metrics: Option<NativeLbMetrics>,
    /// EG sent its secrets: logged once (the shipped values leave them out).
    secrets_logged: AtomicBool,
    /// The listener's connections (a call's connection), and the
    /// plumbing's metrics (the status page).
    connections: Option<(Arc<Connections>, Arc<Metrics>)>,
}

impl NativeLb {
    /// No verdicts yet, no metrics, no connections.
    pub(super) fn new(config: &HookConfig) -> NativeLb {
        NativeLb {
            policy: NativePolicy::new(&config.output.metadata_namespace),
            verdicts: Verdicts::new(
                config.native_lb_max_clusters,
                config.native_lb_max_verdict_bytes,
            ),
            metrics: None,
            secrets_logged: AtomicBool::new(false),
            connections: None,
        }
    }
}

impl HookService {
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
    pub(super) fn verdict(
        &self,
        conn: &ConnKey,
        raw: &[u8],
        answer: Option<&hook::Answer>,
        admitted: bool,
    ) {
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
    pub(super) async fn translate_received(
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
