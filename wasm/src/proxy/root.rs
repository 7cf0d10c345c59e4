//! The root context: configuration, leader election, snapshot sync.

use super::admin::HostAdmin;
use super::http::{PickerHttp, Steer};
use super::metrics::{Metrics, RequestCounters};
use super::now_ms;
use super::shared::SharedKeys;
use super::worker::Worker;
use crate::codec::{self, DecodeError};
use crate::config::{fingerprint, parse_config, PluginConfig};
use crate::refresh::{Outcome, Refresher, Start, ADMIN_SHARE_DIVISOR};
use crate::table::RoutingTable;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType};
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::hash::Hasher;
use std::rc::Rc;
use std::time::Duration;

/// Steers every held request now (with a table) or answers each a 503
/// (`expired`), then restores the tick period.
fn release_held(worker: &Worker, expired: bool) {
    let held = std::mem::take(&mut *worker.held.borrow_mut());
    if held.is_empty() {
        return;
    }
    if expired {
        log::warn!("no snapshot within admin_timeout_ms: held requests get 503 no-snapshot-yet");
    }
    for id in held {
        // A request whose client left is gone: nothing to resume.
        if hostcalls::set_effective_context(id).is_err() {
            continue;
        }
        let steer = Steer {
            worker,
            context_id: None,
        };
        if steer.request() == Action::Continue {
            let _ = hostcalls::resume_http_request();
        }
    }
    let _ = hostcalls::set_effective_context(worker.root_context_id);
    let _ = hostcalls::set_tick_period(tick_period(worker.config.refresh_interval_ms));
}

pub struct PickerRoot {
    /// Envoy's id for this root context.
    context_id: u32,
    /// This context's id in the lease (random: unique across VMs).
    id: u32,
    /// Made an HTTP context: this is a worker's VM (the main thread's never does).
    served: Cell<bool>,
    worker: Option<Rc<Worker>>,
    keys: Option<SharedKeys>,
    refresher: Refresher,
    seen_version: Option<Vec<u8>>,
    published: Option<Vec<u8>>,
    publish_seq: u64,
    leader: bool,
    /// When this leader last started a poll (a stats check or a full refresh).
    last_poll_ms: u64,
    stretch_logged: bool,
}

/// Ticks come several times per refresh interval so that followers pick up a
/// new snapshot soon after it is published (a tick costs one small shared-data
/// read), and a new poller starts its first refresh at once.
fn tick_period(refresh_interval_ms: u64) -> Duration {
    Duration::from_millis((refresh_interval_ms / 4).clamp(50, 250))
}

fn random_id() -> u32 {
    // WASI's random source (std reads it for RandomState's keys; reading it
    // directly spares the module SipHash).
    let mut bytes = [0u8; 4];
    let random = super::host::random_bytes(&mut bytes);
    let mut h = rustc_hash::FxHasher::default();
    h.write_u64(super::now_us());
    if random {
        h.write(&bytes);
    }
    // Never 0: that is the released lease's holder.
    (h.finish() as u32).max(1)
}

impl PickerRoot {
    pub fn new(context_id: u32) -> PickerRoot {
        PickerRoot {
            context_id,
            id: random_id(),
            served: Cell::new(false),
            worker: None,
            keys: None,
            refresher: Refresher::default(),
            seen_version: None,
            published: None,
            publish_seq: 0,
            leader: false,
            last_poll_ms: 0,
            stretch_logged: false,
        }
    }

    /// Takes a published snapshot into this worker's routing table,
    /// rebuilding only the clusters whose part of it changed.
    fn install(&self, snapshot: &[u8]) -> Result<(), DecodeError> {
        let Some(worker) = &self.worker else {
            return Ok(());
        };
        let mut slot = worker.table.borrow_mut();
        let table = slot.get_or_insert_with(|| RoutingTable::new(worker.config.retry_alternates));
        let rebuild = table.update(snapshot)?;
        log::debug!(
            "routing table: {} clusters rebuilt, {} kept",
            rebuild.built,
            rebuild.kept
        );
        worker
            .metrics
            .snapshot_clusters
            .set(table.cluster_count() as u64);
        worker.metrics.snapshot_hosts.set(table.host_count() as u64);
        worker.logged_unknown.borrow_mut().clear();
        drop(slot);
        release_held(worker, false);
        Ok(())
    }

    /// Followers (and a new leader) pick up a newer published snapshot.
    fn sync(&mut self) {
        let Some(keys) = &self.keys else { return };
        let version = keys.version();
        if version.is_none() || version == self.seen_version {
            return;
        }
        let Some(bytes) = keys.snapshot() else { return };
        match self.install(&bytes) {
            Ok(()) => self.seen_version = version,
            Err(e) => {
                log::error!("published snapshot unreadable, keeping ours: {e}")
            }
        }
    }

    /// Publishes `bytes` unless they are what is published already; `plans`
    /// (all of them, or a patch's) name what changed in the log.
    fn publish(&mut self, bytes: Vec<u8>, plans: &[crate::plan::ClusterPlan]) {
        let Some(worker) = self.worker.clone() else {
            return;
        };
        let unchanged = match &self.published {
            Some(last) => *last == bytes,
            None => self.keys.as_ref().and_then(|k| k.snapshot()).as_ref() == Some(&bytes),
        };
        if unchanged {
            if worker.table.borrow().is_none() {
                self.install_own(&bytes);
            }
            self.published = Some(bytes);
            return;
        }
        self.publish_seq += 1;
        let version = format!("{}.{}", self.id, self.publish_seq).into_bytes();
        if let Some(keys) = &self.keys {
            if let Err(e) = keys.publish(&bytes, &version) {
                log::error!("cannot publish the snapshot to shared data: {e:?}");
            }
        }
        worker.metrics.snapshot_published.inc();
        worker.metrics.snapshot_bytes.set(bytes.len() as u64);
        log::info!(
            "published snapshot {}: {}",
            String::from_utf8_lossy(&version),
            summary(plans)
        );
        self.seen_version = Some(version);
        self.install_own(&bytes);
        self.published = Some(bytes);
    }

    /// The leader's own snapshot, just encoded: it always reads back.
    fn install_own(&self, snapshot: &[u8]) {
        if let Err(e) = self.install(snapshot) {
            log::error!("own snapshot unreadable: {e}");
        }
    }
}

/// One line per change: each cluster's tier and host count.
fn summary(plans: &[crate::plan::ClusterPlan]) -> String {
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

impl PickerRoot {
    /// A poll (the change gate's stats) is due every `refresh_interval_ms`;
    /// the refresher spaces the full refreshes it may lead to.
    fn poll_due(&mut self, config: &PluginConfig, now: u64) -> bool {
        let stretched = self.refresher.last_took_ms() * ADMIN_SHARE_DIVISOR;
        if stretched > config.refresh_interval_ms && !self.stretch_logged {
            self.stretch_logged = true;
            log::info!(
                "a refresh takes {} ms of admin time: full refreshes at most every {stretched} ms",
                self.refresher.last_took_ms(),
            );
        }
        now.saturating_sub(self.last_poll_ms) >= config.refresh_interval_ms
    }
}

impl Context for PickerRoot {
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let Some(worker) = self.worker.clone() else {
            return;
        };
        let clock_us = super::now_us();
        let outcome = self.refresher.on_response(
            &mut HostAdmin,
            &worker.config,
            token,
            num_headers,
            body_size,
            now_ms(),
            clock_us,
        );
        let (work, clusters) = match outcome {
            Outcome::Nothing => return,
            Outcome::Failed => {
                worker.metrics.refresh_error.inc();
                return;
            }
            Outcome::Skipped => {
                // The snapshot is confirmed current: a successful poll too.
                worker.metrics.refresh_ok.inc();
                worker.metrics.refresh_skipped_unchanged.inc();
                return;
            }
            Outcome::Unchanged(work) => (work, None),
            Outcome::Plans(plans, work) => {
                worker.metrics.admin_bytes.set(work.admin_bytes as u64);
                self.publish(codec::encode(&plans), &plans);
                (work, Some(plans.len()))
            }
            Outcome::Patch(plans, work) => {
                worker.metrics.admin_bytes.set(work.admin_bytes as u64);
                let spliced = self.published.as_deref().map(|p| codec::splice(p, &plans));
                match spliced {
                    Some(Ok(bytes)) => self.publish(bytes, &plans),
                    // Not expected: a narrowed refresh follows a full one of
                    // this term, whose snapshot is the one kept.
                    _ => {
                        log::error!("cannot patch the published snapshot; the next refresh reads everything");
                        self.refresher.forget_view();
                        worker.metrics.refresh_error.inc();
                        return;
                    }
                }
                (work, Some(plans.len()))
            }
        };
        worker.metrics.refresh_ok.inc();
        if work.narrowed_to.is_some() {
            worker.metrics.refresh_narrowed.inc();
        }
        // Everything this refresh did in the VM, publishing included.
        let busy_us = work.earlier_busy_us + super::now_us().saturating_sub(clock_us);
        worker.metrics.refresh_busy_us.set(busy_us);
        if let Some(clusters) = clusters {
            log::debug!(
                "refresh: {clusters} clusters, {} admin bytes, {busy_us} us in the VM, {} ms end to end{}",
                work.admin_bytes,
                work.took_ms,
                work.narrowed_to
                    .map_or(String::new(), |n| format!(", narrowed to {n} changed clusters"))
            );
        }
    }
}

impl RootContext for PickerRoot {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        super::sync_log_level();
        // No configuration at all reads as empty: every default.
        let raw =
            super::host::buffer(BufferType::PluginConfiguration, usize::MAX).unwrap_or_default();
        let mut config = match parse_config(&raw) {
            Ok(config) => config,
            Err(e) => {
                log::error!("rejecting configuration: {e}");
                return false;
            }
        };
        // Envoy 1.40 serves its Node (bootstrap `node`, `--service-zone`) as the
        // `xds.node` attribute, in root contexts too; the old `node` property is gone.
        let from = config.default_local_zone(super::host::property(b"xds\0node\0locality\0zone"));
        log::info!(
            "local zone \"{}\" from {from}",
            config.selection.local_zone.as_deref().unwrap_or_default()
        );
        self.keys = Some(SharedKeys::for_config(fingerprint(&raw)));
        let config_interval_ms = config.refresh_interval_ms;
        self.worker = Some(Rc::new(Worker {
            config: Rc::new(config),
            metrics: Metrics::define(),
            counters: RequestCounters::define(),
            table: RefCell::new(None),
            logged_unknown: RefCell::new(HashSet::default()),
            held: RefCell::new(Vec::new()),
            held_since_ms: Cell::new(0),
            root_context_id: self.context_id,
        }));
        self.seen_version = None;
        self.published = None;
        self.refresher = Refresher::default();
        self.last_poll_ms = 0;
        if let Err(e) = hostcalls::set_tick_period(tick_period(config_interval_ms)) {
            log::error!("cannot set the tick period: {e:?}");
            return false;
        }
        // Pick up a snapshot other workers already have, before the first tick.
        self.sync();
        true
    }

    fn on_tick(&mut self) {
        super::sync_log_level();
        let (Some(worker), Some(keys)) = (self.worker.clone(), &self.keys) else {
            return;
        };
        let config = &worker.config;
        let now = now_ms();
        if !worker.held.borrow().is_empty()
            && now.saturating_sub(worker.held_since_ms.get()) >= config.admin_timeout_ms
        {
            release_held(&worker, true);
        }
        worker.counters.flush();
        let ttl = config.refresh_interval_ms * 3 + config.admin_timeout_ms;
        // Refreshing on a worker would hold up its requests: while an idle
        // context (the main thread's) is alive, workers leave the lease to it.
        let serving = self.served.get();
        let idle_alive = if serving {
            let fresh = tick_period(config.refresh_interval_ms).as_millis() as u64 * 4;
            keys.idle_alive(now, fresh)
        } else {
            keys.idle_heartbeat(now);
            false
        };
        let leader = keys.hold_lease(self.id, now, ttl, serving, idle_alive);
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
            // Compare against nothing of an earlier term: another leader may have published since.
            self.refresher = Refresher::default();
        }
        self.sync();
        if !leader {
            return;
        }
        // Poll every interval; without a snapshot yet, at once (unless failing).
        let due = self.poll_due(config, now);
        let first = worker.table.borrow().is_none() && !self.refresher.failing();
        match self
            .refresher
            .poll(&mut HostAdmin, config, now, due || first)
        {
            Start::Started => self.last_poll_ms = now,
            Start::Failed => {
                self.last_poll_ms = now;
                worker.metrics.refresh_error.inc();
            }
            Start::Busy | Start::NotDue => {}
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        self.served.set(true);
        let worker = self.worker.clone()?;
        Some(Box::new(PickerHttp::new(worker, context_id)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
