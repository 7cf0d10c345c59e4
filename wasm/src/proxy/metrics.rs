//! Counters and gauges through the host, under stable `serving_picker.*` names
//! (Envoy shows them with its `wasmcustom.` prefix); the ones the native
//! form keeps too are named in the core (`counters`).

use proxy_wasm::hostcalls::{define_metric, increment_metric, record_metric};
use proxy_wasm::types::MetricType;
use serving_picker_core::counters;
use std::cell::Cell;

#[derive(Clone, Copy, Default)]
pub struct Metric(Option<u32>);

impl Metric {
    fn define(kind: MetricType, name: &str) -> Metric {
        match define_metric(kind, name) {
            Ok(id) => Metric(Some(id)),
            Err(e) => {
                log::warn!("cannot define metric {name}: {e:?}");
                Metric(None)
            }
        }
    }

    pub fn inc(self) {
        self.add(1);
    }

    fn add(self, n: u64) {
        if let (Some(id), Ok(n)) = (self.0, i64::try_from(n)) {
            let _ = increment_metric(id, n);
        }
    }

    pub fn set(self, value: u64) {
        if let Some(id) = self.0 {
            let _ = record_metric(id, value);
        }
    }
}

/// A per-request counter counted in the VM and handed to the host on each
/// tick: one host call per tick instead of one per request.
#[derive(Default)]
pub struct Batched {
    metric: Metric,
    pending: Cell<u64>,
}

impl Batched {
    fn define(name: &str) -> Batched {
        Batched {
            metric: Metric::define(MetricType::Counter, name),
            pending: Cell::new(0),
        }
    }

    #[inline]
    pub fn inc(&self) {
        self.pending.set(self.pending.get() + 1);
    }

    fn flush(&self) {
        let n = self.pending.replace(0);
        if n > 0 {
            self.metric.add(n);
        }
    }
}

/// The request path's counters (visible in /stats within one tick).
#[derive(Default)]
pub struct RequestCounters {
    pub pick_ready: Batched,
    pub pick_terminating_fallback: Batched,
    /// Picks by topology mode, indexed by `Topology` (none, node, zone).
    pub pick_topology: [Batched; 3],
    pub reject_no_serving: Batched,
    pub reject_no_snapshot: Batched,
    pub held_no_snapshot: Batched,
    pub passthrough_no_serving: Batched,
    pub passthrough_unknown_cluster: Batched,
    pub passthrough_unmanaged: Batched,
    pub override_header_stripped: Batched,
}

impl RequestCounters {
    pub fn define() -> RequestCounters {
        RequestCounters {
            pick_ready: Batched::define(counters::PICK_READY),
            pick_terminating_fallback: Batched::define(counters::PICK_TERMINATING_FALLBACK),
            pick_topology: counters::PICK_TOPOLOGY.map(Batched::define),
            reject_no_serving: Batched::define(counters::REJECT_NO_SERVING),
            reject_no_snapshot: Batched::define("serving_picker.reject.no_snapshot"),
            held_no_snapshot: Batched::define("serving_picker.hold.no_snapshot"),
            passthrough_no_serving: Batched::define("serving_picker.passthrough.no_serving"),
            passthrough_unknown_cluster: Batched::define(
                "serving_picker.passthrough.unknown_cluster",
            ),
            passthrough_unmanaged: Batched::define("serving_picker.passthrough.unmanaged_cluster"),
            override_header_stripped: Batched::define("serving_picker.override_header.stripped"),
        }
    }

    pub fn flush(&self) {
        for c in [
            &self.pick_ready,
            &self.pick_terminating_fallback,
            &self.pick_topology[0],
            &self.pick_topology[1],
            &self.pick_topology[2],
            &self.reject_no_serving,
            &self.reject_no_snapshot,
            &self.held_no_snapshot,
            &self.passthrough_no_serving,
            &self.passthrough_unknown_cluster,
            &self.passthrough_unmanaged,
            &self.override_header_stripped,
        ] {
            c.flush();
        }
    }
}

/// The snapshot's counters and gauges, set as things happen.
#[derive(Clone, Copy, Default)]
pub struct Metrics {
    pub refresh_ok: Metric,
    pub refresh_error: Metric,
    pub refresh_skipped_unchanged: Metric,
    pub refresh_narrowed: Metric,
    pub snapshot_published: Metric,
    pub snapshot_clusters: Metric,
    pub snapshot_hosts: Metric,
    pub snapshot_bytes: Metric,
    pub refresh_busy_us: Metric,
    pub admin_bytes: Metric,
}

impl Metrics {
    pub fn define() -> Metrics {
        let counter = |name| Metric::define(MetricType::Counter, name);
        let gauge = |name| Metric::define(MetricType::Gauge, name);
        Metrics {
            refresh_ok: counter("serving_picker.snapshot.refresh_ok"),
            refresh_error: counter("serving_picker.snapshot.refresh_error"),
            refresh_skipped_unchanged: counter("serving_picker.snapshot.refresh_skipped_unchanged"),
            refresh_narrowed: counter("serving_picker.snapshot.refresh_narrowed"),
            snapshot_published: counter("serving_picker.snapshot.published"),
            snapshot_clusters: gauge("serving_picker.snapshot.clusters"),
            snapshot_hosts: gauge("serving_picker.snapshot.hosts"),
            snapshot_bytes: gauge("serving_picker.snapshot.bytes"),
            refresh_busy_us: gauge("serving_picker.snapshot.refresh_busy_us"),
            admin_bytes: gauge("serving_picker.snapshot.admin_bytes"),
        }
    }
}
