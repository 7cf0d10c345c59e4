//! Counters and gauges (defined in config_new, shown by Envoy as
//! `dynamicmodulescustom.<name>` in /stats), and the log-once bookkeeping of
//! hosts that are serving but not offered by Envoy.

use std::collections::BTreeSet;

use serving_picker_core::counters;

/// The module's metrics. Counters count across every LB instance (workers
/// and the main thread's); gauges are written by one instance per cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// Requests given a serving, not terminating host.
    PickReady,
    /// Requests given a serving+terminating host (nothing ready).
    PickTerminatingFallback,
    /// Picks by topology mode: no hint in play, node hints, zone hints.
    PickTopologyNone,
    /// Picks among the hosts hinted for this node.
    PickTopologyNode,
    /// Picks among the hosts hinted for this zone.
    PickTopologyZone,
    /// Requests with no serving host: `choose_host` said no (503 UH).
    RejectNoServing,
    /// Retries whose predicate refused the first pick and got another host.
    RetryOtherHost,
    /// Table rebuilds, counted per LB instance (one per worker plus the
    /// main thread's: three per change at `--concurrency 2`).
    Rebuilds,
    /// Gauge: hosts (over all clusters) that metadata calls serving but that
    /// Envoy does not offer as healthy, so they cannot be picked.
    HostsServingNotOffered,
    /// Gauge: microseconds the last rebuild took (any cluster).
    RebuildMicros,
    /// Metadata strings the main thread's copy did not keep (over
    /// `metadata_board::MAX_VALUE_BYTES`, or past the copy's byte bound):
    /// read as absent. Counted per copy.
    MetadataValuesNotKept,
    /// Hosts a worker's rebuild found in Envoy's list but not yet in the
    /// main thread's copy: not picked until the copy lists them.
    MetadataHostsNotYetRead,
    /// Copies of host metadata the main thread's instances published.
    MetadataCopies,
    /// Rebuilds of a worker's instance that read metadata through Envoy
    /// because the main thread had not published a copy yet.
    MetadataReadByWorker,
}

impl Metric {
    /// Every metric, in the order their ids are defined.
    pub const ALL: [Metric; 14] = [
        Metric::PickReady,
        Metric::PickTerminatingFallback,
        Metric::PickTopologyNone,
        Metric::PickTopologyNode,
        Metric::PickTopologyZone,
        Metric::RejectNoServing,
        Metric::RetryOtherHost,
        Metric::Rebuilds,
        Metric::HostsServingNotOffered,
        Metric::RebuildMicros,
        Metric::MetadataValuesNotKept,
        Metric::MetadataHostsNotYetRead,
        Metric::MetadataCopies,
        Metric::MetadataReadByWorker,
    ];

    /// Its stable name (Envoy shows it under `dynamicmodulescustom.`).
    pub fn name(self) -> &'static str {
        match self {
            // The ones the wasm form keeps too: named in the core.
            Metric::PickReady => counters::PICK_READY,
            Metric::PickTerminatingFallback => counters::PICK_TERMINATING_FALLBACK,
            Metric::PickTopologyNone => counters::PICK_TOPOLOGY[0],
            Metric::PickTopologyNode => counters::PICK_TOPOLOGY[1],
            Metric::PickTopologyZone => counters::PICK_TOPOLOGY[2],
            Metric::RejectNoServing => counters::REJECT_NO_SERVING,
            Metric::RetryOtherHost => "serving_picker.retry.other_host",
            Metric::Rebuilds => "serving_picker.rebuilds",
            Metric::HostsServingNotOffered => "serving_picker.hosts.serving_not_offered",
            Metric::RebuildMicros => "serving_picker.rebuild_us",
            Metric::MetadataValuesNotKept => "serving_picker.metadata.values_not_kept",
            Metric::MetadataHostsNotYetRead => "serving_picker.metadata.hosts_not_yet_read",
            Metric::MetadataCopies => "serving_picker.metadata.copies",
            Metric::MetadataReadByWorker => "serving_picker.metadata.read_by_worker",
        }
    }

    /// A gauge (else a counter).
    pub fn is_gauge(self) -> bool {
        matches!(self, Metric::HostsServingNotOffered | Metric::RebuildMicros)
    }

    /// Its place in `ALL` (and in the ids defined on the config).
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The hosts of one cluster currently serving-but-not-offered, so that each
/// is logged once when it leaves Envoy's healthy list and once when it is
/// back (by address: indexes shift between updates).
#[derive(Debug, Default)]
pub struct NotOffered {
    current: BTreeSet<String>,
}

/// What changed since the last update.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct NotOfferedChange {
    /// Hosts that left Envoy's healthy list since the last update.
    pub new: Vec<String>,
    /// Hosts back in it.
    pub recovered: Vec<String>,
}

impl NotOfferedChange {
    /// How the gauge moves: new ones up, recovered ones down.
    pub fn delta(&self) -> i64 {
        self.new.len() as i64 - self.recovered.len() as i64
    }
}

impl NotOffered {
    /// Takes the cluster's serving-but-not-offered hosts now; what changed.
    pub fn update(&mut self, now: &[String]) -> NotOfferedChange {
        let now: BTreeSet<String> = now.iter().cloned().collect();
        let change = NotOfferedChange {
            new: now.difference(&self.current).cloned().collect(),
            recovered: self.current.difference(&now).cloned().collect(),
        };
        self.current = now;
        change
    }

    /// How many are not offered now.
    pub fn len(&self) -> usize {
        self.current.len()
    }

    /// None is.
    pub fn is_empty(&self) -> bool {
        self.current.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_and_prefixed() {
        let names: BTreeSet<&str> = Metric::ALL.iter().map(|m| m.name()).collect();
        assert_eq!(names.len(), Metric::ALL.len());
        assert!(names.iter().all(|n| n.starts_with("serving_picker.")));
        assert!(Metric::ALL.iter().enumerate().all(|(i, m)| m.index() == i));
    }

    #[test]
    fn each_host_once_until_it_recovers() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let mut n = NotOffered::default();
        let c = n.update(&s(&["a", "b"]));
        assert_eq!((c.new, c.recovered.len()), (s(&["a", "b"]), 0));
        let c = n.update(&s(&["b", "a"]));
        assert_eq!(c, NotOfferedChange::default());
        let c = n.update(&s(&["b"]));
        assert_eq!((c.new.len(), c.delta()), (0, -1));
        assert_eq!(c.recovered, s(&["a"]));
        let c = n.update(&s(&["a", "b"]));
        assert_eq!(c.delta(), 1);
        assert_eq!(c.new, s(&["a"]));
        assert_eq!(n.len(), 2);
        n.update(&[]);
        assert!(n.is_empty());
    }
}
