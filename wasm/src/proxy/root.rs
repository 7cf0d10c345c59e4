//! The root context: translates configuration, ticks and admin answers into
//! `poller` calls, and counts what they report. A worker's requests are
//! steered in `http`; held ones are released here.

use super::admin::HostAdmin;
use super::http::{EnvoyRequest, PickerHttp};
use super::metrics::{DrainCounters, Metrics, RequestCounters};
use super::now_ms;
use super::shared_data::EnvoyShared;
use super::worker::Worker;
use crate::codec::{self, DecodeError};
use crate::config::{fingerprint, parse_config, salvage_override_header};
use crate::drain::StreamDrain;
use crate::poller::{self, tick_period, Poller};
use crate::refresh::{Outcome, Start};
use crate::shared::{SharedData, SharedKeys};
use crate::steer::{Held, Steering, Verdict};
use crate::table::RoutingTable;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType};
use std::cell::{Cell, RefCell};
use std::hash::Hasher;
use std::rc::Rc;

/// Steers every held request now (with a table) or answers each a 503
/// (`expired`), then restores the tick period.
fn release_held(worker: &Worker, expired: bool) {
    let held = worker.held.borrow_mut().take();
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
        if worker.steering.request(&mut EnvoyRequest, false) == Verdict::Continue {
            let _ = hostcalls::resume_http_request();
        }
    }
    let _ = hostcalls::set_effective_context(worker.root_context_id);
    let period = tick_period(worker.steering.config.refresh_interval_ms);
    let _ = hostcalls::set_tick_period(period);
}

/// Ends the streams whose drain deadline has come (a stream reset: the only end proxy-wasm
/// gives a response that has started) and counts them by protocol.
fn end_due_streams(worker: &Worker, now: u64) {
    let Some(drain) = &worker.drain else {
        return;
    };
    let due = drain.borrow().due(now);
    if !due.is_empty() {
        for (id, protocol) in due {
            // A stream whose context is gone has nothing to end.
            if hostcalls::set_effective_context(id).is_ok() && super::hostcalls::reset_response() {
                worker.drain_counters.ended[protocol.index()].inc();
            }
            drain.borrow_mut().close(id);
        }
        let _ = hostcalls::set_effective_context(worker.root_context_id);
    }
    worker
        .drain_counters
        .open_streams
        .set(drain.borrow().open_streams() as u64);
}

pub struct PickerRoot {
    /// Envoy's id for this root context.
    context_id: u32,
    /// Made an HTTP context: this is a worker's VM (the main thread's never does).
    served: Cell<bool>,
    worker: Option<Rc<Worker>>,
    keys: Option<SharedKeys<EnvoyShared>>,
    poller: Poller,
    /// When the current configuration arrived.
    configured_ms: u64,
}

fn random_id() -> u32 {
    // WASI's random source (std reads it for RandomState's keys; reading it
    // directly spares the module SipHash).
    let mut bytes = [0u8; 4];
    let random = super::hostcalls::random_bytes(&mut bytes);
    let mut h = rustc_hash::FxHasher::default();
    h.write_u64(super::now_us());
    if random {
        h.write(&bytes);
    }
    // Never 0: that is the released lease's holder.
    (h.finish() as u32).max(1)
}

/// Takes a snapshot into the worker's routing table, rebuilding only the
/// clusters whose part of it changed, and releases held requests.
fn install(worker: &Worker, snapshot: &[u8]) -> Result<(), DecodeError> {
    let steering = &worker.steering;
    let mut slot = steering.table.borrow_mut();
    let table = slot.get_or_insert_with(|| RoutingTable::new(steering.config.retry_alternates));
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
    steering.logged_unknown.borrow_mut().clear();
    if let Some(drain) = &worker.drain {
        let mut drain = drain.borrow_mut();
        drain.update(now_ms(), table.draining());
        let hosts = drain.draining_hosts();
        worker.drain_counters.draining_hosts.set(hosts as u64);
        if hosts > 0 {
            log::debug!("drain: {hosts} hosts drain; their streams end within drain_window_ms");
        }
    }
    drop(slot);
    release_held(worker, false);
    Ok(())
}

/// Sets the worker's snapshot aside while no refresh confirms it (the admin
/// API fails), and takes it back once one does (logged on each change).
/// The `snapshot.stale` gauge says either that, or that no snapshot came
/// within `max_snapshot_age_ms` of the configuration.
fn check_stale<S: SharedData>(
    worker: &Worker,
    keys: &SharedKeys<S>,
    now_ms: u64,
    configured_ms: u64,
) {
    let max_age_ms = worker.steering.config.max_snapshot_age_ms;
    let has_table = worker.steering.table.borrow().is_some();
    let stale = poller::stale(keys.confirmed(), now_ms, max_age_ms, has_table);
    let never = !has_table && now_ms.saturating_sub(configured_ms) > max_age_ms;
    worker.metrics.snapshot_stale.set(u64::from(stale || never));
    if !worker.steering.set_stale(stale) {
        return;
    }
    if stale {
        log::warn!(
            "no refresh has confirmed the snapshot for over {max_age_ms} ms (max_snapshot_age_ms: \
             the admin API fails): every request passes through to Envoy's load balancer until one does"
        );
    } else {
        log::info!("a refresh confirmed the snapshot again: steering resumes");
    }
}

impl PickerRoot {
    pub fn new(context_id: u32) -> PickerRoot {
        PickerRoot {
            context_id,
            served: Cell::new(false),
            worker: None,
            keys: None,
            poller: Poller::new(random_id()),
            configured_ms: 0,
        }
    }

    fn sync(&mut self) {
        let (Some(worker), Some(keys)) = (&self.worker, &self.keys) else {
            return;
        };
        self.poller.sync(keys, |bytes| install(worker, bytes));
    }

    /// A refresh succeeded: every VM's snapshot is current as of now.
    fn confirm(&self) {
        if let Some(keys) = &self.keys {
            keys.confirm(now_ms());
        }
    }

    fn publish(
        &mut self,
        worker: &Worker,
        bytes: Vec<u8>,
        plans: &[serving_picker_core::plan::ClusterPlan],
    ) {
        let Some(keys) = &self.keys else { return };
        let size = bytes.len() as u64;
        let table_empty = worker.steering.table.borrow().is_none();
        if self
            .poller
            .publish(keys, bytes, plans, table_empty, |b| install(worker, b))
        {
            worker.metrics.snapshot_published.inc();
            worker.metrics.snapshot_bytes.set(size);
        }
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
        let outcome = self.poller.refresher.on_response(
            &mut HostAdmin,
            &worker.steering.config,
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
                self.confirm();
                return;
            }
            Outcome::Unchanged(work) => (work, None),
            Outcome::Plans(plans, work) => {
                worker.metrics.admin_bytes.set(work.admin_bytes as u64);
                self.publish(&worker, codec::encode(&plans), &plans);
                (work, Some(plans.len()))
            }
            Outcome::Patch(plans, work) => {
                worker.metrics.admin_bytes.set(work.admin_bytes as u64);
                let Some(bytes) = self.poller.patched(&plans) else {
                    worker.metrics.refresh_error.inc();
                    return;
                };
                self.publish(&worker, bytes, &plans);
                (work, Some(plans.len()))
            }
        };
        worker.metrics.refresh_ok.inc();
        self.confirm();
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
    /// Names the build (version and commit) once per VM, when Envoy starts it.
    fn on_vm_start(&mut self, _vm_configuration_size: usize) -> bool {
        super::sync_log_level();
        log::info!(
            "wasm filter {} starts in this VM",
            serving_picker_core::build_identity!()
        );
        true
    }

    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        super::sync_log_level();
        // No configuration at all reads as empty: every default.
        let raw = super::hostcalls::buffer(BufferType::PluginConfiguration, usize::MAX)
            .unwrap_or_default();
        self.poller.reconfigured();
        self.configured_ms = now_ms();
        // Never `false`: Envoy would refuse the filter, and where the filter
        // comes by ECDS without a default (Istio) every route of the
        // listener would answer 500. A configuration that does not parse
        // makes the filter pass every request through instead.
        let mut config = match parse_config(&raw) {
            Ok(config) => config,
            Err(e) => {
                let header = salvage_override_header(&raw);
                // Only what this state has: no snapshot metrics, so that
                // nothing reads as a refresh that stopped.
                let metrics = Metrics::config_invalid();
                log::error!(
                    "invalid configuration, every request passes through to Envoy's load balancer \
                     (clients' {header} still removed) until a valid one arrives: {e}"
                );
                self.keys = None;
                self.worker = Some(Rc::new(Worker {
                    steering: Steering::config_invalid(header),
                    metrics,
                    counters: RequestCounters::define(),
                    held: RefCell::new(Held::default()),
                    root_context_id: self.context_id,
                    drain: None,
                    drain_counters: DrainCounters::default(),
                }));
                // Ticks only hand the request counters to Envoy.
                let interval_ms = crate::config::PluginConfig::default().refresh_interval_ms;
                if let Err(e) = hostcalls::set_tick_period(tick_period(interval_ms)) {
                    log::error!("cannot set the tick period: {e:?}; counters stay unreported");
                }
                return true;
            }
        };
        let metrics = Metrics::define();
        metrics.config_invalid.set(0);
        metrics.snapshot_stale.set(0);
        // Envoy 1.40 serves its Node (bootstrap `node`, `--service-zone`) as the
        // `xds.node` attribute, in root contexts too; the old `node` property is gone.
        let from =
            config.default_local_zone(super::hostcalls::property(b"xds\0node\0locality\0zone"));
        log::info!(
            "local zone \"{}\" from {from}",
            config.selection.local_zone.as_deref().unwrap_or_default()
        );
        self.keys = Some(SharedKeys::for_config(EnvoyShared, fingerprint(&raw)));
        let config_interval_ms = config.refresh_interval_ms;
        let drain = config
            .drain
            .map(|d| RefCell::new(StreamDrain::new(d.window_ms)));
        let drain_counters = match drain {
            Some(_) => DrainCounters::define(),
            None => DrainCounters::default(),
        };
        let worker = Rc::new(Worker {
            steering: Steering::new(Rc::new(config)),
            metrics,
            counters: RequestCounters::define(),
            held: RefCell::new(Held::default()),
            root_context_id: self.context_id,
            drain,
            drain_counters,
        });
        if let Err(e) = hostcalls::set_tick_period(tick_period(config_interval_ms)) {
            // No ticks, no refresh: nothing could release a held request or
            // confirm a snapshot, so every request passes through.
            log::error!("cannot set the tick period: {e:?}; every request passes through");
            worker.steering.set_stale(true);
        }
        self.worker = Some(worker);
        // Pick up a snapshot other workers already have, before the first tick.
        self.sync();
        true
    }

    fn on_tick(&mut self) {
        super::sync_log_level();
        let Some(worker) = self.worker.clone() else {
            return;
        };
        let config = &worker.steering.config;
        let now = now_ms();
        if worker.held.borrow().expired(now, config.admin_timeout_ms) {
            release_held(&worker, true);
        }
        end_due_streams(&worker, now);
        if worker.counters.flush(&worker.steering.counts) > 0 {
            // Requests came through this context: say whether they passed
            // through for a configuration that does not parse. (Envoy keeps
            // an earlier configuration's contexts alive and may reuse them,
            // so only traffic tells which configuration is in use.)
            worker.metrics.config_invalid.set(u64::from(
                worker.steering.bypass.get() == crate::steer::Bypass::ConfigInvalid,
            ));
        }
        // A configuration that does not parse has nothing to poll.
        let Some(keys) = &self.keys else {
            return;
        };
        // Refreshing on a worker would hold up its requests: while an idle
        // context (the main thread's) is alive, workers leave the lease to it.
        let leader = self.poller.lease(keys, config, now, self.served.get());
        self.sync();
        if let Some(keys) = &self.keys {
            check_stale(&worker, keys, now, self.configured_ms);
        }
        if !leader {
            return;
        }
        let table_empty = worker.steering.table.borrow().is_none();
        if let Start::Failed = self.poller.poll(&mut HostAdmin, config, now, table_empty) {
            worker.metrics.refresh_error.inc();
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
