//! A stream's request body cut into request messages, within the request
//! limits (`--max-request-bytes`, the request buffers, the deadlines).

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::body::Body;

use crate::eds::response_bytes as wire;
use crate::limits::{names as limit, FREE_REQUEST_BYTES};
use crate::net::listener::Conn;
use crate::xds::requests::{self, MessageError};
use crate::xds::server::Core;

/// How long a request message waits for room in `--request-buffer-bytes`
/// before its stream ends.
const REQUEST_BUFFER_WAIT: Duration = Duration::from_secs(2);

/// Why a request stream cannot go on.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReadError {
    /// A message refused from its header.
    #[error("{0}")]
    Message(#[from] MessageError),
    /// A message that is not the request it should be.
    #[error("{0}")]
    Decode(#[from] prost::DecodeError),
    /// Ended inside a message.
    #[error("request stream ended inside a message")]
    Truncated,
    /// A message (of this length) that `--request-buffer-bytes` has no room for.
    #[error("no room for a request message of {0} bytes (--request-buffer-bytes)")]
    NoRoom(usize),
    /// A message (of this length) that the peer's share of the request
    /// buffer (`--request-buffer-bytes-per-peer`) has no room for.
    #[error("no room for a request message of {0} bytes (--request-buffer-bytes-per-peer)")]
    NoPeerRoom(usize),
    /// A deadline passed (`--first-request-timeout`, `--request-receive-timeout`).
    #[error("--{0} passed")]
    Deadline(&'static str),
    /// The stream or connection failed (reset, closed).
    #[error("{0}")]
    Transport(#[source] tonic::Status),
}

/// Requests cut from a stream's request body, one at a time; the buffer
/// goes back to small after a large one.
pub(super) struct RequestReader {
    body: Body,
    buf: BytesMut,
    max: usize,
    ended: bool,
    budget: Arc<Semaphore>,
    /// The budget the message being received holds.
    held: Option<OwnedSemaphorePermit>,
    /// The peer's share of the budget (`None`: no connection, in tests).
    peer_budget: Option<Arc<Semaphore>>,
    /// What the message being received holds of the peer's share.
    peer_held: Option<OwnedSemaphorePermit>,
    /// When the message expected or begun must be complete, and the flag
    /// that says so.
    due: Option<(tokio::time::Instant, &'static str)>,
    receive_timeout: Duration,
}

impl RequestReader {
    /// The reader of a stream's requests, on `conn` (`None`: no
    /// connection, in tests): its first request is due within
    /// `--first-request-timeout`.
    pub(super) fn new(body: Body, core: &Core, conn: Option<&Arc<Conn>>) -> RequestReader {
        RequestReader {
            body,
            buf: BytesMut::new(),
            max: core.limits.max_request_bytes,
            ended: false,
            budget: core.request_budget.clone(),
            held: None,
            peer_budget: conn
                .and_then(|c| c.share())
                .map(|s| s.request_budget(core.limits.request_buffer_bytes_per_peer)),
            peer_held: None,
            due: tokio::time::Instant::now()
                .checked_add(core.limits.first_request_timeout)
                .map(|at| (at, limit::FIRST_REQUEST_TIMEOUT)),
            receive_timeout: core.limits.request_receive_timeout,
        }
    }

    /// The next request message (its bytes, without the gRPC header).
    pub(super) async fn next(&mut self) -> Result<Option<Bytes>, ReadError> {
        loop {
            if let Some(m) =
                requests::next_message(&mut self.buf, self.max).map_err(ReadError::Message)?
            {
                self.held = None;
                self.peer_held = None;
                self.due = None;
                if self.buf.is_empty() {
                    // The message's allocation goes with it (the buffer
                    // would keep it alive): a stream holds no request
                    // bytes between requests.
                    self.buf = BytesMut::new();
                }
                return Ok(Some(m));
            }
            if let Some(len) = requests::announced_len(&self.buf) {
                if len > FREE_REQUEST_BYTES && self.held.is_none() && len <= self.max {
                    let n = u32::try_from(len - FREE_REQUEST_BYTES).unwrap_or(u32::MAX);
                    // Waits a moment for room (many Envoys ACKing 10,000
                    // names at once), reading nothing meanwhile: the
                    // stream's 64 KiB window holds the client back. The
                    // peer's share first, so that one peer waits on itself.
                    let until = tokio::time::Instant::now()
                        .checked_add(REQUEST_BUFFER_WAIT)
                        .unwrap_or_else(tokio::time::Instant::now);
                    if let Some(share) = &self.peer_budget {
                        let wait = share.clone().acquire_many_owned(n);
                        match tokio::time::timeout_at(until, wait).await {
                            Ok(Ok(p)) => self.peer_held = Some(p),
                            _ => return Err(ReadError::NoPeerRoom(len)),
                        }
                    }
                    let wait = self.budget.clone().acquire_many_owned(n);
                    match tokio::time::timeout_at(until, wait).await {
                        Ok(Ok(p)) => self.held = Some(p),
                        _ => return Err(ReadError::NoRoom(len)),
                    }
                }
                // One allocation for the whole message (its length is
                // within --max-request-bytes, and budgeted beyond 64 KiB).
                self.buf
                    .reserve((wire::GRPC_HEADER + len).saturating_sub(self.buf.len()));
            }
            if self.ended {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(ReadError::Truncated)
                };
            }
            if self.due.is_none() && !self.buf.is_empty() {
                // A message begun: it is due whole within --request-receive-timeout
                // (a duration too long to add is no deadline).
                self.due = tokio::time::Instant::now()
                    .checked_add(self.receive_timeout)
                    .map(|at| (at, limit::REQUEST_RECEIVE_TIMEOUT));
            }
            let frame = match self.due {
                Some((at, which)) => tokio::time::timeout_at(at, self.body.frame())
                    .await
                    .map_err(|_| ReadError::Deadline(which))?,
                None => self.body.frame().await,
            };
            match frame {
                None => self.ended = true,
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => return Err(ReadError::Transport(e)),
            }
        }
    }
}
