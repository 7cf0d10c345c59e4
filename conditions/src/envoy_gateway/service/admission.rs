//! A call's admission within the limits (`--max-concurrent-calls`,
//! `--max-bytes-held`), and the calls being answered (the
//! `eg_hook_oldest_call_timestamp_seconds` gauge).

use std::collections::BTreeMap;
use std::sync::Mutex;

use tokio::sync::SemaphorePermit;

use super::{HookMetrics, HookService};
use crate::envoy_gateway::intake::Held;
use crate::telemetry::metrics::unix_now;

/// The calls being answered, by arrival order, with their arrival (Unix
/// seconds): the first is the oldest, its arrival the `oldest_call` gauge.
#[derive(Debug, Default)]
pub(super) struct Outstanding {
    next: u64,
    arrived: BTreeMap<u64, f64>,
}

impl Outstanding {
    fn oldest(&self) -> f64 {
        self.arrived.first_key_value().map_or(0.0, |(_, t)| *t)
    }
}

/// A call being answered: counted as outstanding until dropped.
pub(super) struct Arrival<'a> {
    outstanding: &'a Mutex<Outstanding>,
    metrics: &'a HookMetrics,
    id: u64,
}

impl<'a> Arrival<'a> {
    pub(super) fn new(
        outstanding: &'a Mutex<Outstanding>,
        metrics: &'a HookMetrics,
    ) -> Arrival<'a> {
        let now = unix_now();
        metrics.last_call.set(now);
        let mut o = outstanding.lock().unwrap_or_else(|p| p.into_inner());
        let id = o.next;
        o.next += 1;
        o.arrived.insert(id, now);
        metrics.oldest_call.set(o.oldest());
        Arrival {
            outstanding,
            metrics,
            id,
        }
    }
}

impl Drop for Arrival<'_> {
    fn drop(&mut self) {
        let mut o = self.outstanding.lock().unwrap_or_else(|p| p.into_inner());
        o.arrived.remove(&self.id);
        self.metrics.oldest_call.set(o.oldest());
    }
}

/// A call's share of the limits, given back when the call is answered.
pub(super) struct Admitted<'a> {
    _call: SemaphorePermit<'a>,
    _bytes: Held,
    metrics: &'a HookMetrics,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.metrics.in_flight.dec();
    }
}

impl HookService {
    /// A call of `request_len` bytes within the limits, or the limit it is
    /// over. `received`: the bytes its request took as it arrived (over
    /// gRPC, `intake`), kept as its share; else twice `request_len` taken now.
    pub(super) fn admit(
        &self,
        request_len: usize,
        received: Option<Held>,
    ) -> Result<Admitted<'_>, &'static str> {
        let call = self.calls.try_acquire().map_err(|_| "over_calls")?;
        let bytes = match received {
            Some(held) => held,
            None => self
                .bytes
                .take(request_len.saturating_mul(2))
                .ok_or("over_bytes")?,
        };
        self.metrics.in_flight.inc();
        Ok(Admitted {
            _call: call,
            _bytes: bytes,
            metrics: &self.metrics,
        })
    }
}
