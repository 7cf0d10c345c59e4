//! The stream drain's shared state: which hosts drain in which cluster (published by the
//! load-balancing policy when a cluster's hosts change) and the streams the HTTP filter holds
//! open, with the wake-up of those whose deadline has come.
//!
//! The decision is the core's (`serving_picker_core::drain`); this file keeps its state for
//! the whole module: one [`Board`] behind a mutex, shared by the policy instances (any
//! thread), the filters (each on its worker) and the timer thread that wakes due streams.
//! A stream is woken through its filter's scheduler (a [`Waker`]): the end itself happens on
//! the stream's own worker, in `on_http_filter_scheduled`. Plain Rust: the FFI glue is
//! `http_hooks`.

use std::sync::{Condvar, LazyLock, Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use rustc_hash::{FxHashMap, FxHashSet};
use serving_picker_core::drain::{DrainClock, OpenStream, StreamBook};

use crate::abi::Scheduler;

/// The most streams the board tracks at once; more are served without a drain (counted:
/// `serving_picker.drain.untracked`). About 200 bytes each: 200 MB at most.
pub const MAX_TRACKED_STREAMS: usize = 1 << 20;

/// Wakes one stream on its worker (the filter's scheduler).
pub trait Waker {
    /// Posts `event_id` to the stream's worker.
    fn wake(&self, event_id: u64);
}

/// One cluster's drain: its window, since when each of its hosts drains, and which policy
/// configuration published it (a replaced configuration's last instance does not remove its
/// successor's entry).
#[derive(Debug)]
struct ClusterDrain {
    owner: usize,
    window_ms: u64,
    clock: DrainClock,
}

/// What `open` did with a stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// Tracked: it ends when its host drains.
    Tracked,
    /// Its cluster has no `drain_window_ms`: never ended early.
    NotConfigured,
    /// The board is full ([`MAX_TRACKED_STREAMS`]): served without a drain.
    Full,
}

/// The module's drain state.
pub struct Board<W> {
    clusters: FxHashMap<String, ClusterDrain>,
    book: StreamBook<u64>,
    wakers: FxHashMap<u64, W>,
    /// Woken, waiting for their worker to end them.
    ending: FxHashSet<u64>,
}

impl<W> Default for Board<W> {
    fn default() -> Board<W> {
        Board {
            clusters: FxHashMap::default(),
            book: StreamBook::default(),
            wakers: FxHashMap::default(),
            ending: FxHashSet::default(),
        }
    }
}

impl<W: Waker> Board<W> {
    /// A cluster's hosts changed (`owner`: the publishing policy configuration). With a
    /// window, `draining` (as `draining_hosts` names them) drain from now or since they
    /// started; without one, the cluster's streams are never ended. Whether any host drains.
    pub fn publish(
        &mut self,
        owner: usize,
        cluster: &str,
        window_ms: Option<u64>,
        draining: &[String],
        now_ms: u64,
    ) -> bool {
        let Some(window_ms) = window_ms else {
            self.clusters.remove(cluster);
            return false;
        };
        let entry = self
            .clusters
            .entry(cluster.to_string())
            .or_insert_with(|| ClusterDrain {
                owner,
                window_ms,
                clock: DrainClock::default(),
            });
        entry.owner = owner;
        entry.window_ms = window_ms;
        entry
            .clock
            .update(now_ms, draining.iter().map(String::as_str));
        !entry.clock.is_empty()
    }

    /// The policy configuration `owner` is gone: its cluster's entry goes with it, unless a
    /// newer configuration has published since.
    pub fn forget(&mut self, owner: usize, cluster: &str) {
        if self.clusters.get(cluster).is_some_and(|c| c.owner == owner) {
            self.clusters.remove(cluster);
        }
    }

    /// Whether `cluster` has a drain window.
    pub fn configured(&self, cluster: &str) -> bool {
        self.clusters.contains_key(cluster)
    }

    /// Whether `address` of `cluster` drains now.
    pub fn draining(&self, cluster: &str, address: &str) -> bool {
        self.since(cluster, address).is_some()
    }

    fn since(&self, cluster: &str, address: &str) -> Option<u64> {
        self.clusters.get(cluster)?.clock.since(address)
    }

    /// A stream's response started from `stream.address` of `stream.cluster`. The waker
    /// comes back when the stream is not tracked.
    pub fn open(&mut self, id: u64, stream: OpenStream, waker: W) -> (Opened, Option<W>) {
        if !self.configured(&stream.cluster) {
            return (Opened::NotConfigured, Some(waker));
        }
        if self.wakers.len() >= MAX_TRACKED_STREAMS {
            return (Opened::Full, Some(waker));
        }
        self.book.open(id, stream);
        // Ids are unique: no waker is replaced.
        let replaced = self.wakers.insert(id, waker);
        (Opened::Tracked, replaced)
    }

    /// A stream is done (complete, reset, destroyed, or ended for drain): its waker, to be
    /// deleted by its owner.
    pub fn close(&mut self, id: u64) -> Option<W> {
        self.book.close(&id);
        self.ending.remove(&id);
        self.wakers.remove(&id)
    }

    /// Wakes every stream whose deadline has come, once each (it leaves the book and waits
    /// for its worker's `close`); how many.
    pub fn wake_due(&mut self, now_ms: u64) -> usize {
        let clusters = &self.clusters;
        let window = |c: &str| clusters.get(c).map(|d| d.window_ms);
        let since = |c: &str, a: &str| clusters.get(c)?.clock.since(a);
        let due = self.book.due(now_ms, window, since);
        for id in &due {
            self.book.close(id);
            if let Some(w) = self.wakers.get(id) {
                w.wake(*id);
            }
            self.ending.insert(*id);
        }
        due.len()
    }

    /// The next deadline among the streams not yet woken; `None` when none drains.
    pub fn next_deadline(&self) -> Option<u64> {
        let clusters = &self.clusters;
        let window = |c: &str| clusters.get(c).map(|d| d.window_ms);
        let since = |c: &str, a: &str| clusters.get(c)?.clock.since(a);
        self.book.next_deadline(window, since)
    }

    /// How many streams are tracked (woken ones until their worker closes them).
    pub fn len(&self) -> usize {
        self.wakers.len()
    }

    /// None is.
    pub fn is_empty(&self) -> bool {
        self.wakers.is_empty()
    }
}

impl Waker for Scheduler {
    fn wake(&self, event_id: u64) {
        self.commit(event_id);
    }
}

/// The module's board: the policy instances publish to it, the filters open and close
/// streams on it, the timer thread wakes due streams from it (committing under its lock, so a
/// scheduler is never deleted while it is used).
static BOARD: LazyLock<Mutex<Board<Scheduler>>> = LazyLock::new(Mutex::default);
/// Wakes the timer thread early: a host started draining, or a stream opened on one.
static WAKE: Condvar = Condvar::new();
/// The module's clock's zero.
static START: LazyLock<Instant> = LazyLock::new(Instant::now);
/// The timer thread is started once, by the first drain filter configuration.
static TIMER: Once = Once::new();
/// The longest the timer thread sleeps without being woken.
const TIMER_IDLE: Duration = Duration::from_secs(1);

/// Milliseconds on the module's monotonic clock.
pub fn now_ms() -> u64 {
    START.elapsed().as_millis().min(u128::from(u64::MAX)) as u64
}

/// The board, locked (a panic while it was held leaves it usable: every change to it is a
/// single map operation).
pub fn board() -> MutexGuard<'static, Board<Scheduler>> {
    BOARD.lock().unwrap_or_else(|e| e.into_inner())
}

/// Wakes the timer thread to look at the board again.
pub fn nudge() {
    WAKE.notify_all();
}

/// A cluster's hosts changed (the policy's reporting instance): see [`Board::publish`].
pub fn publish(owner: usize, cluster: &str, window_ms: Option<u64>, draining: &[String]) {
    let drains = board().publish(owner, cluster, window_ms, draining, now_ms());
    if drains {
        nudge();
    }
}

/// The policy configuration `owner` of `cluster` is gone: see [`Board::forget`].
pub fn forget(owner: usize, cluster: &str) {
    board().forget(owner, cluster);
}

/// Starts the timer thread (once): it sleeps until the next stream's deadline (at most
/// [`TIMER_IDLE`]) and wakes the due streams. `Err` with the reason if it cannot start.
pub fn start_timer() -> std::io::Result<()> {
    let mut result = Ok(());
    TIMER.call_once(|| {
        if let Err(e) = std::thread::Builder::new()
            .name("sp-drain".into())
            .spawn(timer_loop)
        {
            result = Err(e);
        }
    });
    result
}

fn timer_loop() {
    let mut b = board();
    loop {
        let now = now_ms();
        b.wake_due(now);
        let wait = b
            .next_deadline()
            .map_or(TIMER_IDLE, |d| {
                Duration::from_millis(d.saturating_sub(now).max(1))
            })
            .min(TIMER_IDLE);
        b = match WAKE.wait_timeout(b, wait) {
            Ok((b, _)) => b,
            Err(e) => e.into_inner().0,
        };
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    #[derive(Clone, Default)]
    struct Woken(Rc<RefCell<Vec<u64>>>);

    impl Waker for Woken {
        fn wake(&self, event_id: u64) {
            self.0.borrow_mut().push(event_id);
        }
    }

    fn stream(cluster: &str, address: &str, opened_ms: u64, key: u64) -> OpenStream {
        OpenStream {
            cluster: cluster.into(),
            address: address.into(),
            opened_ms,
            spread_key: key,
        }
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn streams_on_a_draining_host_are_woken_once_within_the_window() {
        let mut b = Board::default();
        let woken = Woken::default();
        assert!(!b.publish(1, "c", Some(10_000), &[], 0));
        for id in 0..100 {
            assert_eq!(
                b.open(id, stream("c", "A", 0, id), woken.clone()).0,
                Opened::Tracked
            );
        }
        b.open(100, stream("c", "B", 0, 100), woken.clone());
        assert_eq!(b.wake_due(u64::MAX / 2), 0, "nothing drains yet");
        assert_eq!(b.next_deadline(), None);
        assert!(b.publish(1, "c", Some(10_000), &s(&["A"]), 5_000));
        assert!(b.draining("c", "A") && !b.draining("c", "B"));
        assert_eq!(b.wake_due(5_999), 0, "the window's first tenth");
        let first = b.next_deadline().unwrap();
        assert!((6_000..15_000).contains(&first));
        let mut woke = 0;
        for t in (6_000..=15_000).step_by(500) {
            woke += b.wake_due(t);
        }
        assert_eq!(woke, 100);
        assert_eq!(b.wake_due(20_000), 0, "each stream once");
        let mut ids = woken.0.borrow().clone();
        ids.sort();
        assert_eq!(ids, (0..100).collect::<Vec<_>>(), "never the stream on B");
        assert_eq!(b.next_deadline(), None);
        for id in 0..100 {
            assert!(b.close(id).is_some());
        }
        assert_eq!(b.len(), 1);
    }

    #[test]
    fn no_window_no_drain_and_a_closed_stream_is_not_woken() {
        let mut b = Board::default();
        let woken = Woken::default();
        let (opened, back) = b.open(1, stream("plain", "A", 0, 1), woken.clone());
        assert_eq!(opened, Opened::NotConfigured);
        assert!(back.is_some(), "the waker comes back");
        assert!(!b.publish(1, "plain", None, &s(&["A"]), 0));
        b.publish(1, "c", Some(1_000), &s(&["A"]), 0);
        b.open(2, stream("c", "A", 0, 2), woken.clone());
        assert!(b.close(2).is_some());
        assert_eq!(b.wake_due(10_000), 0);
        assert!(woken.0.borrow().is_empty());
    }

    #[test]
    fn a_host_that_stops_draining_keeps_its_streams() {
        let mut b = Board::default();
        let woken = Woken::default();
        b.publish(1, "c", Some(10_000), &s(&["A"]), 0);
        b.open(1, stream("c", "A", 0, 1), woken.clone());
        // B left: A is the only choice again (row 3), nothing drains.
        b.publish(1, "c", Some(10_000), &[], 500);
        assert_eq!(b.wake_due(100_000), 0);
        // Drains again: a new window from now.
        b.publish(1, "c", Some(10_000), &s(&["A"]), 200_000);
        assert_eq!(b.wake_due(200_999), 0);
        assert_eq!(b.wake_due(210_000), 1);
    }

    #[test]
    fn a_replaced_configuration_does_not_remove_its_successor() {
        let mut b: Board<Woken> = Board::default();
        b.publish(1, "c", Some(10_000), &[], 0);
        b.publish(2, "c", Some(10_000), &[], 0);
        b.forget(1, "c");
        assert!(b.configured("c"));
        b.forget(2, "c");
        assert!(!b.configured("c"));
    }
}
