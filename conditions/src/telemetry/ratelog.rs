//! Log lines at a bounded rate: a client that repeats something wrong (or
//! a thousand that connect at once) cannot flood the log; the events
//! themselves are counted in metrics. Two shapes, each telling in the line
//! that gets through how many were left out since the last one:
//! - per kind of line ([`LogBudget`]): a burst, then one per interval;
//! - per key, such as a peer address ([`PerKey`]): at most one per key per
//!   interval, over a bounded number of keys.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One kind of log line's budget (a token bucket).
#[derive(Debug)]
pub struct LogBudget {
    burst: u32,
    every: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    tokens: u32,
    refilled: Option<Instant>,
    left_out: u64,
}

impl LogBudget {
    /// `burst` lines at once, then one per `every`.
    pub const fn new(burst: u32, every: Duration) -> LogBudget {
        LogBudget {
            burst,
            every,
            state: Mutex::new(State {
                tokens: burst,
                refilled: None,
                left_out: 0,
            }),
        }
    }

    /// `Some(lines left out since the last one)` when this line may be logged.
    pub fn allow(&self) -> Option<u64> {
        self.allow_at(Instant::now())
    }

    fn allow_at(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let since = *s.refilled.get_or_insert(now);
        if !self.every.is_zero() {
            let earned =
                (now.saturating_duration_since(since).as_nanos() / self.every.as_nanos()) as u64;
            if earned > 0 {
                s.tokens = (u64::from(s.tokens) + earned).min(u64::from(self.burst)) as u32;
                s.refilled = Some(since + self.every * earned.min(u64::from(u32::MAX)) as u32);
            }
        }
        if s.tokens == 0 {
            s.left_out += 1;
            return None;
        }
        s.tokens -= 1;
        Some(std::mem::take(&mut s.left_out))
    }
}

/// When each key last logged, and how many of its events were not logged
/// since. At most `cap` keys are remembered; when that many keys logged
/// within the interval, a new key's events are not logged until one expires.
#[derive(Debug)]
pub struct PerKey<K> {
    interval: Duration,
    cap: usize,
    last: HashMap<K, (Instant, u64)>,
}

impl<K: Hash + Eq> PerKey<K> {
    /// Each key logs at most once per `interval`; at most `cap` keys remembered.
    pub fn new(interval: Duration, cap: usize) -> PerKey<K> {
        PerKey {
            interval,
            cap,
            last: HashMap::new(),
        }
    }

    /// An event of `key` at `now`: `Some(n)` to log it now (`n` events of
    /// that key went unlogged since its last line), `None` to stay quiet.
    pub fn allow(&mut self, key: K, now: Instant) -> Option<u64> {
        if let Some((at, quiet)) = self.last.get_mut(&key) {
            if now.duration_since(*at) < self.interval {
                *quiet += 1;
                return None;
            }
            let n = *quiet;
            *at = now;
            *quiet = 0;
            return Some(n);
        }
        if self.last.len() >= self.cap {
            let interval = self.interval;
            self.last
                .retain(|_, (at, _)| now.duration_since(*at) < interval);
            if self.last.len() >= self.cap {
                return None;
            }
        }
        self.last.insert(key, (now, 0));
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_burst_then_one_per_interval_counting_the_rest() {
        let b = LogBudget::new(3, Duration::from_secs(10));
        let t = Instant::now();
        let allowed: Vec<Option<u64>> = (0..1000).map(|_| b.allow_at(t)).collect();
        assert_eq!(allowed.iter().filter(|a| a.is_some()).count(), 3);
        assert_eq!(b.allow_at(t + Duration::from_secs(5)), None);
        // One more interval: one line, which tells how many were left out.
        assert_eq!(b.allow_at(t + Duration::from_secs(10)), Some(998));
        assert_eq!(b.allow_at(t + Duration::from_secs(11)), None);
        // A long quiet time refills the burst, no more.
        let later = t + Duration::from_secs(1000);
        assert_eq!(b.allow_at(later), Some(1));
        assert!(b.allow_at(later).is_some());
        assert!(b.allow_at(later).is_some());
        assert_eq!(b.allow_at(later), None);
    }

    #[test]
    fn once_per_key_per_interval_with_the_count_of_the_quiet_ones() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut l = PerKey::new(Duration::from_secs(60), 2);
        assert_eq!(l.allow("a", t0), Some(0));
        assert_eq!(l.allow("a", t0 + s), None);
        assert_eq!(l.allow("a", t0 + 2 * s), None);
        assert_eq!(l.allow("b", t0 + 2 * s), Some(0));
        // Full: a third key stays quiet until an entry expires.
        assert_eq!(l.allow("c", t0 + 3 * s), None);
        assert_eq!(l.allow("a", t0 + 61 * s), Some(2));
        assert_eq!(l.allow("c", t0 + 63 * s), Some(0));
        assert_eq!(l.allow("a", t0 + 62 * s), None);
    }
}
