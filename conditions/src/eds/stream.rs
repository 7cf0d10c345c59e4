//! The xDS protocol of one stream (gRPC v3, state of the world,
//! ClusterLoadAssignments over ADS or plain EDS): [`EdsStream`], a state
//! that tests drive without a network. `xds` runs it over HTTP/2.
//!
//! Rules (xDS protocol, state of the world):
//! - Each response gets a fresh nonce and the snapshot's version. EDS is not
//!   a "full state" type: a response carries only the subscribed resources
//!   whose version this stream has not sent yet, and Envoy keeps the others.
//! - A request whose nonce is not the last one sent is stale and ignored
//!   (Envoy sends a fresh one after the newer response).
//! - A request with `error_detail` NACKs the last response: logged and
//!   counted; the same version is not sent again (a new one will be).
//! - A subscription change (resource_names) sends the newly named resources
//!   at once. A name no `--cluster` defines gets nothing and is not kept
//!   (only counted: a client cannot grow a stream with made-up names).
//! - Before the first full list nothing is sent; a stream that opened
//!   before gets everything it asked for once the snapshot is ready.
//! - A new stream (a new Envoy, or one that reconnects) has sent nothing,
//!   so its first request gets every subscribed resource.
//! - Other type URLs on an ADS stream (CDS, LDS...) are not served: no
//!   answer (an empty answer would remove them), logged once per stream.
//! - Only the newest state matters: a response is built when the transport
//!   takes it ([`EdsStream::take`]), from the snapshot of that moment, so a
//!   stream holds at most one response due, whatever the number of changes
//!   and however slowly it reads; a newer snapshot replaces an unsent one
//!   (coalesced).
//! - A response stays under the message size limit: resources that do not
//!   fit together go in the next response; one that alone is over it is not
//!   sent (reported).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use prost::Message;

use crate::eds::assignment::CLA_TYPE_URL;
use crate::eds::publish::Snapshot;
use crate::eds::response_bytes as wire;

/// The resource names this server defines (the `--cluster` names), numbered.
#[derive(Debug, Default)]
pub struct Names {
    names: Vec<String>,
    index: HashMap<String, usize>,
}

impl Names {
    pub fn new<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Names {
        let mut n = Names::default();
        for name in names {
            let name = name.into();
            if !n.index.contains_key(&name) {
                n.index.insert(name.clone(), n.names.len());
                n.names.push(name);
            }
        }
        n
    }

    pub fn get(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    pub fn name(&self, i: usize) -> &str {
        self.names.get(i).map(String::as_str).unwrap_or("")
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// What a request was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// The first request of a stream (no nonce).
    Initial,
    /// Accepts the last response.
    Ack { version: String },
    /// Rejects the last response.
    Nack { version: String, message: String },
    /// Answers an older response: ignored.
    Stale,
    /// A type this server does not serve: ignored.
    OtherType(String),
}

/// The result of one request.
#[derive(Debug)]
pub struct Handled {
    pub kind: RequestKind,
    /// Time from the response it ACKs to this ACK.
    pub ack_after: Option<Duration>,
    /// The names asked for differ from the last request's.
    pub names_changed: bool,
    /// Names in this request that no cluster defines (not kept).
    pub unknown: usize,
    /// Up to three of them, when the names changed (for the log).
    pub unknown_sample: Vec<String>,
    /// A response is due (the transport may take one).
    pub due: bool,
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
    pub nonce: u64,
    pub version: String,
    pub head: Bytes,
    pub entries: Vec<Bytes>,
    pub tail: Bytes,
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
}

/// What [`EdsStream::take`] gives the transport.
#[derive(Debug, Default)]
pub struct Taken {
    pub response: Option<Prepared>,
    /// Resources left out because alone they exceed the message size
    /// limit: (name, bytes). Marked sent: not retried until they change.
    pub oversized: Vec<(String, usize)>,
}

/// One xDS stream's protocol state.
#[derive(Debug)]
pub struct EdsStream {
    names: Arc<Names>,
    started: bool,
    /// Subscribed resources (numbers in `names`, ascending) and the
    /// version last sent of each (0: none).
    subscribed: Vec<(usize, u64)>,
    /// Fingerprint of the last request's names (unknown ones included).
    names_hash: u64,
    last_nonce: u64,
    last_sent_at: Option<Instant>,
    /// Since when a response has been due and not taken.
    due_since: Option<Instant>,
    /// Sum of the due resources' versions (versions only grow, so a newer
    /// state of any of them changes it).
    due_sum: u64,
}

impl EdsStream {
    pub fn new(names: Arc<Names>) -> EdsStream {
        EdsStream {
            names,
            started: false,
            subscribed: Vec::new(),
            names_hash: 0,
            last_nonce: 0,
            last_sent_at: None,
            due_since: None,
            due_sum: 0,
        }
    }

    /// The subscribed resources, by number in [`Names`].
    pub fn subscribed(&self) -> impl Iterator<Item = usize> + '_ {
        self.subscribed.iter().map(|(i, _)| *i)
    }

    /// Since when a response has been due and not taken by the transport.
    pub fn due_since(&self) -> Option<Instant> {
        self.due_since
    }

    /// Handles one request against the current snapshot.
    pub fn on_request(&mut self, req: &DiscoveryRequest, snap: &Snapshot, now: Instant) -> Handled {
        let mut handled = Handled {
            kind: RequestKind::Initial,
            ack_after: None,
            names_changed: false,
            unknown: 0,
            unknown_sample: Vec::new(),
            due: false,
        };
        if req.type_url != CLA_TYPE_URL {
            handled.kind = RequestKind::OtherType(req.type_url.clone());
            return handled;
        }
        if !req.response_nonce.is_empty() {
            if req.response_nonce.parse::<u64>().ok() != Some(self.last_nonce)
                || self.last_nonce == 0
            {
                handled.kind = RequestKind::Stale;
                return handled;
            }
            handled.kind = match &req.error_detail {
                Some(status) => RequestKind::Nack {
                    version: req.version_info.clone(),
                    message: status.message.clone(),
                },
                None => {
                    handled.ack_after = self.last_sent_at.map(|t| now.saturating_duration_since(t));
                    RequestKind::Ack {
                        version: req.version_info.clone(),
                    }
                }
            };
        }
        self.started = true;
        let mut hasher = std::hash::DefaultHasher::new();
        req.resource_names.hash(&mut hasher);
        let hash = hasher.finish();
        handled.names_changed = hash != self.names_hash;
        self.names_hash = hash;
        let mut wanted = Vec::with_capacity(req.resource_names.len().min(self.names.len()));
        for n in &req.resource_names {
            match self.names.get(n) {
                Some(i) => wanted.push(i),
                None => {
                    handled.unknown += 1;
                    if handled.names_changed && handled.unknown_sample.len() < 3 {
                        handled.unknown_sample.push(n.clone());
                    }
                }
            }
        }
        wanted.sort_unstable();
        wanted.dedup();
        if !self
            .subscribed
            .iter()
            .map(|s| s.0)
            .eq(wanted.iter().copied())
        {
            let old = std::mem::take(&mut self.subscribed);
            self.subscribed = wanted
                .into_iter()
                .map(|i| {
                    let sent = old.iter().find(|s| s.0 == i).map(|s| s.1).unwrap_or(0);
                    (i, sent)
                })
                .collect();
        }
        handled.due = self.refresh_due(snap, now) != SnapshotEffect::Nothing;
        handled
    }

    /// A new snapshot was published.
    pub fn on_snapshot(&mut self, snap: &Snapshot, now: Instant) -> SnapshotEffect {
        self.refresh_due(snap, now)
    }

    /// True when this stream lacks something of `snap` it subscribed to.
    pub fn is_due(&self, snap: &Snapshot) -> bool {
        self.started && snap.ready && self.due_resources(snap).next().is_some()
    }

    fn due_resources<'a>(
        &'a self,
        snap: &'a Snapshot,
    ) -> impl Iterator<Item = (usize, &'a Arc<crate::eds::publish::Resource>)> + 'a {
        self.subscribed
            .iter()
            .enumerate()
            .filter_map(move |(k, (i, sent))| {
                snap.resources
                    .get(self.names.name(*i))
                    .filter(|r| r.version != *sent)
                    .map(|r| (k, r))
            })
    }

    fn refresh_due(&mut self, snap: &Snapshot, now: Instant) -> SnapshotEffect {
        if !self.is_due(snap) {
            self.due_since = None;
            return SnapshotEffect::Nothing;
        }
        let sum = self
            .due_resources(snap)
            .fold(0u64, |s, (_, r)| s.wrapping_add(r.version));
        let effect = match self.due_since {
            None => {
                self.due_since = Some(now);
                SnapshotEffect::Due
            }
            Some(_) if sum != self.due_sum => SnapshotEffect::Coalesced,
            Some(_) => SnapshotEffect::StillDue,
        };
        self.due_sum = sum;
        effect
    }

    /// The response the transport takes now, from `snap` (the newest):
    /// every due resource that fits in `max_message_len` bytes.
    pub fn take(&mut self, snap: &Snapshot, max_message_len: usize, now: Instant) -> Taken {
        let mut taken = Taken::default();
        if !self.is_due(snap) {
            self.due_since = None;
            return taken;
        }
        let nonce = self.last_nonce + 1;
        let nonce_text = nonce.to_string();
        let overhead = wire::message_len(&snap.version, CLA_TYPE_URL, &nonce_text, 0);
        let mut chosen = Vec::new();
        let mut entries_len = 0;
        for (k, r) in self.due_resources(snap) {
            let len = r.entry.len();
            if overhead + len > max_message_len {
                taken.oversized.push((r.name.clone(), r.value().len()));
                chosen.push((k, r.clone(), false));
            } else if overhead + entries_len + len <= max_message_len {
                entries_len += len;
                chosen.push((k, r.clone(), true));
            }
        }
        let mut entries = Vec::new();
        let mut lags = Vec::new();
        for (k, r, send) in chosen {
            if let Some(s) = self.subscribed.get_mut(k) {
                s.1 = r.version;
            }
            if send {
                entries.push(r.entry.clone());
                lags.push(now.saturating_duration_since(r.changed_at));
            }
        }
        if !entries.is_empty() {
            let f = wire::frame(&snap.version, CLA_TYPE_URL, &nonce_text, entries_len);
            self.last_nonce = nonce;
            self.last_sent_at = Some(now);
            taken.response = Some(Prepared {
                nonce,
                version: snap.version.clone(),
                head: f.head,
                entries,
                tail: f.tail,
                lags,
                wire_len: wire::GRPC_HEADER + f.message_len,
            });
        }
        // What did not fit is due now, in a response of its own.
        self.due_since = None;
        self.refresh_due(snap, now);
        taken
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::eds::publish::Resource;
    use envoy_types::pb::google::rpc::Status as RpcStatus;
    use std::collections::BTreeMap;

    const MAX: usize = usize::MAX;

    fn names() -> Arc<Names> {
        Arc::new(Names::new(["a", "b", "c", "x"]))
    }

    fn snap(version: &str, ready: bool, resources: &[(&str, u64)]) -> Snapshot {
        let mut m = BTreeMap::new();
        for (name, v) in resources {
            m.insert(
                name.to_string(),
                Arc::new(Resource::new(
                    name,
                    *v,
                    format!("{name}@{v}").as_bytes(),
                    0,
                    Instant::now(),
                )),
            );
        }
        Snapshot {
            version: version.into(),
            ready,
            resources: m,
        }
    }

    fn req(names: &[&str], version: &str, nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version.into(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            type_url: CLA_TYPE_URL.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    fn now() -> Instant {
        Instant::now()
    }

    /// The response taken now, decoded.
    fn take(st: &mut EdsStream, s: &Snapshot) -> Option<DiscoveryResponse> {
        st.take(s, MAX, now())
            .response
            .map(|p| p.to_response().unwrap())
    }

    fn sent(r: &DiscoveryResponse) -> Vec<String> {
        r.resources
            .iter()
            .map(|a| String::from_utf8(a.value.clone()).unwrap())
            .collect()
    }

    #[test]
    fn initial_request_gets_every_subscribed_resource_then_ack_is_quiet() {
        let s = snap("v1", true, &[("a", 1), ("b", 2), ("c", 3)]);
        let mut st = EdsStream::new(names());
        let h = st.on_request(&req(&["a", "b"], "", ""), &s, now());
        assert_eq!(h.kind, RequestKind::Initial);
        assert!(h.due);
        let r = take(&mut st, &s).unwrap();
        assert_eq!(sent(&r), vec!["a@1", "b@2"]);
        assert_eq!(r.version_info, "v1");
        assert_eq!(r.type_url, CLA_TYPE_URL);
        let h = st.on_request(&req(&["a", "b"], "v1", &r.nonce), &s, now());
        assert_eq!(
            h.kind,
            RequestKind::Ack {
                version: "v1".into()
            }
        );
        assert!(h.ack_after.is_some());
        assert!(!h.due, "an ACK of the current state needs no answer");
        assert!(take(&mut st, &s).is_none());
    }

    #[test]
    fn a_new_snapshot_sends_only_changed_resources_with_fresh_nonces() {
        let mut st = EdsStream::new(names());
        let s1 = snap("v1", true, &[("a", 1), ("b", 2)]);
        st.on_request(&req(&["a", "b"], "", ""), &s1, now());
        let r1 = take(&mut st, &s1).unwrap();
        let s2 = snap("v2", true, &[("a", 1), ("b", 5)]);
        assert_eq!(st.on_snapshot(&s2, now()), SnapshotEffect::Due);
        let r2 = take(&mut st, &s2).unwrap();
        assert_eq!(sent(&r2), vec!["b@5"]);
        assert_eq!(r2.version_info, "v2");
        assert_ne!(r2.nonce, r1.nonce);
        // Nothing changed for this stream: nothing due.
        let s3 = snap("v3", true, &[("a", 1), ("b", 5), ("x", 9)]);
        assert_eq!(st.on_snapshot(&s3, now()), SnapshotEffect::Nothing);
        assert!(take(&mut st, &s3).is_none());
        // The ACK of r1 arrives after r2 was sent: stale, ignored.
        let h = st.on_request(&req(&["a", "b"], "v1", &r1.nonce), &s3, now());
        assert_eq!(h.kind, RequestKind::Stale);
        assert!(!h.due);
    }

    #[test]
    fn snapshots_while_a_response_is_due_coalesce_into_the_newest() {
        let mut st = EdsStream::new(names());
        let s1 = snap("v1", true, &[("a", 1), ("b", 2)]);
        st.on_request(&req(&["a", "b"], "", ""), &s1, now());
        take(&mut st, &s1).unwrap();
        // The stream does not take anything while three snapshots come.
        let t0 = now();
        assert_eq!(
            st.on_snapshot(&snap("v2", true, &[("a", 3), ("b", 2)]), t0),
            SnapshotEffect::Due
        );
        assert_eq!(
            st.on_snapshot(&snap("v3", true, &[("a", 4), ("b", 2)]), now()),
            SnapshotEffect::Coalesced
        );
        let s4 = snap("v4", true, &[("a", 4), ("b", 6), ("x", 7)]);
        assert_eq!(st.on_snapshot(&s4, now()), SnapshotEffect::Coalesced);
        // A snapshot that changes nothing it wants: still the same response.
        let s5 = snap("v5", true, &[("a", 4), ("b", 6), ("x", 8)]);
        assert_eq!(st.on_snapshot(&s5, now()), SnapshotEffect::StillDue);
        assert_eq!(
            st.due_since(),
            Some(t0),
            "due since the first unsent change"
        );
        // One response, the newest state of both.
        let r = take(&mut st, &s5).unwrap();
        assert_eq!(sent(&r), vec!["a@4", "b@6"]);
        assert_eq!(r.version_info, "v5");
        assert_eq!(st.due_since(), None);
        assert!(take(&mut st, &s5).is_none());
    }

    #[test]
    fn nack_is_reported_and_not_answered_with_the_same_version() {
        let s = snap("v1", true, &[("a", 1)]);
        let mut st = EdsStream::new(names());
        st.on_request(&req(&["a"], "", ""), &s, now());
        let r = take(&mut st, &s).unwrap();
        let mut nack = req(&["a"], "", &r.nonce);
        nack.error_detail = Some(RpcStatus {
            code: 3,
            message: "bad".into(),
            details: vec![],
        });
        let h = st.on_request(&nack, &s, now());
        assert_eq!(
            h.kind,
            RequestKind::Nack {
                version: "".into(),
                message: "bad".into()
            }
        );
        assert!(!h.due);
        // A newer version is sent again.
        let s2 = snap("v2", true, &[("a", 2)]);
        st.on_snapshot(&s2, now());
        assert_eq!(sent(&take(&mut st, &s2).unwrap()), vec!["a@2"]);
    }

    #[test]
    fn subscription_changes_send_new_names_and_forget_dropped_ones() {
        let s = snap("v1", true, &[("a", 1), ("b", 2)]);
        let mut st = EdsStream::new(names());
        st.on_request(&req(&["a"], "", ""), &s, now());
        let r = take(&mut st, &s).unwrap();
        // Envoy adds cluster b (ACK of r carrying the new names).
        let h = st.on_request(&req(&["a", "b"], "v1", &r.nonce), &s, now());
        assert!(h.names_changed);
        let r2 = take(&mut st, &s).unwrap();
        assert_eq!(sent(&r2), vec!["b@2"]);
        // b dropped, then asked again: sent again.
        let h = st.on_request(&req(&["a"], "v1", &r2.nonce), &s, now());
        assert!(!h.due);
        let h = st.on_request(&req(&["a", "b"], "v1", &r2.nonce), &s, now());
        assert!(h.due);
        let r4 = take(&mut st, &s).unwrap();
        assert_eq!(sent(&r4), vec!["b@2"]);
        // Names no cluster defines: counted, sampled once, not kept.
        let h = st.on_request(&req(&["a", "b", "zz", "yy"], "v1", &r4.nonce), &s, now());
        assert_eq!(h.unknown, 2);
        assert_eq!(h.unknown_sample, vec!["zz", "yy"]);
        assert!(!h.due);
        assert_eq!(st.subscribed().collect::<Vec<_>>(), vec![0, 1]);
        let h = st.on_request(&req(&["a", "b", "zz", "yy"], "v1", &r4.nonce), &s, now());
        assert_eq!(h.unknown, 2);
        assert!(
            h.unknown_sample.is_empty(),
            "the same names again: not sampled"
        );
    }

    #[test]
    fn a_flood_of_unknown_names_keeps_nothing() {
        let s = snap("v1", true, &[("a", 1)]);
        let mut st = EdsStream::new(names());
        let many: Vec<String> = (0..10_000).map(|i| format!("made-up-{i}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let h = st.on_request(&req(&refs, "", ""), &s, now());
        assert_eq!(h.unknown, 10_000);
        assert_eq!(h.unknown_sample.len(), 3);
        assert_eq!(st.subscribed().count(), 0);
        assert!(st.subscribed.capacity() <= names().len());
    }

    #[test]
    fn nothing_before_ready_everything_once_ready() {
        let mut st = EdsStream::new(names());
        let h = st.on_request(&req(&["a"], "", ""), &snap("", false, &[]), now());
        assert!(!h.due);
        let s = snap("v1", true, &[("a", 1)]);
        assert_eq!(st.on_snapshot(&s, now()), SnapshotEffect::Due);
        assert_eq!(sent(&take(&mut st, &s).unwrap()), vec!["a@1"]);
        // A stream that has not asked anything yet gets nothing.
        let mut idle = EdsStream::new(names());
        assert_eq!(idle.on_snapshot(&s, now()), SnapshotEffect::Nothing);
        assert!(take(&mut idle, &s).is_none());
    }

    #[test]
    fn a_reconnecting_envoy_gets_the_current_state() {
        let s = snap("v7", true, &[("a", 4), ("b", 6)]);
        // Envoy reconnects with the version it last accepted and no nonce.
        let mut st = EdsStream::new(names());
        let h = st.on_request(&req(&["a", "b"], "v3", ""), &s, now());
        assert_eq!(h.kind, RequestKind::Initial);
        assert_eq!(sent(&take(&mut st, &s).unwrap()), vec!["a@4", "b@6"]);
    }

    #[test]
    fn other_types_are_not_answered() {
        let s = snap("v1", true, &[("a", 1)]);
        let mut st = EdsStream::new(names());
        let mut r = req(&[], "", "");
        r.type_url = "type.googleapis.com/envoy.config.cluster.v3.Cluster".into();
        let h = st.on_request(&r, &s, now());
        assert!(matches!(h.kind, RequestKind::OtherType(_)));
        assert!(!h.due);
    }

    #[test]
    fn responses_stay_under_the_size_limit() {
        let s = snap("v1", true, &[("a", 1), ("b", 2), ("c", 3)]);
        let entry = s.resources["a"].entry.len();
        let mut st = EdsStream::new(names());
        st.on_request(&req(&["a", "b", "c"], "", ""), &s, now());
        // Room for two entries per message: a and b, then c.
        let limit = wire::message_len("v1", CLA_TYPE_URL, "1", 2 * entry);
        let t = st.take(&s, limit, now());
        let r = t.response.unwrap();
        assert!(r.wire_len - wire::GRPC_HEADER <= limit);
        assert_eq!(sent(&r.to_response().unwrap()), vec!["a@1", "b@2"]);
        assert!(
            st.due_since().is_some(),
            "c is due in a response of its own"
        );
        let r = st.take(&s, limit, now()).response.unwrap();
        assert_eq!(sent(&r.to_response().unwrap()), vec!["c@3"]);
        // One resource alone over the limit: left out, reported, not retried.
        let s2 = snap("v2", true, &[("a", 9), ("b", 2), ("c", 3)]);
        st.on_snapshot(&s2, now());
        let t = st.take(&s2, entry - 1, now());
        assert!(t.response.is_none());
        assert_eq!(t.oversized, vec![("a".to_string(), 3)]);
        assert!(!st.is_due(&s2));
    }
}
