//! The xDS server: ADS (`StreamAggregatedResources`,
//! `DeltaAggregatedResources`) and plain EDS (`StreamEndpoints`,
//! `DeltaEndpoints`, `FetchEndpoints`) over HTTP/2, state of the world and
//! incremental, each stream running its protocol's state (`sotw`, `delta`)
//! over the snapshots of `eds::publish`.
//!
//! ```text
//! publish --Snapshot (what changed)--> fanout (marks streams due; cuts stuck ones) --wake--> stream body --> HTTP/2 --> Envoy
//!                                                             request task <-- DiscoveryRequest ---------------'
//! ```
//!
//! Bounded by design: a stream holds its protocol state (16 bytes per name
//! subscribed, `--max-subscriptions` over all; every byte it keeps between
//! requests within `--max-stream-retained-bytes`, `--max-retained-bytes`
//! over all) and at most one response in
//! flight, whose resource bytes are shared with every other stream
//! (`eds::response_bytes`); responses are built only when HTTP/2 has room
//! for them (the body is polled only then), so a stream that does not read
//! costs the same as one that does, whatever the number of changes. A
//! change costs a stream a lookup per changed resource, not per
//! subscription. The limits (`limits::XdsLimits`, `limits::GrpcLimits`)
//! cap streams, connections, names and message sizes; one that does not
//! read for `--send-timeout` is cut.
//!
//! - `protocol`: what both protocols share (names served, ACK bookkeeping,
//!   responses as the transport takes them).
//! - `subscriptions`: one stream's names, what it was sent, what is due.
//! - `retained`: the bytes streams keep between requests, bounded per
//!   stream and over all.
//! - `byte_budget`: one stream's share of the work, in bytes of responses
//!   (`--max-stream-send-rate`) and of names requested
//!   (`--max-stream-request-rate`).
//! - `sotw`, `delta`: each protocol's rules, without a network.
//! - `stream_state`: either protocol's state behind one type.
//! - `requests`: requests cut from a stream's bytes.
//! - `callbacks`: what the server reports (metrics, the status page).
//! - `metrics`: the xDS metrics, and the callbacks that record in them.
//! - `server`: what the streams share, and the server that owns it.
//! - `routing`: the gRPC services, a call routed to a new stream.
//! - `request_reader`, `request_task`: a stream's requests, cut from its
//!   body and handled one at a time.
//! - `response_body`: a stream's responses, taken when HTTP/2 has room.
//! - `fanout`: snapshots to streams, the send timeout, the stream gauges.

pub mod byte_budget;
pub mod callbacks;
pub mod delta;
pub mod fanout;
#[cfg(test)]
mod fuzz;
pub mod metrics;
pub mod protocol;
mod request_reader;
mod request_task;
pub mod requests;
mod response_body;
pub mod retained;
mod routing;
pub mod server;
pub mod sotw;
pub mod stream_state;
pub mod subscriptions;

pub use callbacks::Callbacks;
pub use protocol::Names;
pub use routing::{AdsService, EdsService};
pub use server::XdsServer;
