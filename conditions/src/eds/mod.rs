//! The EDS output: what Envoy is sent, built when slices change and shared
//! by every stream.
//!
//! - `assignment`: endpoints -> a ClusterLoadAssignment (conditions
//!   metadata, the tiers as priorities).
//! - `publish`: applies the source's updates to the index and publishes
//!   snapshots (never half built).
//! - `response_bytes`: a DiscoveryResponse's bytes, resource entries
//!   encoded once per snapshot.
//! - `stream`: the xDS protocol of one stream (ADS or EDS) over snapshots,
//!   without a network: requests in, responses due, ACK and NACK.

pub mod assignment;
pub mod publish;
pub mod response_bytes;
pub mod stream;
