//! Snapshots to streams: each new snapshot marks the streams it changes as
//! due and wakes their bodies (which take the response when HTTP/2 has
//! room); once a second, streams that have not taken a due response for
//! `--send-timeout` are cut, and the stream gauges are set.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::eds::snapshot::{name_hash, Snapshot};
use crate::limits::names as limit;
use crate::telemetry::ratelog::LogBudget;
use crate::xds::protocol::SnapshotEffect;
use crate::xds::server::{Core, StreamShared};
use crate::xds::XdsServer;

static CUT_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));

impl XdsServer {
    /// Follows the snapshots and keeps the streams in bounds, until the
    /// snapshot sender is gone. Spawned beside the gRPC server.
    pub async fn run_fanout(self) {
        let core = self.core;
        let mut snapshots = core.snapshots.clone();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                changed = snapshots.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let snap = snapshots.borrow_and_update().clone();
                    fan_out(&core, &snap);
                }
                _ = tick.tick() => sweep(&core, Instant::now()),
            }
        }
    }
}

/// Marks the streams `snap` changes as due, and wakes them.
fn fan_out(core: &Core, snap: &Snapshot) {
    let now = Instant::now();
    for s in core.streams.list() {
        let effect = s.state().on_snapshot(snap, now);
        match effect {
            SnapshotEffect::Due => s.wake.wake(),
            SnapshotEffect::Coalesced => {
                core.callbacks.coalesced();
                s.wake.wake();
            }
            SnapshotEffect::Nothing | SnapshotEffect::StillDue => {}
        }
    }
}

/// Since when a stream has had something it has not taken: a due
/// response (counted from the end of a wait for its share of the response
/// work, `--max-stream-send-rate`), or the rest of one it started.
fn waiting_since(s: &StreamShared) -> Option<Instant> {
    let due = match (s.state().due_since(), s.held_until()) {
        (Some(due), Some(held)) => Some(due.max(held)),
        (due, _) => due,
    };
    match (due, s.sending_since()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn sweep(core: &Core, now: Instant) {
    let timeout = core.limits.send_timeout;
    let mut oldest = Duration::ZERO;
    let explicit: Vec<u64> = core.names.explicit().iter().map(|n| name_hash(n)).collect();
    let mut subscribers = vec![0i64; explicit.len()];
    for s in core.streams.list() {
        {
            let state = s.state();
            for (i, h) in explicit.iter().enumerate() {
                if state.subscribes(*h) {
                    if let Some(n) = subscribers.get_mut(i) {
                        *n += 1;
                    }
                }
            }
        }
        let Some(since) = waiting_since(&s) else {
            continue;
        };
        let age = now.saturating_duration_since(since);
        oldest = oldest.max(age);
        if age >= timeout && !s.cut.swap(true, Ordering::SeqCst) {
            cut(core, &s, age);
        }
    }
    core.callbacks.oldest_unsent(oldest);
    let budget = core
        .limits
        .request_buffer_bytes
        .min(tokio::sync::Semaphore::MAX_PERMITS);
    core.callbacks
        .request_buffer_bytes(budget.saturating_sub(core.request_budget.available_permits()));
    for (name, n) in core.names.explicit().iter().zip(subscribers) {
        core.callbacks.subscribers(name, n);
    }
    core.callbacks
        .subscriptions(core.subscriptions.load(Ordering::SeqCst));
    core.callbacks
        .retained_bytes(core.retained.total(), core.limits.max_retained_bytes);
}

/// A stream that does not read: its connection is closed (HTTP/2 gives a
/// stream whose window is shut no chance to be reset); the client gets the
/// current state when it comes back.
fn cut(core: &Core, s: &Arc<StreamShared>, age: Duration) {
    core.callbacks.limit_hit(limit::SEND_TIMEOUT);
    core.callbacks.stream_reset(limit::SEND_TIMEOUT);
    if let Some(left_out) = CUT_LOG.allow() {
        tracing::warn!(
            api = s.api,
            node = %s.node(),
            peer = %s.peer,
            waited_ms = age.as_millis() as u64,
            left_out,
            "xDS stream has not taken a response within --send-timeout: its connection is closed"
        );
    }
    match &s.conn {
        Some(c) => c.close(),
        None => s.end_with(tonic::Status::unavailable(
            "the stream did not take a response within --send-timeout",
        )),
    }
}
