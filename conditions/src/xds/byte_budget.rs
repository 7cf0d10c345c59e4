//! One stream's share of the server's work, in bytes: a token bucket
//! (so many bytes a second, a burst at most) that a stream spends on its
//! responses (`--max-stream-send-rate`, `--max-stream-send-burst`) and,
//! in a bucket of its own, on the names its requests change
//! (`--max-stream-request-rate`, `--max-stream-request-burst`). A client
//! that keeps subscribing and unsubscribing thousands of names waits on
//! itself and leaves the CPU to the other streams.
//!
//! Work is done whenever the bucket is not in debt, whatever its size, and
//! its bytes are then spent (the bucket may go below zero): nothing is
//! ever refused or cut for its size, and a first full load that fits in
//! the burst goes at once. In debt, the stream's next response (or the
//! reading of its next request) waits until the debt is paid back; what
//! changes meanwhile coalesces, so the stream then gets the newest state
//! in one response. Only that stream waits.

use std::time::{Duration, Instant};

/// A stream's budget of bytes (of responses, or of names requested).
#[derive(Debug, Clone)]
pub struct ByteBudget {
    /// Bytes a second; 0: no budget.
    rate: u64,
    burst: f64,
    /// Bytes the stream may still send (negative: its debt).
    tokens: f64,
    at: Instant,
}

impl ByteBudget {
    /// A full bucket of `burst` bytes refilled at `rate` bytes a second
    /// (`rate` 0: never waits).
    pub fn new(rate: u64, burst: u64, now: Instant) -> ByteBudget {
        ByteBudget {
            rate,
            burst: burst as f64,
            tokens: burst as f64,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = self.at.max(now);
        self.tokens = (self.tokens + elapsed * self.rate as f64).min(self.burst);
    }

    /// How long the stream's next piece of work must wait (`None`: it may
    /// be done now).
    pub fn wait(&mut self, now: Instant) -> Option<Duration> {
        if self.rate == 0 {
            return None;
        }
        self.refill(now);
        if self.tokens >= 0.0 {
            return None;
        }
        // At least a millisecond: a timer that fires at once would spin.
        let secs = (-self.tokens / self.rate as f64).max(0.001);
        Some(Duration::from_secs_f64(secs.min(3600.0)))
    }

    /// Work of `bytes` was done.
    pub fn spend(&mut self, bytes: usize, now: Instant) {
        if self.rate == 0 {
            return;
        }
        self.refill(now);
        self.tokens -= bytes as f64;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_burst_goes_at_once_then_the_stream_waits_its_debt_and_never_more() {
        let t0 = Instant::now();
        let mut b = ByteBudget::new(1000, 5000, t0);
        assert_eq!(b.wait(t0), None, "a full bucket");
        // A first load within the burst, then one more: no wait yet.
        b.spend(4000, t0);
        assert_eq!(b.wait(t0), None);
        // A response larger than what is left is still taken whole...
        b.spend(3000, t0);
        // ...and the next waits for the 2,000 bytes of debt at 1,000/s.
        let w = b.wait(t0).unwrap();
        assert!((w.as_secs_f64() - 2.0).abs() < 1e-6, "{w:?}");
        let t1 = t0 + Duration::from_secs(1);
        let w = b.wait(t1).unwrap();
        assert!((w.as_secs_f64() - 1.0).abs() < 1e-6, "{w:?}");
        assert_eq!(b.wait(t0 + Duration::from_secs(2)), None);
        // The bucket fills up to the burst, not beyond.
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(b.wait(later), None);
        b.spend(5000, later);
        assert_eq!(b.wait(later), None);
        b.spend(1, later);
        assert!(b.wait(later).is_some());
    }

    #[test]
    fn rate_zero_is_no_budget() {
        let t0 = Instant::now();
        let mut b = ByteBudget::new(0, 0, t0);
        b.spend(usize::MAX, t0);
        assert_eq!(b.wait(t0), None);
    }

    #[test]
    fn a_clock_that_goes_back_is_no_refill() {
        let t1 = Instant::now() + Duration::from_secs(10);
        let mut b = ByteBudget::new(100, 100, t1);
        b.spend(200, t1);
        let w = b.wait(t1 - Duration::from_secs(5)).unwrap();
        assert!((w.as_secs_f64() - 1.0).abs() < 1e-6, "{w:?}");
    }
}
