//! The companion's limits, as flags: what one client, or all of them, may
//! take. Every hit is counted (`serving_picker_conditions_limit_hits_total
//! {limit="<flag>"}`) and logged at a bounded rate; every configured value is
//! exported (`serving_picker_conditions_limit{limit="<flag>"}`) beside the
//! usage it bounds, so a limit shows before it bites. Defaults fit the
//! shipped Deployment's 256Mi (docs/companion-limits.md has the budget).

use std::time::Duration;

/// The gRPC listener's connections (both modes).
#[derive(clap::Args, Debug, Clone)]
pub struct GrpcLimits {
    /// gRPC connections open at once; a connection over it is answered
    /// RESOURCE_EXHAUSTED on every call, then closed.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub max_connections: usize,
    /// gRPC connections open at once from one peer (one address, and under
    /// mutual TLS one client certificate on it); a connection over it is
    /// refused as one over `--max-connections`.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_connections_per_peer: usize,
    /// A gRPC connection whose first call (the HTTP/2 preface, then a
    /// stream) has not come within this of its accept is closed.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub preface_timeout: Duration,
    /// A gRPC connection open this long is told to go (HTTP/2 GOAWAY): its
    /// client opens a new one, with the certificates and CA now in force.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = humantime::parse_duration)]
    pub max_connection_age: Duration,
    /// A connection still open this long after `--max-connection-age` (a
    /// stream that never ends) is closed.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration)]
    pub max_connection_age_grace: Duration,
    /// gRPC connections whose TLS handshake is not done yet, at once. They
    /// hold no `--max-connections` slot; when this is full, the oldest one
    /// is dropped to admit a new one, so sockets that never finish a
    /// handshake cannot lock out a client that does.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_pending_handshakes: usize,
    /// A TLS handshake not done within this is dropped.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration)]
    pub handshake_timeout: Duration,
    /// Concurrent gRPC streams on one connection (HTTP/2
    /// SETTINGS_MAX_CONCURRENT_STREAMS; an xDS stream over it is refused
    /// with RESOURCE_EXHAUSTED).
    #[arg(long, value_name = "N", default_value_t = 128)]
    pub max_streams_per_connection: u32,
    /// HTTP/2 PING interval on idle gRPC connections.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub keepalive_interval: Duration,
    /// A connection whose peer does not answer a PING within this is closed.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub keepalive_timeout: Duration,
}

impl Default for GrpcLimits {
    fn default() -> Self {
        GrpcLimits {
            max_connections: 1024,
            max_connections_per_peer: 64,
            preface_timeout: Duration::from_secs(10),
            max_connection_age: Duration::from_secs(3600),
            max_connection_age_grace: Duration::from_secs(300),
            max_pending_handshakes: 256,
            handshake_timeout: Duration::from_secs(5),
            max_streams_per_connection: 128,
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
        }
    }
}

/// The xDS streams (mode `eds`).
#[derive(clap::Args, Debug, Clone)]
pub struct XdsLimits {
    /// xDS streams open at once over all connections; the next one is
    /// refused with RESOURCE_EXHAUSTED.
    #[arg(long, value_name = "N", default_value_t = 2048)]
    pub max_streams: usize,
    /// xDS streams open at once from one peer (one address, and under
    /// mutual TLS one client certificate on it); the next one is refused
    /// with RESOURCE_EXHAUSTED.
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub max_streams_per_peer: usize,
    /// A stream whose first request has not come within this of its
    /// opening ends with DEADLINE_EXCEEDED.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub first_request_timeout: Duration,
    /// A request message begun and not complete within this ends its
    /// stream with DEADLINE_EXCEEDED (and frees what it held of
    /// `--request-buffer-bytes`).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub request_receive_timeout: Duration,
    /// Resource names in one xDS request (and subscribed on one delta
    /// stream); a request with more ends its stream with
    /// RESOURCE_EXHAUSTED. The default lets one Envoy subscribe to every
    /// Service of a cluster at Kubernetes' limits (10,000 Services).
    #[arg(long, value_name = "N", default_value_t = 16384)]
    pub max_resource_names: usize,
    /// Resource names subscribed over all xDS streams at once (16 bytes
    /// each); a request that takes the total over it ends its stream with
    /// RESOURCE_EXHAUSTED. The default holds 50 Envoys subscribed to
    /// 10,000 clusters each (16 MiB at most, with what is due).
    #[arg(long, value_name = "N", default_value_t = 1 << 19)]
    pub max_subscriptions: usize,
    /// Longest resource name an xDS stream keeps (a name not served, held
    /// on a delta stream until a response answers it removed); a request
    /// naming a longer one ends its stream with RESOURCE_EXHAUSTED.
    #[arg(long, value_name = "BYTES", default_value_t = 1024)]
    pub max_name_bytes: usize,
    /// Bytes one xDS stream keeps between requests: its subscriptions (32
    /// bytes a name) and the names it is to be answered removed; a request
    /// over it ends its stream with RESOURCE_EXHAUSTED.
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 20)]
    pub max_stream_retained_bytes: usize,
    /// The same, over all xDS streams at once.
    #[arg(long, value_name = "BYTES", default_value_t = 32 << 20)]
    pub max_retained_bytes: usize,
    /// Largest xDS request message; a larger one ends its stream with
    /// RESOURCE_EXHAUSTED, refused from its 5-byte header.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20)]
    pub max_request_bytes: usize,
    /// Request bytes that all xDS streams may hold at once beyond the first
    /// 64 KiB of each message (Envoy's requests, about 60 KB with its node,
    /// never count); a message that does not fit ends its stream with
    /// RESOURCE_EXHAUSTED.
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 20)]
    pub request_buffer_bytes: usize,
    /// The share of `--request-buffer-bytes` that the streams of one peer
    /// may hold at once; a message that does not fit ends its stream with
    /// RESOURCE_EXHAUSTED.
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 20)]
    pub request_buffer_bytes_per_peer: usize,
    /// Largest xDS response message: assignments that do not fit together
    /// go in further responses; one that alone is larger is not sent.
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 20)]
    pub max_response_bytes: usize,
    /// A stream that has not taken a due response for this long (a client
    /// that does not read) is cut: its connection is closed, and the client
    /// gets the current state when it comes back.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub send_timeout: Duration,
    /// Response bytes one xDS stream is sent a second, after its
    /// `--max-stream-send-burst`: a stream that has spent its burst waits
    /// for its next response (changes coalesce meanwhile; a response is
    /// never refused nor cut), so one client that keeps asking for large
    /// responses slows only itself. 0: no budget.
    #[arg(long, value_name = "BYTES", default_value_t = 2 << 20)]
    pub max_stream_send_rate: u64,
    /// Response bytes one xDS stream may be sent at once before
    /// `--max-stream-send-rate` holds it back: a first full load that fits
    /// goes without waiting.
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 20)]
    pub max_stream_send_burst: u64,
    /// Bytes of resource names one xDS stream's requests may change a
    /// second (each name counted with 8 bytes more: its hash, lookup and
    /// place in the sort), after its `--max-stream-request-burst`: a
    /// stream that has spent its burst is not read until the debt is paid
    /// back (HTTP/2 flow control holds its client back), so one client
    /// that keeps subscribing and unsubscribing thousands of names slows
    /// only itself. Requests that change no names (delta ACKs, a
    /// state-of-the-world ACK repeating its names) cost nothing. 0: no
    /// budget.
    #[arg(long, value_name = "BYTES", default_value_t = 256 << 10)]
    pub max_stream_request_rate: u64,
    /// Bytes of resource names one xDS stream's requests may change at
    /// once before `--max-stream-request-rate` holds it back: a first
    /// subscription to `--max-resource-names` names of 64 bytes goes
    /// without waiting.
    #[arg(long, value_name = "BYTES", default_value_t = 2 << 20)]
    pub max_stream_request_burst: u64,
}

/// The part of each request message that `--request-buffer-bytes` does not count.
pub const FREE_REQUEST_BYTES: usize = 64 * 1024;

/// xDS limit flags that do not agree.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    /// `--max-response-bytes` over what a gRPC message's length can say.
    #[error("--max-response-bytes {0} is over a gRPC message's 4 GiB")]
    ResponseOverGrpc(usize),
    /// A request of `--max-request-bytes` could never be buffered.
    #[error("--max-request-bytes {max_request_bytes} cannot fit in {flag} {buffer} (plus the {FREE_REQUEST_BYTES} bytes of a message not counted)")]
    RequestOverBuffer {
        /// `--max-request-bytes`.
        max_request_bytes: usize,
        /// The buffer flag it does not fit in.
        flag: &'static str,
        /// That flag's value.
        buffer: usize,
    },
}

impl XdsLimits {
    /// The flags that must agree.
    pub fn check(&self) -> Result<(), LimitsError> {
        if u32::try_from(self.max_response_bytes).is_err() {
            return Err(LimitsError::ResponseOverGrpc(self.max_response_bytes));
        }
        for (flag, buffer) in [
            ("--request-buffer-bytes", self.request_buffer_bytes),
            (
                "--request-buffer-bytes-per-peer",
                self.request_buffer_bytes_per_peer,
            ),
        ] {
            if self.max_request_bytes > FREE_REQUEST_BYTES + buffer {
                return Err(LimitsError::RequestOverBuffer {
                    max_request_bytes: self.max_request_bytes,
                    flag,
                    buffer,
                });
            }
        }
        Ok(())
    }
}

impl Default for XdsLimits {
    fn default() -> Self {
        XdsLimits {
            max_streams: 2048,
            max_streams_per_peer: 512,
            first_request_timeout: Duration::from_secs(10),
            request_receive_timeout: Duration::from_secs(10),
            max_resource_names: 16384,
            max_subscriptions: 1 << 19,
            max_name_bytes: 1024,
            max_stream_retained_bytes: 4 << 20,
            max_retained_bytes: 32 << 20,
            max_request_bytes: 1 << 20,
            request_buffer_bytes: 16 << 20,
            request_buffer_bytes_per_peer: 4 << 20,
            max_response_bytes: 16 << 20,
            send_timeout: Duration::from_secs(30),
            max_stream_send_rate: 2 << 20,
            max_stream_send_burst: 16 << 20,
            max_stream_request_rate: 256 << 10,
            max_stream_request_burst: 2 << 20,
        }
    }
}

/// The metrics, /healthz and /readyz listener (both modes).
#[derive(clap::Args, Debug, Clone)]
pub struct HttpLimits {
    /// Connections open at once on the metrics port; a new one over it
    /// closes the oldest connection of the address that holds the most (so
    /// probes always get in, and a scrape in flight is kept).
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub metrics_max_connections: usize,
    /// Connections open at once on the metrics port from one address; a
    /// new one over it closes that address's own oldest, so a client that
    /// keeps connecting cuts only itself.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub metrics_max_connections_per_peer: usize,
    /// A request's headers must arrive within this (idle keep-alive
    /// connections included).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration)]
    pub metrics_header_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            metrics_max_connections: 64,
            metrics_max_connections_per_peer: 8,
            metrics_header_timeout: Duration::from_secs(5),
        }
    }
}

/// The limits of both listeners, for a mode's arguments (`#[command(flatten)]`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ServeLimits {
    /// The gRPC listener's connections.
    #[command(flatten)]
    pub grpc: GrpcLimits,
    /// The metrics port's connections.
    #[command(flatten)]
    pub http: HttpLimits,
}

/// Label values of `limit_hits_total` and `limit`: the flag of each limit.
pub mod names {
    /// `--max-connections`: gRPC connections open at once.
    pub const MAX_CONNECTIONS: &str = "max-connections";
    /// `--max-pending-handshakes`: gRPC connections waiting for their TLS handshake.
    pub const MAX_PENDING_HANDSHAKES: &str = "max-pending-handshakes";
    /// `--handshake-timeout`: the time a TLS handshake may take.
    pub const HANDSHAKE_TIMEOUT: &str = "handshake-timeout";
    /// `--max-streams-per-connection`: gRPC streams on one connection.
    pub const MAX_STREAMS_PER_CONNECTION: &str = "max-streams-per-connection";
    /// `--max-streams`: xDS streams over all connections.
    pub const MAX_STREAMS: &str = "max-streams";
    /// `--max-resource-names`: resource names in one xDS request.
    pub const MAX_RESOURCE_NAMES: &str = "max-resource-names";
    /// `--max-subscriptions`: resource names subscribed over all xDS streams.
    pub const MAX_SUBSCRIPTIONS: &str = "max-subscriptions";
    /// `--max-name-bytes`: the longest resource name an xDS stream keeps.
    pub const MAX_NAME_BYTES: &str = "max-name-bytes";
    /// `--max-stream-retained-bytes`: bytes one xDS stream keeps between requests.
    pub const MAX_STREAM_RETAINED_BYTES: &str = "max-stream-retained-bytes";
    /// `--max-retained-bytes`: bytes all xDS streams keep between requests.
    pub const MAX_RETAINED_BYTES: &str = "max-retained-bytes";
    /// `--max-request-bytes`: the largest xDS request message.
    pub const MAX_REQUEST_BYTES: &str = "max-request-bytes";
    /// `--request-buffer-bytes`: request bytes held beyond each message's first 64 KiB, over all
    /// streams.
    pub const REQUEST_BUFFER_BYTES: &str = "request-buffer-bytes";
    /// `--max-response-bytes`: the largest xDS response message.
    pub const MAX_RESPONSE_BYTES: &str = "max-response-bytes";
    /// `--send-timeout`: how long a due response may wait for its stream.
    pub const SEND_TIMEOUT: &str = "send-timeout";
    /// `--max-stream-send-rate`: response bytes one xDS stream is sent a second, after its burst.
    pub const MAX_STREAM_SEND_RATE: &str = "max-stream-send-rate";
    /// `--max-stream-send-burst`: response bytes one xDS stream may be sent at once.
    pub const MAX_STREAM_SEND_BURST: &str = "max-stream-send-burst";
    /// `--max-stream-request-rate`: bytes of names one xDS stream's requests may change a second.
    pub const MAX_STREAM_REQUEST_RATE: &str = "max-stream-request-rate";
    /// `--max-stream-request-burst`: bytes of names one xDS stream's requests may change at once.
    pub const MAX_STREAM_REQUEST_BURST: &str = "max-stream-request-burst";
    /// `--metrics-max-connections`: connections open on the metrics port.
    pub const METRICS_MAX_CONNECTIONS: &str = "metrics-max-connections";
    /// `--metrics-header-timeout`: the time a metrics request's headers may take.
    pub const METRICS_HEADER_TIMEOUT: &str = "metrics-header-timeout";
    /// `--max-connections-per-peer`: gRPC connections open from one peer.
    pub const MAX_CONNECTIONS_PER_PEER: &str = "max-connections-per-peer";
    /// `--preface-timeout`: the time from accept to a connection's first call.
    pub const PREFACE_TIMEOUT: &str = "preface-timeout";
    /// `--max-connection-age`: how long a gRPC connection is kept before GOAWAY.
    pub const MAX_CONNECTION_AGE: &str = "max-connection-age";
    /// `--max-connection-age-grace`: how long a connection may outlive its GOAWAY.
    pub const MAX_CONNECTION_AGE_GRACE: &str = "max-connection-age-grace";
    /// `--max-streams-per-peer`: xDS streams open from one peer.
    pub const MAX_STREAMS_PER_PEER: &str = "max-streams-per-peer";
    /// `--first-request-timeout`: the time from a stream's opening to its first request.
    pub const FIRST_REQUEST_TIMEOUT: &str = "first-request-timeout";
    /// `--request-receive-timeout`: the time a begun request message may take to arrive.
    pub const REQUEST_RECEIVE_TIMEOUT: &str = "request-receive-timeout";
    /// `--request-buffer-bytes-per-peer`: one peer's share of `--request-buffer-bytes`.
    pub const REQUEST_BUFFER_BYTES_PER_PEER: &str = "request-buffer-bytes-per-peer";
    /// `--metrics-max-connections-per-peer`: metrics port connections from one address.
    pub const METRICS_MAX_CONNECTIONS_PER_PEER: &str = "metrics-max-connections-per-peer";
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeLimits,
        #[command(flatten)]
        xds: XdsLimits,
    }

    #[test]
    fn flag_defaults_equal_the_default_structs() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(
            format!("{:?}", cli.serve),
            format!("{:?}", ServeLimits::default())
        );
        assert_eq!(
            format!("{:?}", cli.xds),
            format!("{:?}", XdsLimits::default())
        );
        let cli =
            Cli::try_parse_from(["x", "--send-timeout", "1500ms", "--max-streams", "7"]).unwrap();
        assert_eq!(cli.xds.send_timeout, Duration::from_millis(1500));
        assert_eq!(cli.xds.max_streams, 7);
        assert!(Cli::try_parse_from(["x", "--keepalive-interval", "soon"]).is_err());
        assert!(cli.xds.check().is_ok());
        let cli = Cli::try_parse_from([
            "x",
            "--request-buffer-bytes",
            "0",
            "--max-request-bytes",
            "70000",
        ])
        .unwrap();
        assert!(cli
            .xds
            .check()
            .unwrap_err()
            .to_string()
            .contains("--request-buffer-bytes"));
    }
}
