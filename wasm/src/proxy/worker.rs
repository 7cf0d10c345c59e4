//! What every request of a worker reads: the steering state (configuration,
//! counters, routing table), the host's metrics, and the requests held until
//! the first snapshot. Shared by the root context (which fills it) and the
//! HTTP contexts (which read it).

use super::metrics::{DrainCounters, Metrics, RequestCounters};
use crate::drain::StreamDrain;
use crate::poller::HOLD_TICK;
use crate::steer::{Held, Steering};
use proxy_wasm::hostcalls;
use std::cell::RefCell;

pub struct Worker {
    pub steering: Steering,
    pub metrics: Metrics,
    pub counters: RequestCounters,
    /// Requests waiting for the first snapshot (`before_first_snapshot:
    /// hold`). The root context releases them.
    pub held: RefCell<Held>,
    /// The root context's id: host calls after a release must be its again
    /// (an admin call dispatched for a request would answer to the request).
    pub root_context_id: u32,
    /// The worker's open streams and the clusters' drain clocks, when `drain_window_ms` is set.
    pub drain: Option<RefCell<StreamDrain>>,
    pub drain_counters: DrainCounters,
}

impl Worker {
    /// Holds a request until the first snapshot (the root releases it).
    pub fn hold(&self, context_id: u32) {
        if self.held.borrow_mut().hold(context_id, super::now_ms()) {
            // Called from the request's context, this sets its root's ticks.
            let _ = hostcalls::set_tick_period(HOLD_TICK);
            log::info!("no snapshot yet; holding requests");
        }
    }
}
