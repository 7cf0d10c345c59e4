//! serving-picker-conditions, the conditions companion: watches
//! EndpointSlices and gives Envoy each endpoint's exact conditions.
//!
//! ```text
//! source (kube API | files) --Update--> eds::publish (index -> assignments) --Snapshot--> xds (streams) --> Envoy
//!                                  \--> envoy_gateway (index) <-- PostEndpointsModify -- Envoy Gateway
//! ```
//!
//! Layers, each importing only the ones above it in this list:
//! - `limits`: every limit as a flag, and the names metrics give them.
//! - `model`: EndpointSlices, the index, endpoints and their conditions,
//!   Service ports, `--cluster` specs; no IO.
//! - `telemetry`: Prometheus metrics and readiness, the status page's
//!   state, log lines at a bounded rate.
//! - `net`: the gRPC listener's connections and TLS, the admin HTTP server.
//! - `source`: where slices come from (the Kubernetes API or files).
//! - `eds`: the EDS output: assignments, snapshots, response bytes.
//! - `xds`: the xDS server over HTTP/2 (mode `eds`): the protocol of one
//!   stream (state of the world and delta), what streams keep, the fan-out
//!   of snapshots to streams.
//! - `envoy_gateway`: Envoy Gateway's PostEndpointsModify hook (mode
//!   `envoy-gateway`).
//! - `run`: each mode's tasks wired together, the admin HTTP server's
//!   among them.
//! - `preflight`: checks of a cluster before installing (its own command).

pub mod eds;
pub mod envoy_gateway;
pub mod limits;
pub mod model;
pub mod net;
pub mod preflight;
pub mod run;
pub mod source;
pub mod telemetry;
pub mod xds;
