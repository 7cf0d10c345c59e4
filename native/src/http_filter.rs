//! The stream-drain HTTP filter (`filter_name: serving_picker_drain`), in plain Rust: what a
//! stream is (gRPC, HTTP/1, HTTP/2, websocket), how each ends when its host drains, the
//! counters, and the filter's configuration. Envoy is reached through [`Stream`], so the
//! filter is tested natively against a fake (`testing::FakeStream`); `http_hooks` is the glue.
//!
//! How a stream ends (docs/native.md says what the client sees, with Envoy's source lines):
//! - gRPC (request `content-type: application/grpc*` over HTTP/2): the response ends with trailers
//!   `grpc-status: 14` (UNAVAILABLE, which gRPC clients retry) and a `grpc-message` naming
//!   the reason;
//! - any other stream (HTTP/1 and HTTP/2 responses, websockets): it is reset. A reset, unlike
//!   an end, tells the client the response is incomplete; HTTP/1 and websockets lose their
//!   connection, HTTP/2 gets RST_STREAM.

use serving_picker_core::config::{err, json_object, ConfigError};

/// The one `filter_name` this module's HTTP filter serves.
pub const FILTER_NAME: &str = "serving_picker_drain";
/// gRPC's UNAVAILABLE, which clients retry.
pub const GRPC_STATUS_UNAVAILABLE: &str = "14";
/// The `grpc-message` of a stream ended for drain.
pub const GRPC_MESSAGE: &str = "serving-picker: upstream pod terminating";
/// The gauge of the streams the module tracks now (every worker), against its bound
/// (`drain::MAX_TRACKED_STREAMS`).
pub const OPEN_STREAMS_GAUGE: &str = "serving_picker.drain.open_streams";
/// The reset's details in Envoy's access log (`%RESPONSE_CODE_DETAILS%`).
pub const RESET_DETAILS: &str = "serving_picker_drain";

/// What kind of stream, as the counters name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// gRPC (any HTTP version).
    Grpc,
    /// An HTTP/1 response.
    Http1,
    /// An HTTP/2 (or HTTP/3) response.
    Http2,
    /// A websocket (HTTP/1 upgrade or HTTP/2 extended CONNECT).
    Websocket,
}

impl Protocol {
    /// The stream's kind from its request: `content-type`, `upgrade`, `:protocol` and the
    /// HTTP version Envoy names (`HTTP/1.1`, `HTTP/2`, ...).
    pub fn of(
        content_type: Option<&str>,
        upgrade: Option<&str>,
        pseudo_protocol: Option<&str>,
        http_version: Option<&str>,
    ) -> Protocol {
        let is = |v: Option<&str>, what: &str| v.is_some_and(|v| v.eq_ignore_ascii_case(what));
        let http1 = http_version.is_some_and(|v| v.starts_with("HTTP/1"));
        let grpc = content_type.is_some_and(|c| {
            c.get(..16)
                .is_some_and(|p| p.eq_ignore_ascii_case("application/grpc"))
        });
        if is(upgrade, "websocket") || is(pseudo_protocol, "websocket") {
            Protocol::Websocket
        } else if http1 {
            // gRPC-web over HTTP/1 too: HTTP/1 carries no trailers unless the listener enables
            // them, and a response ended without them would look complete.
            Protocol::Http1
        } else if grpc {
            Protocol::Grpc
        } else {
            Protocol::Http2
        }
    }

    /// How a stream of this kind ends for drain.
    pub fn end(self) -> End {
        match self {
            Protocol::Grpc => End::TrailersUnavailable,
            _ => End::Reset,
        }
    }
}

/// How a stream ends for drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Trailers `grpc-status: 14` and `grpc-message` end the response.
    TrailersUnavailable,
    /// The stream is reset.
    Reset,
}

/// The filter's counters (unlabelled: one per protocol and outcome; defined on the filter
/// configuration, shown as `dynamicmodulescustom.<name>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainCounter {
    /// gRPC streams ended with trailers `grpc-status: 14`.
    GrpcTrailersUnavailable,
    /// HTTP/1 responses reset.
    Http1Reset,
    /// HTTP/2 responses reset.
    Http2Reset,
    /// Websockets reset.
    WebsocketReset,
    /// Streams served without a drain: the board was full (`drain::MAX_TRACKED_STREAMS`).
    Untracked,
}

impl DrainCounter {
    /// Every counter, in the order their ids are defined.
    pub const ALL: [DrainCounter; 5] = [
        DrainCounter::GrpcTrailersUnavailable,
        DrainCounter::Http1Reset,
        DrainCounter::Http2Reset,
        DrainCounter::WebsocketReset,
        DrainCounter::Untracked,
    ];

    /// Its stable name.
    pub fn name(self) -> &'static str {
        match self {
            DrainCounter::GrpcTrailersUnavailable => {
                "serving_picker.drain.ended.grpc.trailers_unavailable"
            }
            DrainCounter::Http1Reset => "serving_picker.drain.ended.http1.reset",
            DrainCounter::Http2Reset => "serving_picker.drain.ended.http2.reset",
            DrainCounter::WebsocketReset => "serving_picker.drain.ended.websocket.reset",
            DrainCounter::Untracked => "serving_picker.drain.untracked",
        }
    }

    /// The counter of a stream of `protocol` ended by `end`.
    pub fn ended(protocol: Protocol, end: End) -> DrainCounter {
        match (protocol, end) {
            (Protocol::Grpc, End::TrailersUnavailable) => DrainCounter::GrpcTrailersUnavailable,
            (Protocol::Http1, _) => DrainCounter::Http1Reset,
            (Protocol::Websocket, _) => DrainCounter::WebsocketReset,
            _ => DrainCounter::Http2Reset,
        }
    }

    /// Its place in `ALL`.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The filter's configuration (`filter_config`): a JSON object, empty today; any key is
/// refused, named.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FilterConfig {}

/// Parses the filter configuration; empty means every default.
pub fn parse_config(raw: &[u8]) -> Result<FilterConfig, ConfigError> {
    let Some(map) = json_object(raw)? else {
        return Ok(FilterConfig::default());
    };
    if let Some((key, _)) = map.into_iter().next() {
        return Err(err(
            &key,
            "unknown key (the drain filter takes no keys: drain_window_ms is set on the cluster's serving_picker load-balancing policy)",
        ));
    }
    Ok(FilterConfig::default())
}

/// One stream, as the filter sees it through Envoy.
pub trait Stream {
    /// A request header's first value.
    fn request_header(&self, name: &str) -> Option<String>;
    /// The request's HTTP version as Envoy names it (`HTTP/1.1`, `HTTP/2`).
    fn http_version(&self) -> Option<String>;
    /// The cluster the route sent the stream to.
    fn cluster(&self) -> Option<String>;
    /// The upstream host the stream went to (`IP:PORT`).
    fn upstream_address(&self) -> Option<String>;
    /// Ends the response with these trailers.
    fn send_trailers(&self, trailers: &[(&str, &str)]);
    /// Resets the stream.
    fn reset(&self);
}

/// The stream's kind, read from its request headers.
pub fn protocol_of(stream: &impl Stream) -> Protocol {
    Protocol::of(
        stream.request_header("content-type").as_deref(),
        stream.request_header("upgrade").as_deref(),
        stream.request_header(":protocol").as_deref(),
        stream.http_version().as_deref(),
    )
}

/// Ends `stream` for drain; the counter to add one to. The last call into Envoy: Envoy may
/// destroy the filter during it.
pub fn end_stream(stream: &impl Stream, protocol: Protocol) -> DrainCounter {
    let end = protocol.end();
    match end {
        End::TrailersUnavailable => stream.send_trailers(&[
            ("grpc-status", GRPC_STATUS_UNAVAILABLE),
            ("grpc-message", GRPC_MESSAGE),
        ]),
        End::Reset => stream.reset(),
    }
    DrainCounter::ended(protocol, end)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::testing::FakeStream;
    use std::collections::BTreeSet;

    #[test]
    fn kinds_of_stream() {
        let p = Protocol::of;
        assert_eq!(
            p(Some("application/grpc"), None, None, Some("HTTP/2")),
            Protocol::Grpc
        );
        assert_eq!(
            p(Some("application/grpc+proto"), None, None, Some("HTTP/2")),
            Protocol::Grpc
        );
        assert_eq!(
            p(Some("Application/GRPC-web"), None, None, Some("HTTP/2")),
            Protocol::Grpc
        );
        assert_eq!(
            p(Some("application/grpc-web"), None, None, Some("HTTP/1.1")),
            Protocol::Http1,
            "no trailers on HTTP/1: a cut, not a clean-looking end"
        );
        assert_eq!(
            p(Some("application/json"), None, None, Some("HTTP/2")),
            Protocol::Http2
        );
        assert_eq!(p(None, None, None, Some("HTTP/1.1")), Protocol::Http1);
        assert_eq!(p(None, None, None, None), Protocol::Http2);
        assert_eq!(
            p(None, Some("WebSocket"), None, Some("HTTP/1.1")),
            Protocol::Websocket
        );
        assert_eq!(
            p(None, None, Some("websocket"), Some("HTTP/2")),
            Protocol::Websocket
        );
        assert_eq!(p(Some("app"), None, None, Some("HTTP/2")), Protocol::Http2);
    }

    #[test]
    fn grpc_ends_with_unavailable_and_the_rest_are_reset() {
        let s = FakeStream::default().header("content-type", "application/grpc");
        assert_eq!(
            end_stream(&s, protocol_of(&s)),
            DrainCounter::GrpcTrailersUnavailable
        );
        assert_eq!(
            s.trailers(),
            vec![
                ("grpc-status".to_string(), "14".to_string()),
                (
                    "grpc-message".to_string(),
                    "serving-picker: upstream pod terminating".to_string()
                )
            ]
        );
        assert!(!s.was_reset());
        for (s, counter) in [
            (
                FakeStream::default().version("HTTP/1.1"),
                DrainCounter::Http1Reset,
            ),
            (
                FakeStream::default().version("HTTP/2"),
                DrainCounter::Http2Reset,
            ),
            (
                FakeStream::default()
                    .version("HTTP/1.1")
                    .header("upgrade", "websocket"),
                DrainCounter::WebsocketReset,
            ),
        ] {
            assert_eq!(end_stream(&s, protocol_of(&s)), counter);
            assert!(s.was_reset() && s.trailers().is_empty());
        }
    }

    #[test]
    fn counter_names_are_distinct_and_stable() {
        let names: BTreeSet<&str> = DrainCounter::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(names.len(), DrainCounter::ALL.len());
        assert!(names.iter().all(|n| n.starts_with("serving_picker.drain.")));
        assert!(DrainCounter::ALL
            .iter()
            .enumerate()
            .all(|(i, c)| c.index() == i));
    }

    #[test]
    fn the_configuration_is_empty_and_keys_are_refused_by_name() {
        for raw in ["", " ", "{}"] {
            assert_eq!(parse_config(raw.as_bytes()), Ok(FilterConfig::default()));
        }
        let e = parse_config(br#"{"a": 1, "a": 2}"#).unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.reason.as_str()),
            ("a", "given more than once")
        );
        let e = parse_config(br#"{"drain_window_ms": 15000}"#).unwrap_err();
        assert_eq!(e.key, "drain_window_ms");
        assert!(e.reason.contains("load-balancing policy"), "{e}");
        assert!(parse_config(b"[]").is_err());
        assert!(parse_config(b"{").is_err());
    }
}
