//! What the xDS server reports, as go-control-plane's `Callbacks`: the
//! server knows only this trait; the companion answers it with its metrics
//! and status page (`xds::metrics::MetricsCallbacks`), a test with whatever
//! it records.

use std::time::Duration;

/// The xDS server's events. Called on the request and response paths: an
/// implementation records and returns, it never blocks.
pub trait Callbacks: Send + Sync + 'static {
    /// A limit's configured value (its flag's name), once at start.
    fn limit_set(&self, limit: &'static str, value: i64);
    /// A limit bit (its flag's name).
    fn limit_hit(&self, limit: &'static str);
    /// A stream refused with RESOURCE_EXHAUSTED by a limit.
    fn stream_refused(&self, limit: &'static str);
    /// A stream opened (before it names its node).
    fn stream_opened(&self);
    /// A stream's first request named its node.
    fn stream_identified(&self, node: &str, peer: &str);
    /// A stream ended; `node` empty when it never named one.
    fn stream_closed(&self, node: &str);
    /// A request message of `bytes` arrived.
    fn request_received(&self, bytes: usize);
    /// Request bytes held beyond each message's first 64 KiB, over all streams.
    fn request_buffer_bytes(&self, held: usize);
    /// Resource names requested that no cluster defines.
    fn unknown_names(&self, n: usize);
    /// A response of `resources` assignments started, `lags` from each one's change.
    fn response_started(&self, resources: usize, lags: &[Duration]);
    /// A response's every byte (`bytes`) was handed to HTTP/2.
    fn response_sent(&self, bytes: usize);
    /// Envoy accepted `version`, `after` its response was sent, on a
    /// stream from `peer` (a node id is the client's word: the peer is
    /// who sent it).
    fn acked(&self, node: &str, peer: &str, version: &str, after: Option<Duration>);
    /// Envoy rejected `version` with `message`, on a stream from `peer`.
    fn nacked(&self, node: &str, peer: &str, version: &str, message: &str);
    /// Envoy ACKed changes that happened at `triggers` (programming latency).
    fn programmed(&self, node: &str, triggers: &[std::time::SystemTime]);
    /// Names subscribed over all streams.
    fn subscriptions(&self, n: usize);
    /// A snapshot replaced a response due and not yet taken.
    fn coalesced(&self);
    /// The age of the oldest response due and not taken.
    fn oldest_unsent(&self, age: Duration);
    /// Streams subscribed to `cluster`.
    fn subscribers(&self, cluster: &str, n: i64);
    /// The server cut a stream (`reason`: the limit's flag).
    fn stream_reset(&self, reason: &'static str);
    /// Bytes the streams keep between requests (`xds::retained`), and
    /// their limit.
    fn retained_bytes(&self, _bytes: usize, _limit: usize) {}
    /// A due response of `node`'s stream waits `wait` for the stream's
    /// share of the response work (`--max-stream-send-rate`).
    fn send_held(&self, _node: &str, _wait: Duration) {}
    /// `node`'s stream is not read for `wait`: its requests changed more
    /// names than its share (`--max-stream-request-rate`).
    fn request_held(&self, _node: &str, _wait: Duration) {}
}
