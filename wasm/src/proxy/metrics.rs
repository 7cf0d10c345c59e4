//! Counters and gauges through the host, under stable `serving_picker.*` names
//! (Envoy shows them with its `wasmcustom.` prefix); the request path's are
//! named in `steer` (those the native form keeps too, in the core's `counters`).

use crate::drain::Protocol;
use crate::steer::{RequestCounts, COUNTER_NAMES};
use proxy_wasm::hostcalls::{define_metric, increment_metric, record_metric};
use proxy_wasm::types::MetricType;

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

/// The request path's counters in the host: `steer::RequestCounts`, counted
/// in the VM and added here on each tick (visible in /stats within one tick).
pub struct RequestCounters([Metric; 15]);

impl RequestCounters {
    pub fn define() -> RequestCounters {
        RequestCounters(COUNTER_NAMES.map(|name| Metric::define(MetricType::Counter, name)))
    }

    /// Hands the counts to the host; their sum (0: no request counted).
    pub fn flush(&self, counts: &RequestCounts) -> u64 {
        let mut total = 0;
        for (metric, tally) in self.0.iter().zip(counts.all()) {
            let n = tally.take();
            if n > 0 {
                metric.add(n);
                total += n;
            }
        }
        total
    }
}

/// Streams ended for drain, one counter per protocol (`drain::Protocol::reset_counter`);
/// defined only when `drain_window_ms` is set.
#[derive(Clone, Copy, Default)]
pub struct DrainCounters {
    pub ended: [Metric; 4],
    /// Streams this worker holds open to a managed cluster (gauge).
    pub open_streams: Metric,
    /// Hosts whose streams drain now (gauge).
    pub draining_hosts: Metric,
}

impl DrainCounters {
    pub fn define() -> DrainCounters {
        DrainCounters {
            ended: Protocol::ALL.map(|p| Metric::define(MetricType::Counter, p.reset_counter())),
            open_streams: Metric::define(MetricType::Gauge, "serving_picker.drain.open_streams"),
            draining_hosts: Metric::define(
                MetricType::Gauge,
                "serving_picker.drain.draining_hosts",
            ),
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
    /// 1 when the last configuration received, or the one the last
    /// requests went through, does not parse (every request passes
    /// through); 0 when it does.
    pub config_invalid: Metric,
    /// 1 while the snapshot is set aside as stale (every request passes
    /// through), else 0.
    pub snapshot_stale: Metric,
}

impl Metrics {
    /// A filter whose configuration does not parse: only `config_invalid`,
    /// at 1 (it never refreshes).
    pub fn config_invalid() -> Metrics {
        let metrics = Metrics {
            config_invalid: Metric::define(MetricType::Gauge, "serving_picker.config_invalid"),
            ..Metrics::default()
        };
        metrics.config_invalid.set(1);
        metrics
    }

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
            config_invalid: gauge("serving_picker.config_invalid"),
            snapshot_stale: gauge("serving_picker.snapshot.stale"),
        }
    }
}
