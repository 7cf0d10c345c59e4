//! Counters and gauges through the host, under stable `serving_picker.*` names
//! (Envoy shows them with its `wasmcustom.` prefix).

use proxy_wasm::hostcalls::{define_metric, increment_metric, record_metric};
use proxy_wasm::types::MetricType;

#[derive(Clone, Copy, Default)]
pub struct Metric(Option<u32>);

impl Metric {
    fn define(kind: MetricType, name: &str) -> Metric {
        match define_metric(kind, name) {
            Ok(id) => Metric(Some(id)),
            Err(e) => {
                log::warn!("serving_picker: cannot define metric {name}: {e:?}");
                Metric(None)
            }
        }
    }

    #[inline]
    pub fn inc(self) {
        if let Some(id) = self.0 {
            let _ = increment_metric(id, 1);
        }
    }

    pub fn set(self, value: u64) {
        if let Some(id) = self.0 {
            let _ = record_metric(id, value);
        }
    }
}

#[derive(Clone, Copy, Default)]
pub struct Metrics {
    pub pick_ready: Metric,
    pub pick_terminating_fallback: Metric,
    pub reject_no_serving: Metric,
    pub passthrough_no_serving: Metric,
    pub passthrough_unknown_cluster: Metric,
    pub passthrough_unmanaged: Metric,
    pub override_header_stripped: Metric,
    pub refresh_ok: Metric,
    pub refresh_error: Metric,
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
            pick_ready: counter("serving_picker.pick.ready"),
            pick_terminating_fallback: counter("serving_picker.pick.terminating_fallback"),
            reject_no_serving: counter("serving_picker.reject.no_serving"),
            passthrough_no_serving: counter("serving_picker.passthrough.no_serving"),
            passthrough_unknown_cluster: counter("serving_picker.passthrough.unknown_cluster"),
            passthrough_unmanaged: counter("serving_picker.passthrough.unmanaged_cluster"),
            override_header_stripped: counter("serving_picker.override_header.stripped"),
            refresh_ok: counter("serving_picker.snapshot.refresh_ok"),
            refresh_error: counter("serving_picker.snapshot.refresh_error"),
            snapshot_published: counter("serving_picker.snapshot.published"),
            snapshot_clusters: gauge("serving_picker.snapshot.clusters"),
            snapshot_hosts: gauge("serving_picker.snapshot.hosts"),
            snapshot_bytes: gauge("serving_picker.snapshot.bytes"),
            refresh_busy_us: gauge("serving_picker.snapshot.refresh_busy_us"),
            admin_bytes: gauge("serving_picker.snapshot.admin_bytes"),
        }
    }
}
