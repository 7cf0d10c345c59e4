//! The hook's metrics (`eg_hook_*`, `eg_rereads`, `eg_reread_seconds`).

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

use crate::telemetry::metric_group;
use crate::telemetry::metrics::Labels;

metric_group! {
    /// The hook's metrics (prefix `serving_picker_conditions_eg_`).
    #[derive(Clone)]
    pub struct HookMetrics {
        calls: Family<Labels, Counter> = ("eg_hook_calls", "PostEndpointsModify calls, by result (managed, unmanaged, not_ready, undecodable, \
             over_calls, over_bytes: answered unchanged at once; answer_too_big: \
             EG's assignment sent back)"),
        endpoints: Family<Labels, Counter> = ("eg_hook_endpoints", "Endpoints of managed assignments, by outcome (annotated, unknown, disagreed, overruled, dropped)"),
        rereads: Family<Labels, Counter> = ("eg_rereads", "Re-reads of a Service's slices on a doubt, by result (ok, error, timeout; over_budget: not done, the translation's --reread-budget-ms spent)"),
        // 20 us .. ~5 s.
        seconds: Histogram = ("eg_hook_seconds", "Time to answer one PostEndpointsModify call", Histogram::new(exponential_buckets(0.000_02, 2.0, 18))),
        reread_seconds: Histogram = ("eg_reread_seconds", "Time of one re-read round (all the Services in doubt of a call)", Histogram::new(exponential_buckets(0.000_5, 2.0, 12))),
        in_flight: Gauge = ("eg_hook_calls_in_flight", "PostEndpointsModify calls being answered (limit: eg_hook_max_calls)"),
        bytes_held: Gauge = ("eg_hook_bytes_held", "Bytes held by the calls being answered, twice each request (limit: eg_hook_max_bytes_held)"),
        max_calls: Gauge = ("eg_hook_max_calls", "Calls answered at once (--max-concurrent-calls); more are answered unchanged"),
        max_bytes_held: Gauge = ("eg_hook_max_bytes_held", "Bytes the calls being answered may hold (--max-bytes-held); more are answered unchanged"),
        refused: Family<Labels, Counter> = ("eg_hook_refused", "Hook calls (either rpc) refused while their request arrived, by reason (too_large: announces more than --max-message-size, RESOURCE_EXHAUSTED; over_bytes: its bytes do not fit in --max-bytes-held, RESOURCE_EXHAUSTED; receive_timeout: not received whole within --receive-timeout-ms, DEADLINE_EXCEEDED)"),
        receiving: Gauge = ("eg_hook_requests_receiving", "Hook requests being received (their bytes count in eg_hook_bytes_held as they arrive)"),
        receive_timeout: Gauge<f64, AtomicU64> = ("eg_hook_receive_timeout_seconds", "Time a hook request may take to arrive whole (--receive-timeout-ms)"),
        last_call: Gauge<f64, AtomicU64> = ("eg_hook_last_call_timestamp_seconds", "Unix time of Envoy Gateway's last hook call (any result); 0 before the first"),
        oldest_call: Gauge<f64, AtomicU64> = ("eg_hook_oldest_call_timestamp_seconds", "Unix time the oldest hook call still being answered arrived; 0 when none is"),
    }
}

/// The `result` label values of `eg_hook_calls_total`.
const CALL_RESULTS: [&str; 7] = [
    "managed",
    "unmanaged",
    "not_ready",
    "undecodable",
    "over_calls",
    "over_bytes",
    "answer_too_big",
];

impl HookMetrics {
    /// Every result of `eg_hook_calls_total` and reason of
    /// `eg_hook_refused_total` from 0, so that an alert on increase() sees
    /// the first one.
    pub fn zero_results(&self) {
        for result in CALL_RESULTS {
            drop(self.calls.get_or_create(&vec![("result", result)]));
        }
        for reason in crate::envoy_gateway::intake::REFUSED_REASONS {
            drop(self.refused.get_or_create(&vec![("reason", reason)]));
        }
    }

    pub(super) fn call(&self, result: &'static str) {
        self.calls.get_or_create(&vec![("result", result)]).inc();
    }

    pub(super) fn endpoints(&self, outcome: &'static str, n: usize) {
        if n > 0 {
            self.endpoints
                .get_or_create(&vec![("outcome", outcome)])
                .inc_by(n as u64);
        }
    }

    pub(super) fn reread(&self, result: &'static str) {
        self.rereads.get_or_create(&vec![("result", result)]).inc();
    }
}
