//! A stream's response body: HTTP/2 polls it when the stream has window,
//! and only then is a response taken from the stream's state; its drop
//! closes the stream.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body::Frame;
use tonic::Status;

use crate::limits::names as limit;
use crate::telemetry::ratelog::LogBudget;
use crate::xds::byte_budget::ByteBudget;
use crate::xds::protocol::Taken;
use crate::xds::server::{Core, StreamShared, OPEN_LOG};

/// Largest piece of a response handed to HTTP/2 at once: a stream's
/// response goes out as the peer's window allows, not all queued at once.
const CHUNK: usize = 64 * 1024;

static OVERSIZED_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));
static HELD_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));

fn trailers(status: &Status) -> HeaderMap {
    let mut h = HeaderMap::new();
    if status.add_header(&mut h).is_err() {
        h.insert("grpc-status", HeaderValue::from_static("13"));
    }
    h
}

/// The response taken and not fully handed to HTTP/2 yet.
struct InFlight {
    bytes: usize,
}

/// A stream's responses. HTTP/2 polls it only when the stream and the
/// connection have window: only then is a response taken from the state,
/// from the newest snapshot.
pub(super) struct ResponseBody {
    core: Arc<Core>,
    shared: Arc<StreamShared>,
    chunks: VecDeque<Bytes>,
    in_flight: Option<InFlight>,
    finished: bool,
    /// The stream's share of the response work.
    budget: ByteBudget,
    /// The wait for it, while the stream is in debt.
    held: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl ResponseBody {
    /// The body of the stream `shared`, nothing taken yet.
    pub(super) fn new(core: Arc<Core>, shared: Arc<StreamShared>) -> ResponseBody {
        let budget = ByteBudget::new(
            core.limits.max_stream_send_rate,
            core.limits.max_stream_send_burst,
            tokio::time::Instant::now().into_std(),
        );
        ResponseBody {
            core,
            shared,
            chunks: VecDeque::new(),
            in_flight: None,
            finished: false,
            budget,
            held: None,
        }
    }

    /// Whether the stream's next response waits for its share of the
    /// response work; the body is woken when the wait is over.
    fn is_held(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if let Some(sleep) = &mut self.held {
                if sleep.as_mut().poll(cx).is_pending() {
                    return true;
                }
                self.held = None;
            }
            let now = tokio::time::Instant::now();
            let Some(wait) = self.budget.wait(now.into_std()) else {
                return false;
            };
            // Held only when a response is due: a stream with nothing to
            // send costs nothing, and its next change is timed from then.
            if self.shared.state().due_since().is_none() {
                return false;
            }
            let node = self.shared.node();
            self.core.callbacks.send_held(&node, wait);
            if let Some(left_out) = HELD_LOG.allow() {
                tracing::info!(node = %node, peer = %self.shared.peer, wait_ms = wait.as_millis() as u64, rate = self.core.limits.max_stream_send_rate, left_out, "xDS stream over its --max-stream-send-rate: its next response waits (changes coalesce meanwhile)");
            }
            self.shared.set_held_until(now.into_std() + wait);
            self.held = Some(Box::pin(tokio::time::sleep_until(now + wait)));
        }
    }

    fn take(&mut self) -> Option<()> {
        let snap = self.core.snapshots.borrow().clone();
        let now = Instant::now();
        let Taken {
            response,
            oversized,
        } = self
            .shared
            .state()
            .take(&snap, self.core.limits.max_response_bytes, now);
        for (name, bytes) in oversized {
            self.core.callbacks.limit_hit(limit::MAX_RESPONSE_BYTES);
            if let Some(left_out) = OVERSIZED_LOG.allow() {
                tracing::error!(cluster = %name, bytes, max = self.core.limits.max_response_bytes, left_out, "assignment over --max-response-bytes: not sent");
            }
        }
        let p = response?;
        self.core.callbacks.response_started(p.resources, &p.lags);
        tracing::debug!(node = %self.shared.node(), version = %p.version, nonce = p.nonce, resources = p.resources, bytes = p.wire_len, "xDS response taken");
        self.budget
            .spend(p.wire_len, tokio::time::Instant::now().into_std());
        self.in_flight = Some(InFlight { bytes: p.wire_len });
        self.shared.set_sending_since(Some(now));
        self.chunks.push_back(p.head);
        for mut e in p.entries {
            while e.len() > CHUNK {
                self.chunks.push_back(e.split_to(CHUNK));
            }
            self.chunks.push_back(e);
        }
        self.chunks.push_back(p.tail);
        Some(())
    }
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        loop {
            if let Some(chunk) = this.chunks.pop_front() {
                if this.chunks.is_empty() {
                    if let Some(f) = this.in_flight.take() {
                        this.core.callbacks.response_sent(f.bytes);
                        this.shared.set_sending_since(None);
                    }
                }
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            if this.finished {
                return Poll::Ready(None);
            }
            this.shared.wake.register(cx.waker());
            let end = this
                .shared
                .end
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(status) = end {
                this.finished = true;
                return Poll::Ready(Some(Ok(Frame::trailers(trailers(&status)))));
            }
            if this.is_held(cx) || this.take().is_none() {
                return Poll::Pending;
            }
        }
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        let core = &self.core;
        core.streams.map().remove(&self.shared.id);
        core.streams.open.fetch_sub(1, Ordering::SeqCst);
        let counted = self.shared.counted.swap(0, Ordering::SeqCst);
        core.subscriptions.fetch_sub(counted, Ordering::SeqCst);
        if let Some(c) = &self.shared.conn {
            c.streams.fetch_sub(1, Ordering::SeqCst);
            if let Some(share) = c.share() {
                share.streams.fetch_sub(1, Ordering::SeqCst);
            }
        }
        core.callbacks.stream_closed(&self.shared.node());
        self.shared.closed.notify_one();
        if let Some(left_out) = OPEN_LOG.allow() {
            tracing::info!(api = self.shared.api, node = %self.shared.node(), peer = %self.shared.peer, left_out, "xDS stream closed");
        }
    }
}
