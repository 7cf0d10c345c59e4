//! The hook's requests counted as their bytes arrive, before they are
//! buffered.
//!
//! tonic buffers a whole request before the service sees it, and sizes its
//! buffer from the length the client announces. [`Intake`] wraps the hook's
//! gRPC service and its request bodies: each chunk of a request takes twice
//! its size (the request and its answer, as `admit` counts them) from the
//! byte budget shared with the service (`--max-bytes-held`) before tonic
//! sees it. A request is refused, its bytes given back at once:
//! - RESOURCE_EXHAUSTED when a message announces more than
//!   `--max-message-size` (before tonic reserves it), or when its next chunk
//!   does not fit in the budget;
//! - DEADLINE_EXCEEDED when it is not received whole within
//!   `--receive-timeout-ms` (a client that sends slowly or stops holds its
//!   bytes that long at most).
//!
//! A request received whole hands its bytes to the service ([`Received`] in
//! the request's extensions), which holds them until its answer is built.
//! Envoy Gateway (`failOpen: true` as shipped) keeps its own resources on a
//! refusal.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::{Body as HttpBody, Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service};
use tonic::server::NamedService;
use tonic::Status;

use crate::telemetry::metrics::Labels;

/// The gRPC message prefix: a compression flag and a 4-byte length.
const PREFIX: usize = 5;

/// The bytes the hook's calls may hold (`--max-bytes-held`), shared by the
/// requests being received and the calls being answered; `bytes_held`
/// shows what is taken.
#[derive(Clone, Debug)]
pub struct ByteBudget {
    permits: Arc<Semaphore>,
    bytes_held: Gauge,
}

impl ByteBudget {
    /// A budget of `limit` bytes, shown in `bytes_held`.
    pub fn new(limit: usize, bytes_held: Gauge) -> ByteBudget {
        ByteBudget {
            permits: Arc::new(Semaphore::new(limit.min(Semaphore::MAX_PERMITS))),
            bytes_held,
        }
    }

    /// `bytes` taken now, or `None` when they do not fit.
    pub fn take(&self, bytes: usize) -> Option<Held> {
        let n = u32::try_from(bytes).ok()?;
        let permit = if n == 0 {
            None
        } else {
            Some(self.permits.clone().try_acquire_many_owned(n).ok()?)
        };
        self.bytes_held.inc_by(bytes as i64);
        Some(Held {
            permit,
            bytes,
            bytes_held: self.bytes_held.clone(),
        })
    }
}

/// Bytes taken from a [`ByteBudget`], given back when dropped.
#[derive(Debug)]
pub struct Held {
    permit: Option<OwnedSemaphorePermit>,
    bytes: usize,
    bytes_held: Gauge,
}

impl Held {
    /// How many bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// `other`'s bytes held with these.
    fn merge(&mut self, mut other: Held) {
        match (&mut self.permit, other.permit.take()) {
            (Some(p), Some(o)) => p.merge(o),
            (None, o) => self.permit = o,
            (Some(_), None) => {}
        }
        self.bytes += other.bytes;
        other.bytes = 0;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.bytes_held.dec_by(self.bytes as i64);
    }
}

/// A request's bytes, handed from its body to the service once received
/// whole (in the request's extensions).
#[derive(Clone, Debug, Default)]
pub struct Received(Arc<Mutex<Option<Held>>>);

impl Received {
    /// The bytes, taken (once).
    pub fn take(&self) -> Option<Held> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn put(&self, held: Held) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(held);
    }
}

/// The limits of [`Intake`].
#[derive(Clone, Debug)]
pub struct IntakeLimits {
    /// Largest message a request may announce (`--max-message-size`).
    pub max_message_size: usize,
    /// Time to receive a request whole (`--receive-timeout-ms`).
    pub receive_timeout: Duration,
}

/// Requests refused while they arrived, by reason, and those arriving.
#[derive(Clone, Debug)]
pub struct IntakeMetrics {
    /// `eg_hook_refused_total{reason}`.
    pub refused: Family<Labels, Counter>,
    /// `eg_hook_requests_receiving`.
    pub receiving: Gauge,
}

/// The `reason` label values of `eg_hook_refused_total`.
pub const REFUSED_REASONS: [&str; 3] = ["too_large", "over_bytes", "receive_timeout"];

impl IntakeMetrics {
    fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&vec![("reason", reason)]).inc();
    }
}

/// Wraps the hook's gRPC service `S`: its request bodies counted as they
/// arrive (module docs).
#[derive(Clone)]
pub struct Intake<S> {
    inner: S,
    budget: ByteBudget,
    limits: IntakeLimits,
    metrics: IntakeMetrics,
}

impl<S> Intake<S> {
    /// `inner` behind the budget and limits.
    pub fn new(
        inner: S,
        budget: ByteBudget,
        limits: IntakeLimits,
        metrics: IntakeMetrics,
    ) -> Intake<S> {
        Intake {
            inner,
            budget,
            limits,
            metrics,
        }
    }
}

impl<S: NamedService> NamedService for Intake<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Intake<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let received = Received::default();
        let (mut parts, body) = req.into_parts();
        parts.extensions.insert(received.clone());
        let counted = Counted::new(
            body,
            self.budget.clone(),
            &self.limits,
            self.metrics.clone(),
            received,
        );
        let fut = self
            .inner
            .call(http::Request::from_parts(parts, Body::new(counted)));
        Box::pin(fut)
    }
}

/// Where the reading of a message's prefix and body is.
#[derive(Debug)]
enum Framing {
    /// `n` bytes of the prefix read so far (in `prefix`).
    Prefix(usize),
    /// `left` bytes of a message's body still to come.
    Body { left: usize },
}

/// A request body whose chunks take from the budget as they arrive.
struct Counted {
    inner: Body,
    budget: ByteBudget,
    max_message_size: usize,
    metrics: IntakeMetrics,
    held: Option<Held>,
    received: Received,
    prefix: [u8; PREFIX],
    framing: Framing,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
    /// Ended (refused or complete): nothing more is read.
    done: bool,
}

impl Counted {
    fn new(
        inner: Body,
        budget: ByteBudget,
        limits: &IntakeLimits,
        metrics: IntakeMetrics,
        received: Received,
    ) -> Counted {
        metrics.receiving.inc();
        Counted {
            inner,
            budget,
            max_message_size: limits.max_message_size,
            metrics,
            held: None,
            received,
            prefix: [0; PREFIX],
            framing: Framing::Prefix(0),
            deadline: Box::pin(tokio::time::sleep(limits.receive_timeout)),
            timeout: limits.receive_timeout,
            done: false,
        }
    }

    /// Ends the request with `status`: its bytes given back now.
    fn refuse(&mut self, reason: &'static str, status: Status) -> Status {
        self.metrics.refused(reason);
        self.held = None;
        self.done = true;
        tracing::debug!(
            reason,
            message = status.message(),
            "hook request refused while it arrived"
        );
        status
    }

    /// Walks `data`'s message prefixes: the first announced length over
    /// `--max-message-size`, if any.
    fn announced_too_large(&mut self, mut data: &[u8]) -> Option<usize> {
        while !data.is_empty() {
            match &mut self.framing {
                Framing::Prefix(n) => {
                    let take = (PREFIX - *n).min(data.len());
                    self.prefix[*n..*n + take].copy_from_slice(&data[..take]);
                    *n += take;
                    data = &data[take..];
                    if *n == PREFIX {
                        let mut len = &self.prefix[1..];
                        let announced = len.get_u32() as usize;
                        if announced > self.max_message_size {
                            return Some(announced);
                        }
                        self.framing = Framing::Body { left: announced };
                    }
                }
                Framing::Body { left } => {
                    let take = (*left).min(data.len());
                    *left -= take;
                    data = &data[take..];
                    if *left == 0 {
                        self.framing = Framing::Prefix(0);
                    }
                }
            }
        }
        None
    }

    /// Takes twice `data`'s size from the budget for it.
    fn count(&mut self, data: &Bytes) -> Result<(), Status> {
        if let Some(announced) = self.announced_too_large(data) {
            let max = self.max_message_size;
            return Err(self.refuse(
                "too_large",
                Status::resource_exhausted(format!(
                    "the request announces {announced} bytes, over --max-message-size {max}"
                )),
            ));
        }
        let Some(more) = self.budget.take(data.len().saturating_mul(2)) else {
            let held = self.held.as_ref().map_or(0, Held::bytes);
            return Err(self.refuse(
                "over_bytes",
                Status::resource_exhausted(format!(
                    "the hook's calls hold --max-bytes-held bytes: this request ({} bytes received) is refused",
                    held / 2
                )),
            ));
        };
        match &mut self.held {
            Some(h) => h.merge(more),
            None => self.held = Some(more),
        }
        Ok(())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.metrics.receiving.dec();
        if let Some(held) = self.held.take() {
            self.received.put(held);
        }
    }
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if let Err(status) = self.count(data) {
                        return Poll::Ready(Some(Err(status)));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Pending => {
                if self.deadline.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let ms = self.timeout.as_millis();
                Poll::Ready(Some(Err(self.refuse(
                    "receive_timeout",
                    Status::deadline_exceeded(format!(
                        "the request was not received whole within --receive-timeout-ms {ms}"
                    )),
                ))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use http_body_util::BodyExt;

    fn metrics() -> IntakeMetrics {
        IntakeMetrics {
            refused: Family::default(),
            receiving: Gauge::default(),
        }
    }

    fn message(len: usize) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend_from_slice(&(len as u32).to_be_bytes());
        m.extend(std::iter::repeat_n(7u8, len));
        m
    }

    fn counted(body: Body, budget: &ByteBudget, max: usize, received: Received) -> Counted {
        Counted::new(
            body,
            budget.clone(),
            &IntakeLimits {
                max_message_size: max,
                receive_timeout: Duration::from_secs(5),
            },
            metrics(),
            received,
        )
    }

    #[tokio::test]
    async fn a_request_received_whole_hands_twice_its_bytes_to_the_service() {
        let gauge = Gauge::default();
        let budget = ByteBudget::new(1000, gauge.clone());
        let received = Received::default();
        let body = Body::new(http_body_util::Full::new(Bytes::from(message(100))));
        let got = counted(body, &budget, 200, received.clone())
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(got.len(), 105);
        let held = received.take().unwrap();
        assert_eq!(held.bytes(), 210);
        assert_eq!(gauge.get(), 210);
        drop(held);
        assert_eq!(gauge.get(), 0);
        assert_eq!(budget.permits.available_permits(), 1000);
    }

    #[tokio::test]
    async fn an_announced_length_over_the_message_size_is_refused_before_its_bytes() {
        let budget = ByteBudget::new(1000, Gauge::default());
        // The prefix alone: 201 bytes announced, none sent.
        let body = Body::new(http_body_util::Full::new(Bytes::from(
            message(201)[..PREFIX].to_vec(),
        )));
        let err = counted(body, &budget, 200, Received::default())
            .collect()
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
        assert_eq!(budget.permits.available_permits(), 1000);
    }

    #[tokio::test]
    async fn a_request_over_the_budget_is_refused_and_gives_its_bytes_back() {
        let gauge = Gauge::default();
        let budget = ByteBudget::new(100, gauge.clone());
        let taken = budget.take(60).unwrap();
        let body = Body::new(http_body_util::Full::new(Bytes::from(message(30))));
        let received = Received::default();
        let err = counted(body, &budget, 200, received.clone())
            .collect()
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
        assert!(received.take().is_none());
        assert_eq!(gauge.get(), 60);
        drop(taken);
        assert_eq!(budget.permits.available_permits(), 100);
    }

    #[tokio::test]
    async fn a_request_not_received_in_time_is_refused() {
        let budget = ByteBudget::new(1000, Gauge::default());
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Status>>(4);
        let body = http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        let c = Counted::new(
            Body::new(body),
            budget.clone(),
            &IntakeLimits {
                max_message_size: 200,
                receive_timeout: Duration::from_millis(100),
            },
            metrics(),
            Received::default(),
        );
        tx.send(Ok(Frame::data(Bytes::from(message(100)[..50].to_vec()))))
            .await
            .unwrap();
        let err = c.collect().await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");
        assert_eq!(budget.permits.available_permits(), 1000);
        drop(tx);
    }

    proptest::proptest! {
        /// Whatever the messages and however their bytes are cut into
        /// chunks, the first one announcing more than the limit is found;
        /// any bytes at all, cut anywhere, never panic.
        #[test]
        fn the_first_message_over_the_limit_is_found_however_the_bytes_are_cut(
            lens in proptest::collection::vec(0usize..64, 0..6),
            limit in 0usize..64,
            cuts in proptest::collection::vec(0usize..1000, 0..8),
            raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let _g = rt.enter();
            let budget = ByteBudget::new(10_000, Gauge::default());
            let read = |bytes: &[u8]| {
                let mut at: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
                at.sort_unstable();
                at.push(bytes.len());
                let mut c = counted(Body::empty(), &budget, limit, Received::default());
                let mut start = 0;
                let mut found = None;
                for end in at {
                    if found.is_none() {
                        found = c.announced_too_large(&bytes[start..end]);
                    }
                    start = end;
                }
                found
            };
            let bytes: Vec<u8> = lens.iter().flat_map(|&l| message(l)).collect();
            proptest::prop_assert_eq!(read(&bytes), lens.iter().copied().find(|&l| l > limit));
            let _ = read(&raw);
        }
    }

    #[test]
    fn prefixes_split_across_chunks_are_read() {
        let budget = ByteBudget::new(10_000, Gauge::default());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _g = rt.enter();
        let mut c = counted(Body::empty(), &budget, 10, Received::default());
        let two = [message(10), message(11)].concat();
        // 10 announced then 11: the second is over, whatever the chunking.
        for split in 1..two.len() {
            c.framing = Framing::Prefix(0);
            let first = c.announced_too_large(&two[..split]);
            let rest = first.or_else(|| c.announced_too_large(&two[split..]));
            assert_eq!(rest, Some(11), "split at {split}");
        }
    }
}
