//! The xDS server: ADS (`StreamAggregatedResources`) and plain EDS
//! (`StreamEndpoints`, `FetchEndpoints`) over HTTP/2, each stream running
//! the protocol of `eds::stream::EdsStream` on a snapshot of `eds::publish`.
//!
//! ```text
//! publish --Snapshot--> fanout (marks streams due; cuts stuck ones) --wake--> stream body --> HTTP/2 --> Envoy
//!                                                      request task <-- DiscoveryRequest ---------------'
//! ```
//!
//! Bounded by design: a stream holds its protocol state and at most one
//! response in flight, whose resource bytes are shared with every other
//! stream (`eds::response_bytes`); responses are built only when HTTP/2 has room for
//! them (the body is polled only then), so a stream that does not read
//! costs the same as one that does, whatever the number of changes. The
//! limits (`limits::XdsLimits`, `limits::GrpcLimits`) cap streams,
//! connections, names and message sizes; one that does not read for
//! `--send-timeout` is cut.
//!
//! - `requests`: requests cut from a stream's bytes.
//! - `callbacks`: what the server reports (metrics, the status page).
//! - `server`: the gRPC services, a stream's request task and response body.
//! - `fanout`: snapshots to streams, the send timeout, the stream gauges.

pub mod callbacks;
pub mod fanout;
pub mod requests;
pub mod server;

pub use callbacks::Callbacks;
pub use server::XdsServer;
