//! The incremental (delta) xDS protocol of one stream
//! (`DeltaAggregatedResources`, `DeltaEndpoints`): [`DeltaStream`], a state
//! that tests drive without a network; `server` runs it over HTTP/2 with
//! the same limits as state of the world.
//!
//! Rules (besides `protocol`'s):
//! - Requests subscribe and unsubscribe names; every request's changes are
//!   taken, whatever its nonce (a delta request is a difference: dropping
//!   one would lose it). A nonce that names the response in flight ACKs or
//!   NACKs it.
//! - A response carries the subscribed resources whose content the client
//!   lacks, each with its version: a hash of its content, the same across
//!   restarts of the companion, so a client that reconnects with
//!   `initial_resource_versions` is not sent what it has.
//! - A name subscribed again while subscribed is sent again: the client may
//!   have forgotten it (the xDS protocol, "Subscribing to Resources": the
//!   server must still provide it).
//! - A name not served when subscribed is answered in `removed_resources`:
//!   the protocol's "does not exist". Envoy's EDS then finishes warming the
//!   cluster, without hosts, at once (`envoyproxy/envoy`
//!   `source/extensions/clusters/eds/eds.cc`: a delta update without the
//!   resource is an empty update, `update_empty`). A name that may be
//!   served later (as in `protocol`) stays subscribed and is sent when it
//!   appears.
//! - A resource that stops being served is never sent as removed (Envoy's
//!   EDS would keep its last hosts: `eds.cc` ignores removals); the
//!   publisher sends it empty instead, as state of the world does.
//! - The names to answer removed are kept until a response carries them,
//!   bounded in bytes (`retained`): a request that would keep more ends
//!   the stream, refused whole.
//! - A request's names are read, hashed and sorted before the stream's
//!   state is locked ([`DeltaStream::read_names`]); the state then takes
//!   them in one merge ([`DeltaStream::on_read`]), so the lock the fan-out
//!   takes is held for a merge, not for a request's worth of hashing.
//! - Wildcard subscriptions (`*`, or none on the first request) are not
//!   served: EDS is asked by name.

use std::sync::Arc;
use std::time::Instant;

use crate::eds::assignment::CLA_TYPE_URL;
use crate::eds::response_bytes as wire;
use crate::eds::snapshot::{name_hash, Snapshot};
use crate::xds::protocol::{
    catch_up, effect, lags, Acks, Handled, Names, Prepared, RequestKind, SeenSnapshots,
    SnapshotEffect, Taken,
};
use crate::xds::requests::{name_str, DeltaRequestView};
use crate::xds::retained::{
    cut_bytes, Refusal, Retained, RetainedBudget, NAME_OVERHEAD, SUB_BYTES, TYPE_URL_KEPT,
};
use crate::xds::subscriptions::{Fit, Subscriptions};

/// Names answered as removed in one response at most; more wait for the
/// next.
const REMOVED_MAX: usize = 4096;

/// A delta request's names, read before the stream's state is locked.
#[derive(Debug, Default)]
pub struct DeltaNames {
    /// Keys to subscribe (served now or maybe later), sorted, unique.
    subscribe: Vec<u64>,
    /// Keys to unsubscribe, sorted, unique.
    unsubscribe: Vec<u64>,
    /// Names not served now: answered removed.
    removed: Vec<String>,
    removed_bytes: usize,
    unknown: usize,
    unknown_sample: Vec<String>,
    /// A name over `--max-name-bytes`.
    refused: Option<Refusal>,
}

/// One delta stream's protocol state.
#[derive(Debug)]
pub struct DeltaStream {
    names: Arc<Names>,
    subs: Subscriptions,
    started: bool,
    acks: Acks,
    seen: SeenSnapshots,
    /// Names subscribed that are not served: answered as removed in the
    /// next response.
    removed: Vec<String>,
    /// Bytes of the names in `removed` (with [`NAME_OVERHEAD`] each).
    removed_bytes: usize,
    retained: Retained,
    due_since: Option<Instant>,
}

impl DeltaStream {
    /// A stream opened when `snap` was the newest snapshot.
    pub fn new(names: Arc<Names>, snap: &Snapshot) -> DeltaStream {
        DeltaStream {
            names,
            subs: Subscriptions::default(),
            started: false,
            acks: Acks::default(),
            seen: SeenSnapshots { seq: snap.seq },
            removed: Vec::new(),
            removed_bytes: 0,
            retained: Retained::new(RetainedBudget::unbounded()),
            due_since: None,
        }
    }

    /// Keeps what the stream retains within `budget`.
    pub fn retaining(mut self, budget: Arc<RetainedBudget>) -> DeltaStream {
        self.retained = Retained::new(budget);
        self
    }

    /// Bytes the stream keeps (subscriptions and names to answer removed).
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
        self.started
            && snap.ready
            && !self.acks.awaiting
            && (self.subs.any_due() || !self.removed.is_empty())
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

    /// Reads a request's names against `snap` (no stream state: done
    /// before the state is locked): their keys sorted, the names not served.
    pub fn read_names(
        names: &Names,
        budget: &RetainedBudget,
        req: &DeltaRequestView,
        snap: &Snapshot,
    ) -> DeltaNames {
        let mut out = DeltaNames::default();
        if req.type_url != CLA_TYPE_URL {
            return out;
        }
        out.subscribe.reserve(req.resource_names_subscribe.len());
        for n in &req.resource_names_subscribe {
            let name = name_str(n);
            let h = name_hash(name);
            let served = snap.table.get(h).is_some_and(|r| r.name == name);
            if !served {
                if let Err(r) = budget.check_name(n.len()) {
                    out.refused = Some(r);
                    return out;
                }
                out.unknown += 1;
                if out.unknown_sample.len() < 3 {
                    out.unknown_sample.push(name.to_string());
                }
                out.removed_bytes += name.len() + NAME_OVERHEAD;
                out.removed.push(name.to_string());
            }
            if served || names.may_serve(name, h) {
                out.subscribe.push(h);
            }
        }
        out.subscribe.sort_unstable();
        out.subscribe.dedup();
        out.unsubscribe = req
            .resource_names_unsubscribe
            .iter()
            .map(|n| name_hash(name_str(n)))
            .collect();
        out.unsubscribe.sort_unstable();
        out.unsubscribe.dedup();
        out
    }

    /// Handles one request against the current snapshot (its names read
    /// here: [`DeltaStream::read_names`] and [`DeltaStream::on_read`]).
    pub fn on_request(&mut self, req: &DeltaRequestView, snap: &Snapshot, now: Instant) -> Handled {
        let read = DeltaStream::read_names(&self.names, &self.retained_budget(), req, snap);
        self.on_read(req, read, snap, now)
    }

    fn retained_budget(&self) -> Arc<RetainedBudget> {
        self.retained.budget()
    }

    /// How many names the stream subscribes once `read` is applied
    /// (subscribed first, then unsubscribed, as `on_read` applies them).
    fn subscribed_after(&self, read: &DeltaNames) -> usize {
        let fresh = read
            .subscribe
            .iter()
            .filter(|k| !self.subs.contains(**k))
            .count();
        let gone = read
            .unsubscribe
            .iter()
            .filter(|k| self.subs.contains(**k) || read.subscribe.binary_search(k).is_ok())
            .count();
        (self.subs.len() + fresh).saturating_sub(gone)
    }

    /// Handles one request whose names `read_names` read from `snap`.
    pub fn on_read(
        &mut self,
        req: &DeltaRequestView,
        read: DeltaNames,
        snap: &Snapshot,
        now: Instant,
    ) -> Handled {
        let mut handled = Handled::new();
        if req.type_url != CLA_TYPE_URL {
            handled.kind =
                RequestKind::OtherType(cut_bytes(&req.type_url, TYPE_URL_KEPT).to_string());
            return handled;
        }
        if let Some(r) = read.refused {
            handled.refused = Some(r);
            return handled;
        }
        // The whole request is kept, or none of it.
        let keeps =
            self.subscribed_after(&read) * SUB_BYTES + self.removed_bytes + read.removed_bytes;
        if let Err(r) = self.retained.set(keeps) {
            handled.refused = Some(r);
            return handled;
        }
        if !req.response_nonce.is_empty() {
            if self.acks.is_current(&req.response_nonce) && self.acks.awaiting {
                let accepted = req.error_detail.is_none();
                let (applied, after) = self.acks.replied(accepted, now);
                handled.kind = match &req.error_detail {
                    Some(status) => RequestKind::Nack {
                        version: req.response_nonce.clone(),
                        message: status.message.clone(),
                    },
                    None => {
                        handled.ack_after = after;
                        handled.applied = applied;
                        RequestKind::Ack {
                            version: req.response_nonce.clone(),
                        }
                    }
                };
            } else {
                handled.kind = RequestKind::Stale;
            }
        }
        self.started = true;
        handled.names_changed =
            !req.resource_names_subscribe.is_empty() || !req.resource_names_unsubscribe.is_empty();
        handled.unknown = read.unknown;
        handled.unknown_sample = read.unknown_sample;
        self.removed.extend(read.removed);
        self.removed_bytes += read.removed_bytes;
        let versions = &req.initial_resource_versions;
        self.subs.add(&read.subscribe, &snap.table, |_, r| {
            versions.get(&r.name).is_some_and(|v| *v == r.delta_version)
        });
        self.subs.remove(&read.unsubscribe);
        handled.due = self.refresh_due(snap, now);
        handled
    }

    /// A new snapshot was published.
    pub fn on_snapshot(&mut self, snap: &Snapshot, now: Instant) -> SnapshotEffect {
        let was_pending = self.subs.any_due() || !self.removed.is_empty();
        let touched = catch_up(&mut self.subs, &mut self.seen, snap);
        if !self.started {
            return SnapshotEffect::Nothing;
        }
        let due = self.refresh_due(snap, now);
        effect(was_pending, touched, due)
    }

    /// The response the transport takes now: every due resource that fits
    /// in `max_message_len` bytes, and the names not served.
    pub fn take(&mut self, snap: &Snapshot, max_message_len: usize, now: Instant) -> Taken {
        let mut taken = Taken::default();
        if !self.sendable(snap) {
            self.due_since = None;
            return taken;
        }
        let nonce = self.acks.last_nonce + 1;
        let nonce_text = nonce.to_string();
        let cut = self.removed.len().min(REMOVED_MAX);
        let removed: Vec<String> = self.removed.drain(..cut).collect();
        self.removed_bytes = self
            .removed_bytes
            .saturating_sub(removed.iter().map(|n| n.len() + NAME_OVERHEAD).sum());
        // Giving back never fails.
        let _ = self
            .retained
            .set(self.subs.len() * SUB_BYTES + self.removed_bytes);
        let overhead =
            wire::delta_message_len(&snap.version, CLA_TYPE_URL, &nonce_text, &removed, 0);
        let mut entries_len = 0;
        let mut oversized = Vec::new();
        let chosen = self.subs.take(
            &snap.table,
            |r| {
                let len = r.delta_len();
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
        if !chosen.is_empty() || !removed.is_empty() {
            let f = wire::delta_frame(
                &snap.version,
                CLA_TYPE_URL,
                &nonce_text,
                &removed,
                entries_len,
            );
            let resources: Vec<_> = chosen.iter().map(|c| c.resource.clone()).collect();
            let triggers = chosen.iter().filter_map(|c| c.trigger).collect();
            self.acks.sent(nonce, triggers, now);
            let mut entries = Vec::with_capacity(resources.len() * 3);
            for r in &resources {
                entries.push(r.delta_head.clone());
                entries.push(r.value_bytes());
                entries.push(r.delta_tail.clone());
            }
            taken.response = Some(Prepared {
                nonce,
                version: snap.version.clone(),
                head: f.head,
                entries,
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
    use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse;
    use envoy_types::pb::google::rpc::Status as RpcStatus;

    fn names() -> Arc<Names> {
        Arc::new(Names::new(["a", "b", "c"]).managing(true))
    }

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

        fn snap(&mut self, resources: &[(&str, u64)]) -> Snapshot {
            let rs: Vec<Arc<Resource>> = resources
                .iter()
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
                version: format!("v{}", self.seq),
                ready: true,
                table: self.table.clone(),
                seq: self.seq,
                after,
                changed: Arc::from(rs.iter().map(|r| r.hash).collect::<Vec<_>>()),
            }
        }
    }

    fn req(sub: &[&str], unsub: &[&str], nonce: &str) -> DeltaRequestView {
        DeltaRequestView {
            type_url: CLA_TYPE_URL.into(),
            resource_names_subscribe: sub.iter().map(|s| Bytes::from(s.to_string())).collect(),
            resource_names_unsubscribe: unsub.iter().map(|s| Bytes::from(s.to_string())).collect(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    fn take(st: &mut DeltaStream, s: &Snapshot) -> Option<DeltaDiscoveryResponse> {
        st.take(s, usize::MAX, Instant::now())
            .response
            .map(|p| p.to_delta_response().unwrap())
    }

    fn got(r: &DeltaDiscoveryResponse) -> Vec<String> {
        let mut v: Vec<String> = r
            .resources
            .iter()
            .map(|x| {
                let value = &x.resource.as_ref().unwrap().value;
                format!("{}={}", x.name, String::from_utf8(value.clone()).unwrap())
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn subscribe_get_changes_only_and_unsubscribe() {
        let mut w = World::new();
        let s = w.snap(&[("a", 1), ("b", 2), ("c", 3)]);
        let mut st = DeltaStream::new(names(), &s);
        let h = st.on_request(&req(&["a", "b"], &[], ""), &s, Instant::now());
        assert!(h.due);
        let r = take(&mut st, &s).unwrap();
        assert_eq!(got(&r), ["a=a@1", "b=b@2"]);
        assert!(r.removed_resources.is_empty());
        assert_eq!(r.resources[0].version.len(), 16, "a content hash");
        let h = st.on_request(&req(&[], &[], &r.nonce), &s, Instant::now());
        assert!(matches!(h.kind, RequestKind::Ack { .. }));
        assert!(!h.due);
        // A change to b: b alone, timed at the ACK.
        let s2 = w.snap(&[("b", 5)]);
        assert_eq!(st.on_snapshot(&s2, Instant::now()), SnapshotEffect::Due);
        let r2 = take(&mut st, &s2).unwrap();
        assert_eq!(got(&r2), ["b=b@5"]);
        let h = st.on_request(&req(&[], &["a"], &r2.nonce), &s2, Instant::now());
        assert_eq!(h.applied.len(), 1);
        // a unsubscribed: its change is nothing to this stream.
        let s3 = w.snap(&[("a", 9)]);
        assert_eq!(st.on_snapshot(&s3, Instant::now()), SnapshotEffect::Nothing);
    }

    #[test]
    fn names_not_served_are_answered_removed_and_sent_when_they_appear() {
        let mut w = World::new();
        let s = w.snap(&[("a", 1)]);
        let mut st = DeltaStream::new(names(), &s);
        let h = st.on_request(
            &req(&["a", "shop/web:http", "junk name"], &[], ""),
            &s,
            Instant::now(),
        );
        assert_eq!(h.unknown, 2);
        let r = take(&mut st, &s).unwrap();
        assert_eq!(got(&r), ["a=a@1"]);
        assert_eq!(r.removed_resources, ["shop/web:http", "junk name"]);
        st.on_request(&req(&[], &[], &r.nonce), &s, Instant::now());
        let s2 = w.snap(&[("shop/web:http", 4)]);
        assert_eq!(st.on_snapshot(&s2, Instant::now()), SnapshotEffect::Due);
        assert_eq!(
            got(&take(&mut st, &s2).unwrap()),
            ["shop/web:http=shop/web:http@4"]
        );
    }

    #[test]
    fn a_reconnect_with_initial_versions_is_sent_only_what_differs() {
        let mut w = World::new();
        let s = w.snap(&[("a", 1), ("b", 2)]);
        let a = s.resource("a").unwrap();
        let mut st = DeltaStream::new(names(), &s);
        let mut r = req(&["a", "b"], &[], "");
        r.initial_resource_versions
            .insert("a".into(), a.delta_version.clone());
        r.initial_resource_versions
            .insert("b".into(), "stale".into());
        st.on_request(&r, &s, Instant::now());
        assert_eq!(got(&take(&mut st, &s).unwrap()), ["b=b@2"]);
    }

    #[test]
    fn a_name_subscribed_again_is_sent_again_unless_the_client_has_it() {
        let mut w = World::new();
        let s = w.snap(&[("a", 1), ("b", 2)]);
        let mut st = DeltaStream::new(names(), &s);
        st.on_request(&req(&["a", "b"], &[], ""), &s, Instant::now());
        let r = take(&mut st, &s).unwrap();
        st.on_request(&req(&[], &[], &r.nonce), &s, Instant::now());
        assert!(take(&mut st, &s).is_none());
        // a subscribed again while subscribed: the client may have lost it.
        let h = st.on_request(&req(&["a"], &[], ""), &s, Instant::now());
        assert!(h.due);
        let r2 = take(&mut st, &s).unwrap();
        assert_eq!(got(&r2), ["a=a@1"]);
        let h = st.on_request(&req(&[], &[], &r2.nonce), &s, Instant::now());
        assert!(!h.due, "the ACK alone sends nothing");
        // With the version it has: nothing.
        let mut again = req(&["b"], &[], "");
        again
            .initial_resource_versions
            .insert("b".into(), s.resource("b").unwrap().delta_version.clone());
        let h = st.on_request(&again, &s, Instant::now());
        assert!(!h.due);
        assert!(take(&mut st, &s).is_none());
    }

    #[test]
    fn one_response_awaits_its_ack_and_a_nack_is_reported() {
        let mut w = World::new();
        let s = w.snap(&[("a", 1)]);
        let mut st = DeltaStream::new(names(), &s);
        st.on_request(&req(&["a"], &[], ""), &s, Instant::now());
        let r = take(&mut st, &s).unwrap();
        let s2 = w.snap(&[("a", 2)]);
        st.on_snapshot(&s2, Instant::now());
        assert!(take(&mut st, &s2).is_none(), "waiting for the ACK");
        // A subscription change with an old nonce is taken, not an ACK.
        let h = st.on_request(&req(&["b"], &[], "0"), &s2, Instant::now());
        assert_eq!(h.kind, RequestKind::Stale);
        assert!(st.subscriptions().contains(name_hash("b")));
        let mut nack = req(&[], &[], &r.nonce);
        nack.error_detail = Some(RpcStatus {
            code: 3,
            message: "bad".into(),
            details: vec![],
        });
        let h = st.on_request(&nack, &s2, Instant::now());
        assert!(matches!(h.kind, RequestKind::Nack { .. }));
        assert!(h.due);
        let r = take(&mut st, &s2).unwrap();
        assert_eq!(got(&r), ["a=a@2"]);
        assert_eq!(r.removed_resources, ["b"], "b is not served (yet)");
    }

    #[test]
    fn what_a_stream_keeps_is_bounded_in_bytes_refused_whole_and_given_back() {
        use crate::limits::names as limit;
        let mut w = World::new();
        let s = w.snap(&[("a", 1)]);
        let now = Instant::now();
        let budget = Arc::new(RetainedBudget::new(8, 600, 500));
        let mut st = DeltaStream::new(names(), &s).retaining(budget.clone());
        // A name not served and longer than --max-name-bytes: refused.
        let h = st.on_request(&req(&["a", "ninebytes"], &[], ""), &s, now);
        assert_eq!(h.refused.unwrap().limit, limit::MAX_NAME_BYTES);
        assert!(st.subscriptions().is_empty(), "nothing of it is kept");
        assert_eq!(budget.total(), 0);
        // One served name (32 bytes) and two to answer removed (2 bytes
        // each, and their String).
        let kept = SUB_BYTES + 2 * (2 + NAME_OVERHEAD);
        let h = st.on_request(&req(&["a", "x1", "x2"], &[], ""), &s, now);
        assert!(h.refused.is_none());
        assert_eq!(st.retained(), kept);
        assert_eq!(budget.total(), kept);
        // 100 more names: over the stream's 600 bytes.
        let many: Vec<String> = (0..100).map(|i| format!("u{i:02}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let h = st.on_request(&req(&many, &[], ""), &s, now);
        assert_eq!(h.refused.unwrap().limit, limit::MAX_STREAM_RETAINED_BYTES);
        assert_eq!(st.retained(), kept, "refused whole");
        // Another stream, within its own 600 bytes, takes the total's 500.
        let mut other = DeltaStream::new(names(), &s).retaining(budget.clone());
        let h = other.on_request(&req(&many[..15], &[], ""), &s, now);
        assert!(h.refused.is_none());
        let h = other.on_request(&req(&many[15..16], &[], ""), &s, now);
        assert_eq!(h.refused.unwrap().limit, limit::MAX_RETAINED_BYTES);
        // A response answers the names removed: their bytes go back.
        let r = take(&mut st, &s).unwrap();
        assert_eq!(r.removed_resources, ["x1", "x2"]);
        assert_eq!(st.retained(), SUB_BYTES);
        // Unsubscribing gives back too; an ended stream gives back all.
        st.on_request(&req(&[], &["a"], &r.nonce), &s, now);
        assert_eq!(st.retained(), 0);
        drop(other);
        drop(st);
        assert_eq!(budget.total(), 0);
    }

    #[test]
    fn names_that_are_not_text_still_count() {
        let mut w = World::new();
        let s = w.snap(&[("a", 1)]);
        let budget = Arc::new(RetainedBudget::new(1024, 10 * NAME_OVERHEAD, usize::MAX));
        let mut st = DeltaStream::new(names(), &s).retaining(budget);
        let mut r = req(&[], &[], "");
        r.resource_names_subscribe = vec![Bytes::from_static(&[0xff]); 11];
        let h = st.on_request(&r, &s, Instant::now());
        assert!(
            h.refused.is_some(),
            "11 empty names are over 10 names' worth"
        );
    }

    #[test]
    fn other_type_urls_are_kept_cut() {
        let mut w = World::new();
        let s = w.snap(&[("a", 1)]);
        let mut st = DeltaStream::new(names(), &s);
        let mut r = req(&[], &[], "");
        r.type_url = "t".repeat(1 << 20);
        match st.on_request(&r, &s, Instant::now()).kind {
            RequestKind::OtherType(t) => assert_eq!(t.len(), TYPE_URL_KEPT),
            k => panic!("{k:?}"),
        }
    }
}
