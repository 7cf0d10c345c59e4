//! A stream's request task: each request through the stream's protocol
//! state, reported (metrics, status page, logs), the stream ended with a
//! status when requests end or break a limit.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::Node;
use prost::Message;
use tonic::body::Body;
use tonic::Status;

use crate::limits::names as limit;
use crate::net::listener::Conn;
use crate::telemetry::ratelog::LogBudget;
use crate::xds::byte_budget::ByteBudget;
use crate::xds::delta::DeltaStream;
use crate::xds::protocol::{Handled, RequestKind};
use crate::xds::request_reader::{ReadError, RequestReader};
use crate::xds::requests::{DeltaRequestView, MessageError, RequestView};
use crate::xds::retained::Refusal;
use crate::xds::server::{Core, StreamShared, OPEN_LOG};
use crate::xds::stream_state::StreamState;

/// A node id is kept for the logs up to this length (the status page's
/// key: the same length).
const NODE_ID_MAX: usize = crate::telemetry::status::MAX_NODE_ID;
/// Other type URLs remembered per stream (to log each once).
const OTHER_TYPES_MAX: usize = 8;

static UNKNOWN_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));
static NACK_LOG: LogBudget = LogBudget::new(10, Duration::from_secs(10));
static OTHER_TYPE_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));
static ENDED_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));
static HELD_LOG: LogBudget = LogBudget::new(5, Duration::from_secs(10));

/// What a request's names cost its stream's `--max-stream-request-rate`:
/// their bytes, and [`NAME_WORK`] each.
fn names_cost(names: &[Bytes]) -> usize {
    names.iter().map(|n| n.len() + NAME_WORK).sum()
}

/// The work a name costs beside its bytes (a hash, a lookup, a place in
/// the sort), in bytes.
const NAME_WORK: usize = 8;

/// A per-peer share or deadline hit on `conn` (counted with the peer's
/// class; plainly when the stream has no connection, in tests).
fn peer_hit(core: &Core, conn: Option<&Arc<Conn>>, which: &'static str) {
    match (&core.connections, conn.and_then(|c| c.share())) {
        (Some(connections), Some(share)) => connections.peer_limit_hit(which, share.key.class()),
        _ => core.callbacks.limit_hit(which),
    }
}

/// A stream's request side: each request through the protocol state; the
/// stream ends (trailers after the response in flight) when requests end
/// or break a limit.
pub(super) async fn read_requests(
    core: Arc<Core>,
    shared: Arc<StreamShared>,
    body: Body,
    delta: bool,
) {
    let mut reader = RequestReader::new(body, &core, shared.conn.as_ref());
    let mut other_types = BTreeSet::new();
    let mut budget = ByteBudget::new(
        core.limits.max_stream_request_rate,
        core.limits.max_stream_request_burst,
        tokio::time::Instant::now().into_std(),
    );
    let end = loop {
        if let Some(wait) = budget.wait(tokio::time::Instant::now().into_std()) {
            let node = shared.node();
            core.callbacks.request_held(&node, wait);
            if let Some(left_out) = HELD_LOG.allow() {
                tracing::info!(node = %node, peer = %shared.peer, wait_ms = wait.as_millis() as u64, rate = core.limits.max_stream_request_rate, left_out, "xDS stream's requests change names faster than its --max-stream-request-rate: not read meanwhile");
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shared.closed.notified() => break None,
            }
        }
        let next = tokio::select! {
            r = reader.next() => r,
            _ = shared.closed.notified() => break None,
        };
        match next {
            Ok(Some(message)) => {
                core.callbacks.request_received(message.len());
                let handled = if delta {
                    DeltaRequestView::decode(message)
                        .map_err(ReadError::Decode)
                        .map(|req| {
                            let cost = names_cost(&req.resource_names_subscribe)
                                + names_cost(&req.resource_names_unsubscribe);
                            handle_delta(&core, &shared, &req).map(|h| (h, cost))
                        })
                } else {
                    RequestView::decode(message)
                        .map_err(ReadError::Decode)
                        .map(|req| {
                            handle_sotw(&core, &shared, &req).map(|h| {
                                // A repeat of the names is recognised by
                                // their fingerprint: no work per name.
                                let cost = if h.names_changed {
                                    names_cost(&req.resource_names)
                                } else {
                                    0
                                };
                                (h, cost)
                            })
                        })
                };
                match handled {
                    Ok(Err(status)) => break Some(status),
                    Ok(Ok((h, cost))) => {
                        budget.spend(cost, tokio::time::Instant::now().into_std());
                        report(&core, &shared, &h, &mut other_types)
                    }
                    Err(ReadError::Decode(e)) => {
                        break Some(Status::invalid_argument(format!(
                            "not a {}DiscoveryRequest: {e}",
                            if delta { "Delta" } else { "" }
                        )))
                    }
                    Err(_) => break Some(Status::invalid_argument("bad request")),
                }
            }
            Ok(None) => break Some(Status::ok("")),
            Err(ReadError::Message(MessageError::TooLarge(len))) => {
                core.callbacks.limit_hit(limit::MAX_REQUEST_BYTES);
                break Some(Status::resource_exhausted(format!(
                    "request message of {len} bytes is over --max-request-bytes {}",
                    core.limits.max_request_bytes
                )));
            }
            Err(ReadError::NoRoom(len)) => {
                core.callbacks.limit_hit(limit::REQUEST_BUFFER_BYTES);
                break Some(Status::resource_exhausted(format!(
                    "no room for a request message of {len} bytes: the streams' request buffers are full (--request-buffer-bytes {}); retry later",
                    core.limits.request_buffer_bytes
                )));
            }
            Err(ReadError::NoPeerRoom(len)) => {
                peer_hit(
                    &core,
                    shared.conn.as_ref(),
                    limit::REQUEST_BUFFER_BYTES_PER_PEER,
                );
                break Some(Status::resource_exhausted(format!(
                    "no room for a request message of {len} bytes: this peer's streams hold their share of the request buffers (--request-buffer-bytes-per-peer {}); retry later",
                    core.limits.request_buffer_bytes_per_peer
                )));
            }
            Err(ReadError::Deadline(which)) => {
                peer_hit(&core, shared.conn.as_ref(), which);
                break Some(Status::deadline_exceeded(
                    if which == limit::FIRST_REQUEST_TIMEOUT {
                        format!(
                        "no request within --first-request-timeout ({:?}) of the stream's opening",
                        core.limits.first_request_timeout
                    )
                    } else {
                        format!(
                        "a request message begun was not complete within --request-receive-timeout ({:?})",
                        core.limits.request_receive_timeout
                    )
                    },
                ));
            }
            Err(ReadError::Message(MessageError::Compressed)) => {
                break Some(Status::unimplemented(
                    "compressed requests are not accepted (no grpc-encoding is announced)",
                ))
            }
            Err(ReadError::Decode(e)) => {
                break Some(Status::invalid_argument(format!(
                    "not a DiscoveryRequest: {e}"
                )))
            }
            Err(ReadError::Truncated) => {
                break Some(Status::invalid_argument(
                    "request stream ended inside a message",
                ))
            }
            Err(ReadError::Transport(e)) => {
                tracing::debug!(node = %shared.node(), peer = %shared.peer, error = %e, "xDS stream ended by an error");
                break None;
            }
        }
    };
    if let Some(status) = end {
        if status.code() != tonic::Code::Ok {
            if let Some(left_out) = ENDED_LOG.allow() {
                tracing::warn!(node = %shared.node(), peer = %shared.peer, code = ?status.code(), message = status.message(), left_out, "xDS stream ended by the companion");
            }
        }
        shared.end_with(status);
    }
}

/// Reads the node's id once per stream, for the logs.
fn identify(core: &Core, shared: &StreamShared, node_bytes: &Bytes) {
    if node_bytes.is_empty() {
        return;
    }
    let mut node = shared.node.lock().unwrap_or_else(|p| p.into_inner());
    if node.is_empty() {
        *node = match Node::decode(node_bytes.clone()) {
            Ok(n) if !n.id.is_empty() => n.id.chars().take(NODE_ID_MAX).collect(),
            _ => "-".to_string(),
        };
        core.callbacks.stream_identified(&node, &shared.peer);
    }
}

/// Counts the stream's names in the total; over `--max-subscriptions` the
/// stream ends.
fn count_subscriptions(core: &Core, shared: &StreamShared, now: usize) -> Result<(), Status> {
    let before = shared.counted.swap(now, Ordering::SeqCst);
    let total = if now >= before {
        core.subscriptions.fetch_add(now - before, Ordering::SeqCst) + (now - before)
    } else {
        core.subscriptions.fetch_sub(before - now, Ordering::SeqCst) - (before - now)
    };
    let max = core.limits.max_subscriptions;
    if total > max {
        core.callbacks.limit_hit(limit::MAX_SUBSCRIPTIONS);
        return Err(Status::resource_exhausted(format!(
            "{total} resource names subscribed over all xDS streams, over --max-subscriptions {max}; retry later"
        )));
    }
    Ok(())
}

/// A request over a byte limit ends its stream.
fn refused(core: &Core, refusal: &Option<Refusal>) -> Result<(), Status> {
    match refusal {
        Some(r) => {
            core.callbacks.limit_hit(r.limit);
            Err(Status::resource_exhausted(r.message.clone()))
        }
        None => Ok(()),
    }
}

/// One state-of-the-world request; `Err(status)` ends the stream.
fn handle_sotw(core: &Core, shared: &StreamShared, req: &RequestView) -> Result<Handled, Status> {
    let max = core.limits.max_resource_names;
    if req.resource_names.len() > max {
        core.callbacks.limit_hit(limit::MAX_RESOURCE_NAMES);
        return Err(Status::resource_exhausted(format!(
            "{} resource names in one request, over --max-resource-names {max}",
            req.resource_names.len()
        )));
    }
    identify(core, shared, &req.node);
    let snap = core.snapshots.borrow().clone();
    let (h, subscribed) = {
        let mut state = shared.state();
        let h = match &mut *state {
            StreamState::Sotw(s) => s.on_request(req, &snap, Instant::now()),
            StreamState::Delta(_) => return Err(Status::internal("not a delta stream")),
        };
        (h, state.subscribed())
    };
    refused(core, &h.refused)?;
    count_subscriptions(core, shared, subscribed)?;
    Ok(h)
}

/// One delta request; `Err(status)` ends the stream.
fn handle_delta(
    core: &Core,
    shared: &StreamShared,
    req: &DeltaRequestView,
) -> Result<Handled, Status> {
    let max = core.limits.max_resource_names;
    let asked = req.resource_names_subscribe.len() + req.resource_names_unsubscribe.len();
    if asked > max {
        core.callbacks.limit_hit(limit::MAX_RESOURCE_NAMES);
        return Err(Status::resource_exhausted(format!(
            "{asked} resource names in one request, over --max-resource-names {max}"
        )));
    }
    identify(core, shared, &req.node);
    let snap = core.snapshots.borrow().clone();
    // Read and sorted before the lock that the fan-out takes.
    let read = DeltaStream::read_names(&core.names, &core.retained, req, &snap);
    let (h, subscribed) = {
        let mut state = shared.state();
        let h = match &mut *state {
            StreamState::Delta(s) => s.on_read(req, read, &snap, Instant::now()),
            StreamState::Sotw(_) => {
                return Err(Status::internal("not a state-of-the-world stream"))
            }
        };
        (h, state.subscribed())
    };
    refused(core, &h.refused)?;
    if subscribed > max {
        core.callbacks.limit_hit(limit::MAX_RESOURCE_NAMES);
        return Err(Status::resource_exhausted(format!(
            "{subscribed} resource names subscribed on one stream, over --max-resource-names {max}"
        )));
    }
    count_subscriptions(core, shared, subscribed)?;
    Ok(h)
}

/// Reports a handled request (metrics, status page, logs) and wakes the
/// body when a response is due.
fn report(core: &Core, shared: &StreamShared, h: &Handled, other_types: &mut BTreeSet<String>) {
    let node = shared.node();
    match &h.kind {
        RequestKind::Initial => {
            if let Some(left_out) = OPEN_LOG.allow() {
                tracing::info!(node = %node, api = shared.api, left_out, "xDS subscription");
            }
        }
        RequestKind::Ack { version } => {
            core.callbacks
                .acked(&node, &shared.peer, version, h.ack_after);
            if !h.applied.is_empty() {
                core.callbacks.programmed(&node, &h.applied);
            }
            tracing::debug!(node = %node, version = %version, "xDS ACK");
        }
        RequestKind::Nack { version, message } => {
            core.callbacks.nacked(&node, &shared.peer, version, message);
            if let Some(left_out) = NACK_LOG.allow() {
                let message: String = message.chars().take(1024).collect();
                tracing::warn!(node = %node, peer = %shared.peer, version = %version, error = %message, left_out, "xDS NACK: Envoy rejected an assignment");
            }
        }
        RequestKind::Repeated { version } => {
            tracing::debug!(node = %node, version = %version, "xDS request repeats its last ACK: Envoy re-added a watch (a cluster CDS updated)");
        }
        RequestKind::Stale => {
            tracing::debug!(node = %node, "xDS request with a stale nonce")
        }
        RequestKind::OtherType(t) => {
            if other_types.len() < OTHER_TYPES_MAX && other_types.insert(t.clone()) {
                if let Some(left_out) = OTHER_TYPE_LOG.allow() {
                    let t: String = t.chars().take(256).collect();
                    tracing::warn!(node = %node, type_url = %t, left_out, "xDS type not served by this companion (only ClusterLoadAssignment): ignored");
                }
            }
        }
    }
    if h.resent > 0 {
        tracing::debug!(node = %node, resources = h.resent, "every subscribed assignment sent again (a watch re-added)");
    }
    if h.unknown > 0 {
        core.callbacks.unknown_names(h.unknown);
        if h.names_changed && !h.unknown_sample.is_empty() {
            if let Some(left_out) = UNKNOWN_LOG.allow() {
                let sample: Vec<String> = h
                    .unknown_sample
                    .iter()
                    .map(|n| n.chars().take(128).collect())
                    .collect();
                tracing::warn!(node = %node, unknown = h.unknown, sample = ?sample, left_out, "Envoy asks for EDS resources that are not served (no --cluster defines them, or their Service has no slices): not answered until they are");
            }
        }
    }
    if h.due {
        shared.wake.wake();
    }
}
