//! What every request of a worker reads: its configuration, metrics,
//! routing table, and the requests held until the first snapshot. Shared by
//! the root context (which fills it) and the HTTP contexts (which read it).

use super::metrics::{Metrics, RequestCounters};
use crate::config::PluginConfig;
use crate::table::RoutingTable;
use proxy_wasm::hostcalls;
use rustc_hash::FxBuildHasher;
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::rc::Rc;
use std::time::Duration;

pub struct Worker {
    pub config: Rc<PluginConfig>,
    pub metrics: Metrics,
    pub counters: RequestCounters,
    pub table: RefCell<Option<RoutingTable>>,
    /// Clusters already logged as unknown since the last snapshot change.
    pub logged_unknown: RefCell<HashSet<String, FxBuildHasher>>,
    /// Requests waiting for the first snapshot (`before_first_snapshot:
    /// hold`), by context id, and since when the oldest waits. The root
    /// context releases them.
    pub held: RefCell<Vec<u32>>,
    pub held_since_ms: Cell<u64>,
    /// The root context's id: host calls after a release must be its again
    /// (an admin call dispatched for a request would answer to the request).
    pub root_context_id: u32,
}

/// While requests wait, ticks come this often so that they leave soon after
/// the snapshot is published.
const HOLD_TICK: Duration = Duration::from_millis(5);

impl Worker {
    /// Holds a request until the first snapshot (the root releases it).
    pub fn hold(&self, context_id: u32) {
        let mut held = self.held.borrow_mut();
        if held.is_empty() {
            self.held_since_ms.set(super::now_ms());
            // Called from the request's context, this sets its root's ticks.
            let _ = hostcalls::set_tick_period(HOLD_TICK);
            log::info!("no snapshot yet; holding requests");
        }
        held.push(context_id);
        self.counters.held_no_snapshot.inc();
    }
}
