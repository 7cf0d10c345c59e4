//! Long-lived streams leave a terminating pod before it exits.
//!
//! Every form picks a host per request, so new requests follow the behaviour table; a stream
//! opened while its pod was ready stays on it through the pod's termination until the pod exits
//! and the stream is reset. With a drain window set, a stream open to a host that turns
//! terminating while a ready host exists in its cluster (the table's rows 5 and 6: new requests
//! already go to the ready hosts) ends inside the window, each stream at its own point of it, so
//! clients reconnect to ready pods before the pod exits and the ready pods do not take every
//! reconnect at once.
//!
//! Never while the terminating host is the only serving choice (rows 3 and 4: kube-proxy's
//! fallback holds for streams too: [`draining_hosts`] needs a ready host), and never for a host
//! that is only not ready (not terminating: Envoy and the table's "nobody" handle it).
//!
//! The forms keep a [`DrainClock`] per cluster, updated when endpoints change, and a
//! [`StreamBook`] of the streams they hold; [`StreamBook::due`] names the streams to end now.

use crate::config::{bounded_u64, ConfigError};
use crate::contract::Conditions;
use rustc_hash::FxHashMap;
use serde_json::Value;
use std::hash::Hash;

/// The configuration key that turns stream draining on, with the window in milliseconds.
pub const DRAIN_WINDOW_KEY: &str = "drain_window_ms";
/// The window the shipped examples set: well inside Kubernetes' default 30 s termination grace
/// period, leaving room for the change to reach Envoy and for clients to reconnect.
pub const DEFAULT_DRAIN_WINDOW_MS: u64 = 15_000;
/// The shortest window accepted.
pub const MIN_DRAIN_WINDOW_MS: u64 = 1_000;
/// The longest window accepted (one hour).
pub const MAX_DRAIN_WINDOW_MS: u64 = 3_600_000;
/// The part of the window no stream ends in (a tenth): a stream younger than this is never cut,
/// so a short request that happens to reach a host as it turns terminating completes.
pub const WINDOW_FLOOR_DIVISOR: u64 = 10;

/// Stream draining, as configured: the window streams end in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainConfig {
    /// Streams end within this many milliseconds of their host starting to drain.
    pub window_ms: u64,
}

impl Default for DrainConfig {
    fn default() -> DrainConfig {
        DrainConfig {
            window_ms: DEFAULT_DRAIN_WINDOW_MS,
        }
    }
}

impl DrainConfig {
    /// `drain_window_ms`'s value: an integer of milliseconds within
    /// [`MIN_DRAIN_WINDOW_MS`]..=[`MAX_DRAIN_WINDOW_MS`]; errors name the key.
    pub fn parse(value: Value) -> Result<DrainConfig, ConfigError> {
        let window_ms = bounded_u64(
            DRAIN_WINDOW_KEY,
            value,
            MIN_DRAIN_WINDOW_MS,
            MAX_DRAIN_WINDOW_MS,
        )?;
        Ok(DrainConfig { window_ms })
    }
}

/// The hosts of one cluster whose streams drain: those terminating (serving or not) while at
/// least one host of the cluster is ready (serving, not terminating). None when no host is ready.
pub fn draining_hosts<'a, I>(hosts: I) -> Vec<&'a str>
where
    I: IntoIterator<Item = (&'a str, Conditions)>,
    I::IntoIter: Clone,
{
    let hosts = hosts.into_iter();
    let any_ready = hosts.clone().any(|(_, c)| c == Conditions::READY);
    if !any_ready {
        return Vec::new();
    }
    hosts
        .filter(|(_, c)| c.terminating)
        .map(|(address, _)| address)
        .collect()
}

/// Since when each host of one cluster has been draining (milliseconds on the form's clock).
/// Updated when the cluster's hosts change; a host that stops draining (its cluster lost its
/// last ready host, or it left) is forgotten, and starts a new window if it drains again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainClock {
    since: FxHashMap<String, u64>,
}

impl DrainClock {
    /// The cluster's draining hosts are now `draining` (as [`draining_hosts`] names them).
    pub fn update<'a>(&mut self, now_ms: u64, draining: impl IntoIterator<Item = &'a str>) {
        let mut next = FxHashMap::default();
        for address in draining {
            let since = self.since.get(address).copied().unwrap_or(now_ms);
            next.insert(address.to_string(), since);
        }
        self.since = next;
    }

    /// Since when `address` has been draining, if it is.
    pub fn since(&self, address: &str) -> Option<u64> {
        self.since.get(address).copied()
    }

    /// How many hosts drain.
    pub fn len(&self) -> usize {
        self.since.len()
    }

    /// None drains.
    pub fn is_empty(&self) -> bool {
        self.since.is_empty()
    }
}

/// When a stream ends: `max(since, opened)` plus its own point of the window, which lies in the
/// window's last nine tenths, spread by `stream_key` (any number that differs between streams:
/// a stream id, a context id) so reconnects are spread over the window.
pub fn stream_deadline(since_ms: u64, opened_ms: u64, window_ms: u64, stream_key: u64) -> u64 {
    let floor = window_ms / WINDOW_FLOOR_DIVISOR;
    let span = window_ms.saturating_sub(floor).max(1);
    since_ms.max(opened_ms) + floor + mix(stream_key) % span
}

/// splitmix64's finaliser: consecutive keys land far apart.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// One open stream: the cluster and host it went to, when it opened, its spread key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenStream {
    /// The cluster the stream was routed to.
    pub cluster: String,
    /// The host (`IP:PORT`) it went to.
    pub address: String,
    /// When it opened (milliseconds on the form's clock).
    pub opened_ms: u64,
    /// Spreads its end over the window ([`stream_deadline`]).
    pub spread_key: u64,
}

/// The open streams a form holds (one per worker or VM), by the form's stream key `K`.
#[derive(Clone, Debug)]
pub struct StreamBook<K> {
    streams: FxHashMap<K, OpenStream>,
}

impl<K> Default for StreamBook<K> {
    fn default() -> StreamBook<K> {
        StreamBook {
            streams: FxHashMap::default(),
        }
    }
}

impl<K: Hash + Eq + Clone> StreamBook<K> {
    /// A stream is open (its response has started from `address`).
    pub fn open(&mut self, key: K, stream: OpenStream) {
        self.streams.insert(key, stream);
    }

    /// A stream is done (completed, reset, or ended for drain).
    pub fn close(&mut self, key: &K) -> Option<OpenStream> {
        self.streams.remove(key)
    }

    /// How many streams are open.
    pub fn len(&self) -> usize {
        self.streams.len()
    }

    /// None is open.
    pub fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }

    /// The streams to end at `now_ms`: those whose host drains (`since(cluster, address)` says
    /// since when) and whose [`stream_deadline`] has come, with `window_ms` their cluster's
    /// window. Streams stay in the book until [`StreamBook::close`].
    pub fn due(
        &self,
        now_ms: u64,
        window_ms: impl Fn(&str) -> Option<u64>,
        since: impl Fn(&str, &str) -> Option<u64>,
    ) -> Vec<K> {
        self.streams
            .iter()
            .filter(|(_, s)| {
                let (Some(window), Some(since)) =
                    (window_ms(&s.cluster), since(&s.cluster, &s.address))
                else {
                    return false;
                };
                stream_deadline(since, s.opened_ms, window, s.spread_key) <= now_ms
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The earliest deadline among streams whose host drains, to arm a timer for; `None` when
    /// no stream's host drains.
    pub fn next_deadline(
        &self,
        window_ms: impl Fn(&str) -> Option<u64>,
        since: impl Fn(&str, &str) -> Option<u64>,
    ) -> Option<u64> {
        self.streams
            .values()
            .filter_map(|s| {
                let window = window_ms(&s.cluster)?;
                let since = since(&s.cluster, &s.address)?;
                Some(stream_deadline(since, s.opened_ms, window, s.spread_key))
            })
            .min()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use proptest::prelude::*;

    const READY: Conditions = Conditions::READY;
    const SERVING_TERMINATING: Conditions = Conditions::SERVING_TERMINATING;
    const NOT_SERVING: Conditions = Conditions::NOT_SERVING;
    const TERMINATING_NOT_SERVING: Conditions = Conditions {
        serving: false,
        terminating: true,
    };

    #[test]
    fn the_table_rows() {
        // Row 1: A serving.
        assert!(draining_hosts([("A", READY)]).is_empty());
        // Row 2: A not serving (terminating or not): nobody gets traffic, nothing to drain to.
        assert!(draining_hosts([("A", NOT_SERVING)]).is_empty());
        assert!(draining_hosts([("A", TERMINATING_NOT_SERVING)]).is_empty());
        // Row 3: A serving+terminating, the only choice.
        assert!(draining_hosts([("A", SERVING_TERMINATING)]).is_empty());
        // Row 4: A serving+terminating, B not yet serving.
        assert!(draining_hosts([("A", SERVING_TERMINATING), ("B", NOT_SERVING)]).is_empty());
        // Row 5: A serving+terminating, B serving: A drains.
        assert_eq!(
            draining_hosts([("A", SERVING_TERMINATING), ("B", READY)]),
            vec!["A"]
        );
        // Row 6: A terminating not serving, B serving: A drains too.
        assert_eq!(
            draining_hosts([("A", TERMINATING_NOT_SERVING), ("B", READY)]),
            vec!["A"]
        );
    }

    #[test]
    fn a_host_only_not_ready_never_drains() {
        assert!(draining_hosts([("A", NOT_SERVING), ("B", READY)]).is_empty());
    }

    #[test]
    fn the_clock_keeps_since_and_forgets_hosts_that_stop() {
        let mut clock = DrainClock::default();
        clock.update(100, ["A"]);
        clock.update(200, ["A", "B"]);
        assert_eq!(clock.since("A"), Some(100));
        assert_eq!(clock.since("B"), Some(200));
        clock.update(300, ["B"]);
        assert_eq!(clock.since("A"), None);
        clock.update(400, ["A", "B"]);
        assert_eq!(clock.since("A"), Some(400), "a new window");
        assert_eq!(clock.since("B"), Some(200));
        assert_eq!(clock.len(), 2);
    }

    #[test]
    fn the_window_parses_and_names_its_key() {
        assert_eq!(
            DrainConfig::parse(serde_json::json!(5000)),
            Ok(DrainConfig { window_ms: 5000 })
        );
        let e = DrainConfig::parse(serde_json::json!(10)).unwrap_err();
        assert_eq!(e.key, DRAIN_WINDOW_KEY);
        let e = DrainConfig::parse(serde_json::json!("5s")).unwrap_err();
        assert_eq!(e.key, DRAIN_WINDOW_KEY);
    }

    fn book(streams: &[(u64, &str, u64)]) -> StreamBook<u64> {
        let mut b = StreamBook::default();
        for &(id, address, opened_ms) in streams {
            b.open(
                id,
                OpenStream {
                    cluster: "c".into(),
                    address: address.into(),
                    opened_ms,
                    spread_key: id,
                },
            );
        }
        b
    }

    #[test]
    fn streams_on_a_draining_host_end_within_the_window_and_others_never() {
        let b = book(&[(1, "A", 0), (2, "A", 0), (3, "B", 0)]);
        let since = |_: &str, a: &str| (a == "A").then_some(1_000);
        let window = |_: &str| Some(10_000);
        assert!(b.due(1_000 + 999, window, since).is_empty(), "the floor");
        let mut all = b.due(11_000, window, since);
        all.sort();
        assert_eq!(all, vec![1, 2]);
        assert!(b.due(u64::MAX, window, |_, _| None).is_empty());
        assert!(
            b.due(u64::MAX, |_| None, since).is_empty(),
            "not configured"
        );
        let next = b.next_deadline(window, since).unwrap();
        assert!((2_000..11_000).contains(&next));
    }

    proptest! {
        #[test]
        fn a_deadline_lies_in_the_window_after_since_and_opening(
            since in 0u64..1 << 40,
            opened in 0u64..1 << 40,
            window in MIN_DRAIN_WINDOW_MS..=MAX_DRAIN_WINDOW_MS,
            key in any::<u64>(),
        ) {
            let d = stream_deadline(since, opened, window, key);
            let start = since.max(opened);
            prop_assert!(d >= start + window / WINDOW_FLOOR_DIVISOR);
            prop_assert!(d < start + window);
        }

        #[test]
        fn deadlines_spread_over_the_window(first in any::<u64>()) {
            // 1,000 consecutive stream keys: no tenth of the window holds more than a fifth.
            let window = 10_000;
            let mut buckets = [0u32; 10];
            for k in first..first.saturating_add(1_000) {
                let d = stream_deadline(0, 0, window, k);
                buckets[(d * 10 / window) as usize] += 1;
            }
            prop_assert_eq!(buckets[0], 0);
            prop_assert!(buckets.iter().all(|&n| n <= 200), "{:?}", buckets);
        }
    }
}
