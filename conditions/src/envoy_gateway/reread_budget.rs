//! The time re-reads may take in one translation of Envoy Gateway's.
//!
//! EG calls the hook once per cluster, one call after the other, and waits
//! for each answer, so every re-read of a Service in doubt (up to
//! `--reread-timeout-ms`) holds up the whole translation. At 10,000
//! clusters, doubts on many Services at once (a burst of rollouts, a slow
//! API server) would add up to minutes. So re-reads share a budget per
//! translation (`--reread-budget-ms`): each may take what is left of it, at
//! most its own timeout; once it is spent, calls are answered from the
//! index at once (doubtful endpoints as EG sent them, the same answer as a
//! re-read that timed out), counted as `eg_rereads_total{result="over_budget"}`.
//!
//! EG's calls carry no translation id (the context is empty), so a
//! translation is taken to be a run of calls: a call after [`GAP`] without
//! one starts a new translation, and so does one [`WINDOW`] after the
//! current one began (EG translating without a pause, under churn, still
//! gets the budget again every [`WINDOW`]).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Calls further apart than this belong to different translations.
pub const GAP: Duration = Duration::from_secs(1);
/// A translation is never taken to last longer than this.
pub const WINDOW: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
struct State {
    began: Option<Instant>,
    last_call: Option<Instant>,
    spent: Duration,
}

/// The re-read time left in the current translation.
#[derive(Debug)]
pub struct RereadBudget {
    budget: Duration,
    state: Mutex<State>,
}

impl RereadBudget {
    /// `budget` of re-read time per translation.
    pub fn new(budget: Duration) -> RereadBudget {
        RereadBudget {
            budget,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A call arrived at `now`.
    pub fn on_call(&self, now: Instant) {
        let mut s = self.lock();
        let new = match (s.began, s.last_call) {
            (Some(began), Some(last)) => {
                now.saturating_duration_since(last) >= GAP
                    || now.saturating_duration_since(began) >= WINDOW
            }
            _ => true,
        };
        if new {
            s.began = Some(now);
            s.spent = Duration::ZERO;
        }
        s.last_call = Some(now);
    }

    /// How long a re-read may take now: its `timeout`, or what is left of
    /// the budget if less; `None` when the budget is spent.
    pub fn allowance(&self, timeout: Duration) -> Option<Duration> {
        let left = self.budget.saturating_sub(self.lock().spent);
        (!left.is_zero()).then(|| left.min(timeout))
    }

    /// A re-read took `took`.
    pub fn spend(&self, took: Duration) {
        let mut s = self.lock();
        s.spent += took;
    }

    /// Spent in the current translation.
    pub fn spent(&self) -> Duration {
        self.lock().spent
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn rereads_share_the_budget_of_a_translation() {
        let b = RereadBudget::new(1000 * MS);
        let t0 = Instant::now();
        b.on_call(t0);
        assert_eq!(b.allowance(500 * MS), Some(500 * MS));
        b.spend(500 * MS);
        b.on_call(t0 + 600 * MS);
        b.spend(400 * MS);
        b.on_call(t0 + 1100 * MS);
        assert_eq!(b.allowance(500 * MS), Some(100 * MS), "what is left");
        b.spend(100 * MS);
        b.on_call(t0 + 1300 * MS);
        assert_eq!(b.allowance(500 * MS), None, "spent: answered at once");
        // A pause between calls: a new translation, a new budget.
        b.on_call(t0 + 2400 * MS);
        assert_eq!(b.allowance(500 * MS), Some(500 * MS));
    }

    #[test]
    fn translations_without_pause_get_the_budget_again_each_window() {
        let b = RereadBudget::new(100 * MS);
        let t0 = Instant::now();
        let mut t = t0;
        b.on_call(t);
        b.spend(100 * MS);
        while t < t0 + WINDOW - 10 * MS {
            t += 500 * MS;
            b.on_call(t);
            if t < t0 + WINDOW {
                assert_eq!(b.allowance(500 * MS), None);
            }
        }
        b.on_call(t0 + WINDOW + 100 * MS);
        assert_eq!(b.allowance(500 * MS), Some(100 * MS));
        assert_eq!(b.spent(), Duration::ZERO);
    }
}
