//! What both protocols of a stream share: the names served ([`Names`]),
//! what a request was ([`Handled`]), what a snapshot means to a stream
//! ([`SnapshotEffect`]), a response as the transport takes it
//! ([`Prepared`]).
//!
//! Rules both follow (the xDS protocol; each protocol's file has its own):
//! - Each response gets a fresh nonce. At most one response waits for its
//!   ACK (or NACK) at a time: what changes meanwhile goes in the next one,
//!   so a stream's response rate follows what its Envoy can apply, and
//!   many changes in a row cost one response, not one each.
//! - Only the newest state matters: a response is built when the transport
//!   takes it, from the newest resources, so a stream holds at most one
//!   response due, whatever the number of changes and however slowly it
//!   reads; a newer snapshot replaces an unsent one (coalesced).
//! - Before the first full list nothing is sent.
//! - A name that is not served now is remembered when it may be later (a
//!   `--cluster` name, or with `--manage` any name of the template's form):
//!   when it appears it is sent. Others are counted and forgotten.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryResponse, DiscoveryResponse};
use prost::Message;

use crate::eds::response_bytes as wire;
use crate::eds::snapshot::{name_hash, Resource, Snapshot};
use crate::model::cluster::parse_template;
use crate::xds::retained::Refusal;
use crate::xds::subscriptions::Subscriptions;

/// The resource names this server may serve: the `--cluster` names, and
/// with `--manage` every name of the template's form
/// (`model::cluster::template_name`).
#[derive(Debug, Default)]
pub struct Names {
    explicit: Vec<String>,
    keys: HashSet<u64>,
    manage: bool,
}

impl Names {
    /// The `--cluster` names.
    pub fn new<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Names {
        let mut n = Names::default();
        for name in names {
            let name = name.into();
            if n.keys.insert(name_hash(&name)) {
                n.explicit.push(name);
            }
        }
        n
    }

    /// Also every name of the template's form (`--manage`).
    pub fn managing(mut self, manage: bool) -> Names {
        self.manage = manage;
        self
    }

    /// Whether `name` (whose key is `hash`) may be served, now or later.
    pub fn may_serve(&self, name: &str, hash: u64) -> bool {
        self.keys.contains(&hash) || (self.manage && parse_template(name).is_some())
    }

    /// The `--cluster` names.
    pub fn explicit(&self) -> &[String] {
        &self.explicit
    }

    /// How many `--cluster` names.
    pub fn len(&self) -> usize {
        self.explicit.len()
    }

    /// No `--cluster` name (with `--manage`, template names are served).
    pub fn is_empty(&self) -> bool {
        self.explicit.is_empty()
    }
}

/// What a request was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// The first request of a stream (no nonce).
    Initial,
    /// Accepts the last response.
    Ack {
        /// The version accepted.
        version: String,
    },
    /// Rejects the last response.
    Nack {
        /// The version rejected.
        version: String,
        /// The message of Envoy's `error_detail`.
        message: String,
    },
    /// State of the world: repeats the ACK (or NACK) of the last response,
    /// already received: the client re-added a watch (`sotw`); answered
    /// with every subscribed resource.
    Repeated {
        /// The version repeated.
        version: String,
    },
    /// Answers an older response (state of the world: ignored; delta: its
    /// subscription changes are taken, nothing is acknowledged).
    Stale,
    /// A type this server does not serve: ignored.
    OtherType(String),
}

/// The result of one request.
#[derive(Debug)]
pub struct Handled {
    /// What the request was.
    pub kind: RequestKind,
    /// Time from the response it ACKs to this ACK.
    pub ack_after: Option<Duration>,
    /// The names asked for differ from the last request's.
    pub names_changed: bool,
    /// Names in this request that are not served now.
    pub unknown: usize,
    /// Up to three of them, when the names changed (for the log).
    pub unknown_sample: Vec<String>,
    /// A response is due (the transport may take one).
    pub due: bool,
    /// Trigger times of the changes this ACK confirms applied.
    pub applied: Vec<SystemTime>,
    /// Resources due again because the client re-added a watch (`sotw`).
    pub resent: usize,
    /// The request is over a byte limit (`retained`): nothing of it was
    /// taken, and the stream ends with RESOURCE_EXHAUSTED.
    pub refused: Option<Refusal>,
}

impl Handled {
    pub(crate) fn new() -> Handled {
        Handled {
            kind: RequestKind::Initial,
            ack_after: None,
            names_changed: false,
            unknown: 0,
            unknown_sample: Vec::new(),
            due: false,
            applied: Vec::new(),
            resent: 0,
            refused: None,
        }
    }
}

/// What a new snapshot means for a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotEffect {
    /// Nothing to send.
    Nothing,
    /// A response is now due.
    Due,
    /// A response was due and not taken; it now carries the newer state.
    Coalesced,
    /// A response was due and still is, unchanged.
    StillDue,
}

/// A response as the transport takes it: per-stream head and tail around
/// resource entries shared with every other stream (see `response_bytes`).
#[derive(Debug)]
pub struct Prepared {
    /// The response's nonce (its number on the stream).
    pub nonce: u64,
    /// Its `version_info` (state of the world) or `system_version_info` (delta).
    pub version: String,
    /// The stream's own bytes before the resource entries (the gRPC header,
    /// the version).
    pub head: Bytes,
    /// The resource entries, shared with every stream that sends them.
    pub entries: Vec<Bytes>,
    /// The stream's own bytes after the entries (the type URL, the nonce; in
    /// a delta response, the names removed too).
    pub tail: Bytes,
    /// Resources in it.
    pub resources: usize,
    /// Lags (source change -> this response) of its resources.
    pub lags: Vec<Duration>,
    /// Bytes on the wire: gRPC header and message.
    pub wire_len: usize,
}

impl Prepared {
    /// Every byte, in order (tests; the unary FetchEndpoints).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.wire_len);
        v.extend_from_slice(&self.head);
        for e in &self.entries {
            v.extend_from_slice(e);
        }
        v.extend_from_slice(&self.tail);
        v
    }

    /// The message, decoded (tests).
    pub fn to_response(&self) -> Result<DiscoveryResponse, prost::DecodeError> {
        let bytes = self.to_bytes();
        DiscoveryResponse::decode(bytes.get(wire::GRPC_HEADER..).unwrap_or_default())
    }

    /// The delta message, decoded (tests).
    pub fn to_delta_response(&self) -> Result<DeltaDiscoveryResponse, prost::DecodeError> {
        let bytes = self.to_bytes();
        DeltaDiscoveryResponse::decode(bytes.get(wire::GRPC_HEADER..).unwrap_or_default())
    }
}

/// What a stream's `take` gives the transport.
#[derive(Debug, Default)]
pub struct Taken {
    /// The response to send, if any is due and fits.
    pub response: Option<Prepared>,
    /// Resources left out because alone they exceed the message size
    /// limit: (name, bytes). Marked sent: not retried until they change.
    pub oversized: Vec<(String, usize)>,
}

/// The ACK bookkeeping both protocols share: the nonce last sent, the
/// response waiting for its ACK and the trigger times it carries.
#[derive(Debug, Default)]
pub(crate) struct Acks {
    pub last_nonce: u64,
    pub last_sent_at: Option<Instant>,
    /// The response sent and not yet ACKed or NACKed.
    pub awaiting: bool,
    pub triggers: Vec<SystemTime>,
}

impl Acks {
    /// A reply to the response in flight: its trigger times (empty for a
    /// NACK), and how long after it was sent.
    pub fn replied(&mut self, accepted: bool, now: Instant) -> (Vec<SystemTime>, Option<Duration>) {
        self.awaiting = false;
        let triggers = std::mem::take(&mut self.triggers);
        let after = self.last_sent_at.map(|t| now.saturating_duration_since(t));
        (if accepted { triggers } else { Vec::new() }, after)
    }

    pub fn sent(&mut self, nonce: u64, triggers: Vec<SystemTime>, now: Instant) {
        self.last_nonce = nonce;
        self.last_sent_at = Some(now);
        self.awaiting = true;
        self.triggers = triggers;
    }

    /// Whether `nonce` names the last response sent.
    pub fn is_current(&self, nonce: &str) -> bool {
        self.last_nonce != 0 && nonce.parse::<u64>().ok() == Some(self.last_nonce)
    }
}

/// Tracks whether a stream's responses follow each other's snapshots:
/// when one was missed, the stream checks every subscription again.
#[derive(Debug, Default)]
pub(crate) struct SeenSnapshots {
    pub seq: u64,
}

impl SeenSnapshots {
    /// True when `snap` directly follows the last snapshot seen.
    pub fn follows(&mut self, snap: &Snapshot) -> bool {
        let follows = snap.after == self.seq;
        self.seq = snap.seq;
        follows
    }
}

/// Brings `subs` up to `snap`: the resources it changed, or (when a
/// snapshot was missed) every subscription checked against the table.
/// Returns how many subscribed resources the stream is behind on.
pub(crate) fn catch_up(
    subs: &mut Subscriptions,
    seen: &mut SeenSnapshots,
    snap: &Snapshot,
) -> usize {
    if seen.follows(snap) {
        subs.on_changed(&snap.changed, &snap.table)
    } else {
        subs.recheck(&snap.table, true);
        usize::from(subs.any_due())
    }
}

/// What a snapshot did to a stream: `was_pending` (something was due
/// before), `touched` (subscribed resources it is behind on), `due` (a
/// response can be taken now).
pub(crate) fn effect(was_pending: bool, touched: usize, due: bool) -> SnapshotEffect {
    match (was_pending, touched > 0) {
        (true, true) => SnapshotEffect::Coalesced,
        (true, false) => SnapshotEffect::StillDue,
        (false, true) if due => SnapshotEffect::Due,
        (false, true) => SnapshotEffect::StillDue,
        (false, false) => SnapshotEffect::Nothing,
    }
}

/// The push lags of the resources in a response.
pub(crate) fn lags(resources: &[Arc<Resource>], now: Instant) -> Vec<Duration> {
    resources
        .iter()
        .map(|r| now.saturating_duration_since(r.changed_at))
        .collect()
}
