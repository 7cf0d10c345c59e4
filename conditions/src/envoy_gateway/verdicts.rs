//! The verdicts PostEndpointsModify leaves for PostTranslateModify, bound
//! to the translation they came from.
//!
//! **The rule.** A verdict counts only for the next PostTranslateModify on
//! the same gRPC connection, which takes every verdict the connection
//! recorded since its last PostTranslateModify, and drops them. A cluster
//! without a verdict in that batch keeps Envoy Gateway's policy: a missing
//! call means "no".
//!
//! **Why it is exact for Envoy Gateway.** One EG process holds one gRPC
//! connection to the extension server: its extension manager dials once
//! and caches the `ClientConn` for every hook (`extensionConnCache`,
//! envoyproxy/gateway@v1.9.0
//! `internal/extension/registry/extension_manager.go`, the same at v1.8.3).
//! Its translations run one after another: the xDS runner handles IR
//! updates in one loop (`message.HandleSubscription`,
//! `internal/message/watchutil.go`, called from `internal/xds/runner/runner.go`),
//! and each `Translate` calls PostEndpointsModify once per EDS assignment,
//! in turn, then PostTranslateModify once at the end, whatever failed
//! before it (translation is best-effort: errors are collected, the hook
//! still runs; `internal/xds/translator/translator.go`). So the calls on
//! one connection since its last PostTranslateModify are exactly this
//! translation's. Two EG replicas (both run the translator) are two
//! connections: each gets its own verdicts. A connection that breaks
//! between the hooks takes its verdicts with it: EG's PostTranslateModify
//! arrives on a new connection (or on a restarted companion) that has none,
//! and every cluster keeps EG's policy.
//!
//! **What it cannot tell apart.** Verdicts carry no translation id. Should
//! two translations interleave on one connection (not what EG does), the
//! first PostTranslateModify takes both batches; the second finds none
//! ("no" for all of its clusters); a cluster asked about twice in one batch
//! counts as "no" unless both answers were yes. An EG translation that
//! panics between the hooks (EG recovers it: `handleWithCrashRecovery`)
//! leaves its verdicts to the next translation on that connection, which
//! asks again about every assignment it has and overwrites them; only a
//! call of that next translation that never reaches the handler (refused
//! by the gRPC layer) would leave the older verdict standing.
//!
//! **Bounds.** A verdict is recorded only for a call the hook admitted; a
//! cluster name longer than [`MAX_KEY_BYTES`] gets none (counted). The
//! table holds at most `max_verdicts` verdicts (`--native-lb-max-clusters`)
//! and `max_bytes` bytes (`--native-lb-max-verdict-bytes`) over all
//! connections; a verdict over either is not recorded (its cluster keeps
//! EG's policy, counted). The batches of closed connections are dropped
//! when the table needs room, and at every PostTranslateModify.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};

use crate::net::listener::Conn;

/// Cluster names longer than this get no verdict (EG's are a route's kind,
/// namespace, name and rule: well under it).
pub const MAX_KEY_BYTES: usize = 1024;
/// Bytes a verdict costs besides its name: the map slot, the string's
/// header, the flag.
pub const ENTRY_OVERHEAD_BYTES: usize = 64;
/// Default of `--native-lb-max-verdict-bytes`.
pub const DEFAULT_MAX_BYTES: usize = 16 << 20;

/// The connection a hook call came on.
#[derive(Clone, Debug)]
pub struct ConnKey {
    key: Key,
    /// The listener's record of the connection, when the listener keeps
    /// one: the batch is dropped once it is gone.
    conn: Option<Weak<Conn>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    /// The listener's connection number (unique for the process).
    Id(u64),
    /// The peer's address, for a server without the listener's records.
    Peer(SocketAddr),
    /// A call made in process (tests, benchmarks).
    Local,
}

impl ConnKey {
    /// A connection the listener accepted.
    pub fn conn(conn: &Arc<Conn>) -> ConnKey {
        ConnKey {
            key: Key::Id(conn.id()),
            conn: Some(Arc::downgrade(conn)),
        }
    }

    /// A connection known by its peer address only.
    pub fn peer(addr: SocketAddr) -> ConnKey {
        ConnKey {
            key: Key::Peer(addr),
            conn: None,
        }
    }

    /// Calls made in process, without a connection.
    pub fn local() -> ConnKey {
        ConnKey {
            key: Key::Local,
            conn: None,
        }
    }

    fn closed(conn: &Option<Weak<Conn>>) -> bool {
        conn.as_ref()
            .is_some_and(|w| w.upgrade().is_none_or(|c| c.is_closed()))
    }
}

/// What became of a verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// Kept for the connection's next PostTranslateModify.
    Kept,
    /// The cluster name is longer than [`MAX_KEY_BYTES`].
    KeyTooLong,
    /// The table is full (`--native-lb-max-clusters` or
    /// `--native-lb-max-verdict-bytes`).
    Full,
}

#[derive(Debug, Default)]
struct Batch {
    conn: Option<Weak<Conn>>,
    verdicts: HashMap<String, bool>,
    bytes: usize,
}

#[derive(Debug, Default)]
struct Table {
    batches: HashMap<Key, Batch>,
    count: usize,
    bytes: usize,
}

impl Table {
    fn drop_batch(&mut self, key: &Key) -> Option<Batch> {
        let b = self.batches.remove(key)?;
        self.count -= b.verdicts.len();
        self.bytes -= b.bytes;
        Some(b)
    }

    fn drop_closed(&mut self) {
        let closed: Vec<Key> = self
            .batches
            .iter()
            .filter(|(_, b)| ConnKey::closed(&b.conn))
            .map(|(k, _)| *k)
            .collect();
        for k in closed {
            self.drop_batch(&k);
        }
    }
}

/// The verdicts of every connection, bounded in count and bytes.
#[derive(Debug)]
pub struct Verdicts {
    table: Mutex<Table>,
    max_verdicts: usize,
    max_bytes: usize,
}

/// The verdicts one PostTranslateModify takes, by assignment name.
#[derive(Debug, Default)]
pub struct Taken {
    verdicts: HashMap<String, bool>,
}

impl Taken {
    /// The verdict of `cluster` in this batch, if any.
    pub fn get(&self, cluster: &str) -> Option<bool> {
        self.verdicts.get(cluster).copied()
    }

    /// How many verdicts it holds.
    pub fn len(&self) -> usize {
        self.verdicts.len()
    }

    /// It holds none.
    pub fn is_empty(&self) -> bool {
        self.verdicts.is_empty()
    }
}

fn cost(name: &str) -> usize {
    name.len() + ENTRY_OVERHEAD_BYTES
}

impl Verdicts {
    /// At most `max_verdicts` verdicts of at most `max_bytes` bytes in all.
    pub fn new(max_verdicts: usize, max_bytes: usize) -> Verdicts {
        Verdicts {
            table: Mutex::new(Table::default()),
            max_verdicts,
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the verdict of `cluster` for `conn`'s next
    /// PostTranslateModify. A cluster asked about twice in one batch stays
    /// eligible only if both answers were.
    pub fn record(&self, conn: &ConnKey, cluster: &str, eligible: bool) -> Recorded {
        if cluster.len() > MAX_KEY_BYTES {
            return Recorded::KeyTooLong;
        }
        let mut t = self.lock();
        if let Some(v) = t
            .batches
            .get_mut(&conn.key)
            .and_then(|b| b.verdicts.get_mut(cluster))
        {
            *v = *v && eligible;
            return Recorded::Kept;
        }
        let c = cost(cluster);
        let fits = |t: &Table| t.count < self.max_verdicts && t.bytes + c <= self.max_bytes;
        if !fits(&t) {
            t.drop_closed();
            if !fits(&t) {
                return Recorded::Full;
            }
        }
        let b = t.batches.entry(conn.key).or_insert_with(|| Batch {
            conn: conn.conn.clone(),
            ..Batch::default()
        });
        b.verdicts.insert(cluster.to_string(), eligible);
        b.bytes += c;
        t.count += 1;
        t.bytes += c;
        Recorded::Kept
    }

    /// A call about `cluster` on `conn` was not admitted: a verdict of the
    /// same batch for it turns to "no" (nothing new is kept).
    pub fn revoke(&self, conn: &ConnKey, cluster: &str) {
        let mut t = self.lock();
        if let Some(v) = t
            .batches
            .get_mut(&conn.key)
            .and_then(|b| b.verdicts.get_mut(cluster))
        {
            *v = false;
        }
    }

    /// Takes every verdict `conn` recorded since its last call of this
    /// (for its PostTranslateModify); drops those of closed connections.
    pub fn take(&self, conn: &ConnKey) -> Taken {
        let mut t = self.lock();
        let b = t.drop_batch(&conn.key);
        t.drop_closed();
        Taken {
            verdicts: b.map(|b| b.verdicts).unwrap_or_default(),
        }
    }

    /// Verdicts held, over all connections.
    pub fn len(&self) -> usize {
        self.lock().count
    }

    /// None is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the verdicts held count for (names plus
    /// [`ENTRY_OVERHEAD_BYTES`] each).
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Connections with verdicts waiting for their PostTranslateModify.
    pub fn connections(&self) -> usize {
        self.lock().batches.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn peer(port: u16) -> ConnKey {
        ConnKey::peer(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    #[test]
    fn a_verdict_counts_once_for_its_own_connection() {
        let v = Verdicts::new(100, 1 << 20);
        let (a, b) = (peer(1), peer(2));
        assert_eq!(v.record(&a, "c", true), Recorded::Kept);
        assert_eq!(v.record(&b, "c", false), Recorded::Kept);
        assert_eq!(v.record(&b, "d", true), Recorded::Kept);
        assert_eq!(v.connections(), 2);
        let got = v.take(&a);
        assert_eq!((got.get("c"), got.get("d")), (Some(true), None));
        // Consumed: the next translation on `a` starts from nothing.
        assert!(v.take(&a).is_empty());
        let got = v.take(&b);
        assert_eq!((got.get("c"), got.get("d")), (Some(false), Some(true)));
        assert!(v.is_empty());
        assert_eq!(v.bytes(), 0);
    }

    #[test]
    fn a_missing_call_is_no_and_a_refused_one_turns_an_older_yes_to_no() {
        let v = Verdicts::new(100, 1 << 20);
        let a = peer(1);
        // Translation 1 asks about c (yes) and takes it.
        v.record(&a, "c", true);
        assert_eq!(v.take(&a).get("c"), Some(true));
        // Translation 2's call about c never reaches the handler.
        assert_eq!(v.take(&a).get("c"), None);
        // Two answers in one batch: yes only if both were.
        v.record(&a, "c", true);
        v.record(&a, "c", false);
        v.record(&a, "d", true);
        v.revoke(&a, "d");
        v.revoke(&a, "never-recorded");
        let got = v.take(&a);
        assert_eq!((got.get("c"), got.get("d")), (Some(false), Some(false)));
        assert_eq!(got.get("never-recorded"), None);
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn bounded_in_count_bytes_and_key_length() {
        let long = "x".repeat(MAX_KEY_BYTES + 1);
        let v = Verdicts::new(2, 1 << 20);
        let a = peer(1);
        assert_eq!(v.record(&a, &long, true), Recorded::KeyTooLong);
        assert_eq!(
            v.record(&a, &"y".repeat(MAX_KEY_BYTES), true),
            Recorded::Kept
        );
        assert_eq!(v.record(&peer(2), "b", true), Recorded::Kept);
        assert_eq!(v.record(&peer(3), "c", true), Recorded::Full);
        // A known name is updated even when full.
        assert_eq!(v.record(&peer(2), "b", false), Recorded::Kept);
        assert_eq!(v.len(), 2);
        assert_eq!(v.bytes(), MAX_KEY_BYTES + 1 + 2 * ENTRY_OVERHEAD_BYTES);
        v.take(&a);
        assert_eq!(v.record(&peer(3), "c", true), Recorded::Kept);

        let by_bytes = Verdicts::new(100, 2 * (10 + ENTRY_OVERHEAD_BYTES));
        assert_eq!(by_bytes.record(&a, &"a".repeat(10), true), Recorded::Kept);
        assert_eq!(by_bytes.record(&a, &"b".repeat(10), true), Recorded::Kept);
        assert_eq!(by_bytes.record(&a, "c", true), Recorded::Full);
        assert_eq!(by_bytes.bytes(), 2 * (10 + ENTRY_OVERHEAD_BYTES));
    }

    #[test]
    fn a_closed_connection_s_verdicts_go() {
        let v = Verdicts::new(10, 1 << 20);
        let open = Arc::new(Conn::new(SocketAddr::from(([127, 0, 0, 1], 1)), 1));
        let gone = Arc::new(Conn::new(SocketAddr::from(([127, 0, 0, 1], 2)), 2));
        let closed = Arc::new(Conn::new(SocketAddr::from(([127, 0, 0, 1], 3)), 3));
        for c in [&open, &gone, &closed] {
            v.record(&ConnKey::conn(c), "c", true);
        }
        drop(gone);
        closed.close();
        assert_eq!(v.connections(), 3);
        assert!(v.take(&peer(9)).is_empty());
        assert_eq!(v.connections(), 1);
        assert_eq!(v.take(&ConnKey::conn(&open)).get("c"), Some(true));
        // A new connection of the same peer address is another connection.
        let again = Arc::new(Conn::new(SocketAddr::from(([127, 0, 0, 1], 1)), 4));
        v.record(&ConnKey::conn(&open), "d", true);
        assert_eq!(v.take(&ConnKey::conn(&again)).get("d"), None);
    }

    #[test]
    fn a_local_caller_is_one_connection() {
        let v = Verdicts::new(10, 1 << 20);
        v.record(&ConnKey::local(), "c", true);
        assert_eq!(v.take(&peer(1)).get("c"), None);
        assert_eq!(v.take(&ConnKey::local()).get("c"), Some(true));
    }
}
