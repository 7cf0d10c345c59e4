//! Stream draining in a worker: which of its open streams end, and when (the decision is the
//! core's `drain`). The root context keeps one [`StreamDrain`] per worker VM: it updates the
//! clusters' drain clocks when a snapshot arrives ([`StreamDrain::update`]), its HTTP contexts
//! register a stream when its response starts ([`StreamDrain::open`]) and leave on done
//! ([`StreamDrain::close`]), and each tick it ends the streams [`StreamDrain::due`] names.
//!
//! Only when `drain_window_ms` is set: without it no stream is registered and none ends.

use rustc_hash::FxHashMap;
use serving_picker_core::drain::{DrainClock, OpenStream, StreamBook};

/// A stream's protocol, as the drain counters name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// A gRPC call (`content-type: application/grpc...`).
    Grpc,
    /// An upgraded stream (`upgrade: websocket`).
    Websocket,
    /// Any other HTTP/2 (or HTTP/3) response.
    Http2,
    /// Any other HTTP/1.x response.
    Http1,
}

impl Protocol {
    /// Every protocol, in the order of the drain counters.
    pub const ALL: [Protocol; 4] = [
        Protocol::Grpc,
        Protocol::Http1,
        Protocol::Http2,
        Protocol::Websocket,
    ];

    /// The protocol of a request: its `content-type`, its `upgrade` header and Envoy's
    /// `request.protocol` (`HTTP/1.1`, `HTTP/2`, `HTTP/3`).
    pub fn of(content_type: Option<&[u8]>, upgrade: Option<&[u8]>, protocol: &[u8]) -> Protocol {
        if upgrade.is_some_and(|u| u.eq_ignore_ascii_case(b"websocket")) {
            Protocol::Websocket
        } else if content_type
            .is_some_and(|c| c.len() >= 16 && c[..16].eq_ignore_ascii_case(b"application/grpc"))
        {
            Protocol::Grpc
        } else if protocol.starts_with(b"HTTP/1") {
            Protocol::Http1
        } else {
            Protocol::Http2
        }
    }

    /// Its index in [`Protocol::ALL`].
    pub fn index(self) -> usize {
        match self {
            Protocol::Grpc => 0,
            Protocol::Http1 => 1,
            Protocol::Http2 => 2,
            Protocol::Websocket => 3,
        }
    }

    /// The counter of streams of this protocol the filter ended for drain (all by a stream
    /// reset: proxy-wasm has no call that ends a started response with trailers).
    pub fn reset_counter(self) -> &'static str {
        match self {
            Protocol::Grpc => "serving_picker.drain.ended.grpc.reset",
            Protocol::Http1 => "serving_picker.drain.ended.http1.reset",
            Protocol::Http2 => "serving_picker.drain.ended.http2.reset",
            Protocol::Websocket => "serving_picker.drain.ended.websocket.reset",
        }
    }
}

/// One worker's drain state: a clock per cluster, the open streams by context id.
#[derive(Debug, Default)]
pub struct StreamDrain {
    window_ms: u64,
    clocks: FxHashMap<String, DrainClock>,
    book: StreamBook<u32>,
    protocols: FxHashMap<u32, Protocol>,
}

impl StreamDrain {
    /// Streams end within `window_ms` of their host starting to drain.
    pub fn new(window_ms: u64) -> StreamDrain {
        StreamDrain {
            window_ms,
            ..StreamDrain::default()
        }
    }

    /// A snapshot arrived: each cluster's draining hosts as of `now_ms`. A cluster left out
    /// drains nothing.
    pub fn update<'a>(
        &mut self,
        now_ms: u64,
        clusters: impl IntoIterator<Item = (&'a str, &'a [String])>,
    ) {
        let mut next = FxHashMap::default();
        for (cluster, draining) in clusters {
            if draining.is_empty() {
                continue;
            }
            let mut clock = self.clocks.remove(cluster).unwrap_or_default();
            clock.update(now_ms, draining.iter().map(String::as_str));
            next.insert(cluster.to_string(), clock);
        }
        self.clocks = next;
    }

    /// Hosts that drain, over every cluster.
    pub fn draining_hosts(&self) -> usize {
        self.clocks.values().map(DrainClock::len).sum()
    }

    /// Context `id`'s response started from `address` of `cluster` at `now_ms`.
    pub fn open(&mut self, id: u32, cluster: String, address: String, now_ms: u64, p: Protocol) {
        let stream = OpenStream {
            cluster,
            address,
            opened_ms: now_ms,
            spread_key: u64::from(id),
        };
        self.book.open(id, stream);
        self.protocols.insert(id, p);
    }

    /// Context `id` is done (or was ended).
    pub fn close(&mut self, id: u32) {
        self.book.close(&id);
        self.protocols.remove(&id);
    }

    /// Streams open.
    pub fn open_streams(&self) -> usize {
        self.book.len()
    }

    /// The streams to end at `now_ms`, each with its protocol; they stay registered until
    /// [`StreamDrain::close`].
    pub fn due(&self, now_ms: u64) -> Vec<(u32, Protocol)> {
        if self.clocks.is_empty() {
            return Vec::new();
        }
        let window = self.window_ms;
        let clocks = &self.clocks;
        self.book
            .due(
                now_ms,
                |_| Some(window),
                |cluster, address| clocks.get(cluster)?.since(address),
            )
            .into_iter()
            .map(|id| {
                (
                    id,
                    self.protocols.get(&id).copied().unwrap_or(Protocol::Http2),
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn hosts(h: &[&str]) -> Vec<String> {
        h.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn streams_on_a_draining_host_end_within_the_window_only() {
        let mut d = StreamDrain::new(3_000);
        for id in 0..20 {
            d.open(id, "c".into(), "A".into(), 0, Protocol::Grpc);
        }
        d.open(100, "c".into(), "B".into(), 0, Protocol::Grpc);
        d.open(101, "other".into(), "A".into(), 0, Protocol::Http1);
        assert!(d.due(u64::MAX).is_empty(), "nothing drains yet");
        let a = hosts(&["A"]);
        d.update(1_000, [("c", a.as_slice()), ("other", &[][..])]);
        assert_eq!(d.draining_hosts(), 1);
        assert!(d.due(1_000 + 299).is_empty(), "the window's first tenth");
        let all = d.due(1_000 + 3_000);
        assert_eq!(all.len(), 20);
        assert!(all.iter().all(|&(id, p)| id < 20 && p == Protocol::Grpc));
        // A snapshot that keeps A draining keeps its window's start.
        d.update(2_000, [("c", a.as_slice())]);
        assert_eq!(d.due(4_000).len(), 20);
        // Ended streams leave.
        for (id, _) in d.due(4_000) {
            d.close(id);
        }
        assert_eq!(d.open_streams(), 2);
        // A stops draining (its cluster lost its ready host): nothing is due.
        d.open(7, "c".into(), "A".into(), 4_000, Protocol::Grpc);
        d.update(5_000, [("c", &[][..])]);
        assert!(d.due(u64::MAX).is_empty());
    }

    #[test]
    fn protocols_from_request_headers() {
        assert_eq!(
            Protocol::of(Some(b"application/grpc+proto"), None, b"HTTP/2"),
            Protocol::Grpc
        );
        assert_eq!(
            Protocol::of(None, Some(b"WebSocket"), b"HTTP/1.1"),
            Protocol::Websocket
        );
        assert_eq!(
            Protocol::of(Some(b"text/plain"), None, b"HTTP/1.1"),
            Protocol::Http1
        );
        assert_eq!(Protocol::of(None, None, b"HTTP/2"), Protocol::Http2);
        assert_eq!(
            Protocol::of(Some(b"application/gr"), None, b"HTTP/2"),
            Protocol::Http2
        );
    }
}
