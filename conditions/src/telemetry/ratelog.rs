//! Log lines at a bounded rate: a client that repeats something wrong (or
//! a thousand that connect at once) cannot flood the log. Each kind of line
//! has a budget: a burst, then one per interval; a line that gets through
//! says how many of its kind were left out since the last one. (Per key,
//! such as a peer address: `log_limit`.)

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
}
