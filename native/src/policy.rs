//! The policy instance: what the hooks do, in plain Rust.
//!
//! `PolicyConfig` is one cluster's configuration (the parsed JSON, the
//! metric ids, which LB instance reports for the cluster); `LbInstance` is a
//! worker's (or the main thread's) load balancer for that cluster: its
//! table, rebuilt on every host change, read per request. Envoy reaches
//! them through three small traits, so that they are tested natively
//! against fakes (`testing`): `Proxy` (logs, metrics, the thread's CPU
//! clock), `table::HostSource` (the cluster's hosts) and `Request` (one
//! request's retry state). `envoy_host` implements them over the ABI.
//!
//! Threading (checked on Envoy 1.38 to 1.40): config new/destroy run on the
//! main thread; each cluster has one LB instance per worker plus one on the
//! main thread, and each instance's hooks run on its own thread only. An
//! instance's state is therefore in `RefCell`s, not locks. Host metadata is
//! read through Envoy by the main thread's instance only and shared through
//! the configuration's `MetadataBoard` (why: `metadata_board`).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, ThreadId};
use std::time::Instant;

use serving_picker_core::contract::Tier;
use serving_picker_core::plan::Topology;

use crate::config::{self, NativeConfig, POLICY_NAME};
use crate::metadata_board::{self, BoardSource, MetadataBoard};
use crate::metrics::{Metric, NotOffered};
use crate::table::{self, Choice, HostSource, Slot, Table};

/// Log levels the policy uses (Envoy's `dynamic_modules` logger).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Per-event detail.
    Debug,
    /// Start-up and changes worth a line.
    Info,
    /// Something is off; the policy goes on.
    Warn,
    /// The policy cannot do what it was asked.
    Error,
}

/// Envoy's side of a policy configuration: its log, the metrics defined on
/// the configuration (from any thread), and the calling thread's CPU clock.
pub trait Proxy: Send + Sync {
    /// Logs `message` at `level`.
    fn log(&self, level: Level, message: &str);
    /// Whether a line at `level` would be printed (skip building it if not).
    fn log_enabled(&self, level: Level) -> bool;
    /// Defines an unlabelled counter (configuration time only); its id.
    fn define_counter(&self, name: &str) -> Option<usize>;
    /// Defines an unlabelled gauge (configuration time only); its id.
    fn define_gauge(&self, name: &str) -> Option<usize>;
    /// Adds `by` to counter `id`.
    fn increment_counter(&self, id: usize, by: u64);
    /// Sets gauge `id` to `value`.
    fn set_gauge(&self, id: usize, value: u64);
    /// Moves gauge `id` by `delta`, up or down.
    fn add_gauge(&self, id: usize, delta: i64);
    /// The calling thread's CPU time in microseconds (0 if unavailable).
    fn thread_cpu_micros(&self) -> u64;
}

/// A shared proxy (tests keep one to read what a refused configuration logged).
impl<P: Proxy + ?Sized> Proxy for Arc<P> {
    fn log(&self, level: Level, message: &str) {
        (**self).log(level, message)
    }
    fn log_enabled(&self, level: Level) -> bool {
        (**self).log_enabled(level)
    }
    fn define_counter(&self, name: &str) -> Option<usize> {
        (**self).define_counter(name)
    }
    fn define_gauge(&self, name: &str) -> Option<usize> {
        (**self).define_gauge(name)
    }
    fn increment_counter(&self, id: usize, by: u64) {
        (**self).increment_counter(id, by)
    }
    fn set_gauge(&self, id: usize, value: u64) {
        (**self).set_gauge(id, value)
    }
    fn add_gauge(&self, id: usize, delta: i64) {
        (**self).add_gauge(id, delta)
    }
    fn thread_cpu_micros(&self) -> u64 {
        (**self).thread_cpu_micros()
    }
}

/// The request a host is chosen for (Envoy's `LoadBalancerContext`).
pub trait Request {
    /// The route's `host_selection_retry_max_attempts` (0 without one).
    fn host_selection_retry_count(&self) -> u32;
    /// Whether the route's retry host predicates (e.g. previous_hosts)
    /// refuse this host.
    fn should_select_another_host(&self, slot: &Slot) -> bool;
}

/// One policy configuration (one per cluster using it).
pub struct PolicyConfig<P: Proxy> {
    config: NativeConfig,
    proxy: P,
    ids: [Option<usize>; Metric::ALL.len()],
    /// The first LB instance of the config reports for the cluster: logs
    /// hosts that are not offered, writes the gauges. One writer, so no
    /// duplicate lines and no races between workers.
    reporter_taken: AtomicBool,
    /// The thread Envoy configured the policy on: its main thread, where
    /// EDS updates replace host metadata.
    main_thread: ThreadId,
    /// The main thread's instance's copy of the hosts' metadata.
    board: MetadataBoard,
}

impl<P: Proxy> PolicyConfig<P> {
    /// Parses the policy configuration and defines the metrics. A refused
    /// configuration is logged (naming the key) and answered with `None`,
    /// which makes Envoy reject the cluster's configuration.
    pub fn new(proxy: P, lb_policy_name: &[u8], raw: &[u8]) -> Option<PolicyConfig<P>> {
        if lb_policy_name != POLICY_NAME.as_bytes() {
            proxy.log(
                Level::Error,
                &format!(
                    "serving_picker: lb_policy_name {:?} refused: this module serves {POLICY_NAME:?}",
                    String::from_utf8_lossy(lb_policy_name)
                ),
            );
            return None;
        }
        let parsed = match config::parse(raw) {
            Ok(c) => c,
            Err(e) => {
                proxy.log(
                    Level::Error,
                    &format!("serving_picker: lb_policy_config refused: {e}"),
                );
                return None;
            }
        };
        let mut ids = [None; Metric::ALL.len()];
        for m in Metric::ALL {
            let id = if m.is_gauge() {
                proxy.define_gauge(m.name())
            } else {
                proxy.define_counter(m.name())
            };
            if id.is_none() {
                proxy.log(
                    Level::Warn,
                    &format!("serving_picker: could not define metric {}", m.name()),
                );
            }
            if let Some(slot) = ids.get_mut(m.index()) {
                *slot = id;
            }
        }
        proxy.log(
            Level::Info,
            &format!(
                "serving_picker: policy configured: metadata_namespace {:?}, local_zone {:?}, local_zone_min_share {}",
                parsed.selection.metadata_namespace,
                parsed.selection.local_zone,
                parsed.selection.local_zone_min_share
            ),
        );
        Some(PolicyConfig {
            config: parsed,
            proxy,
            ids,
            reporter_taken: AtomicBool::new(false),
            main_thread: thread::current().id(),
            board: MetadataBoard::default(),
        })
    }

    /// Envoy's side of this configuration (its log and metrics).
    pub fn proxy(&self) -> &P {
        &self.proxy
    }

    fn count(&self, m: Metric, by: u64) {
        if let Some(Some(id)) = self.ids.get(m.index()) {
            self.proxy.increment_counter(*id, by);
        }
    }

    fn gauge_set(&self, m: Metric, v: u64) {
        if let Some(Some(id)) = self.ids.get(m.index()) {
            self.proxy.set_gauge(*id, v);
        }
    }

    fn gauge_add(&self, m: Metric, delta: i64) {
        if let (Some(Some(id)), true) = (self.ids.get(m.index()), delta != 0) {
            self.proxy.add_gauge(*id, delta);
        }
    }
}

/// One LB instance: a worker's (or the main thread's) table for one cluster.
pub struct LbInstance<P: Proxy> {
    config: Arc<PolicyConfig<P>>,
    cluster: String,
    /// The main thread's instance reads metadata through Envoy and publishes
    /// it; the others build from the published copy.
    reads_metadata: bool,
    state: RefCell<State>,
    reporter: Option<RefCell<Reporter>>,
}

/// What the reporting instance remembers between rebuilds.
#[derive(Default)]
struct Reporter {
    not_offered: NotOffered,
    /// The tier last logged (a line when it changes).
    tier: Option<Tier>,
    /// The draining hosts last logged (a line when they change).
    draining: Vec<String>,
}

#[derive(Default)]
struct State {
    table: Table,
    sequence: u64,
    /// The board's generation the table was built at.
    board_generation: u64,
}

impl<P: Proxy> LbInstance<P> {
    /// A new instance for `cluster`, its table built from `hosts`. The
    /// config's first instance reports for the cluster.
    pub fn new(config: Arc<PolicyConfig<P>>, cluster: String, hosts: &impl HostSource) -> Self {
        let on_main_thread = thread::current().id() == config.main_thread;
        Self::with_role(config, cluster, hosts, on_main_thread)
    }

    /// An instance that reads metadata through Envoy (`reads_metadata`: the
    /// main thread's) or from the main thread's copy.
    pub fn with_role(
        config: Arc<PolicyConfig<P>>,
        cluster: String,
        hosts: &impl HostSource,
        reads_metadata: bool,
    ) -> Self {
        let reporter = !config.reporter_taken.swap(true, Ordering::AcqRel);
        let instance = LbInstance {
            config,
            cluster,
            reads_metadata,
            state: RefCell::new(State::default()),
            reporter: reporter.then(|| RefCell::new(Reporter::default())),
        };
        instance.rebuild(hosts, "lb_new");
        instance
    }

    /// Envoy's hosts changed (`added`/`removed` are 0 for metadata, weight
    /// and health changes): the table is rebuilt whole.
    pub fn on_membership_update(&self, hosts: &impl HostSource, added: usize, removed: usize) {
        let why = if added == 0 && removed == 0 {
            "update".to_string()
        } else {
            format!("+{added} -{removed}")
        };
        self.rebuild(hosts, &why);
    }

    fn rebuild(&self, hosts: &impl HostSource, why: &str) {
        let cfg = &*self.config;
        let proxy = &cfg.proxy;
        let start = Instant::now();
        let cpu_start = proxy.thread_cpu_micros();
        let (built, board_generation) = self.build(hosts);
        let micros = start.elapsed().as_micros() as u64;
        let cpu_micros = proxy.thread_cpu_micros().saturating_sub(cpu_start);
        cfg.count(Metric::Rebuilds, 1);
        let (tier, picks) = (built.table.tier, built.table.len());
        match self.state.try_borrow_mut() {
            Ok(mut st) => {
                st.table = built.table;
                st.board_generation = board_generation;
            }
            Err(_) => return,
        }
        if let Some(rep) = &self.reporter {
            if let Ok(mut rep) = rep.try_borrow_mut() {
                let change = rep.not_offered.update(&built.not_offered);
                for addr in &change.new {
                    proxy.log(
                        Level::Warn,
                        &format!(
                            "serving_picker: cluster {}: host {addr} is serving by its metadata but Envoy does not offer it as healthy (EDS DRAINING/UNHEALTHY/DEGRADED, failed health check or outlier ejection): it cannot be picked",
                            self.cluster
                        ),
                    );
                }
                for addr in &change.recovered {
                    proxy.log(
                        Level::Info,
                        &format!(
                            "serving_picker: cluster {}: host {addr} is offered again (or gone)",
                            self.cluster
                        ),
                    );
                }
                cfg.gauge_add(Metric::HostsServingNotOffered, change.delta());
                // The tier, when it changes (not for the empty start-up table).
                if rep.tier != Some(tier) && (built.hosts > 0 || rep.tier.is_some()) {
                    rep.tier = Some(tier);
                    proxy.log(
                        Level::Info,
                        &format!(
                            "serving_picker: cluster {}: tier {} with {picks} pickable host(s) of {} ({why})",
                            self.cluster,
                            tier.name(),
                            built.hosts
                        ),
                    );
                }
            }
            self.publish_drain(&built.draining);
            cfg.gauge_set(Metric::RebuildMicros, micros);
            if built.unreadable > 0 {
                proxy.log(
                    Level::Warn,
                    &format!(
                        "serving_picker: cluster {}: {} host(s) without a readable address skipped",
                        self.cluster, built.unreadable
                    ),
                );
            }
        }
        if proxy.log_enabled(Level::Debug) {
            proxy.log(
                Level::Debug,
                &format!(
                    "serving_picker: cluster {}: rebuilt ({why}): tier {}, {picks} pickable of {} hosts, {} serving but not offered, {micros} us ({cpu_micros} us CPU)",
                    self.cluster,
                    tier.name(),
                    built.hosts,
                    built.not_offered.len()
                ),
            );
        }
    }

    /// Plans the cluster with the metadata of the board: the main thread's
    /// instance reads it through Envoy and publishes it first. Before the
    /// main thread has published, a worker reads through Envoy (there is no
    /// copy yet). Also answers the board's generation the table is built at.
    fn build(&self, hosts: &impl HostSource) -> (table::Built, u64) {
        let cfg = &*self.config;
        let selection = &cfg.config.selection;
        if self.reads_metadata {
            let snapshot = Arc::new(metadata_board::read(
                hosts,
                &self.cluster,
                &selection.metadata_namespace,
                table::metadata_keys(selection),
            ));
            cfg.count(Metric::MetadataValuesNotKept, snapshot.dropped_values);
            if snapshot.dropped_values > 0 && cfg.proxy.log_enabled(Level::Debug) {
                cfg.proxy.log(
                    Level::Debug,
                    &format!(
                        "serving_picker: cluster {}: {} metadata string(s) over {} bytes (or past {} bytes in all) read as absent",
                        self.cluster,
                        snapshot.dropped_values,
                        metadata_board::MAX_VALUE_BYTES,
                        metadata_board::MAX_BOARD_BYTES
                    ),
                );
            }
            cfg.board.publish(Arc::clone(&snapshot));
            cfg.count(Metric::MetadataCopies, 1);
            let built = table::build(&BoardSource::new(hosts, &snapshot), selection);
            return (built, cfg.board.generation());
        }
        match cfg.board.latest(&self.cluster) {
            (generation, Some(snapshot)) => {
                let source = BoardSource::new(hosts, &snapshot);
                let built = table::build(&source, selection);
                let unknown = source.unknown_hosts();
                if unknown > 0 {
                    cfg.count(Metric::MetadataHostsNotYetRead, unknown as u64);
                }
                (built, generation)
            }
            (generation, None) => {
                cfg.count(Metric::MetadataReadByWorker, 1);
                (table::build(hosts, selection), generation)
            }
        }
    }

    /// A worker's table built before the main thread's latest copy.
    fn behind_the_board(&self) -> bool {
        !self.reads_metadata
            && self
                .state
                .try_borrow()
                .is_ok_and(|st| st.board_generation != self.config.board.generation())
    }

    /// The reporting instance publishes the cluster's draining hosts to the drain filter's
    /// board (`drain`), with the window (`drain_window_ms`; without it, nothing drains), and
    /// logs when they change.
    fn publish_drain(&self, draining: &[String]) {
        let cfg = &*self.config;
        let window = cfg.config.drain.map(|d| d.window_ms);
        crate::drain::publish(self.owner(), &self.cluster, window, draining);
        let Some(window) = window else {
            return;
        };
        let Some(Ok(mut rep)) = self.reporter.as_ref().map(|r| r.try_borrow_mut()) else {
            return;
        };
        if rep.draining != draining {
            rep.draining = draining.to_vec();
            cfg.proxy.log(
                Level::Info,
                &format!(
                    "serving_picker: cluster {}: {} host(s) drain ({}): their open streams end within {window} ms",
                    self.cluster,
                    draining.len(),
                    draining.join(", ")
                ),
            );
        }
    }

    /// This instance's configuration, as the drain board's owner key.
    fn owner(&self) -> usize {
        Arc::as_ptr(&self.config) as usize
    }

    /// The host for one request: (priority, index into that priority's
    /// healthy hosts), or `None` when nothing serves (Envoy answers 503 UH).
    /// A worker whose table predates the main thread's latest metadata copy
    /// rebuilds first (once per copy).
    pub fn choose(
        &self,
        hosts: &impl HostSource,
        request: Option<&impl Request>,
    ) -> Option<(u32, u32)> {
        if self.behind_the_board() {
            self.rebuild(hosts, "metadata");
        }
        let cfg = &*self.config;
        let Ok(mut st) = self.state.try_borrow_mut() else {
            return None;
        };
        let sequence = st.sequence;
        st.sequence = sequence.wrapping_add(1);
        let attempts = request.map_or(0, |r| r.host_selection_retry_count());
        let choice = st.table.choose(sequence, attempts, |slot| {
            request.is_some_and(|r| r.should_select_another_host(slot))
        });
        match choice {
            Choice::Host { slot, tier, moved } => {
                cfg.count(
                    match tier {
                        Tier::TerminatingFallback => Metric::PickTerminatingFallback,
                        _ => Metric::PickReady,
                    },
                    1,
                );
                cfg.count(
                    match st.table.topology {
                        Topology::None => Metric::PickTopologyNone,
                        Topology::Node => Metric::PickTopologyNode,
                        Topology::Zone => Metric::PickTopologyZone,
                    },
                    1,
                );
                if moved {
                    cfg.count(Metric::RetryOtherHost, 1);
                }
                Some((slot.priority, slot.healthy_index))
            }
            Choice::NoServing => {
                cfg.count(Metric::RejectNoServing, 1);
                None
            }
        }
    }
}

impl<P: Proxy> Drop for LbInstance<P> {
    fn drop(&mut self) {
        // The cluster's share of the gauge goes with its reporter, and its drain entry.
        if self.reporter.is_some() {
            crate::drain::forget(self.owner(), &self.cluster);
        }
        if let Some(rep) = &self.reporter {
            if let Ok(rep) = rep.try_borrow() {
                self.config.gauge_add(
                    Metric::HostsServingNotOffered,
                    -(rep.not_offered.len() as i64),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::testing::{FakeCluster, FakeHost, FakeRequest, RecordingProxy};

    const A: &str = "10.0.0.1:80";
    const B: &str = "10.0.0.2:80";

    fn ready(a: &str) -> FakeHost {
        FakeHost::new(a).conditions(true, true, false)
    }

    fn cluster(hosts: Vec<FakeHost>) -> FakeCluster {
        FakeCluster {
            priorities: vec![hosts],
        }
    }

    fn config(json: &str) -> Arc<PolicyConfig<RecordingProxy>> {
        Arc::new(
            PolicyConfig::new(
                RecordingProxy::default(),
                b"serving_picker",
                json.as_bytes(),
            )
            .unwrap(),
        )
    }

    fn no_request() -> Option<&'static FakeRequest> {
        None
    }

    #[test]
    fn the_reporter_publishes_draining_hosts_only_with_a_window() {
        let terminating = |a: &str| FakeHost::new(a).conditions(false, true, true);
        let row5 = cluster(vec![terminating(A), ready(B)]);
        let row3 = cluster(vec![terminating(A)]);
        // With drain_window_ms: A drains in row 5, not in row 3; the log says so once.
        let cfg = config(r#"{"drain_window_ms": 5000}"#);
        let lb = LbInstance::new(cfg.clone(), "drain-policy-test".into(), &row3);
        assert!(crate::drain::board().configured("drain-policy-test"));
        assert!(!crate::drain::board().draining("drain-policy-test", A));
        lb.on_membership_update(&row5, 0, 0);
        lb.on_membership_update(&row5, 0, 0);
        assert!(crate::drain::board().draining("drain-policy-test", A));
        assert!(!crate::drain::board().draining("drain-policy-test", B));
        let lines = cfg.proxy().lines(Level::Info, "host(s) drain");
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("within 5000 ms") && lines[0].contains(A));
        lb.on_membership_update(&row3, 0, 0);
        assert!(!crate::drain::board().draining("drain-policy-test", A));
        drop(lb);
        assert!(
            !crate::drain::board().configured("drain-policy-test"),
            "forgotten with its reporter"
        );
        // Without it: nothing is published.
        let lb = LbInstance::new(config("{}"), "drain-policy-off".into(), &row5);
        assert!(!crate::drain::board().configured("drain-policy-off"));
        drop(lb);
    }

    #[test]
    fn configuration_defines_every_metric_and_logs_the_keys() {
        let cfg = config(r#"{"local_zone": "zone-a"}"#);
        let p = cfg.proxy();
        assert_eq!(p.recorded().defined.len(), Metric::ALL.len());
        let lines = p.lines(Level::Info, "policy configured");
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].contains(r#"local_zone Some("zone-a")"#),
            "{lines:?}"
        );
    }

    #[test]
    fn refusals_are_logged_and_answered_with_none() {
        let p = Arc::new(RecordingProxy::default());
        assert!(PolicyConfig::new(p.clone(), b"round_robin", b"").is_none());
        let refused = p.lines(Level::Error, "lb_policy_name \"round_robin\" refused");
        assert_eq!(refused.len(), 1, "{:?}", p.recorded().logs);
        assert!(PolicyConfig::new(p.clone(), b"serving_picker", br#"{"bogus": 1}"#).is_none());
        let refused = p.lines(Level::Error, "lb_policy_config refused");
        assert!(refused[0].contains("bogus"), "{refused:?}");
        // Nothing defined for a refused configuration.
        assert!(p.recorded().defined.is_empty());
        // A metric Envoy will not define: a warning, and the rest works.
        let p = RecordingProxy::refusing(&[Metric::Rebuilds.name()]);
        let cfg = PolicyConfig::new(p, b"serving_picker", b"").unwrap();
        let warned = cfg.proxy().lines(Level::Warn, "could not define metric");
        assert_eq!(warned.len(), 1, "{warned:?}");
        // Counting a metric Envoy did not define is a no-op, not a panic.
        cfg.count(Metric::Rebuilds, 1);
        assert_eq!(cfg.proxy().value(Metric::Rebuilds.name()), 0);
    }

    #[test]
    fn the_first_instance_reports_and_the_others_do_not() {
        let cfg = config("");
        let hosts = cluster(vec![ready(A), ready(B).not_offered()]);
        let first = LbInstance::new(cfg.clone(), "backend".into(), &hosts);
        let second = LbInstance::new(cfg.clone(), "backend".into(), &hosts);
        assert!(first.reporter.is_some() && second.reporter.is_none());
        let p = cfg.proxy();
        // One warning for B, one tier line, although two instances rebuilt.
        assert_eq!(p.lines(Level::Warn, B).len(), 1);
        assert_eq!(p.lines(Level::Info, "tier ready with 1 pickable").len(), 1);
        assert_eq!(p.value(Metric::Rebuilds.name()), 2);
        assert_eq!(p.value(Metric::HostsServingNotOffered.name()), 1);
        // The reporter leaves: its share of the gauge goes with it.
        drop(second);
        assert_eq!(p.value(Metric::HostsServingNotOffered.name()), 1);
        drop(first);
        assert_eq!(p.value(Metric::HostsServingNotOffered.name()), 0);
    }

    #[test]
    fn tier_changes_and_recoveries_are_logged_once() {
        let cfg = config("");
        let lb = LbInstance::new(cfg.clone(), "backend".into(), &cluster(vec![]));
        let p = cfg.proxy();
        // The empty start-up table logs no tier.
        assert!(p.lines(Level::Info, "tier").is_empty());
        let st = cluster(vec![FakeHost::new(A).conditions(false, true, true)]);
        lb.on_membership_update(&st, 1, 0);
        lb.on_membership_update(&st, 0, 0);
        let tiers = p.lines(Level::Info, "tier terminating_fallback");
        assert_eq!(tiers.len(), 1, "{tiers:?}");
        assert!(tiers[0].contains("(+1 -0)"), "{tiers:?}");
        // A ready host is ejected, then offered again.
        lb.on_membership_update(&cluster(vec![ready(A).not_offered()]), 0, 0);
        lb.on_membership_update(&cluster(vec![ready(A)]), 0, 0);
        assert_eq!(p.lines(Level::Warn, "does not offer it").len(), 1);
        assert_eq!(p.lines(Level::Info, "offered again").len(), 1);
        assert_eq!(p.value(Metric::HostsServingNotOffered.name()), 0);
        assert_eq!(p.lines(Level::Info, "tier no_serving").len(), 1);
        assert_eq!(p.lines(Level::Info, "tier ready").len(), 1);
    }

    #[test]
    fn debug_lines_only_when_envoy_prints_them() {
        let cfg = config("");
        LbInstance::new(cfg.clone(), "c".into(), &cluster(vec![ready(A)]));
        assert!(cfg.proxy().lines(Level::Debug, "rebuilt").is_empty());
        let p = RecordingProxy::at_level(Level::Debug);
        let cfg = Arc::new(PolicyConfig::new(p, b"serving_picker", b"").unwrap());
        LbInstance::new(cfg.clone(), "c".into(), &cluster(vec![ready(A)]));
        let debug = cfg.proxy().lines(Level::Debug, "rebuilt (lb_new)");
        assert_eq!(debug.len(), 1, "{debug:?}");
    }

    #[test]
    fn unreadable_hosts_are_reported() {
        let cfg = config("");
        LbInstance::new(cfg.clone(), "c".into(), &cluster(vec![FakeHost::new("")]));
        let warned = cfg.proxy().lines(Level::Warn, "without a readable address");
        assert_eq!(warned.len(), 1, "{warned:?}");
    }

    #[test]
    fn picks_are_counted_by_tier_and_topology() {
        let cfg = config("");
        let one = cluster(vec![ready(A)]);
        let lb = LbInstance::new(cfg.clone(), "c".into(), &one);
        assert_eq!(lb.choose(&one, no_request()), Some((0, 0)));
        let p = cfg.proxy();
        assert_eq!(p.value(Metric::PickReady.name()), 1);
        assert_eq!(p.value(Metric::PickTopologyNone.name()), 1);
        let st = cluster(vec![FakeHost::new(A).conditions(false, true, true)]);
        lb.on_membership_update(&st, 0, 0);
        assert_eq!(lb.choose(&st, no_request()), Some((0, 0)));
        assert_eq!(p.value(Metric::PickTerminatingFallback.name()), 1);
        let gone = cluster(vec![FakeHost::new(A).conditions(false, false, true)]);
        lb.on_membership_update(&gone, 0, 0);
        assert_eq!(lb.choose(&gone, no_request()), None);
        assert_eq!(p.value(Metric::RejectNoServing.name()), 1);
    }

    /// Envoy's hosts, counting the metadata reads made through them.
    struct CountingMetadata<'a> {
        hosts: &'a FakeCluster,
        reads: std::cell::Cell<usize>,
    }

    impl<'a> CountingMetadata<'a> {
        fn new(hosts: &'a FakeCluster) -> Self {
            CountingMetadata {
                hosts,
                reads: std::cell::Cell::new(0),
            }
        }
    }

    impl HostSource for CountingMetadata<'_> {
        fn priority_count(&self) -> usize {
            self.hosts.priority_count()
        }
        fn host_count(&self, p: u32) -> usize {
            self.hosts.host_count(p)
        }
        fn healthy_count(&self, p: u32) -> usize {
            self.hosts.healthy_count(p)
        }
        fn healthy_address(&self, p: u32, i: usize) -> Option<&str> {
            self.hosts.healthy_address(p, i)
        }
        fn address(&self, p: u32, i: usize) -> Option<&str> {
            self.hosts.address(p, i)
        }
        fn weight(&self, p: u32, i: usize) -> u32 {
            self.hosts.weight(p, i)
        }
        fn health(&self, p: u32, i: usize) -> table::HostHealth {
            self.hosts.health(p, i)
        }
        fn locality_zone(&self, p: u32, i: usize) -> Option<&str> {
            self.hosts.locality_zone(p, i)
        }
        fn metadata_bool(&self, p: u32, i: usize, ns: &str, key: &str) -> Option<bool> {
            self.reads.set(self.reads.get() + 1);
            self.hosts.metadata_bool(p, i, ns, key)
        }
        fn metadata_str(&self, p: u32, i: usize, ns: &str, key: &str) -> Option<&str> {
            self.reads.set(self.reads.get() + 1);
            self.hosts.metadata_str(p, i, ns, key)
        }
    }

    /// Once the main thread's instance has published, a worker reads no metadata through
    /// Envoy: not when it rebuilds, not when it catches up before a pick.
    #[test]
    fn workers_read_metadata_only_from_the_main_threads_copy() {
        let cfg = config("");
        let row5 = cluster(vec![
            FakeHost::new(A).conditions(false, true, true),
            ready(B),
        ]);
        let main = LbInstance::with_role(cfg.clone(), "c".into(), &row5, true);
        let envoy = CountingMetadata::new(&row5);
        let worker = LbInstance::with_role(cfg.clone(), "c".into(), &envoy, false);
        assert_eq!(envoy.reads.get(), 0, "built from the copy");
        assert_eq!(worker.choose(&envoy, no_request()), Some((0, 1)), "B");
        // B stops serving: the worker hears of it first (no copy yet: B reads as before),
        // then the main thread publishes and the worker's next pick catches up.
        let b_gone = cluster(vec![
            FakeHost::new(A).conditions(false, true, true),
            FakeHost::new(B).conditions(false, false, false),
        ]);
        let envoy = CountingMetadata::new(&b_gone);
        worker.on_membership_update(&envoy, 0, 0);
        main.on_membership_update(&b_gone, 0, 0);
        assert_eq!(
            worker.choose(&envoy, no_request()),
            Some((0, 0)),
            "A, the fallback"
        );
        assert_eq!(envoy.reads.get(), 0);
        assert_eq!(cfg.proxy().value(Metric::MetadataHostsNotYetRead.name()), 0);
    }

    /// A worker created before the main thread's instance reads through Envoy (there is no
    /// copy yet) and moves to the copy at its first pick after the publish.
    #[test]
    fn a_worker_before_the_first_copy_reads_through_envoy_then_uses_the_copy() {
        let cfg = config("");
        let hosts = cluster(vec![ready(A)]);
        let envoy = CountingMetadata::new(&hosts);
        let worker = LbInstance::with_role(cfg.clone(), "c".into(), &envoy, false);
        let before = envoy.reads.get();
        assert!(before > 0);
        assert_eq!(worker.choose(&envoy, no_request()), Some((0, 0)));
        let _main = LbInstance::with_role(cfg.clone(), "c".into(), &hosts, true);
        assert_eq!(worker.choose(&envoy, no_request()), Some((0, 0)));
        assert_eq!(envoy.reads.get(), before, "the catch-up read the copy");
        assert_eq!(cfg.proxy().value(Metric::MetadataReadByWorker.name()), 1);
        assert_eq!(cfg.proxy().value(Metric::MetadataCopies.name()), 1);
        assert_eq!(cfg.proxy().value(Metric::Rebuilds.name()), 3);
    }

    /// A host the worker sees before the main thread's copy lists it is not picked, and is
    /// counted; the pick after the copy catches up takes it.
    #[test]
    fn hosts_not_yet_in_the_copy_wait_for_it() {
        let cfg = config("");
        let a_only = cluster(vec![FakeHost::new(A).conditions(false, false, true)]);
        let main = LbInstance::with_role(cfg.clone(), "c".into(), &a_only, true);
        let worker = LbInstance::with_role(cfg.clone(), "c".into(), &a_only, false);
        let with_b = cluster(vec![
            FakeHost::new(A).conditions(false, false, true),
            ready(B),
        ]);
        worker.on_membership_update(&with_b, 1, 0);
        assert_eq!(cfg.proxy().value(Metric::MetadataHostsNotYetRead.name()), 1);
        main.on_membership_update(&with_b, 1, 0);
        assert_eq!(worker.choose(&with_b, no_request()), Some((0, 1)), "B");
    }

    #[test]
    fn retries_move_within_the_tier_and_are_counted() {
        let cfg = config("");
        let hosts = cluster(vec![
            ready(A),
            ready(B),
            FakeHost::new("10.0.0.3:80").conditions(false, false, false),
        ]);
        let lb = LbInstance::new(cfg.clone(), "c".into(), &hosts);
        let retry = FakeRequest {
            retry_count: 3,
            refused_host_indexes: vec![0],
        };
        for _ in 0..6 {
            // A (host 0) refused: always B, healthy index 1.
            assert_eq!(lb.choose(&hosts, Some(&retry)), Some((0, 1)));
        }
        let moved = cfg.proxy().value(Metric::RetryOtherHost.name());
        assert_eq!(moved, 3, "every other pick lands on A first and moves");
        // No retry budget: the predicate is not consulted.
        let no_budget = FakeRequest {
            retry_count: 0,
            refused_host_indexes: vec![0, 1],
        };
        assert!(lb.choose(&hosts, Some(&no_budget)).is_some());
        assert_eq!(cfg.proxy().value(Metric::RetryOtherHost.name()), 3);
    }
}
