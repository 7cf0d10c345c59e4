//! Log lines at a bounded rate: at most one per key per interval, whatever
//! a client does (the events themselves are counted in metrics).

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

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
    use super::*;

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
