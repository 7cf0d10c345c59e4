//! The resources one stream subscribes to, what it was last sent of each,
//! and which are due: the part of a stream's state both protocols (state
//! of the world and delta) share, built so that a change costs a stream
//! work in proportion to the change, not to what it subscribes to.
//!
//! - Names are kept by their key (`eds::publish::name_hash`), sorted: 16
//!   bytes a name, whether served now or not (a name that is not served yet
//!   is remembered: its Service may appear, and then it is sent).
//! - A snapshot names the resources it changed; each is looked up here
//!   (a binary search) and marked due when this stream is behind on it.
//! - What is due is a list of its own, so a response costs what it carries.
//! - A change that makes a resource due keeps its trigger time (the first
//!   one not yet sent), for the programming-latency histogram; a resource
//!   due because it was just subscribed has none.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::eds::snapshot::{Resource, Table};

/// The bit of `Sub::sent` that says the entry is due.
const DUE: u64 = 1 << 63;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sub {
    hash: u64,
    /// The version last sent (0: none), with [`DUE`] set while due.
    sent: u64,
}

impl Sub {
    fn version(&self) -> u64 {
        self.sent & !DUE
    }
    fn is_due(&self) -> bool {
        self.sent & DUE != 0
    }
}

/// A resource chosen for a response.
#[derive(Debug)]
pub struct Chosen {
    /// The resource at its newest version.
    pub resource: Arc<Resource>,
    /// When the change it carries happened (`None`: sent because it was
    /// subscribed, not because it changed).
    pub trigger: Option<SystemTime>,
}

/// One stream's subscriptions.
#[derive(Debug, Default)]
pub struct Subscriptions {
    subs: Vec<Sub>,
    /// Due entries: (name key, trigger in ns since the epoch, 0: none).
    due: Vec<(u64, u64)>,
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        .max(1)
}

fn time_of(n: u64) -> Option<SystemTime> {
    (n != 0).then(|| UNIX_EPOCH + Duration::from_nanos(n))
}

impl Subscriptions {
    /// Names subscribed.
    pub fn len(&self) -> usize {
        self.subs.len()
    }

    /// No name subscribed.
    pub fn is_empty(&self) -> bool {
        self.subs.is_empty()
    }

    /// The subscribed keys, ascending.
    pub fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.subs.iter().map(|s| s.hash)
    }

    /// True when something is due.
    pub fn any_due(&self) -> bool {
        !self.due.is_empty()
    }

    fn find(&self, hash: u64) -> Result<usize, usize> {
        self.subs.binary_search_by_key(&hash, |s| s.hash)
    }

    fn mark(&mut self, i: usize, trigger: u64) -> bool {
        let Some(s) = self.subs.get_mut(i) else {
            return false;
        };
        if s.is_due() {
            return false;
        }
        s.sent |= DUE;
        self.due.push((s.hash, trigger));
        true
    }

    /// Subscribes to exactly `keys` (sorted, unique): kept names keep what
    /// they were sent; new ones are due when served. Returns how many were
    /// added.
    pub fn set(&mut self, keys: &[u64], table: &Table) -> usize {
        let old = std::mem::take(&mut self.subs);
        let mut added = 0;
        let mut subs = Vec::with_capacity(keys.len());
        let mut o = old.iter().peekable();
        for &k in keys {
            while o.peek().is_some_and(|s| s.hash < k) {
                o.next();
            }
            match o.peek() {
                Some(s) if s.hash == k => subs.push(**s),
                _ => {
                    added += 1;
                    subs.push(Sub { hash: k, sent: 0 });
                }
            }
        }
        self.subs = subs;
        self.due.retain(|(h, _)| keys.binary_search(h).is_ok());
        self.recheck(table, false);
        added
    }

    /// Adds `keys` (delta subscribe; sorted, unique), in one merge with
    /// what is subscribed: O(n + k). `known`: what the client says it
    /// already has of some (a version the table's resource has now counts
    /// as sent). A key already subscribed is sent again unless `known`
    /// says the client has it: a client may have forgotten a resource it
    /// is still subscribed to (the xDS protocol, "Subscribing to
    /// Resources": the server must still provide it). Returns the keys
    /// that were not subscribed before.
    pub fn add(
        &mut self,
        keys: &[u64],
        table: &Table,
        known: impl Fn(u64, &Resource) -> bool,
    ) -> Vec<u64> {
        let mut fresh = Vec::new();
        if keys.is_empty() {
            return fresh;
        }
        let old = std::mem::take(&mut self.subs);
        let mut subs = Vec::with_capacity(old.len() + keys.len());
        let mut o = old.into_iter().peekable();
        for &k in keys {
            while let Some(s) = o.next_if(|s| s.hash < k) {
                subs.push(s);
            }
            let current = table.get(k);
            let sent = current
                .as_ref()
                .filter(|r| known(k, r))
                .map_or(0, |r| r.version);
            let mut sub = match o.next_if(|s| s.hash == k) {
                // Kept due if it was.
                Some(s) => Sub {
                    hash: k,
                    sent: sent | (s.sent & DUE),
                },
                None => {
                    fresh.push(k);
                    Sub { hash: k, sent }
                }
            };
            if current.is_some_and(|r| r.version != sent) && !sub.is_due() {
                sub.sent |= DUE;
                self.due.push((k, 0));
            }
            subs.push(sub);
        }
        subs.extend(o);
        self.subs = subs;
        fresh
    }

    /// Sets what entry `i` was last sent to `version`, keeping it due if
    /// it is.
    fn forget_sent(&mut self, i: usize, version: u64) {
        if let Some(s) = self.subs.get_mut(i) {
            s.sent = version | (s.sent & DUE);
        }
    }

    /// Marks every subscribed resource that is served due again, as never
    /// sent: the client may have lost track of which it holds (a state of
    /// the world client that re-added a watch). What was due keeps its
    /// trigger time; the rest carry none (not a change). Returns how many
    /// are due.
    pub fn resend_all(&mut self, table: &Table) -> usize {
        for i in 0..self.subs.len() {
            self.forget_sent(i, 0);
            let served = self
                .subs
                .get(i)
                .is_some_and(|s| table.get(s.hash).is_some());
            if served {
                self.mark(i, 0);
            }
        }
        self.due.len()
    }

    /// Removes `keys` (delta unsubscribe; any order, repeats allowed):
    /// O((n + d) log k), whatever the order of `keys`.
    pub fn remove(&mut self, keys: &[u64]) {
        if keys.is_empty() {
            return;
        }
        let mut gone = keys.to_vec();
        gone.sort_unstable();
        gone.dedup();
        self.subs.retain(|s| gone.binary_search(&s.hash).is_err());
        self.due.retain(|(h, _)| gone.binary_search(h).is_err());
    }

    /// Resources of a snapshot changed (`changed`, by key): those this
    /// stream subscribes to and is behind on become due (if they are not
    /// already), with their trigger time. Returns how many it is behind on.
    pub fn on_changed(&mut self, changed: &[u64], table: &Table) -> usize {
        let mut n = 0;
        for &h in changed {
            if let Ok(i) = self.find(h) {
                let Some(r) = table.get(h) else { continue };
                let behind = self.subs.get(i).is_some_and(|s| s.version() != r.version);
                if behind {
                    // A resource this stream never had is a change too (a
                    // Service that appeared); one it was due anyway (just
                    // subscribed) stays untimed.
                    self.mark(i, nanos(r.trigger));
                    n += 1;
                }
            }
        }
        n
    }

    /// Marks due every subscribed resource this stream is behind on (after
    /// a subscription change, or when snapshots were missed). `timed`:
    /// those it had an older version of carry their trigger time.
    pub fn recheck(&mut self, table: &Table, timed: bool) {
        for i in 0..self.subs.len() {
            let Some(s) = self.subs.get(i).copied() else {
                continue;
            };
            if s.is_due() {
                continue;
            }
            if let Some(r) = table.get(s.hash) {
                if r.version != s.version() {
                    let trigger = if timed && s.version() != 0 {
                        nanos(r.trigger)
                    } else {
                        0
                    };
                    self.mark(i, trigger);
                }
            }
        }
    }

    /// Takes due resources for a response, in the order they became due:
    /// `fits(resource)` says whether one more fits (it may refuse the first:
    /// then `oversized` gets it, marked sent). What does not fit stays due.
    pub fn take(
        &mut self,
        table: &Table,
        mut fits: impl FnMut(&Resource) -> Fit,
        oversized: &mut Vec<Arc<Resource>>,
    ) -> Vec<Chosen> {
        let mut chosen = Vec::new();
        let mut keep = Vec::new();
        let due = std::mem::take(&mut self.due);
        let mut full = false;
        for (h, trigger) in due {
            let Ok(i) = self.find(h) else { continue };
            let Some(r) = table.get(h) else {
                // Not served (any more): nothing to send.
                if let Some(s) = self.subs.get_mut(i) {
                    s.sent &= !DUE;
                }
                continue;
            };
            let Some(s) = self.subs.get_mut(i) else {
                continue;
            };
            if r.version == s.version() {
                s.sent &= !DUE;
                continue;
            }
            if full {
                keep.push((h, trigger));
                continue;
            }
            match fits(&r) {
                Fit::Yes => {
                    s.sent = r.version;
                    chosen.push(Chosen {
                        resource: r,
                        trigger: time_of(trigger),
                    });
                }
                Fit::Never => {
                    s.sent = r.version;
                    oversized.push(r);
                }
                Fit::NotNow => {
                    full = true;
                    keep.push((h, trigger));
                }
            }
        }
        self.due = keep;
        chosen
    }

    /// The version last sent of `hash` (0: none, or not subscribed).
    pub fn sent(&self, hash: u64) -> u64 {
        self.find(hash)
            .ok()
            .and_then(|i| self.subs.get(i))
            .map_or(0, Sub::version)
    }

    /// Whether `hash` is subscribed.
    pub fn contains(&self, hash: u64) -> bool {
        self.find(hash).is_ok()
    }
}

/// Whether one more resource fits in a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    /// In this response.
    Yes,
    /// Not in this response; in the next.
    NotNow,
    /// Alone over the limit: never.
    Never,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::eds::snapshot::{name_hash, Snapshot};
    use std::time::Instant;

    fn table(resources: &[(&str, u64)]) -> Arc<Table> {
        let s = Snapshot::empty();
        let t = s.table.clone();
        put(&t, resources);
        t
    }

    fn put(t: &Table, resources: &[(&str, u64)]) {
        for (name, v) in resources {
            t.put(
                &[Arc::new(Resource::new(
                    name,
                    *v,
                    name.as_bytes(),
                    0,
                    Instant::now(),
                ))],
                &[],
            );
        }
    }

    fn keys(names: &[&str]) -> Vec<u64> {
        let mut k: Vec<u64> = names.iter().map(|n| name_hash(n)).collect();
        k.sort_unstable();
        k.dedup();
        k
    }

    fn names(c: &[Chosen]) -> Vec<String> {
        let mut v: Vec<String> = c.iter().map(|c| c.resource.name.clone()).collect();
        v.sort();
        v
    }

    fn all(_: &Resource) -> Fit {
        Fit::Yes
    }

    #[test]
    fn a_change_marks_only_the_streams_behind_on_it_with_its_trigger() {
        let t = table(&[("a", 1), ("b", 2)]);
        let mut s = Subscriptions::default();
        assert_eq!(s.set(&keys(&["a", "b", "later"]), &t), 3);
        let first = s.take(&t, all, &mut vec![]);
        assert_eq!(names(&first), ["a", "b"]);
        assert!(
            first.iter().all(|c| c.trigger.is_none()),
            "subscribed, not changed"
        );
        assert!(!s.any_due());
        // b changes: due, timed.
        put(&t, &[("b", 5)]);
        assert_eq!(s.on_changed(&keys(&["b"]), &t), 1);
        assert_eq!(s.on_changed(&keys(&["b"]), &t), 1, "still behind");
        assert_eq!(s.due.len(), 1, "due once");
        // A change to something else is nothing to this stream.
        put(&t, &[("z", 9)]);
        assert_eq!(s.on_changed(&keys(&["z"]), &t), 0);
        let c = s.take(&t, all, &mut vec![]);
        assert_eq!(names(&c), ["b"]);
        assert!(c[0].trigger.is_some());
        // A name that was not served appears: sent, and timed.
        put(&t, &[("later", 11)]);
        assert_eq!(s.on_changed(&keys(&["later"]), &t), 1);
        let c = s.take(&t, all, &mut vec![]);
        assert_eq!(names(&c), ["later"]);
        assert!(c[0].trigger.is_some());
        assert_eq!(s.sent(name_hash("later")), 11);
    }

    #[test]
    fn what_does_not_fit_waits_and_what_never_fits_is_reported() {
        let t = table(&[("a", 1), ("b", 2), ("c", 3)]);
        let mut s = Subscriptions::default();
        s.set(&keys(&["a", "b", "c"]), &t);
        let mut n = 0;
        let one_at_a_time = |_: &Resource| {
            n += 1;
            if n == 1 {
                Fit::Yes
            } else {
                Fit::NotNow
            }
        };
        assert_eq!(s.take(&t, one_at_a_time, &mut vec![]).len(), 1);
        assert!(s.any_due());
        let mut big = vec![];
        let c = s.take(
            &t,
            |r: &Resource| if r.name == "b" { Fit::Never } else { Fit::Yes },
            &mut big,
        );
        assert_eq!(c.len() + big.len(), 2);
        assert!(!s.any_due());
        // Subscribing again to the same names sends nothing.
        assert_eq!(s.set(&keys(&["a", "b", "c"]), &t), 0);
        assert!(!s.any_due());
        // Dropped names are forgotten; added back, they are sent again.
        s.set(&keys(&["a"]), &t);
        s.set(&keys(&["a", "c"]), &t);
        assert_eq!(names(&s.take(&t, all, &mut vec![])), ["c"]);
    }

    #[test]
    fn resend_all_marks_every_served_name_once_keeping_pending_triggers() {
        let t = table(&[("a", 1), ("b", 2)]);
        let mut s = Subscriptions::default();
        s.set(&keys(&["a", "b", "later"]), &t);
        s.take(&t, all, &mut vec![]);
        put(&t, &[("b", 5)]);
        s.on_changed(&keys(&["b"]), &t);
        assert_eq!(s.resend_all(&t), 2, "a and b; later is not served");
        assert_eq!(s.resend_all(&t), 2, "due once each");
        let c = s.take(&t, all, &mut vec![]);
        assert_eq!(names(&c), ["a", "b"]);
        let timed: Vec<_> = c
            .iter()
            .filter(|c| c.trigger.is_some())
            .map(|c| c.resource.name.as_str())
            .collect();
        assert_eq!(timed, ["b"], "b's change keeps its trigger; a is untimed");
        assert!(!s.any_due());
    }

    #[test]
    fn delta_add_skips_what_the_client_has_and_remove_forgets() {
        let t = table(&[("a", 1), ("b", 2)]);
        let mut s = Subscriptions::default();
        let fresh = s.add(&keys(&["a", "b", "x"]), &t, |_, r| r.name == "a");
        assert_eq!(fresh.len(), 3);
        assert_eq!(names(&s.take(&t, all, &mut vec![])), ["b"]);
        assert!(s.add(&keys(&["a"]), &t, |_, _| false).is_empty());
        s.remove(&keys(&["b"]));
        assert!(!s.contains(name_hash("b")));
        put(&t, &[("b", 7)]);
        assert_eq!(s.on_changed(&keys(&["b"]), &t), 0);
        assert_eq!(s.len(), 2);
    }
}

/// The fast set operations against a naive model (a map and a set, one
/// key at a time), over any sequence of subscribes, unsubscribes, whole
/// sets, changes and takes.
#[cfg(test)]
mod model {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::eds::snapshot::{name_hash, Snapshot};
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};
    use std::time::Instant;

    /// Names drawn from a small universe, so that operations meet.
    const UNIVERSE: u8 = 24;

    #[derive(Clone, Debug)]
    enum Op {
        /// Delta subscribe; the client says it has the current version of `known`.
        Add(Vec<u8>, Vec<u8>),
        Remove(Vec<u8>),
        Set(Vec<u8>),
        /// New versions of these names published.
        Change(Vec<u8>),
        /// The transport takes everything due.
        Take,
        Resend,
    }

    fn names() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(0..UNIVERSE, 0..12)
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (names(), names()).prop_map(|(a, k)| Op::Add(a, k)),
            names().prop_map(Op::Remove),
            names().prop_map(Op::Set),
            names().prop_map(Op::Change),
            Just(Op::Take),
            Just(Op::Resend),
        ]
    }

    fn key(n: u8) -> u64 {
        name_hash(&format!("n{n}"))
    }

    fn sorted(ns: &[u8]) -> Vec<u64> {
        let mut k: Vec<u64> = ns.iter().map(|n| key(*n)).collect();
        k.sort_unstable();
        k.dedup();
        k
    }

    /// The naive model: what each subscribed key was sent, and what is due.
    #[derive(Default)]
    struct Naive {
        sent: BTreeMap<u64, u64>,
        due: BTreeSet<u64>,
    }

    impl Naive {
        fn behind(&self, k: u64, table: &Table) -> bool {
            table
                .get(k)
                .is_some_and(|r| self.sent.get(&k).is_some_and(|s| *s != r.version))
        }
    }

    proptest! {
        #[test]
        fn fast_subscriptions_match_the_naive_model(
            served in proptest::collection::vec(0..UNIVERSE, 0..16),
            ops in proptest::collection::vec(op(), 1..40),
        ) {
            let table = Snapshot::empty().table.clone();
            let mut version = 1u64;
            let publish = |table: &Table, ns: &[u8], version: &mut u64| {
                for n in ns {
                    *version += 1;
                    table.put(
                        &[Arc::new(Resource::new(&format!("n{n}"), *version, b"x", 0, Instant::now()))],
                        &[],
                    );
                }
            };
            publish(&table, &served, &mut version);
            let mut fast = Subscriptions::default();
            let mut naive = Naive::default();
            for op in ops {
                match op {
                    Op::Add(ns, known) => {
                        let keys = sorted(&ns);
                        let known = sorted(&known);
                        let fresh = fast.add(&keys, &table, |k, _| known.binary_search(&k).is_ok());
                        let mut want_fresh = Vec::new();
                        for k in &keys {
                            let sent = table
                                .get(*k)
                                .filter(|_| known.binary_search(k).is_ok())
                                .map_or(0, |r| r.version);
                            if naive.sent.insert(*k, sent).is_none() {
                                want_fresh.push(*k);
                            }
                            if naive.behind(*k, &table) {
                                naive.due.insert(*k);
                            }
                        }
                        prop_assert_eq!(fresh, want_fresh);
                    }
                    Op::Remove(ns) => {
                        // In the request's order, repeats included.
                        let keys: Vec<u64> = ns.iter().map(|n| key(*n)).collect();
                        fast.remove(&keys);
                        for k in &keys {
                            naive.sent.remove(k);
                            naive.due.remove(k);
                        }
                    }
                    Op::Set(ns) => {
                        let keys = sorted(&ns);
                        let added = fast.set(&keys, &table);
                        let mut sent = BTreeMap::new();
                        for k in &keys {
                            sent.insert(*k, naive.sent.get(k).copied().unwrap_or(0));
                        }
                        let kept = keys.iter().filter(|k| naive.sent.contains_key(k)).count();
                        prop_assert_eq!(added, keys.len() - kept);
                        naive.sent = sent;
                        naive.due.retain(|k| naive.sent.contains_key(k));
                        for k in &keys {
                            if naive.behind(*k, &table) {
                                naive.due.insert(*k);
                            }
                        }
                    }
                    Op::Change(ns) => {
                        publish(&table, &ns, &mut version);
                        let changed = sorted(&ns);
                        fast.on_changed(&changed, &table);
                        for k in &changed {
                            if naive.behind(*k, &table) {
                                naive.due.insert(*k);
                            }
                        }
                    }
                    Op::Resend => {
                        fast.resend_all(&table);
                        for (k, s) in naive.sent.iter_mut() {
                            *s = 0;
                            if table.get(*k).is_some() {
                                naive.due.insert(*k);
                            }
                        }
                    }
                    Op::Take => {
                        let chosen = fast.take(&table, |_| Fit::Yes, &mut vec![]);
                        let got: BTreeSet<u64> = chosen.iter().map(|c| c.resource.hash).collect();
                        prop_assert_eq!(got.len(), chosen.len(), "each resource once");
                        let mut want = BTreeSet::new();
                        for k in std::mem::take(&mut naive.due) {
                            if let Some(r) = table.get(k) {
                                if naive.sent.get(&k) != Some(&r.version) {
                                    naive.sent.insert(k, r.version);
                                    want.insert(k);
                                }
                            }
                        }
                        prop_assert_eq!(got, want);
                    }
                }
                // After every operation: the same keys, each sent the same
                // version, the same due.
                let keys: Vec<u64> = fast.keys().collect();
                let want: Vec<u64> = naive.sent.keys().copied().collect();
                prop_assert_eq!(&keys, &want);
                prop_assert!(keys.windows(2).all(|w| w[0] < w[1]), "sorted, unique");
                for (k, s) in &naive.sent {
                    prop_assert_eq!(fast.sent(*k), *s);
                }
                let due: BTreeSet<u64> = fast.due.iter().map(|(h, _)| *h).collect();
                prop_assert_eq!(due.len(), fast.due.len(), "due once each");
                let marked: BTreeSet<u64> = fast.subs.iter().filter(|s| s.is_due()).map(|s| s.hash).collect();
                prop_assert_eq!(&due, &marked, "the due list and the due bits agree");
                prop_assert_eq!(&due, &naive.due);
            }
        }
    }
}
