//! The EDS output: what Envoy is sent, built when slices change and shared
//! by every stream.
//!
//! - `assignment`: endpoints -> a ClusterLoadAssignment (conditions
//!   metadata, the tiers as priorities).
//! - `metrics`: the index's and the publisher's metrics.
//! - `publish`: applies the source's updates to the index and publishes
//!   snapshots (never half built).
//! - `snapshot`: what is published: each resource, the table of those
//!   served now, and a snapshot of what changed.
//! - `response_bytes`: a DiscoveryResponse's (and a delta response's)
//!   bytes, resource entries encoded once per version.
//!
//! The xDS protocol of a stream is the xDS server's (`xds`).

pub mod assignment;
pub mod metrics;
pub mod publish;
pub mod response_bytes;
pub mod snapshot;
