//! serving-picker-conditions: watches EndpointSlices and gives Envoy each
//! endpoint's exact conditions.
//!
//! ```text
//! source (kube API | files) --Update--> publish (index -> assignments) --Snapshot--> eds (xDS streams) --> Envoy
//! ```
//!
//! - `slice`: an EndpointSlice as kept; `index`: slices by Service, endpoints
//!   by address:port (which copy wins); `endpoint`: one endpoint's conditions,
//!   health and priority; `assignment`: endpoints -> ClusterLoadAssignment;
//!   `cluster`: `--cluster` specs; `port_view`: one Service port's endpoints
//!   kept up to date slice by slice.
//! - `source::kube`, `source::files`: where slices come from.
//! - `publish`: applies updates, publishes snapshots (never half built).
//! - `eds`: the xDS protocol per stream; `xds`: the gRPC services over
//!   HTTP/2, shared response bytes, the fan-out of snapshots to streams.
//! - `limits`: every limit as a flag; `listener`: the gRPC listener's
//!   connections, counted and capped; `ratelog`: log lines at a bounded rate.
//! - `metrics`: Prometheus, `/healthz`, `/readyz` (a bounded listener).
//! - `serve`: the listeners and the gRPC server, as both modes run them.
//! - `tls`: TLS and mTLS on the gRPC listener, files reloaded as they change.
//! - `log_limit`: log lines at a bounded rate.
//! - `envoy_gateway`: mode `envoy-gateway`, Envoy Gateway's PostEndpointsModify
//!   hook answered from the index.

pub mod assignment;
pub mod cluster;
pub mod eds;
pub mod endpoint;
pub mod envoy_gateway;
#[cfg(test)]
mod fixtures;
pub mod index;
pub mod limits;
pub mod listener;
pub mod log_limit;
pub mod metrics;
pub mod port_view;
pub mod preflight;
pub mod publish;
pub mod ratelog;
pub mod serve;
pub mod slice;
pub mod source;
pub mod status;
pub mod tls;
pub mod xds;
