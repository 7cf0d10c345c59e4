//! The leader's refresh: ask the change gate (a small stats answer) whether
//! anything changed, then fetch the config dump and live health, and turn
//! them into plans. Runs only in the elected root context, through
//! [`AdminApi`]: the proxy-wasm glue implements it with host calls, the
//! tests below with canned answers.

use crate::admin_json::{
    check_admin_response, implied_live_health, needs_live_health, parse_clusters,
    parse_config_dump, EndpointsDump, LiveHealth,
};
use crate::change_gate::{hidden_cluster, ChangeGate, Reason, Verdict};
use crate::config::PluginConfig;
use crate::narrow::{merge, narrowed_path, worth_narrowing, KnownClusters, Scope};
use crate::plans::build_plans;
use rustc_hash::FxBuildHasher;
use serving_picker_core::plan::ClusterPlan;
use std::collections::HashSet;
use std::time::Duration;

/// The host refused to start an admin call: its status, as the host names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRefused(pub String);

impl std::fmt::Display for CallRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CallRefused {}

/// What the refresh asks of its host: calls to Envoy's admin API through
/// the admin cluster, the answer being read, and the clock.
pub trait AdminApi {
    /// Starts `GET path` on `cluster` (JSON accepted): the call's token, or
    /// why it could not start.
    fn get(&mut self, cluster: &str, path: &str, timeout: Duration) -> Result<u32, CallRefused>;
    /// The `:status` of the answer being read (asked only when it has headers).
    fn response_status(&self) -> Option<Vec<u8>>;
    /// The first `size` bytes of the answer's body.
    fn response_body(&self, size: usize) -> Option<Vec<u8>>;
    /// Wall-clock microseconds, for cost figures (not decisions).
    fn now_us(&self) -> u64;
}

/// The admin call a refresh waits for, by its token.
enum Pending {
    /// The change gate's stats.
    Stats { token: u32 },
    /// The config dump, narrowed to these clusters or (`None`) whole.
    Dump {
        token: u32,
        only: Option<Vec<String>>,
    },
    /// `/clusters`, the dump it completes and the work so far.
    Health {
        token: u32,
        dump: EndpointsDump,
        work: Work,
    },
}

impl Pending {
    fn token(&self) -> u32 {
        match self {
            Pending::Stats { token }
            | Pending::Dump { token, .. }
            | Pending::Health { token, .. } => *token,
        }
    }
}

/// A finished admin call as the host reports it: its headers (0: the call
/// failed), its body's size, and the clocks (milliseconds, VM microseconds).
#[derive(Clone, Copy)]
struct Answer {
    num_headers: usize,
    body_size: usize,
    now_ms: u64,
    clock_us: u64,
}

/// What one refresh cost, for the debug log and gauges.
#[derive(Clone, Copy, Default, Debug)]
pub struct Work {
    /// Bytes of the admin answers read (the dump, and `/clusters` when read).
    pub admin_bytes: usize,
    /// VM time of the refresh's earlier callbacks (the dump's, when
    /// `/clusters` followed); the caller adds the last one's.
    pub earlier_busy_us: u64,
    /// The endpoints differed from the last ones.
    pub dump_changed: bool,
    /// The dump was narrowed to this many clusters whose stats moved.
    pub narrowed_to: Option<usize>,
    /// `/clusters` was read (else the dump settled every host's health).
    pub live_read: bool,
    /// From the first admin call of the refresh to its last answer.
    pub took_ms: u64,
}

/// What a tick's poll did.
#[derive(Debug, PartialEq, Eq)]
pub enum Start {
    /// The first admin call of a refresh is under way.
    Started,
    /// A call of the refresh under way has not answered yet.
    Busy,
    /// No poll due yet, or a full refresh is too soon after the last one.
    NotDue,
    /// The admin call could not start.
    Failed,
}

/// What a finished admin call led to.
pub enum Outcome {
    /// Not our call, or the next call of the refresh is under way.
    Nothing,
    /// A complete refresh: the plans to publish.
    Plans(Vec<ClusterPlan>, Work),
    /// A narrowed refresh: the plans of the clusters it read, to put in
    /// place of theirs in the published snapshot.
    Patch(Vec<ClusterPlan>, Work),
    /// A complete refresh that found nothing changed.
    Unchanged(Work),
    /// The change gate saw the same stats: no refresh was needed.
    Skipped,
    /// The refresh failed; the last good snapshot stays.
    Failed,
}

/// The leader's refresh: the call under way, the change gate, and what the last refreshes read.
#[derive(Default)]
pub struct Refresher {
    /// The call under way and when its step started (the poll for the
    /// stats, the full refresh for the dump and live health).
    pending: Option<(Pending, u64)>,
    gate: ChangeGate,
    /// Why the gate could not judge the last poll, logged once.
    gate_problem: Option<String>,
    /// When the last full refresh (the dump) started.
    last_full_ms: u64,
    /// The last parsed dump, to tell a changed one.
    last_dump: Option<EndpointsDump>,
    /// The last live view fetched from `/clusters` (cluster and service names).
    known_live: Option<LiveHealth>,
    /// Full refreshes since `/clusters` was last fetched.
    since_live: u32,
    last_error: Option<String>,
    logged_notes: HashSet<String, FxBuildHasher>,
    /// The live health of the last refresh: equal dump and health, equal plans.
    last_live: Option<LiveHealth>,
    /// How long the last complete full refresh took end to end (admin rendering included).
    last_took_ms: u64,
    /// The refresh under way follows moved membership or health stats (not
    /// the first or periodic one, nor config-update counters alone).
    stats_moved: bool,
}

const MAX_LOGGED_NOTES: usize = 10_000;
/// The periodic full refresh takes at most 1/50 of the time (of Envoy's
/// main thread, which renders the dump): spaced by 50 times its duration.
const PERIODIC_SHARE_DIVISOR: u64 = 50;
/// `/clusters` is fetched at least every this many refreshes.
const MAX_REFRESHES_WITHOUT_LIVE: u32 = 10;
/// Admin answers are rendered on Envoy's main thread: a full refresh (the
/// whole dump) starts at least this many times the last one's duration after
/// the previous one, so that it takes at most a quarter of that thread however
/// large the clusters grow. The change gate's small stats polls, and the
/// narrowed refreshes they lead to, keep the plain interval.
pub const ADMIN_SHARE_DIVISOR: u64 = 4;

impl Refresher {
    /// The end-to-end time of the last complete full refresh: Envoy renders
    /// admin answers on its main thread, so full refreshes space out with it.
    pub fn last_took_ms(&self) -> u64 {
        self.last_took_ms
    }

    /// Whether a full refresh may start now (see `ADMIN_SHARE_DIVISOR`).
    fn full_allowed(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.last_full_ms) >= self.last_took_ms * ADMIN_SHARE_DIVISOR
    }

    /// A refresh failed and none has succeeded since.
    pub fn failing(&self) -> bool {
        self.last_error.is_some()
    }

    /// Starts a refresh when `due` and none is under way. A call that never
    /// got its callback is dropped (and counts as failed) after two timeouts.
    pub fn poll(
        &mut self,
        admin: &mut impl AdminApi,
        config: &PluginConfig,
        now_ms: u64,
        due: bool,
    ) -> Start {
        if let Some((_, started)) = &self.pending {
            let lost_after = config.admin_timeout_ms * 2 + config.refresh_interval_ms;
            if now_ms.saturating_sub(*started) < lost_after {
                return Start::Busy;
            }
            self.fail("admin call got no callback; starting over".into());
            return Start::Failed;
        }
        if !due {
            return Start::NotDue;
        }
        if !ChangeGate::enabled(config) {
            if !self.full_allowed(now_ms) {
                return Start::NotDue;
            }
            return if self.start_dump(admin, config, now_ms, None) {
                Start::Started
            } else {
                Start::Failed
            };
        }
        match self.dispatch(admin, config, &config.admin_stats_path) {
            Some(token) => {
                self.pending = Some((Pending::Stats { token }, now_ms));
                Start::Started
            }
            None => Start::Failed,
        }
    }

    /// Asks for the config dump, narrowed to `only` or whole; false when the
    /// call could not be made.
    fn start_dump(
        &mut self,
        admin: &mut impl AdminApi,
        config: &PluginConfig,
        now_ms: u64,
        only: Option<(String, Vec<String>)>,
    ) -> bool {
        let (path, only) = match only {
            Some((path, clusters)) => (path, Some(clusters)),
            None => {
                self.last_full_ms = now_ms;
                (config.admin_path.clone(), None)
            }
        };
        match self.dispatch(admin, config, &path) {
            Some(token) => {
                self.pending = Some((Pending::Dump { token, only }, now_ms));
                true
            }
            None => false,
        }
    }

    /// After the stats moved: the narrowed dump path and its clusters, when
    /// the move is pinned to a few known clusters.
    fn narrowing(&self, config: &PluginConfig, reason: Reason) -> Option<(String, Vec<String>)> {
        if reason != Reason::StatsMoved || !config.partial_refresh || self.last_dump.is_none() {
            return None;
        }
        // Envoy writes `:` as `_` in stat names: with clusters `a:b` and
        // `a_b`, a stat of one reads as the other's. Ask for everything.
        if let Some(live) = &self.known_live {
            let clash = live
                .clusters
                .keys()
                .any(|n| n.contains(':') && live.clusters.contains_key(&n.replace(':', "_")));
            if clash {
                log::debug!("refresh not narrowed: cluster names clash in stats");
                return None;
            }
        }
        // A cluster's stats carry its Envoy name; the dump lists it under
        // its EDS service name, which only `/clusters` tells.
        let listed_as = |name: &str| match (&self.known_live, &self.last_dump) {
            (Some(live), _) => live.clusters.get(name).map(|c| {
                c.eds_service_name
                    .clone()
                    .unwrap_or_else(|| name.to_string())
            }),
            (None, Some(view)) => view
                .clusters
                .iter()
                .any(|c| c.name == name)
                .then(|| name.to_string()),
            (None, None) => None,
        };
        let count = match &self.known_live {
            Some(live) => live.clusters.len(),
            None => self.last_dump.as_ref().map_or(0, |v| v.clusters.len()),
        };
        let known = KnownClusters {
            count,
            listed_as: &listed_as,
        };
        match self.gate.moved(&known) {
            Scope::Only(clusters) => {
                let view = self.last_dump.as_ref()?;
                if !worth_narrowing(view, &clusters) {
                    log::debug!("refresh not narrowed: most hosts moved");
                    return None;
                }
                let path = narrowed_path(&config.admin_path, &clusters)?;
                Some((path, clusters))
            }
            Scope::All(why) => {
                log::debug!("refresh not narrowed: {why}");
                None
            }
        }
    }

    fn dispatch(
        &mut self,
        admin: &mut impl AdminApi,
        config: &PluginConfig,
        path: &str,
    ) -> Option<u32> {
        let timeout = Duration::from_millis(config.admin_timeout_ms);
        match admin.get(&config.admin_cluster, path, timeout) {
            Ok(token) => Some(token),
            Err(e) => {
                self.fail(format!(
                    "cannot call admin cluster {:?} ({e}); is it defined in the bootstrap?",
                    config.admin_cluster
                ));
                None
            }
        }
    }

    /// An admin call finished: the refresh's next step, by the call it
    /// answers (the stats, the dump, the live health). `num_headers` is 0
    /// when the call failed (reset, timeout, cut mid-body): then there is no
    /// header map to read, and reading it would trap.
    #[allow(clippy::too_many_arguments)]
    pub fn on_response(
        &mut self,
        admin: &mut impl AdminApi,
        config: &PluginConfig,
        token: u32,
        num_headers: usize,
        body_size: usize,
        now_ms: u64,
        clock_us: u64,
    ) -> Outcome {
        if !matches!(&self.pending, Some((p, _)) if p.token() == token) {
            return Outcome::Nothing;
        }
        let Some((pending, started)) = self.pending.take() else {
            return Outcome::Nothing;
        };
        let answer = Answer {
            num_headers,
            body_size,
            now_ms,
            clock_us,
        };
        match pending {
            Pending::Stats { .. } => self.on_stats(admin, config, answer),
            Pending::Dump { only, .. } => self.on_dump(admin, config, answer, only, started),
            Pending::Health { dump, work, .. } => {
                self.on_health(admin, config, answer, dump, work, started)
            }
        }
    }

    /// The change gate's stats: skip, or ask for the dump (narrowed when the
    /// move is pinned to a few clusters; a full one only when its share of
    /// Envoy's main thread allows).
    fn on_stats(
        &mut self,
        admin: &mut impl AdminApi,
        config: &PluginConfig,
        answer: Answer,
    ) -> Outcome {
        let stats = self.read_stats(admin, config, answer);
        let decision = self.gate.decide(config, answer.now_ms, stats);
        self.note_gate_problem(decision.problem);
        let reason = match decision.verdict {
            Verdict::Skip => return Outcome::Skipped,
            Verdict::Fetch(reason) => reason,
        };
        // A DNS cluster's resolutions leave nothing for `/clusters` to
        // explain (`narrow::hosts_moved`).
        self.stats_moved = reason == Reason::StatsMoved && self.gate.hosts_moved();
        let narrowed = self.narrowing(config, reason);
        if narrowed.is_none() && !self.full_allowed(answer.now_ms) {
            // Too soon for the whole dump: the next poll asks again.
            log::debug!("full refresh ({reason:?}) deferred: the last one was slow");
            self.gate.refresh_failed();
            return Outcome::Nothing;
        }
        log::debug!(
            "refresh ({reason:?}){}",
            narrowed
                .as_ref()
                .map_or(String::new(), |(_, c)| format!(" of {} clusters", c.len()))
        );
        self.ask_dump(admin, config, answer.now_ms, narrowed)
    }

    /// The stats answer, or why the gate cannot judge it: one without a
    /// managed cluster's membership counter is hidden by a stats matcher.
    fn read_stats(
        &self,
        admin: &impl AdminApi,
        config: &PluginConfig,
        answer: Answer,
    ) -> Result<Vec<u8>, String> {
        let stats = read_body(admin, "stats", config, answer.num_headers, answer.body_size)?;
        let managed = self.known_live.as_ref().map(|live| {
            live.clusters
                .keys()
                .map(String::as_str)
                .filter(|name| config.manages(name))
        });
        // (An empty answer is the gate's own, clearer, complaint.)
        if let Some(managed) = managed {
            if let Some(name) = hidden_cluster(&stats, managed).filter(|_| !stats.is_empty()) {
                return Err(format!(
                    "the stats answer has no cluster.{name}.membership_total (a stats_matcher, \
                     e.g. Istio's, or admin_stats_path hides the clusters' stats): every poll is a full refresh"
                ));
            }
        }
        Ok(stats)
    }

    /// Asks for the dump (`start_dump`): the refresh goes on, or failed.
    fn ask_dump(
        &mut self,
        admin: &mut impl AdminApi,
        config: &PluginConfig,
        now_ms: u64,
        only: Option<(String, Vec<String>)>,
    ) -> Outcome {
        if self.start_dump(admin, config, now_ms, only) {
            Outcome::Nothing
        } else {
            Outcome::Failed
        }
    }

    /// The dump (whole, or narrowed to `only`): the refresh ends with the
    /// health it implies, or asks `/clusters` for the live health.
    fn on_dump(
        &mut self,
        admin: &mut impl AdminApi,
        config: &PluginConfig,
        answer: Answer,
        only: Option<Vec<String>>,
        started: u64,
    ) -> Outcome {
        let narrowed_to = only.as_ref().map(Vec::len);
        let (dump, dump_changed) =
            match self.read_dump(admin, config, answer.num_headers, answer.body_size, only) {
                Ok(Some(read)) => read,
                // The narrowed answer did not fit: ask for everything.
                Ok(None) => return self.ask_dump(admin, config, answer.now_ms, None),
                Err(why) => return self.fail(why),
            };
        let work = Work {
            admin_bytes: answer.body_size,
            dump_changed,
            narrowed_to,
            ..Work::default()
        };
        if let Some(implied) = self.implied_health(&dump, dump_changed) {
            if narrowed_to.is_none() {
                self.since_live += 1;
            }
            return self.finish(dump, Some(implied), work, started, answer.now_ms, config);
        }
        match self.dispatch(admin, config, &config.admin_health_path) {
            Some(token) => {
                let work = Work {
                    earlier_busy_us: admin.now_us().saturating_sub(answer.clock_us),
                    ..work
                };
                self.pending = Some((Pending::Health { token, dump, work }, started));
                Outcome::Nothing
            }
            None => Outcome::Failed,
        }
    }

    /// The live health `dump` implies, when `/clusters` may be skipped.
    /// `/clusters` is the larger answer (per-host stats): skip it while the
    /// dump settles every host's health (its coarse verdict shows failed
    /// checks and ejections too), but not for long. Stats that moved while
    /// the endpoints did not point at what only `/clusters` shows (a host
    /// kept pending removal).
    fn implied_health(&self, dump: &EndpointsDump, dump_changed: bool) -> Option<LiveHealth> {
        let known = self.known_live.as_ref()?;
        let unexplained = self.stats_moved && !dump_changed;
        (self.since_live < MAX_REFRESHES_WITHOUT_LIVE
            && !unexplained
            && !needs_live_health(dump, Some(known)))
        .then(|| implied_live_health(dump, known))
    }

    /// `/clusters`: the live health; the refresh ends with it.
    fn on_health(
        &mut self,
        admin: &mut impl AdminApi,
        config: &PluginConfig,
        answer: Answer,
        dump: EndpointsDump,
        mut work: Work,
        started: u64,
    ) -> Outcome {
        let body = match read_body(
            admin,
            "live health",
            config,
            answer.num_headers,
            answer.body_size,
        ) {
            Ok(body) => body,
            Err(why) => return self.fail(why),
        };
        work.admin_bytes += body.len();
        work.live_read = true;
        match parse_clusters(&body) {
            Ok(live) => {
                self.known_live = Some(live.clone());
                self.since_live = 0;
                self.finish(dump, Some(live), work, started, answer.now_ms, config)
            }
            Err(e) => self.fail(e.to_string()),
        }
    }

    /// The endpoints this answer brought (the whole view, or the narrowed
    /// clusters only) and whether they changed; `None` when a narrowed answer
    /// does not match what was asked.
    fn read_dump(
        &mut self,
        admin: &impl AdminApi,
        config: &PluginConfig,
        num_headers: usize,
        body_size: usize,
        only: Option<Vec<String>>,
    ) -> Result<Option<(EndpointsDump, bool)>, String> {
        let body = read_body(admin, "config_dump", config, num_headers, body_size)?;
        let dump = parse_config_dump(&body, &config.selection.metadata_namespace)
            .map_err(|e| e.to_string())?;
        self.log_notes(&dump.notes);
        match (only, self.last_dump.as_mut()) {
            (Some(asked), Some(view)) => match merge(view, &dump, &asked) {
                Ok(changed) => Ok(Some((dump, changed))),
                Err(why) => {
                    log::debug!("narrowed refresh refused ({why}); fetching all");
                    Ok(None)
                }
            },
            (Some(_), None) => Ok(None),
            // Compared parsed: Envoy prints metadata keys in a different order
            // on each dump, so equal content rarely means equal bytes.
            (None, last) => {
                let changed = last.is_none_or(|last| last.clusters != dump.clusters);
                self.last_dump = Some(dump.clone());
                Ok(Some((dump, changed)))
            }
        }
    }

    fn finish(
        &mut self,
        dump: EndpointsDump,
        live: Option<LiveHealth>,
        mut work: Work,
        started: u64,
        now_ms: u64,
        config: &PluginConfig,
    ) -> Outcome {
        if self.last_error.take().is_some() {
            log::info!("admin refresh recovered");
        }
        self.gate.refresh_succeeded(work.narrowed_to.is_none());
        work.took_ms = now_ms.saturating_sub(started);
        if work.narrowed_to.is_none() {
            self.last_took_ms = work.took_ms;
            self.gate
                .space_periodic(work.took_ms.saturating_mul(PERIODIC_SHARE_DIVISOR));
        }
        if work.narrowed_to.is_some() {
            // Plans for the narrowed clusters only. Their health comes from
            // the dump alone unless `/clusters` was read, which may differ
            // even where the dump does not (EDS DRAINING and UNHEALTHY read
            // the same there): then the patch is built, and the caller
            // publishes it only if the snapshot's bytes change.
            if !work.dump_changed && !work.live_read {
                return Outcome::Unchanged(work);
            }
            // The full refresh after a patch compares against nothing.
            self.last_live = None;
            return Outcome::Patch(build_plans(dump, live.as_ref(), config), work);
        }
        let unchanged = !work.dump_changed && self.last_live.is_some() && self.last_live == live;
        if unchanged {
            return Outcome::Unchanged(work);
        }
        let plans = build_plans(dump, live.as_ref(), config);
        self.last_live = live;
        Outcome::Plans(plans, work)
    }

    /// The next poll reads everything (a patch could not be applied).
    pub fn forget_view(&mut self) {
        self.last_dump = None;
        self.last_live = None;
        self.gate = ChangeGate::default();
    }

    /// Logs a refresh failure once until it changes or recovers.
    fn fail(&mut self, why: String) -> Outcome {
        if self.last_error.as_deref() != Some(why.as_str()) {
            log::warn!("admin refresh failed, keeping the last good snapshot: {why}");
            self.last_error = Some(why);
        }
        self.pending = None;
        self.gate.refresh_failed();
        Outcome::Failed
    }

    /// Logs why the gate is off once until it changes or the gate works again.
    fn note_gate_problem(&mut self, problem: Option<String>) {
        match problem {
            Some(why) if self.gate_problem.as_deref() != Some(why.as_str()) => {
                log::warn!("admin stats gate off, doing a full refresh: {why}");
                self.gate_problem = Some(why);
            }
            Some(_) => {}
            None => {
                if self.gate_problem.take().is_some() {
                    log::info!("admin stats gate back on");
                }
            }
        }
    }

    fn log_notes(&mut self, notes: &[String]) {
        if self.logged_notes.len() > MAX_LOGGED_NOTES {
            self.logged_notes.clear();
        }
        for note in notes {
            if self.logged_notes.insert(note.clone()) {
                log::warn!("{note}");
            }
        }
    }
}

fn read_body(
    admin: &impl AdminApi,
    what: &str,
    config: &PluginConfig,
    num_headers: usize,
    body_size: usize,
) -> Result<Vec<u8>, String> {
    let status = if num_headers == 0 {
        None
    } else {
        admin.response_status()
    };
    check_admin_response(
        what,
        status.as_deref(),
        body_size,
        config.max_admin_body_bytes,
    )
    .map_err(|e| e.to_string())?;
    if body_size == 0 {
        return Ok(Vec::new());
    }
    admin
        .response_body(body_size)
        .ok_or_else(|| format!("{what}: cannot read the body"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serving_picker_core::contract::Tier;

    /// Envoy's admin API with canned answers: records what is asked.
    #[derive(Default)]
    struct FakeAdmin {
        /// Paths asked, in order (the token of the i-th is i + 1).
        asked: Vec<String>,
        /// `get` fails (no such cluster).
        refuse: bool,
        /// The answer being read: `:status` and body.
        answer: (Option<Vec<u8>>, Vec<u8>),
    }

    impl AdminApi for FakeAdmin {
        fn get(
            &mut self,
            cluster: &str,
            path: &str,
            _timeout: Duration,
        ) -> Result<u32, CallRefused> {
            assert_eq!(cluster, "envoy_admin");
            if self.refuse {
                return Err(CallRefused("BadArgument".into()));
            }
            self.asked.push(path.to_string());
            Ok(self.asked.len() as u32)
        }
        fn response_status(&self) -> Option<Vec<u8>> {
            self.answer.0.clone()
        }
        fn response_body(&self, size: usize) -> Option<Vec<u8>> {
            self.answer.1.get(..size).map(<[u8]>::to_vec)
        }
        fn now_us(&self) -> u64 {
            0
        }
    }

    /// A refresher, its admin API and the clock.
    struct Leader {
        refresher: Refresher,
        admin: FakeAdmin,
        config: PluginConfig,
        now_ms: u64,
    }

    impl Leader {
        fn new(config: PluginConfig) -> Leader {
            Leader {
                refresher: Refresher::default(),
                admin: FakeAdmin::default(),
                config,
                now_ms: 1_000_000,
            }
        }

        fn poll(&mut self) -> Start {
            self.refresher
                .poll(&mut self.admin, &self.config, self.now_ms, true)
        }

        fn last_asked(&self) -> &str {
            self.admin.asked.last().map_or("", String::as_str)
        }

        /// The last call's answer: HTTP 200 with `body`.
        fn answer(&mut self, body: &str) -> Outcome {
            self.answer_with(Some(b"200"), body.as_bytes())
        }

        /// `status: None` is a call that failed (no headers).
        fn answer_with(&mut self, status: Option<&[u8]>, body: &[u8]) -> Outcome {
            self.admin.answer = (status.map(<[u8]>::to_vec), body.to_vec());
            let token = self.admin.asked.len() as u32;
            let headers = usize::from(status.is_some());
            self.refresher.on_response(
                &mut self.admin,
                &self.config,
                token,
                headers,
                body.len(),
                self.now_ms,
                0,
            )
        }

        /// A whole first refresh: stats (when the gate is on), dump, live
        /// health; the plans published.
        fn first_refresh(&mut self, stats: &str, dump: &str, live: &str) -> Vec<ClusterPlan> {
            assert_eq!(self.poll(), Start::Started);
            if ChangeGate::enabled(&self.config) {
                assert_eq!(self.last_asked(), self.config.admin_stats_path);
                assert!(matches!(self.answer(stats), Outcome::Nothing));
            }
            assert_eq!(self.last_asked(), self.config.admin_path);
            assert!(matches!(self.answer(dump), Outcome::Nothing));
            assert_eq!(self.last_asked(), self.config.admin_health_path);
            match self.answer(live) {
                Outcome::Plans(plans, work) => {
                    assert!(work.live_read && work.dump_changed);
                    assert_eq!(work.admin_bytes, dump.len() + live.len());
                    plans
                }
                other => panic!("{}", name(&other)),
            }
        }
    }

    fn name(o: &Outcome) -> &'static str {
        match o {
            Outcome::Nothing => "Nothing",
            Outcome::Plans(..) => "Plans",
            Outcome::Patch(..) => "Patch",
            Outcome::Unchanged(_) => "Unchanged",
            Outcome::Skipped => "Skipped",
            Outcome::Failed => "Failed",
        }
    }

    /// A config dump: clusters of (name, [(last address byte, EDS status)]),
    /// every host serving by metadata unless its status says otherwise.
    fn dump(clusters: &[(&str, &[(u8, &str)])]) -> String {
        let entries: Vec<String> = clusters
            .iter()
            .map(|(name, hosts)| {
                let lbs: Vec<String> = hosts
                    .iter()
                    .map(|(ip, health)| {
                        format!(
                            r#"{{"endpoint":{{"address":{{"socket_address":{{"address":"10.0.0.{ip}","port_value":80}}}}}},"health_status":"{health}"}}"#
                        )
                    })
                    .collect();
                format!(
                    r#"{{"endpoint_config":{{"cluster_name":"{name}","endpoints":[{{"lb_endpoints":[{}]}}]}}}}"#,
                    lbs.join(",")
                )
            })
            .collect();
        format!(
            r#"{{"configs":[{{"static_endpoint_configs":[{}]}}]}}"#,
            entries.join(",")
        )
    }

    /// `/clusters?format=json` naming these clusters, hosts healthy.
    fn live(clusters: &[(&str, &[u8])]) -> String {
        let statuses: Vec<String> = clusters
            .iter()
            .map(|(name, hosts)| {
                let hosts: Vec<String> = hosts
                    .iter()
                    .map(|ip| {
                        format!(
                            r#"{{"address":{{"socket_address":{{"address":"10.0.0.{ip}","port_value":80}}}},"health_status":{{"eds_health_status":"HEALTHY"}}}}"#
                        )
                    })
                    .collect();
                format!(
                    r#"{{"name":"{name}","host_statuses":[{}]}}"#,
                    hosts.join(",")
                )
            })
            .collect();
        format!(r#"{{"cluster_statuses":[{}]}}"#, statuses.join(","))
    }

    /// A stats answer: each cluster's membership_total (sorted, as Envoy's).
    fn stats(clusters: &[(&str, u32)]) -> String {
        clusters
            .iter()
            .map(|(name, n)| format!("cluster.{name}.membership_total: {n}\n"))
            .collect()
    }

    const THREE: [(&str, &[(u8, &str)]); 3] = [
        ("a", &[(1, "HEALTHY")]),
        ("b", &[(2, "HEALTHY")]),
        ("c", &[(3, "HEALTHY")]),
    ];
    const THREE_LIVE: [(&str, &[u8]); 3] = [("a", &[1]), ("b", &[2]), ("c", &[3])];

    fn three() -> Leader {
        let mut l = Leader::new(PluginConfig::default());
        let plans = l.first_refresh(
            &stats(&[("a", 1), ("b", 1), ("c", 1)]),
            &dump(&THREE),
            &live(&THREE_LIVE),
        );
        let names: Vec<&str> = plans.iter().map(|p| p.cluster.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(plans.iter().all(|p| p.tier == Tier::Ready));
        l
    }

    #[test]
    fn first_refresh_reads_stats_dump_and_live_health() {
        let l = three();
        assert_eq!(l.admin.asked.len(), 3);
        assert!(!l.refresher.failing());
    }

    #[test]
    fn unmoved_stats_skip_the_dump() {
        let mut l = three();
        l.now_ms += 1000;
        assert_eq!(l.poll(), Start::Started);
        let asked = l.admin.asked.len();
        let out = l.answer(&stats(&[("a", 1), ("b", 1), ("c", 1)]));
        assert!(matches!(out, Outcome::Skipped), "{}", name(&out));
        assert_eq!(l.admin.asked.len(), asked, "no dump asked");
        // Past full_refresh_interval_ms the dump is read whatever the stats say.
        l.now_ms += l.config.full_refresh_interval_ms;
        assert_eq!(l.poll(), Start::Started);
        l.answer(&stats(&[("a", 1), ("b", 1), ("c", 1)]));
        assert_eq!(l.last_asked(), l.config.admin_path);
        // Same endpoints, every host settled by the dump: no `/clusters`.
        let out = l.answer(&dump(&THREE));
        assert!(matches!(out, Outcome::Unchanged(_)), "{}", name(&out));
    }

    #[test]
    fn stats_of_one_cluster_narrow_the_dump_to_it() {
        let mut l = three();
        l.now_ms += 1000;
        l.poll();
        l.answer(&stats(&[("a", 2), ("b", 1), ("c", 1)]));
        assert_eq!(
            l.last_asked(),
            format!("{}&name_regex=%5E%28a%29%24", l.config.admin_path)
        );
        let out = l.answer(&dump(&[("a", &[(1, "HEALTHY"), (4, "UNHEALTHY")])]));
        // A host the dump calls UNHEALTHY: `/clusters` tells why.
        assert_eq!(l.last_asked(), l.config.admin_health_path);
        assert!(matches!(out, Outcome::Nothing));
        match l.answer(&live(&[("a", &[1, 4]), ("b", &[2]), ("c", &[3])])) {
            Outcome::Patch(plans, work) => {
                assert_eq!(work.narrowed_to, Some(1));
                assert_eq!(plans.len(), 1);
                assert_eq!(plans[0].cluster, "a");
            }
            other => panic!("{}", name(&other)),
        }
        // A narrowed answer that brings another cluster: everything is asked.
        l.now_ms += 1000;
        l.poll();
        l.answer(&stats(&[("a", 3), ("b", 1), ("c", 1)]));
        assert!(l.last_asked().contains("name_regex"));
        let out = l.answer(&dump(&[("a", &[(1, "HEALTHY")]), ("b", &[(2, "HEALTHY")])]));
        assert!(matches!(out, Outcome::Nothing));
        assert_eq!(l.last_asked(), l.config.admin_path);
    }

    #[test]
    fn failures_keep_the_last_snapshot_until_a_refresh_succeeds() {
        let mut l = three();
        l.now_ms += 1000;
        l.poll();
        // The stats call failed (no headers to read): the gate is off for
        // this poll, the dump is asked for.
        assert!(matches!(l.answer_with(None, b""), Outcome::Nothing));
        assert_eq!(l.last_asked(), l.config.admin_path);
        assert!(matches!(l.answer_with(None, b""), Outcome::Failed));
        assert!(l.refresher.failing());
        l.now_ms += 1000;
        l.poll();
        l.answer(&stats(&[("a", 2), ("b", 1), ("c", 1)]));
        let out = l.answer_with(Some(b"503"), b"busy");
        assert!(matches!(out, Outcome::Failed));
        assert!(l.refresher.failing());
        // The gate recorded nothing from the failures: the next stats move
        // on from the last good ones, and the refresh recovers.
        l.now_ms += 1000;
        l.poll();
        l.answer(&stats(&[("a", 1), ("b", 1), ("c", 2)]));
        let out = l.answer(&dump(&[("c", &[(3, "HEALTHY"), (5, "HEALTHY")])]));
        assert!(matches!(out, Outcome::Patch(..)), "{}", name(&out));
        assert!(!l.refresher.failing());
    }

    #[test]
    fn answers_too_large_or_unreadable_fail() {
        let mut config = PluginConfig::default();
        config.admin_stats_path.clear();
        config.max_admin_body_bytes = 10;
        let mut l = Leader::new(config);
        l.poll();
        assert_eq!(l.last_asked(), l.config.admin_path);
        assert!(matches!(l.answer(&dump(&THREE)), Outcome::Failed));
        l.config.max_admin_body_bytes = 1 << 20;
        l.now_ms += 1000;
        l.poll();
        assert!(matches!(l.answer("{not json"), Outcome::Failed));
    }

    #[test]
    fn a_call_without_answer_is_dropped_after_two_timeouts() {
        let mut l = Leader::new(PluginConfig::default());
        assert_eq!(l.poll(), Start::Started);
        l.now_ms += l.config.admin_timeout_ms;
        assert_eq!(l.poll(), Start::Busy);
        l.now_ms += l.config.admin_timeout_ms + l.config.refresh_interval_ms;
        assert_eq!(l.poll(), Start::Failed);
        assert!(l.refresher.failing());
        assert_eq!(l.poll(), Start::Started);
        // An answer to a call that is not the one under way is not ours.
        let out = l
            .refresher
            .on_response(&mut l.admin, &l.config, 99, 1, 0, l.now_ms, 0);
        assert!(matches!(out, Outcome::Nothing));
    }

    #[test]
    fn no_admin_cluster_fails_the_poll() {
        let mut l = Leader::new(PluginConfig::default());
        l.admin.refuse = true;
        assert_eq!(l.poll(), Start::Failed);
        assert!(l.refresher.failing());
        assert!(l.admin.asked.is_empty());
    }

    #[test]
    fn without_the_gate_full_refreshes_space_out_by_their_duration() {
        let mut config = PluginConfig::default();
        config.admin_stats_path.clear();
        let mut l = Leader::new(config);
        let start = l.now_ms;
        assert_eq!(l.poll(), Start::Started);
        l.answer(&dump(&THREE));
        // The whole refresh took 100 ms (admin rendering included).
        l.now_ms += 100;
        assert!(matches!(l.answer(&live(&THREE_LIVE)), Outcome::Plans(..)));
        assert_eq!(l.refresher.last_took_ms(), 100);
        l.now_ms = start + 100 * ADMIN_SHARE_DIVISOR - 1;
        assert_eq!(l.poll(), Start::NotDue);
        l.now_ms = start + 100 * ADMIN_SHARE_DIVISOR;
        assert_eq!(l.poll(), Start::Started);
        // Same dump, health settled by it: nothing changed.
        let out = l.answer(&dump(&THREE));
        assert!(matches!(out, Outcome::Unchanged(_)), "{}", name(&out));
    }

    #[test]
    fn stats_that_hide_a_cluster_turn_the_gate_off() {
        let mut l = three();
        l.now_ms += 1000;
        l.poll();
        // No line for cluster c (a stats_matcher drops it): full refresh.
        l.answer(&stats(&[("a", 1), ("b", 1)]));
        assert_eq!(l.last_asked(), l.config.admin_path);
        assert!(l.refresher.gate_problem.is_some());
    }
}
