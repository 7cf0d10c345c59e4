//! The hooks Envoy calls (`envoy_dynamic_module_on_*`). Each checks its
//! pointers, catches any panic (the release profile unwinds; a panic across
//! `extern "C"` would abort Envoy) and calls plain Rust: `config::parse`,
//! `table::build`, `Table::choose`.
//!
//! Threading (checked on Envoy 1.40): config new/destroy run on the main
//! thread; each cluster has one LB instance per worker plus one on the main
//! thread, and each instance's hooks run on its own thread only. An
//! instance's state is therefore in `RefCell`s, not locks.

use std::cell::RefCell;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serving_picker_core::plan::{Tier, Topology};

use crate::abi::{self, ConfigHandle, Context, EnvoyBuffer, Lb};
use crate::config::{self, NativeConfig, POLICY_NAME};
use crate::metrics::{Metric, NotOffered};
use crate::table::{self, Choice, Coarse, HostSource, Table};

/// The ABI version Envoy 1.40 expects (a mismatch is only a warning there).
static ABI_VERSION: &[u8] = b"v0.2.0\0";

/// Runs `f`, or logs the panic and returns `fallback`.
fn guarded<T>(hook: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            // Logging itself must not panic again: `log` only formats a &str.
            let _ = catch_unwind(|| {
                abi::log(
                    abi::LOG_ERROR,
                    &format!("serving_picker: internal error (panic) in {hook}; answered safely"),
                )
            });
            fallback
        }
    }
}

/// One policy configuration (one per cluster using it).
pub struct PolicyConfig {
    config: NativeConfig,
    envoy: ConfigHandle,
    ids: [Option<usize>; Metric::ALL.len()],
    /// The first LB instance of the config reports for the cluster: logs
    /// hosts that are not offered, writes the gauges. One writer, so no
    /// duplicate lines and no races between workers.
    reporter_taken: AtomicBool,
}

impl PolicyConfig {
    fn count(&self, m: Metric, by: u64) {
        if let Some(Some(id)) = self.ids.get(m.index()) {
            self.envoy.increment_counter(*id, by);
        }
    }

    fn gauge_set(&self, m: Metric, v: u64) {
        if let Some(Some(id)) = self.ids.get(m.index()) {
            self.envoy.set_gauge(*id, v);
        }
    }

    fn gauge_add(&self, m: Metric, delta: i64) {
        if let (Some(Some(id)), true) = (self.ids.get(m.index()), delta != 0) {
            self.envoy.add_gauge(*id, delta);
        }
    }
}

/// One LB instance: a worker's (or the main thread's) table for one cluster.
pub struct LbInstance {
    config: *const PolicyConfig,
    cluster: String,
    state: RefCell<State>,
    reporter: Option<RefCell<Reporter>>,
}

/// What the reporting instance remembers between rebuilds.
#[derive(Default)]
struct Reporter {
    not_offered: NotOffered,
    /// The tier last logged (a line when it changes).
    tier: Option<Tier>,
}

struct State {
    table: Table,
    sequence: u64,
}

/// Envoy's hosts through the ABI.
struct EnvoyHosts(Lb);

impl HostSource for EnvoyHosts {
    fn priority_count(&self) -> usize {
        self.0.priority_count()
    }
    fn host_count(&self, p: u32) -> usize {
        self.0.host_count(p)
    }
    fn healthy_count(&self, p: u32) -> usize {
        self.0.healthy_count(p)
    }
    fn healthy_address(&self, p: u32, i: usize) -> Option<&str> {
        self.0.healthy_address(p, i)
    }
    fn address(&self, p: u32, i: usize) -> Option<&str> {
        self.0.address(p, i)
    }
    fn weight(&self, p: u32, i: usize) -> u32 {
        self.0.weight(p, i)
    }
    fn health(&self, p: u32, i: usize) -> Coarse {
        match self.0.health(p, i) {
            abi::HEALTH_HEALTHY => Coarse::Healthy,
            abi::HEALTH_DEGRADED => Coarse::Degraded,
            _ => Coarse::Unhealthy,
        }
    }
    fn locality_zone(&self, p: u32, i: usize) -> Option<&str> {
        self.0.locality_zone(p, i)
    }
    fn metadata_bool(&self, p: u32, i: usize, ns: &str, key: &str) -> Option<bool> {
        self.0.metadata_bool(p, i, ns, key)
    }
    fn metadata_str(&self, p: u32, i: usize, ns: &str, key: &str) -> Option<&str> {
        self.0.metadata_str(p, i, ns, key)
    }
}

impl LbInstance {
    fn config(&self) -> &PolicyConfig {
        // SAFETY: Envoy destroys every LB instance of a config before the
        // config (the C++ LB holds a shared pointer to it).
        unsafe { &*self.config }
    }

    fn rebuild(&self, lb: Lb, why: &str) {
        let cfg = self.config();
        let start = Instant::now();
        let cpu_start = abi::thread_cpu_micros();
        let built = table::build(&EnvoyHosts(lb), &cfg.config.selection);
        let micros = start.elapsed().as_micros() as u64;
        let cpu_micros = abi::thread_cpu_micros().saturating_sub(cpu_start);
        cfg.count(Metric::Rebuilds, 1);
        let (tier, picks) = (built.table.tier, built.table.len());
        match self.state.try_borrow_mut() {
            Ok(mut st) => st.table = built.table,
            Err(_) => return,
        }
        if let Some(rep) = &self.reporter {
            if let Ok(mut rep) = rep.try_borrow_mut() {
                let change = rep.not_offered.update(&built.not_offered);
                for addr in &change.new {
                    abi::log(
                        abi::LOG_WARN,
                        &format!(
                            "serving_picker: cluster {}: host {addr} is serving by its metadata but Envoy does not offer it as healthy (EDS DRAINING/UNHEALTHY/DEGRADED, failed health check or outlier ejection): it cannot be picked",
                            self.cluster
                        ),
                    );
                }
                for addr in &change.recovered {
                    abi::log(
                        abi::LOG_INFO,
                        &format!(
                            "serving_picker: cluster {}: host {addr} is offered again (or gone)",
                            self.cluster
                        ),
                    );
                }
                cfg.gauge_add(Metric::HostsServingNotOffered, change.delta());
                // The tier, when it changes (not for the empty start-up table).
                if rep.tier != Some(tier) && (built.hosts > 0 || rep.tier.is_some()) {
                    rep.tier = Some(tier);
                    abi::log(
                        abi::LOG_INFO,
                        &format!(
                            "serving_picker: cluster {}: tier {} with {picks} pickable host(s) of {} ({why})",
                            self.cluster,
                            tier.name(),
                            built.hosts
                        ),
                    );
                }
            }
            cfg.gauge_set(Metric::RebuildMicros, micros);
            if built.unreadable > 0 {
                abi::log(
                    abi::LOG_WARN,
                    &format!(
                        "serving_picker: cluster {}: {} host(s) without a readable address skipped",
                        self.cluster, built.unreadable
                    ),
                );
            }
        }
        if abi::log_enabled(abi::LOG_DEBUG) {
            abi::log(
                abi::LOG_DEBUG,
                &format!(
                    "serving_picker: cluster {}: rebuilt ({why}): tier {}, {picks} pickable of {} hosts, {} serving but not offered, {micros} us ({cpu_micros} us CPU)",
                    self.cluster,
                    tier.name(),
                    built.hosts,
                    built.not_offered.len()
                ),
            );
        }
    }

    fn choose(&self, lb: Lb, context: Option<Context>) -> Option<(u32, u32)> {
        let cfg = self.config();
        let Ok(mut st) = self.state.try_borrow_mut() else {
            return None;
        };
        let sequence = st.sequence;
        st.sequence = sequence.wrapping_add(1);
        let attempts = context.map_or(0, |c| c.host_selection_retry_count());
        let choice = st.table.choose(sequence, attempts, |slot| {
            context.is_some_and(|c| {
                c.should_select_another_host(lb, slot.priority, slot.host_index as usize)
            })
        });
        match choice {
            Choice::Host { slot, tier, moved } => {
                cfg.count(
                    match tier {
                        Tier::TerminatingFallback => Metric::PickTerminatingFallback,
                        _ => Metric::PickReady,
                    },
                    1,
                );
                cfg.count(
                    match st.table.topology {
                        Topology::None => Metric::PickTopologyNone,
                        Topology::Node => Metric::PickTopologyNode,
                        Topology::Zone => Metric::PickTopologyZone,
                    },
                    1,
                );
                if moved {
                    cfg.count(Metric::RetryOtherHost, 1);
                }
                Some((slot.priority, slot.healthy_index))
            }
            Choice::NoServing => {
                cfg.count(Metric::RejectNoServing, 1);
                None
            }
        }
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const u8 {
    ABI_VERSION.as_ptr()
}

/// Parses the policy configuration and defines the metrics. A refused
/// configuration is logged (naming the key) and answered with null, which
/// makes Envoy reject the cluster's configuration.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_lb_config_new(
    config_envoy: *mut c_void,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const c_void {
    guarded("on_lb_config_new", std::ptr::null(), || {
        let Some(envoy) = ConfigHandle::new(config_envoy) else {
            abi::log(
                abi::LOG_ERROR,
                "serving_picker: no config object from Envoy",
            );
            return std::ptr::null();
        };
        // SAFETY: Envoy's buffers are valid for this call.
        let (name, raw) = unsafe { (name.bytes(), config.bytes()) };
        if name != POLICY_NAME.as_bytes() {
            abi::log(
                abi::LOG_ERROR,
                &format!(
                    "serving_picker: lb_policy_name {:?} refused: this module serves {POLICY_NAME:?}",
                    String::from_utf8_lossy(name)
                ),
            );
            return std::ptr::null();
        }
        let parsed = match config::parse(raw) {
            Ok(c) => c,
            Err(e) => {
                abi::log(
                    abi::LOG_ERROR,
                    &format!("serving_picker: lb_policy_config refused: {e}"),
                );
                return std::ptr::null();
            }
        };
        let mut ids = [None; Metric::ALL.len()];
        for m in Metric::ALL {
            let id = if m.is_gauge() {
                envoy.define_gauge(m.name())
            } else {
                envoy.define_counter(m.name())
            };
            if id.is_none() {
                abi::log(
                    abi::LOG_WARN,
                    &format!("serving_picker: could not define metric {}", m.name()),
                );
            }
            if let Some(slot) = ids.get_mut(m.index()) {
                *slot = id;
            }
        }
        abi::log(
            abi::LOG_INFO,
            &format!(
                "serving_picker: policy configured: metadata_namespace {:?}, local_zone {:?}, local_zone_min_share {}",
                parsed.selection.metadata_namespace,
                parsed.selection.local_zone,
                parsed.selection.local_zone_min_share
            ),
        );
        let boxed = Box::new(PolicyConfig {
            config: parsed,
            envoy,
            ids,
            reporter_taken: AtomicBool::new(false),
        });
        Box::into_raw(boxed) as *const c_void
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_lb_config_destroy(config_module: *const c_void) {
    guarded("on_lb_config_destroy", (), || {
        if !config_module.is_null() {
            // SAFETY: a pointer this module made with Box::into_raw in
            // config_new; Envoy destroys it once, after its LB instances.
            drop(unsafe { Box::from_raw(config_module as *mut PolicyConfig) });
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_lb_new(
    config_module: *const c_void,
    lb_envoy: *mut c_void,
) -> *const c_void {
    guarded("on_lb_new", std::ptr::null(), || {
        let Some(lb) = Lb::new(lb_envoy) else {
            return std::ptr::null();
        };
        if config_module.is_null() {
            return std::ptr::null();
        }
        let config = config_module as *const PolicyConfig;
        // SAFETY: made by config_new, alive until config_destroy.
        let cfg = unsafe { &*config };
        let reporter = !cfg.reporter_taken.swap(true, Ordering::AcqRel);
        let instance = Box::new(LbInstance {
            config,
            cluster: lb.cluster_name(),
            state: RefCell::new(State {
                table: Table::default(),
                sequence: 0,
            }),
            reporter: reporter.then(|| RefCell::new(Reporter::default())),
        });
        instance.rebuild(lb, "lb_new");
        Box::into_raw(instance) as *const c_void
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_lb_on_host_membership_update(
    lb_envoy: *mut c_void,
    lb_module: *const c_void,
    n_added: usize,
    n_removed: usize,
) {
    guarded("on_lb_on_host_membership_update", (), || {
        let Some(lb) = Lb::new(lb_envoy) else {
            return;
        };
        if lb_module.is_null() {
            return;
        }
        // SAFETY: made by lb_new, alive until lb_destroy; used on its thread only.
        let instance = unsafe { &*(lb_module as *const LbInstance) };
        let why = if n_added == 0 && n_removed == 0 {
            "update".to_string()
        } else {
            format!("+{n_added} -{n_removed}")
        };
        instance.rebuild(lb, &why);
    })
}

/// # Safety
/// Envoy passes its load balancer, this module's instance from lb_new, the
/// request's context (or null) and two writable `u32` slots (checked for
/// null here).
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_lb_choose_host(
    lb_envoy: *mut c_void,
    lb_module: *const c_void,
    context: *mut c_void,
    out_priority: *mut u32,
    out_healthy_index: *mut u32,
) -> bool {
    guarded("on_lb_choose_host", false, || {
        let Some(lb) = Lb::new(lb_envoy) else {
            return false;
        };
        if lb_module.is_null() || out_priority.is_null() || out_healthy_index.is_null() {
            return false;
        }
        // SAFETY: made by lb_new, alive until lb_destroy; used on its thread only.
        let instance = unsafe { &*(lb_module as *const LbInstance) };
        match instance.choose(lb, Context::new(context)) {
            Some((priority, index)) => {
                // SAFETY: both checked non-null; Envoy passes its locals.
                unsafe {
                    *out_priority = priority;
                    *out_healthy_index = index;
                }
                true
            }
            None => false,
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_lb_destroy(lb_module: *const c_void) {
    guarded("on_lb_destroy", (), || {
        if lb_module.is_null() {
            return;
        }
        // SAFETY: made by lb_new with Box::into_raw; Envoy destroys it once.
        let instance = unsafe { Box::from_raw(lb_module as *mut LbInstance) };
        if let Some(rep) = &instance.reporter {
            if let Ok(rep) = rep.try_borrow() {
                // The cluster's share of the gauge goes with it.
                instance.config().gauge_add(
                    Metric::HostsServingNotOffered,
                    -(rep.not_offered.len() as i64),
                );
            }
        }
    })
}
