//! The change gate: before a refresh the leader reads a small stats answer
//! (`admin_stats_path`: a few gauges and change-only counters per cluster).
//! When it is byte-identical to the one read before the last successful full
//! refresh, and that refresh is younger than `full_refresh_interval_ms`, the
//! snapshot is still right and the config dump (megabytes, rendered on
//! Envoy's main thread) is not asked for.

use crate::config::PluginConfig;
use crate::narrow::{hosts_moved, moved_clusters, KnownClusters, Scope};

/// What to do with this poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing changed since the last full refresh: no dump, no `/clusters`.
    Skip,
    /// Do the full refresh, for this reason (logged at debug).
    Fetch(Reason),
}

/// Why the full refresh is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Nothing recorded yet.
    FirstPoll,
    /// The stats differ from the recorded ones.
    StatsMoved,
    /// `full_refresh_interval_ms` passed since the recorded full refresh.
    Periodic,
    /// The stats could not be read or judged (see `Decision::problem`).
    GateOff,
}

/// The verdict, and why the gate could not judge (to be logged once).
#[derive(Debug, PartialEq, Eq)]
pub struct Decision {
    /// Skip the refresh, or fetch it and why.
    pub verdict: Verdict,
    /// Why the stats could not be judged, when they could not.
    pub problem: Option<String>,
}

/// A stats body, and when the last full refresh read its stats.
struct Reading {
    body: Vec<u8>,
    full_at_ms: u64,
}

/// Remembers the stats read before the last successful full refresh, and decides each poll against
/// them.
#[derive(Default)]
pub struct ChangeGate {
    /// The periodic full refresh comes no sooner than this either (see
    /// `space_periodic`).
    periodic_floor_ms: u64,
    /// Read before the last successful full refresh.
    recorded: Option<Reading>,
    /// Read before the full refresh under way: recorded only if it succeeds,
    /// so that a failed dump is not remembered as done.
    pending: Option<Reading>,
}

impl ChangeGate {
    /// The gate is on: `admin_stats_path` is set (empty turns it off).
    pub fn enabled(config: &PluginConfig) -> bool {
        !config.admin_stats_path.is_empty()
    }

    /// `stats`: the body of a 200 answer, or why there is none (status,
    /// timeout, size). Any problem means a full refresh: the gate is off for
    /// this poll.
    pub fn decide(
        &mut self,
        config: &PluginConfig,
        now_ms: u64,
        stats: Result<Vec<u8>, String>,
    ) -> Decision {
        self.pending = None;
        let checked = stats.and_then(|body| match check_stats_text(&body) {
            Ok(()) => Ok(body),
            Err(e) => Err(e.to_string()),
        });
        let body = match checked {
            Ok(body) => body,
            Err(why) => {
                return Decision {
                    verdict: Verdict::Fetch(Reason::GateOff),
                    problem: Some(why),
                }
            }
        };
        let verdict = match &self.recorded {
            None => Verdict::Fetch(Reason::FirstPoll),
            // The stats cannot see everything (e.g. two hosts swapping health
            // within one poll): a full refresh now and then, whatever they say.
            Some(last)
                if now_ms.saturating_sub(last.full_at_ms)
                    >= config.full_refresh_interval_ms.max(self.periodic_floor_ms) =>
            {
                Verdict::Fetch(Reason::Periodic)
            }
            Some(last) if last.body != body => Verdict::Fetch(Reason::StatsMoved),
            Some(_) => Verdict::Skip,
        };
        if verdict != Verdict::Skip {
            self.pending = Some(Reading {
                body,
                full_at_ms: now_ms,
            });
        }
        Decision {
            verdict,
            problem: None,
        }
    }

    /// The refresh that followed `decide` succeeded: a full one restarts the
    /// timer, a narrowed one (only the clusters whose stats moved) does not.
    pub fn refresh_succeeded(&mut self, full: bool) {
        if let Some(mut reading) = self.pending.take() {
            if let (false, Some(last)) = (full, &self.recorded) {
                reading.full_at_ms = last.full_at_ms;
            }
            self.recorded = Some(reading);
        }
    }

    /// The periodic full refresh is a safety net for what the stats cannot
    /// see; at scale it is the costly part of steady state (Envoy renders
    /// the whole dump on its main thread), so it comes at most once per
    /// `floor_ms` however short `full_refresh_interval_ms` is.
    pub fn space_periodic(&mut self, floor_ms: u64) {
        self.periodic_floor_ms = floor_ms;
    }

    /// After a `StatsMoved` verdict: which clusters' stats moved since the
    /// last refresh.
    pub fn moved(&self, known: &KnownClusters) -> Scope {
        match (&self.recorded, &self.pending) {
            (Some(last), Some(now)) => moved_clusters(&last.body, &now.body, known),
            _ => Scope::All("no earlier stats to compare"),
        }
    }

    /// After a `StatsMoved` verdict: whether more than config-update counters
    /// moved (see `narrow::hosts_moved`).
    pub fn hosts_moved(&self) -> bool {
        match (&self.recorded, &self.pending) {
            (Some(last), Some(now)) => hosts_moved(&last.body, &now.body),
            _ => true,
        }
    }

    /// The full refresh that followed `decide` failed: its stats are dropped.
    pub fn refresh_failed(&mut self) {
        self.pending = None;
    }
}

/// The first of `clusters` (Envoy cluster names) without a
/// `cluster.<name>.membership_total` line in the stats answer: a
/// `stats_matcher` (Istio's keeps only a few prefixes) or a narrowed
/// `admin_stats_path` hides its stats, and the gate would read its changes
/// as "unchanged". Envoy writes `:` as `_` in stat names.
pub fn hidden_cluster<'a>(body: &[u8], clusters: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let text = std::str::from_utf8(body).ok()?;
    let mut shown = crate::admin_json::NameIndex::default();
    for line in text.lines() {
        if let Some(name) = line
            .split_once(": ")
            .and_then(|(stat, _)| stat.strip_prefix("cluster."))
            .and_then(|rest| rest.strip_suffix(".membership_total"))
        {
            shown.insert(name, Default::default());
        }
    }
    let mut sanitized = String::new();
    clusters.into_iter().find(|name| {
        sanitized.clear();
        sanitized.extend(name.chars().map(|c| if c == ':' { '_' } else { c }));
        !shown.contains_key(sanitized.as_str())
    })
}

/// Why a stats answer cannot gate the refresh.
#[derive(Clone, Debug, PartialEq, Eq)]
enum NotStatsText {
    /// No stats at all.
    Empty,
    /// Bytes that are not UTF-8.
    NotUtf8,
    /// A line that is not `name: value` (its first 80 characters).
    NotLines(String),
}

impl std::fmt::Display for NotStatsText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotStatsText::Empty => f.write_str(
                "the stats answer is empty (stats turned off by stats_matcher, or \
                 admin_stats_path selects none): no change gate, every poll is a full refresh",
            ),
            NotStatsText::NotUtf8 => f.write_str("the stats answer is not UTF-8 text"),
            NotStatsText::NotLines(line) => write!(
                f,
                "the stats answer is not `name: value` lines (admin_stats_path must select text stats): {line:?}"
            ),
        }
    }
}

/// Envoy's text stats: one `name: value` line per stat. Anything else (an
/// HTML error page, JSON) would compare as "changed" forever or, worse, as
/// "unchanged": refuse it.
fn check_stats_text(body: &[u8]) -> Result<(), NotStatsText> {
    if body.is_empty() {
        return Err(NotStatsText::Empty);
    }
    let Ok(text) = std::str::from_utf8(body) else {
        return Err(NotStatsText::NotUtf8);
    };
    let stat_line = |line: &str| {
        line.split_once(": ").is_some_and(|(name, _)| {
            !name.is_empty()
                && !name
                    .chars()
                    .any(|c| c.is_whitespace() || "{}[]\"<>".contains(c))
        })
    };
    match text.lines().find(|line| !stat_line(line)) {
        None => Ok(()),
        Some(line) => Err(NotStatsText::NotLines(line.chars().take(80).collect())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATS: &[u8] =
        b"cluster.backend.membership_healthy: 2\ncluster.backend.update_success: 4\n";
    const MOVED: &[u8] =
        b"cluster.backend.membership_healthy: 1\ncluster.backend.update_success: 4\n";

    fn config() -> PluginConfig {
        PluginConfig {
            full_refresh_interval_ms: 10_000,
            ..PluginConfig::default()
        }
    }

    fn ok(body: &[u8]) -> Result<Vec<u8>, String> {
        Ok(body.to_vec())
    }

    const FIRST: Verdict = Verdict::Fetch(Reason::FirstPoll);
    const MOVED_FETCH: Verdict = Verdict::Fetch(Reason::StatsMoved);
    const PERIODIC: Verdict = Verdict::Fetch(Reason::Periodic);
    const GATE_OFF: Verdict = Verdict::Fetch(Reason::GateOff);

    #[test]
    fn clusters_whose_stats_are_hidden() {
        let body = b"cluster.a.membership_total: 1\ncluster.b_c.membership_total: 2\ncluster_manager.active_clusters: 3\n";
        assert_eq!(hidden_cluster(body, ["a", "b:c"].into_iter()), None);
        assert_eq!(hidden_cluster(body, ["a", "d"].into_iter()), Some("d"));
        // Istio's stats_matcher: only the cluster manager's lines.
        let istio = b"cluster_manager.active_clusters: 3\ncluster_manager.cluster_added: 3\n";
        assert_eq!(hidden_cluster(istio, ["a"].into_iter()), Some("a"));
        assert_eq!(hidden_cluster(istio, std::iter::empty()), None);
    }

    /// A gate that recorded `STATS` at time 0.
    fn recorded() -> ChangeGate {
        let mut gate = ChangeGate::default();
        assert_eq!(gate.decide(&config(), 0, ok(STATS)).verdict, FIRST);
        gate.refresh_succeeded(true);
        gate
    }

    #[test]
    fn first_poll_fetches() {
        let d = ChangeGate::default().decide(&config(), 0, ok(STATS));
        assert_eq!(
            d,
            Decision {
                verdict: FIRST,
                problem: None
            }
        );
    }

    #[test]
    fn identical_body_skips() {
        let mut gate = recorded();
        assert_eq!(
            gate.decide(&config(), 100, ok(STATS)).verdict,
            Verdict::Skip
        );
        assert_eq!(
            gate.decide(&config(), 9_999, ok(STATS)).verdict,
            Verdict::Skip
        );
    }

    #[test]
    fn changed_body_fetches() {
        let mut gate = recorded();
        assert_eq!(gate.decide(&config(), 100, ok(MOVED)).verdict, MOVED_FETCH);
        gate.refresh_succeeded(true);
        assert_eq!(
            gate.decide(&config(), 200, ok(MOVED)).verdict,
            Verdict::Skip
        );
        assert_eq!(gate.decide(&config(), 300, ok(STATS)).verdict, MOVED_FETCH);
    }

    #[test]
    fn the_timer_forces_a_full_refresh_and_restarts() {
        let mut gate = recorded();
        assert_eq!(gate.decide(&config(), 10_000, ok(STATS)).verdict, PERIODIC);
        gate.refresh_succeeded(true);
        assert_eq!(
            gate.decide(&config(), 19_999, ok(STATS)).verdict,
            Verdict::Skip
        );
        assert_eq!(gate.decide(&config(), 20_000, ok(STATS)).verdict, PERIODIC);
    }

    #[test]
    fn a_narrowed_refresh_records_the_stats_but_not_the_time() {
        let mut gate = recorded();
        assert_eq!(
            gate.decide(&config(), 5_000, ok(MOVED)).verdict,
            MOVED_FETCH
        );
        gate.refresh_succeeded(false);
        assert_eq!(
            gate.decide(&config(), 6_000, ok(MOVED)).verdict,
            Verdict::Skip
        );
        // The timer still runs from the full refresh at 0.
        assert_eq!(gate.decide(&config(), 10_000, ok(MOVED)).verdict, PERIODIC);
    }

    #[test]
    fn a_costly_full_refresh_spaces_the_timer_out() {
        let mut gate = recorded();
        gate.space_periodic(25_000);
        assert_eq!(
            gate.decide(&config(), 24_999, ok(STATS)).verdict,
            Verdict::Skip
        );
        assert_eq!(gate.decide(&config(), 25_000, ok(STATS)).verdict, PERIODIC);
        // A short floor leaves the configured interval in charge.
        gate.space_periodic(1);
        gate.refresh_succeeded(true);
        assert_eq!(
            gate.decide(&config(), 34_999, ok(STATS)).verdict,
            Verdict::Skip
        );
        assert_eq!(gate.decide(&config(), 35_000, ok(STATS)).verdict, PERIODIC);
    }

    #[test]
    fn the_timer_wins_over_moved_stats() {
        let mut gate = recorded();
        assert_eq!(gate.decide(&config(), 10_000, ok(MOVED)).verdict, PERIODIC);
    }

    #[test]
    fn moved_names_the_clusters_between_the_recorded_and_the_new_stats() {
        let lookup = |name: &str| (name == "backend").then(|| "svc".to_string());
        let known = KnownClusters {
            count: 2,
            listed_as: &lookup,
        };
        let mut gate = recorded();
        assert!(
            matches!(gate.moved(&known), Scope::All(_)),
            "nothing pending"
        );
        assert_eq!(gate.decide(&config(), 100, ok(MOVED)).verdict, MOVED_FETCH);
        assert_eq!(gate.moved(&known), Scope::Only(vec!["svc".to_string()]));
        assert!(matches!(ChangeGate::default().moved(&known), Scope::All(_)));
    }

    #[test]
    fn a_failed_refresh_is_not_recorded() {
        let mut gate = recorded();
        assert_eq!(gate.decide(&config(), 100, ok(MOVED)).verdict, MOVED_FETCH);
        gate.refresh_failed();
        // Still compared with the last success: the change is fetched again.
        assert_eq!(gate.decide(&config(), 200, ok(MOVED)).verdict, MOVED_FETCH);
        // A refresh that failed after the timer fired does not restart it.
        let mut gate = recorded();
        assert_eq!(gate.decide(&config(), 10_000, ok(STATS)).verdict, PERIODIC);
        gate.refresh_failed();
        assert_eq!(gate.decide(&config(), 10_100, ok(STATS)).verdict, PERIODIC);
    }

    #[test]
    fn a_decision_without_its_refresh_records_nothing() {
        // A skip in between drops what a fetch read before it.
        let mut gate = recorded();
        assert_eq!(gate.decide(&config(), 100, ok(MOVED)).verdict, MOVED_FETCH);
        assert_eq!(
            gate.decide(&config(), 200, ok(STATS)).verdict,
            Verdict::Skip
        );
        gate.refresh_succeeded(true);
        assert_eq!(gate.decide(&config(), 300, ok(MOVED)).verdict, MOVED_FETCH);
    }

    #[test]
    fn problems_turn_the_gate_off_for_the_poll() {
        let mut gate = recorded();
        let cases: [(Result<Vec<u8>, String>, &str); 5] = [
            (Err("stats: admin answered HTTP 500".into()), "HTTP 500"),
            (ok(b""), "empty"),
            (ok(b"<html><body>502</body></html>\n"), "not `name: value`"),
            (
                ok(b"{\"stats\":[{\"name\":\"a\",\"value\":1}]}"),
                "not `name: value`",
            ),
            (ok(b"\xff\xfe: 1\n"), "UTF-8"),
        ];
        for (answer, expected) in cases {
            let d = gate.decide(&config(), 100, answer);
            assert_eq!(d.verdict, GATE_OFF, "{expected}");
            let problem = d.problem.unwrap_or_default();
            assert!(problem.contains(expected), "{problem}");
            // The full refresh that follows does not record anything.
            gate.refresh_succeeded(true);
            assert_eq!(
                gate.decide(&config(), 200, ok(STATS)).verdict,
                Verdict::Skip
            );
        }
    }

    #[test]
    fn text_stats_with_text_readouts_are_accepted() {
        let body =
            b"cluster.backend.version_text: \"7\"\ncluster.a.b.c|80||x.svc.update_success: 3\n";
        let d = ChangeGate::default().decide(&config(), 0, ok(body));
        assert_eq!(d.problem, None);
    }

    #[test]
    fn an_empty_path_disables_the_gate() {
        assert!(ChangeGate::enabled(&PluginConfig::default()));
        let off = PluginConfig {
            admin_stats_path: String::new(),
            ..PluginConfig::default()
        };
        assert!(!ChangeGate::enabled(&off));
    }
}
