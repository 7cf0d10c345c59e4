//! What the companion shows: Prometheus metrics and readiness (`metrics`),
//! the status page's state (`status`), and log lines at a bounded rate
//! (`ratelog`).

mod group;

pub mod metrics;
pub mod ratelog;
pub mod status;

pub(crate) use group::metric_group;

use prometheus_client::registry::{Metric, Registry};

/// `metric`, registered in `registry` as `name` with `help` (the registry
/// keeps a handle to the same metric).
pub fn registered<M: Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}
