//! The state-of-the-world xDS protocol of one stream (gRPC v3,
//! ClusterLoadAssignments over ADS or plain EDS): [`SotwStream`], a state
//! that tests drive without a network; `server` runs it over HTTP/2.
//!
//! Rules (besides `protocol`'s):
//! - EDS is not a "full state" type: a response carries only the
//!   subscribed resources whose version this stream has not sent yet, and
//!   Envoy keeps the others (a resource left out of a response is not
//!   removed: `envoyproxy/go-control-plane`'s `pkg/cache/v3/linear.go`
//!   answers EDS the same way, and `tests/e2e/companion/chain.rs` checks
//!   it on Envoy 1.40 with two clusters changing one at a time).
//! - A request whose nonce is not the last one sent is stale and ignored
//!   (Envoy sends a fresh one after the newer response).
//! - A request that repeats the nonce of a response already ACKed or
//!   NACKed (a second ACK of the same response) is answered with every
//!   subscribed resource again, under a new nonce. Envoy sends one when a
//!   watch is added or removed outside a response: over ADS a cluster that
//!   CDS updates (its load-balancing policy, say) is re-created, and its
//!   EDS watch names what the old cluster's names, at the same version and
//!   nonce (`envoyproxy/envoy`
//!   `source/extensions/config_subscription/grpc/grpc_mux_impl.{cc,h}`:
//!   `addWatch` and a watch's removal each queue a request). The new
//!   cluster warms only when an assignment reaches it (the xDS protocol,
//!   "Resource warming"), and a state-of-the-world request does not say
//!   which name is new, so all are sent; unanswered, it warms at its
//!   `initial_fetch_timeout` (15 s) from Envoy's cached assignment. Istio
//!   answers the same way after a CDS push (`istio/istio@1.30.3`
//!   `pilot/pkg/model/context.go`, `AlwaysRespond`); go-control-plane's
//!   caches answer only what changed or was never sent
//!   (`envoyproxy/go-control-plane@v0.14.0` `pkg/cache/v3/simple.go`,
//!   `createResponse`). Such a request that
//!   arrives while a response is in flight is stale; it is remembered, and
//!   the ACK of that response is answered the same way. Each takes at most
//!   one response, sent only when none awaits its ACK, so a client cannot
//!   make the server send faster than it ACKs.
//! - A request with `error_detail` NACKs the last response: logged and
//!   counted; the same version is not sent again (a new one will be).
//! - A subscription change (resource_names) sends the newly named resources
//!   at once. An ACK that names what the last request named (Envoy sends
//!   every name on every request) is recognised by a fingerprint of the
//!   names, without reading each.
//! - A name not served is not answered: Envoy waits for it up to the
//!   cluster's `initial_fetch_timeout` (15 s by default), then uses the
//!   cluster without hosts, as go-control-plane leaves it.
//! - A new stream (a new Envoy, or one that reconnects) has sent nothing,
//!   so its first request gets every subscribed resource.
//! - Other type URLs on an ADS stream (CDS, LDS...) are not served: no
//!   answer (an empty answer would remove them), logged once per stream.
//! - A response stays under the message size limit: resources that do not
//!   fit together go in the next response; one that alone is over it is not
//!   sent (reported).

use std::sync::Arc;
use std::time::Instant;

use crate::eds::assignment::CLA_TYPE_URL;
use crate::eds::response_bytes as wire;
use crate::eds::snapshot::{name_hash, Snapshot};
use crate::xds::protocol::{
    catch_up, effect, lags, Acks, Handled, Names, Prepared, RequestKind, SeenSnapshots,
    SnapshotEffect, Taken,
};
use crate::xds::requests::{name_str, names_fingerprint, RequestView};
use crate::xds::retained::{cut_bytes, Retained, RetainedBudget, SUB_BYTES, TYPE_URL_KEPT};
use crate::xds::subscriptions::{Fit, Subscriptions};

/// One state-of-the-world stream's protocol state.
#[derive(Debug)]
pub struct SotwStream {
    names: Arc<Names>,
    subs: Subscriptions,
    started: bool,
    /// Fingerprint of the last request's names, and how many of them were
    /// not served.
    names_seen: Option<(u64, usize)>,
    acks: Acks,
    seen: SeenSnapshots,
    /// Since when a response has been due and not taken.
    due_since: Option<Instant>,
    /// A stale request came while a response was in flight: its ACK is
    /// answered with every subscribed resource.
    resend_at_ack: bool,
    retained: Retained,
}

impl SotwStream {
    /// A stream opened when `snap` was the newest snapshot.
    pub fn new(names: Arc<Names>, snap: &Snapshot) -> SotwStream {
        SotwStream {
            names,
            subs: Subscriptions::default(),
            started: false,
            names_seen: None,
            acks: Acks::default(),
            seen: SeenSnapshots { seq: snap.seq },
            due_since: None,
            resend_at_ack: false,
            retained: Retained::new(RetainedBudget::unbounded()),
        }
    }

    /// Keeps what the stream retains within `budget`.
    pub fn retaining(mut self, budget: Arc<RetainedBudget>) -> SotwStream {
        self.retained = Retained::new(budget);
        self
    }

    /// Bytes the stream keeps (its subscriptions).
    pub fn retained(&self) -> usize {
        self.retained.held()
    }

    /// The stream's subscriptions.
    pub fn subscriptions(&self) -> &Subscriptions {
        &self.subs
    }

    /// Since when a response has been due and not taken by the transport.
    pub fn due_since(&self) -> Option<Instant> {
        self.due_since
    }

    fn sendable(&self, snap: &Snapshot) -> bool {
        self.started && snap.ready && !self.acks.awaiting && self.subs.any_due()
    }

    /// True when a response can be taken now.
    pub fn is_due(&self, snap: &Snapshot) -> bool {
        self.sendable(snap)
    }

    fn refresh_due(&mut self, snap: &Snapshot, now: Instant) -> bool {
        if self.sendable(snap) {
            self.due_since.get_or_insert(now);
            true
        } else {
            self.due_since = None;
            false
        }
    }

    /// Handles one request against the current snapshot.
    pub fn on_request(&mut self, req: &RequestView, snap: &Snapshot, now: Instant) -> Handled {
        let mut handled = Handled::new();
        if req.type_url != CLA_TYPE_URL {
            handled.kind =
                RequestKind::OtherType(cut_bytes(&req.type_url, TYPE_URL_KEPT).to_string());
            return handled;
        }
        // Every subscribed resource goes again (a watch was re-added).
        let mut resend = false;
        if !req.response_nonce.is_empty() {
            if !self.acks.is_current(&req.response_nonce) {
                // With one response awaiting its ACK, a request naming an
                // older one was sent before this response arrived, outside
                // any response: a watch changed.
                self.resend_at_ack |= self.acks.awaiting;
                handled.kind = RequestKind::Stale;
                return handled;
            }
            if !self.acks.awaiting {
                resend = true;
                handled.kind = RequestKind::Repeated {
                    version: req.version_info.clone(),
                };
            } else {
                let accepted = req.error_detail.is_none();
                let (applied, after) = self.acks.replied(accepted, now);
                // A NACK fails every watch's update, warming ones included:
                // nothing to resend.
                resend = std::mem::take(&mut self.resend_at_ack) && accepted;
                handled.kind = match &req.error_detail {
                    Some(status) => RequestKind::Nack {
                        version: req.version_info.clone(),
                        message: status.message.clone(),
                    },
                    None => {
                        handled.ack_after = after;
                        handled.applied = applied;
                        RequestKind::Ack {
                            version: req.version_info.clone(),
                        }
                    }
                };
            }
        }
        self.started = true;
        let fp = names_fingerprint(&req.resource_names);
        match self.names_seen {
            Some((seen, unknown)) if seen == fp => handled.unknown = unknown,
            _ => {
                handled.names_changed = true;
                let mut keys = Vec::with_capacity(req.resource_names.len());
                for n in &req.resource_names {
                    let name = name_str(n);
                    let h = name_hash(name);
                    let served = snap.table.get(h).is_some_and(|r| r.name == name);
                    if !served {
                        handled.unknown += 1;
                        if handled.unknown_sample.len() < 3 {
                            handled.unknown_sample.push(name.to_string());
                        }
                    }
                    if served || self.names.may_serve(name, h) {
                        keys.push(h);
                    }
                }
                keys.sort_unstable();
                keys.dedup();
                if let Err(r) = self.retained.set(keys.len() * SUB_BYTES) {
                    handled.refused = Some(r);
                    return handled;
                }
                self.subs.set(&keys, &snap.table);
                self.names_seen = Some((fp, handled.unknown));
            }
        }
        if resend {
            handled.resent = self.subs.resend_all(&snap.table);
        }
        handled.due = self.refresh_due(snap, now);
        handled
    }

    /// A new snapshot was published.
    pub fn on_snapshot(&mut self, snap: &Snapshot, now: Instant) -> SnapshotEffect {
        let was_pending = self.subs.any_due();
        let touched = catch_up(&mut self.subs, &mut self.seen, snap);
        if !self.started {
            return SnapshotEffect::Nothing;
        }
        let due = self.refresh_due(snap, now);
        effect(was_pending, touched, due)
    }

    /// The response the transport takes now, from `snap` (the newest):
    /// every due resource that fits in `max_message_len` bytes.
    pub fn take(&mut self, snap: &Snapshot, max_message_len: usize, now: Instant) -> Taken {
        let mut taken = Taken::default();
        if !self.sendable(snap) {
            self.due_since = None;
            return taken;
        }
        let nonce = self.acks.last_nonce + 1;
        let nonce_text = nonce.to_string();
        let overhead = wire::message_len(&snap.version, CLA_TYPE_URL, &nonce_text, 0);
        let mut entries_len = 0;
        let mut oversized = Vec::new();
        let chosen = self.subs.take(
            &snap.table,
            |r| {
                let len = r.entry.len();
                if overhead + len > max_message_len {
                    Fit::Never
                } else if overhead + entries_len + len <= max_message_len {
                    entries_len += len;
                    Fit::Yes
                } else {
                    Fit::NotNow
                }
            },
            &mut oversized,
        );
        taken.oversized = oversized
            .iter()
            .map(|r| (r.name.clone(), r.value().len()))
            .collect();
        if !chosen.is_empty() {
            let f = wire::frame(&snap.version, CLA_TYPE_URL, &nonce_text, entries_len);
            let resources: Vec<_> = chosen.iter().map(|c| c.resource.clone()).collect();
            let triggers = chosen.iter().filter_map(|c| c.trigger).collect();
            self.acks.sent(nonce, triggers, now);
            taken.response = Some(Prepared {
                nonce,
                version: snap.version.clone(),
                head: f.head,
                entries: resources.iter().map(|r| r.entry.clone()).collect(),
                tail: f.tail,
                resources: resources.len(),
                lags: lags(&resources, now),
                wire_len: wire::GRPC_HEADER + f.message_len,
            });
        }
        self.due_since = None;
        self.refresh_due(snap, now);
        taken
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::eds::snapshot::{Resource, Table};
    use bytes::Bytes;
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
    use envoy_types::pb::google::rpc::Status as RpcStatus;

    const MAX: usize = usize::MAX;

    fn names() -> Arc<Names> {
        Arc::new(Names::new(["a", "b", "c", "x"]))
    }

    /// Snapshots over one table, as the publisher makes them.
    struct World {
        table: Arc<Table>,
        seq: u64,
    }

    impl World {
        fn new() -> World {
            World {
                table: Arc::new(Table::default()),
                seq: 0,
            }
        }

        fn snap(&mut self, version: &str, ready: bool, resources: &[(&str, u64)]) -> Snapshot {
            let rs: Vec<Arc<Resource>> = resources
                .iter()
                .filter(|(n, v)| self.table.by_name(n).is_none_or(|r| r.version != *v))
                .map(|(name, v)| {
                    Arc::new(Resource::new(
                        name,
                        *v,
                        format!("{name}@{v}").as_bytes(),
                        0,
                        Instant::now(),
                    ))
                })
                .collect();
            self.table.put(&rs, &[]);
            let after = self.seq;
            self.seq += 1;
            Snapshot {
                version: version.into(),
                ready,
                table: self.table.clone(),
                seq: self.seq,
                after,
                changed: Arc::from(rs.iter().map(|r| r.hash).collect::<Vec<_>>()),
            }
        }
    }

    fn req(names: &[&str], version: &str, nonce: &str) -> RequestView {
        RequestView {
            version_info: version.into(),
            resource_names: names.iter().map(|s| Bytes::from(s.to_string())).collect(),
            type_url: CLA_TYPE_URL.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    fn now() -> Instant {
        Instant::now()
    }

    /// The response taken now, decoded.
    fn take(st: &mut SotwStream, s: &Snapshot) -> Option<DiscoveryResponse> {
        st.take(s, MAX, now())
            .response
            .map(|p| p.to_response().unwrap())
    }

    fn sent(r: &DiscoveryResponse) -> Vec<String> {
        let mut v: Vec<String> = r
            .resources
            .iter()
            .map(|a| String::from_utf8(a.value.clone()).unwrap())
            .collect();
        v.sort();
        v
    }

    fn ack(st: &mut SotwStream, names: &[&str], r: &DiscoveryResponse, s: &Snapshot) -> Handled {
        st.on_request(&req(names, &r.version_info, &r.nonce), s, now())
    }

    #[test]
    fn initial_request_gets_every_subscribed_resource_then_ack_is_quiet() {
        let mut w = World::new();
        let s = w.snap("v1", true, &[("a", 1), ("b", 2), ("c", 3)]);
        let mut st = SotwStream::new(names(), &s);
        let h = st.on_request(&req(&["a", "b"], "", ""), &s, now());
        assert_eq!(h.kind, RequestKind::Initial);
        assert!(h.due);
        let r = take(&mut st, &s).unwrap();
        assert_eq!(sent(&r), vec!["a@1", "b@2"]);
        assert_eq!(r.version_info, "v1");
        assert_eq!(r.type_url, CLA_TYPE_URL);
        let h = ack(&mut st, &["a", "b"], &r, &s);
        assert_eq!(
            h.kind,
            RequestKind::Ack {
                version: "v1".into()
            }
        );
        assert!(h.ack_after.is_some());
        assert!(h.applied.is_empty(), "a first send is not a change");
        assert!(!h.names_changed, "the same names: recognised");
        assert!(!h.due, "an ACK of the current state needs no answer");
        assert!(take(&mut st, &s).is_none());
    }

    #[test]
    fn a_new_snapshot_sends_only_changed_resources_one_response_awaiting_its_ack() {
        let mut w = World::new();
        let s1 = w.snap("v1", true, &[("a", 1), ("b", 2)]);
        let mut st = SotwStream::new(names(), &s1);
        st.on_request(&req(&["a", "b"], "", ""), &s1, now());
        let r1 = take(&mut st, &s1).unwrap();
        // Not ACKed yet: a change waits for the ACK.
        let s2 = w.snap("v2", true, &[("a", 1), ("b", 5)]);
        assert_eq!(st.on_snapshot(&s2, now()), SnapshotEffect::StillDue);
        assert!(take(&mut st, &s2).is_none(), "one response awaits its ACK");
        let h = ack(&mut st, &["a", "b"], &r1, &s2);
        assert!(h.due, "the ACK lets the change go");
        let r2 = take(&mut st, &s2).unwrap();
        assert_eq!(sent(&r2), vec!["b@5"]);
        assert_eq!(r2.version_info, "v2");
        assert_ne!(r2.nonce, r1.nonce);
        let h = ack(&mut st, &["a", "b"], &r2, &s2);
        assert_eq!(h.applied.len(), 1, "the ACK confirms a change: timed");
        // Nothing changed for this stream: nothing due.
        let s3 = w.snap("v3", true, &[("x", 9)]);
        assert_eq!(st.on_snapshot(&s3, now()), SnapshotEffect::Nothing);
        assert!(take(&mut st, &s3).is_none());
        // An ACK of an older response: stale, ignored.
        let h = ack(&mut st, &["a", "b"], &r1, &s3);
        assert_eq!(h.kind, RequestKind::Stale);
        assert!(!h.due);
    }

    #[test]
    fn snapshots_while_a_response_is_due_coalesce_into_the_newest() {
        let mut w = World::new();
        let s1 = w.snap("v1", true, &[("a", 1), ("b", 2)]);
        let mut st = SotwStream::new(names(), &s1);
        st.on_request(&req(&["a", "b"], "", ""), &s1, now());
        let r1 = take(&mut st, &s1).unwrap();
        ack(&mut st, &["a", "b"], &r1, &s1);
        // The stream does not take anything while three snapshots come.
        let t0 = now();
        assert_eq!(
            st.on_snapshot(&w.snap("v2", true, &[("a", 3)]), t0),
            SnapshotEffect::Due
        );
        assert_eq!(
            st.on_snapshot(&w.snap("v3", true, &[("a", 4)]), now()),
            SnapshotEffect::Coalesced,
            "the response due now carries a@4"
        );
        let s4 = w.snap("v4", true, &[("b", 6), ("x", 7)]);
        assert_eq!(st.on_snapshot(&s4, now()), SnapshotEffect::Coalesced);
        let s5 = w.snap("v5", true, &[("x", 8)]);
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
        let h = ack(&mut st, &["a", "b"], &r, &s5);
        assert_eq!(h.applied.len(), 2);
        assert!(take(&mut st, &s5).is_none());
    }

    #[test]
    fn a_missed_snapshot_is_caught_up_from_the_table() {
        let mut w = World::new();
        let s1 = w.snap("v1", true, &[("a", 1), ("b", 2)]);
        let mut st = SotwStream::new(names(), &s1);
        st.on_request(&req(&["a", "b"], "", ""), &s1, now());
        let r1 = take(&mut st, &s1).unwrap();
        ack(&mut st, &["a", "b"], &r1, &s1);
        let _missed = w.snap("v2", true, &[("a", 5)]);
        let s3 = w.snap("v3", true, &[("x", 1)]);
        assert_eq!(st.on_snapshot(&s3, now()), SnapshotEffect::Due);
        assert_eq!(sent(&take(&mut st, &s3).unwrap()), vec!["a@5"]);
    }

    #[test]
    fn nack_is_reported_and_not_answered_with_the_same_version() {
        let mut w = World::new();
        let s = w.snap("v1", true, &[("a", 1)]);
        let mut st = SotwStream::new(names(), &s);
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
        assert!(h.applied.is_empty());
        // A newer version is sent again.
        let s2 = w.snap("v2", true, &[("a", 2)]);
        st.on_snapshot(&s2, now());
        assert_eq!(sent(&take(&mut st, &s2).unwrap()), vec!["a@2"]);
    }

    #[test]
    fn subscription_changes_send_new_names_and_forget_dropped_ones() {
        let mut w = World::new();
        let s = w.snap("v1", true, &[("a", 1), ("b", 2)]);
        let mut st = SotwStream::new(names(), &s);
        st.on_request(&req(&["a"], "", ""), &s, now());
        let r = take(&mut st, &s).unwrap();
        // Envoy adds cluster b (ACK of r carrying the new names).
        let h = ack(&mut st, &["a", "b"], &r, &s);
        assert!(h.names_changed);
        let r2 = take(&mut st, &s).unwrap();
        assert_eq!(sent(&r2), vec!["b@2"]);
        // b dropped, then asked again outside a response (the nonce already
        // ACKed): a watch added, so every name is sent again.
        let h = ack(&mut st, &["a"], &r2, &s);
        assert!(!h.due);
        let h = st.on_request(&req(&["a", "b"], "v1", &r2.nonce), &s, now());
        assert!(h.due);
        let r4 = take(&mut st, &s).unwrap();
        assert_eq!(sent(&r4), vec!["a@1", "b@2"]);
        // Names no cluster defines: counted, sampled, not kept.
        let h = ack(&mut st, &["a", "b", "zz", "yy"], &r4, &s);
        assert_eq!(h.unknown, 2);
        assert_eq!(h.unknown_sample, vec!["zz", "yy"]);
        assert!(!h.due);
        assert_eq!(st.subscriptions().len(), 2);
        let h = st.on_request(&req(&["a", "b", "zz", "yy"], "v1", &r4.nonce), &s, now());
        assert_eq!(h.unknown, 2, "counted again");
        assert!(
            h.unknown_sample.is_empty(),
            "the same names again: not sampled"
        );
    }

    /// Envoy over ADS, when CDS updates a cluster: the new cluster's EDS
    /// watch names what the old one's did, and Envoy sends its last ACK
    /// again (same names, version and nonce).
    #[test]
    fn a_repeated_ack_is_answered_with_every_resource_once() {
        let mut w = World::new();
        let s = w.snap("v1", true, &[("a", 1), ("b", 2)]);
        let mut st = SotwStream::new(names(), &s);
        st.on_request(&req(&["a", "b"], "", ""), &s, now());
        let r1 = take(&mut st, &s).unwrap();
        let h = ack(&mut st, &["a", "b"], &r1, &s);
        assert!(matches!(h.kind, RequestKind::Ack { .. }));
        assert!(!h.due);
        // The cluster re-created: the same request again.
        let h = ack(&mut st, &["a", "b"], &r1, &s);
        assert_eq!(
            h.kind,
            RequestKind::Repeated {
                version: "v1".into()
            }
        );
        assert!(h.due);
        assert_eq!(h.resent, 2);
        assert!(h.ack_after.is_none(), "not an ACK: no ACK latency");
        let r2 = take(&mut st, &s).unwrap();
        assert_eq!(sent(&r2), vec!["a@1", "b@2"]);
        assert_eq!(r2.version_info, "v1", "nothing changed");
        assert_ne!(r2.nonce, r1.nonce);
        // Its ACK is an ACK: no loop.
        let h = ack(&mut st, &["a", "b"], &r2, &s);
        assert!(matches!(h.kind, RequestKind::Ack { .. }));
        assert!(h.applied.is_empty(), "a resend is not a change");
        assert!(!h.due);
        assert!(take(&mut st, &s).is_none());
        // The old cluster's watch removed once the new one warmed: once more.
        let h = ack(&mut st, &["a", "b"], &r2, &s);
        assert!(h.due);
        let r3 = take(&mut st, &s).unwrap();
        assert_eq!(sent(&r3), vec!["a@1", "b@2"]);
        ack(&mut st, &["a", "b"], &r3, &s);
        assert!(take(&mut st, &s).is_none());
    }

    #[test]
    fn a_repeated_ack_with_new_names_sends_every_name() {
        let mut w = World::new();
        let s = w.snap("v1", true, &[("a", 1), ("b", 2), ("c", 3)]);
        let mut st = SotwStream::new(names(), &s);
        st.on_request(&req(&["a", "b"], "", ""), &s, now());
        let r1 = take(&mut st, &s).unwrap();
        ack(&mut st, &["a", "b"], &r1, &s);
        // One CDS update re-creates a and adds c: one request.
        let h = ack(&mut st, &["a", "b", "c"], &r1, &s);
        assert!(h.names_changed);
        assert!(h.due);
        let r2 = take(&mut st, &s).unwrap();
        assert_eq!(sent(&r2), vec!["a@1", "b@2", "c@3"]);
        assert!(take(&mut st, &s).is_none(), "one response awaits its ACK");
        ack(&mut st, &["a", "b", "c"], &r2, &s);
        // One that re-creates a and drops b: what is still named.
        let h = ack(&mut st, &["a", "c"], &r2, &s);
        assert!(h.due);
        assert_eq!(sent(&take(&mut st, &s).unwrap()), vec!["a@1", "c@3"]);
    }

    #[test]
    fn a_watch_re_added_while_a_response_is_in_flight_is_answered_at_its_ack() {
        let mut w = World::new();
        let s1 = w.snap("v1", true, &[("a", 1), ("b", 2)]);
        let mut st = SotwStream::new(names(), &s1);
        st.on_request(&req(&["a", "b"], "", ""), &s1, now());
        let r1 = take(&mut st, &s1).unwrap();
        ack(&mut st, &["a", "b"], &r1, &s1);
        let s2 = w.snap("v2", true, &[("b", 5)]);
        st.on_snapshot(&s2, now());
        let r2 = take(&mut st, &s2).unwrap();
        assert_eq!(sent(&r2), vec!["b@5"]);
        // Envoy re-adds a's watch before r2 arrives: stale, not answered now.
        let h = ack(&mut st, &["a", "b"], &r1, &s2);
        assert_eq!(h.kind, RequestKind::Stale);
        assert!(!h.due);
        assert!(take(&mut st, &s2).is_none(), "r2 awaits its ACK");
        // More of them cost nothing more.
        ack(&mut st, &["a", "b"], &r1, &s2);
        // r2's ACK is answered with everything, once.
        let h = ack(&mut st, &["a", "b"], &r2, &s2);
        assert!(matches!(h.kind, RequestKind::Ack { .. }));
        assert_eq!(h.applied.len(), 1, "r2's change is timed");
        assert!(h.due);
        assert_eq!(h.resent, 2);
        let r3 = take(&mut st, &s2).unwrap();
        assert_eq!(sent(&r3), vec!["a@1", "b@5"]);
        let h = ack(&mut st, &["a", "b"], &r3, &s2);
        assert!(!h.due);
        assert!(take(&mut st, &s2).is_none());
    }

    #[test]
    fn a_nack_ends_a_pending_resend() {
        let mut w = World::new();
        let s1 = w.snap("v1", true, &[("a", 1), ("b", 2)]);
        let mut st = SotwStream::new(names(), &s1);
        st.on_request(&req(&["a", "b"], "", ""), &s1, now());
        let r1 = take(&mut st, &s1).unwrap();
        ack(&mut st, &["a", "b"], &r1, &s1);
        let s2 = w.snap("v2", true, &[("b", 5)]);
        st.on_snapshot(&s2, now());
        let r2 = take(&mut st, &s2).unwrap();
        ack(&mut st, &["a", "b"], &r1, &s2);
        // Envoy rejects r2: every watch's update fails, the warming one's
        // too (it warms), so nothing is sent again.
        let mut nack = req(&["a", "b"], "v1", &r2.nonce);
        nack.error_detail = Some(RpcStatus {
            code: 3,
            message: "bad".into(),
            details: vec![],
        });
        let h = st.on_request(&nack, &s2, now());
        assert!(matches!(h.kind, RequestKind::Nack { .. }));
        assert_eq!(h.resent, 0);
        assert!(!h.due);
        assert!(take(&mut st, &s2).is_none());
    }

    /// However often a client repeats its ACK, one response awaits its
    /// ACK at a time: it cannot make the server send faster than it ACKs.
    #[test]
    fn repeated_acks_take_one_response_per_ack() {
        let mut w = World::new();
        let s = w.snap("v1", true, &[("a", 1), ("b", 2)]);
        let mut st = SotwStream::new(names(), &s);
        st.on_request(&req(&["a", "b"], "", ""), &s, now());
        let r1 = take(&mut st, &s).unwrap();
        ack(&mut st, &["a", "b"], &r1, &s);
        let mut responses = 0;
        let mut last = r1.clone();
        for _ in 0..100 {
            ack(&mut st, &["a", "b"], &r1, &s);
            if let Some(r) = take(&mut st, &s) {
                responses += 1;
                last = r;
            }
        }
        assert_eq!(responses, 1, "r1 repeated: one answer, then stale");
        ack(&mut st, &["a", "b"], &last, &s);
        assert!(take(&mut st, &s).is_some(), "the repeats seen in flight");
        assert!(take(&mut st, &s).is_none());
    }

    #[test]
    fn a_flood_of_unknown_names_keeps_nothing() {
        let mut w = World::new();
        let s = w.snap("v1", true, &[("a", 1)]);
        let mut st = SotwStream::new(names(), &s);
        let many: Vec<String> = (0..10_000).map(|i| format!("made-up-{i}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let h = st.on_request(&req(&refs, "", ""), &s, now());
        assert_eq!(h.unknown, 10_000);
        assert_eq!(h.unknown_sample.len(), 3);
        assert_eq!(st.subscriptions().len(), 0);
    }

    #[test]
    fn subscriptions_are_kept_within_the_byte_limits() {
        use crate::limits::names as limit;
        let mut w = World::new();
        let s = w.snap("v1", true, &[("a", 1), ("b", 2), ("c", 3)]);
        let budget = Arc::new(RetainedBudget::new(64, 2 * SUB_BYTES, usize::MAX));
        let mut st = SotwStream::new(names(), &s).retaining(budget.clone());
        assert!(st
            .on_request(&req(&["a", "b"], "", ""), &s, now())
            .refused
            .is_none());
        assert_eq!(st.retained(), 2 * SUB_BYTES);
        let h = st.on_request(&req(&["a", "b", "c"], "", ""), &s, now());
        assert_eq!(h.refused.unwrap().limit, limit::MAX_STREAM_RETAINED_BYTES);
        assert_eq!(st.subscriptions().len(), 2, "refused whole");
        assert!(st
            .on_request(&req(&["a"], "", ""), &s, now())
            .refused
            .is_none());
        assert_eq!(budget.total(), SUB_BYTES);
        drop(st);
        assert_eq!(budget.total(), 0);
    }

    #[test]
    fn with_manage_a_template_name_waits_for_its_service() {
        let mut w = World::new();
        let s = w.snap("v1", true, &[("a", 1)]);
        let managed = Arc::new(Names::new(["a"]).managing(true));
        let mut st = SotwStream::new(managed, &s);
        let h = st.on_request(
            &req(&["a", "shop/web:http", "not a name"], "", ""),
            &s,
            now(),
        );
        assert_eq!(h.unknown, 2);
        assert_eq!(st.subscriptions().len(), 2, "the template name is kept");
        let r = take(&mut st, &s).unwrap();
        ack(&mut st, &["a", "shop/web:http", "not a name"], &r, &s);
        // The Service appears: sent at once, as a change.
        let s2 = w.snap("v2", true, &[("shop/web:http", 5)]);
        assert_eq!(st.on_snapshot(&s2, now()), SnapshotEffect::Due);
        let r2 = take(&mut st, &s2).unwrap();
        assert_eq!(sent(&r2), vec!["shop/web:http@5"]);
        let h = ack(&mut st, &["a", "shop/web:http", "not a name"], &r2, &s2);
        assert_eq!(h.applied.len(), 1);
    }

    #[test]
    fn nothing_before_ready_everything_once_ready() {
        let mut w = World::new();
        let s0 = w.snap("", false, &[]);
        let mut st = SotwStream::new(names(), &s0);
        let h = st.on_request(&req(&["a"], "", ""), &s0, now());
        assert!(!h.due);
        let s = w.snap("v1", true, &[("a", 1)]);
        assert_eq!(st.on_snapshot(&s, now()), SnapshotEffect::Due);
        assert_eq!(sent(&take(&mut st, &s).unwrap()), vec!["a@1"]);
        // A stream that has not asked anything yet gets nothing.
        let mut idle = SotwStream::new(names(), &s);
        assert_eq!(idle.on_snapshot(&s, now()), SnapshotEffect::Nothing);
        assert!(take(&mut idle, &s).is_none());
    }

    #[test]
    fn a_reconnecting_envoy_gets_the_current_state() {
        let mut w = World::new();
        let s = w.snap("v7", true, &[("a", 4), ("b", 6)]);
        // Envoy reconnects with the version it last accepted and no nonce.
        let mut st = SotwStream::new(names(), &s);
        let h = st.on_request(&req(&["a", "b"], "v3", ""), &s, now());
        assert_eq!(h.kind, RequestKind::Initial);
        assert_eq!(sent(&take(&mut st, &s).unwrap()), vec!["a@4", "b@6"]);
    }

    #[test]
    fn other_types_are_not_answered() {
        let mut w = World::new();
        let s = w.snap("v1", true, &[("a", 1)]);
        let mut st = SotwStream::new(names(), &s);
        let mut r = req(&[], "", "");
        r.type_url = "type.googleapis.com/envoy.config.cluster.v3.Cluster".into();
        let h = st.on_request(&r, &s, now());
        assert!(matches!(h.kind, RequestKind::OtherType(_)));
        assert!(!h.due);
    }

    #[test]
    fn responses_stay_under_the_size_limit() {
        let mut w = World::new();
        let s = w.snap("v1", true, &[("a", 1), ("b", 2), ("c", 3)]);
        let entry = s.resource("a").unwrap().entry.len();
        let mut st = SotwStream::new(names(), &s);
        st.on_request(&req(&["a", "b", "c"], "", ""), &s, now());
        // Room for two entries per message.
        let limit = wire::message_len("v1", CLA_TYPE_URL, "1", 2 * entry);
        let r = st.take(&s, limit, now()).response.unwrap();
        assert!(r.wire_len - wire::GRPC_HEADER <= limit);
        assert_eq!(sent(&r.to_response().unwrap()).len(), 2);
        let d = r.to_response().unwrap();
        ack(&mut st, &["a", "b", "c"], &d, &s);
        assert!(
            st.due_since().is_some(),
            "the third is due in a response of its own"
        );
        let r = st.take(&s, limit, now()).response.unwrap();
        assert_eq!(sent(&r.to_response().unwrap()).len(), 1);
        ack(&mut st, &["a", "b", "c"], &r.to_response().unwrap(), &s);
        // One resource alone over the limit: left out, reported, not retried.
        let s2 = w.snap("v2", true, &[("a", 9)]);
        st.on_snapshot(&s2, now());
        let t = st.take(&s2, entry - 1, now());
        assert!(t.response.is_none());
        assert_eq!(t.oversized, vec![("a".to_string(), 3)]);
        assert!(!st.is_due(&s2));
    }
}
