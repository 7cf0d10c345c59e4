//! The index's and the publisher's metrics: what the index holds, whether
//! the first full list is in, the updates applied and the snapshots
//! published. Mode `envoy-gateway`'s index reports the same.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use std::time::Duration;

use crate::model::index::Index;
use crate::telemetry::metric_group;
use crate::telemetry::metrics::seconds_buckets;

metric_group! {
    /// The index's and the publisher's metrics (prefix
    /// `serving_picker_conditions_`), after the source's in `/metrics`.
    #[derive(Clone)]
    pub struct PublishMetrics {
        index_slices: Gauge = ("index_slices", "EndpointSlices in the index"),
        index_endpoints: Gauge = ("index_endpoints", "Endpoints over all indexed slices"),
        ready: Gauge = ("ready", "1 once the first full list of EndpointSlices is in"),
        updates: Counter = ("updates", "Source updates applied to the index"),
        snapshots: Counter = ("snapshots", "Snapshots published"),
        build_seconds: Histogram = ("snapshot_build_seconds", "Time to apply a batch of updates and rebuild the changed assignments", seconds_buckets()),
    }
}

impl PublishMetrics {
    /// After `n` updates were applied to `index` in `took`; `ready`: the
    /// first full list is in.
    pub fn applied(&self, n: usize, index: &Index, ready: bool, took: Duration) {
        self.updates.inc_by(n as u64);
        self.index_slices.set(index.slice_count() as i64);
        self.index_endpoints.set(index.endpoint_count() as i64);
        self.ready.set(i64::from(ready));
        self.build_seconds.observe(took.as_secs_f64());
    }

    /// A snapshot was published.
    pub fn published(&self) {
        self.snapshots.inc();
    }
}
