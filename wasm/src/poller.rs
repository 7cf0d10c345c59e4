//! The root context's decisions, one per VM: who polls Envoy's admin API
//! (the lease, its TTL, what a change of leader resets), when a poll is due,
//! what is published (nothing when the bytes are already there; otherwise a
//! new version `<id>.<seq>`), and which published snapshot a worker takes.
//! Shared data is `SharedKeys`; the worker's table is reached through an
//! `install` callback. `proxy::root` only translates host events into these
//! calls and counts what they report.

use crate::codec::{self, DecodeError};
use crate::config::PluginConfig;
use crate::refresh::{AdminApi, Refresher, Start, ADMIN_SHARE_DIVISOR};
use crate::shared::{SharedData, SharedKeys};
use serving_picker_core::plan::ClusterPlan;
use std::time::Duration;

/// Ticks come several times per refresh interval so that followers pick up a
/// new snapshot soon after it is published (a tick costs one small shared-data
/// read), and a new poller starts its first refresh at once.
pub fn tick_period(refresh_interval_ms: u64) -> Duration {
    Duration::from_millis((refresh_interval_ms / 4).clamp(50, 250))
}

/// While requests wait for the first snapshot, ticks come this often so that
/// they leave soon after it is published.
pub const HOLD_TICK: Duration = Duration::from_millis(5);

/// How long a lease outlives its last renewal: three missed polls and one
/// admin call's timeout, so a leader busy with a slow admin answer keeps it.
pub fn lease_ttl_ms(config: &PluginConfig) -> u64 {
    config.refresh_interval_ms * 3 + config.admin_timeout_ms
}

/// An idle context's heartbeat counts as alive for four ticks.
pub fn idle_fresh_ms(config: &PluginConfig) -> u64 {
    tick_period(config.refresh_interval_ms).as_millis() as u64 * 4
}

/// Whether a worker's snapshot is stale: it has one, and no refresh
/// confirmed the published snapshot within `max_age_ms` (the admin API is
/// failing). A snapshot never confirmed yet (just published) is not.
pub fn stale(confirmed_ms: Option<u64>, now_ms: u64, max_age_ms: u64, has_table: bool) -> bool {
    has_table && confirmed_ms.is_some_and(|at| now_ms.saturating_sub(at) > max_age_ms)
}

/// One root context's poller: its part in the lease, the refresh it leads, what it published and
/// the snapshot its worker holds.
pub struct Poller {
    /// This context's id in the lease (random: unique across VMs; never 0).
    pub id: u32,
    /// The refresh this context runs while it leads.
    pub refresher: Refresher,
    seen_version: Option<Vec<u8>>,
    published: Option<Vec<u8>>,
    publish_seq: u64,
    leader: bool,
    /// When this leader last started a poll (a stats check or a full refresh).
    last_poll_ms: u64,
    stretch_logged: bool,
}

impl Poller {
    /// A poller with the lease id `id` (0 is taken as 1: 0 is nobody's).
    pub fn new(id: u32) -> Poller {
        Poller {
            id: id.max(1),
            refresher: Refresher::default(),
            seen_version: None,
            published: None,
            publish_seq: 0,
            leader: false,
            last_poll_ms: 0,
            stretch_logged: false,
        }
    }

    /// A new configuration: nothing seen, published or polled yet.
    pub fn reconfigured(&mut self) {
        self.seen_version = None;
        self.published = None;
        self.refresher = Refresher::default();
        self.last_poll_ms = 0;
    }

    /// This context holds the lease (it polls the admin API).
    pub fn leader(&self) -> bool {
        self.leader
    }

    /// The version of the snapshot this worker holds, if any.
    pub fn seen_version(&self) -> Option<&[u8]> {
        self.seen_version.as_deref()
    }

    /// Renews, takes or gives up the lease; on a change of leader forgets
    /// what this term published and compared, since another leader may have
    /// published since. `serving`: this VM serves requests (a worker's);
    /// such a VM leaves the lease to an idle one while one is alive.
    pub fn lease<S: SharedData>(
        &mut self,
        keys: &SharedKeys<S>,
        config: &PluginConfig,
        now_ms: u64,
        serving: bool,
    ) -> bool {
        let idle_alive = if serving {
            keys.idle_alive(now_ms, idle_fresh_ms(config))
        } else {
            keys.idle_heartbeat(now_ms);
            false
        };
        let leader = keys.hold_lease(self.id, now_ms, lease_ttl_ms(config), serving, idle_alive);
        if leader != self.leader {
            log::info!(
                "context {:08x} {} the admin poller{}",
                self.id,
                if leader { "is now" } else { "is no longer" },
                if !leader && serving && idle_alive {
                    " (it serves requests; an idle context takes over)"
                } else {
                    ""
                }
            );
            self.leader = leader;
            self.published = None;
            self.refresher = Refresher::default();
        }
        leader
    }

    /// Takes a newer published snapshot (followers, and a new leader); an
    /// unreadable one is logged and the current table kept.
    pub fn sync<S: SharedData>(
        &mut self,
        keys: &SharedKeys<S>,
        install: impl FnOnce(&[u8]) -> Result<(), DecodeError>,
    ) {
        let version = keys.version();
        if version.is_none() || version == self.seen_version {
            return;
        }
        let Some(bytes) = keys.snapshot() else { return };
        match install(&bytes) {
            Ok(()) => self.seen_version = version,
            Err(e) => log::error!("published snapshot unreadable, keeping ours: {e}"),
        }
    }

    /// Starts a poll when one is due (every `refresh_interval_ms`), or at
    /// once while there is no snapshot yet (unless the admin API fails).
    pub fn poll(
        &mut self,
        admin: &mut impl AdminApi,
        config: &PluginConfig,
        now_ms: u64,
        table_empty: bool,
    ) -> Start {
        let stretched = self.refresher.last_took_ms() * ADMIN_SHARE_DIVISOR;
        if stretched > config.refresh_interval_ms && !self.stretch_logged {
            self.stretch_logged = true;
            log::info!(
                "a refresh takes {} ms of admin time: full refreshes at most every {stretched} ms",
                self.refresher.last_took_ms(),
            );
        }
        let due = now_ms.saturating_sub(self.last_poll_ms) >= config.refresh_interval_ms;
        let first = table_empty && !self.refresher.failing();
        let start = self.refresher.poll(admin, config, now_ms, due || first);
        if matches!(start, Start::Started | Start::Failed) {
            self.last_poll_ms = now_ms;
        }
        start
    }

    /// The published snapshot with `plans` (a narrowed refresh's) spliced
    /// in. `None` when there is none to patch or it does not splice: then
    /// the next refresh reads everything.
    pub fn patched(&mut self, plans: &[ClusterPlan]) -> Option<Vec<u8>> {
        let spliced = self.published.as_deref().map(|p| codec::splice(p, plans));
        match spliced {
            Some(Ok(bytes)) => Some(bytes),
            // Not expected: a narrowed refresh follows a full one of this
            // term, whose snapshot is the one kept.
            _ => {
                log::error!(
                    "cannot patch the published snapshot; the next refresh reads everything"
                );
                self.refresher.forget_view();
                None
            }
        }
    }

    /// Publishes `bytes` unless they are what is published already (by this
    /// leader, or by any VM when this term has published nothing yet), and
    /// installs them when the worker has no table. `plans` (all of them, or a
    /// patch's) name what changed in the log. True when a new version went out.
    pub fn publish<S: SharedData>(
        &mut self,
        keys: &SharedKeys<S>,
        bytes: Vec<u8>,
        plans: &[ClusterPlan],
        table_empty: bool,
        install: impl FnOnce(&[u8]) -> Result<(), DecodeError>,
    ) -> bool {
        let unchanged = match &self.published {
            Some(last) => *last == bytes,
            None => keys.snapshot().as_ref() == Some(&bytes),
        };
        if unchanged {
            if table_empty {
                install_own(install, &bytes);
            }
            self.published = Some(bytes);
            return false;
        }
        self.publish_seq += 1;
        let version = format!("{}.{}", self.id, self.publish_seq).into_bytes();
        if let Err(e) = keys.publish(&bytes, &version) {
            log::error!("cannot publish the snapshot to shared data: {e:?}");
        }
        log::info!(
            "published snapshot {}: {}",
            String::from_utf8_lossy(&version),
            summary(plans)
        );
        self.seen_version = Some(version);
        install_own(install, &bytes);
        self.published = Some(bytes);
        true
    }
}

/// The leader's own snapshot, just encoded: it always reads back.
fn install_own(install: impl FnOnce(&[u8]) -> Result<(), DecodeError>, snapshot: &[u8]) {
    if let Err(e) = install(snapshot) {
        log::error!("own snapshot unreadable: {e}");
    }
}

/// One line per change: each cluster's tier and host count.
pub fn summary(plans: &[ClusterPlan]) -> String {
    const SHOWN: usize = 8;
    let mut line = String::new();
    for p in plans.iter().take(SHOWN) {
        line += &format!("{}={}x{} ", p.cluster, p.tier.name(), p.hosts.len());
    }
    if plans.len() > SHOWN {
        line += &format!("(+{} clusters)", plans.len() - SHOWN);
    }
    line
}

#[cfg(test)]
mod tests;
