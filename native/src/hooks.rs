//! The hooks Envoy calls (`envoy_dynamic_module_on_*`), and only them: each
//! checks its pointers (through `abi`), catches any panic (the release
//! profile unwinds; a panic across `extern "C"` would abort Envoy) and hands
//! over to `policy` through the `envoy_host` adapter.

// Envoy finds the hooks by their unmangled names (`#[no_mangle]`).
#![allow(unsafe_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use crate::abi::{
    self, AbiVersionPtr, ConfigHandle, Context, EnvoyBuffer, EnvoyPtr, Lb, ModulePtr, OutU32,
};
use crate::envoy_host::{self, Envoy, EnvoyHosts, EnvoyLbInstance, EnvoyPolicy, EnvoyRequest};
use crate::envoy_version::{self, CheckMode, Verdict, CHECK_VAR};
use crate::policy::Level;

/// Runs `f`, or logs the panic and returns `fallback`.
pub(crate) fn guarded<T>(hook: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            // Logging itself must not panic again: `log` only formats a &str.
            let _ = catch_unwind(|| {
                envoy_host::log(
                    Level::Error,
                    &format!("serving_picker: internal error (panic) in {hook}; answered safely"),
                )
            });
            fallback
        }
    }
}

/// Answers the running Envoy's own ABI version string, or refuses (null)
/// an Envoy the module cannot run in (`envoy_version`).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> AbiVersionPtr {
    guarded("on_program_init", abi::NO_ABI_VERSION, || {
        let mode = match envoy_version::check_mode(std::env::var(CHECK_VAR).ok().as_deref()) {
            Ok(mode) => mode,
            Err(unknown) => {
                envoy_host::log(Level::Warn, &unknown.to_string());
                CheckMode::Warn
            }
        };
        // The version and commit (`0.1.0 (commit …)`) open the load line.
        let build = serving_picker_core::build_identity!().to_string();
        match envoy_version::verdict(&envoy_version::running_envoy(), mode, &build) {
            Verdict::Load {
                abi_version,
                tested,
                message,
            } => {
                envoy_host::log(if tested { Level::Info } else { Level::Warn }, &message);
                envoy_version::set_untested(!tested);
                abi::abi_version_ptr(abi_version)
            }
            Verdict::Refuse(message) => {
                envoy_host::log(Level::Error, &message);
                abi::NO_ABI_VERSION
            }
        }
    })
}

/// A refused configuration is answered with null, which makes Envoy reject
/// the cluster's configuration.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_lb_config_new(
    config_envoy: EnvoyPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> ModulePtr {
    guarded("on_lb_config_new", abi::NO_MODULE, || {
        let Some(handle) = ConfigHandle::new(config_envoy) else {
            envoy_host::log(Level::Error, "serving_picker: no config object from Envoy");
            return abi::NO_MODULE;
        };
        // 1 when the running Envoy is not a tested release (program_init).
        if let Some(id) = handle.define_gauge(envoy_version::UNTESTED_GAUGE) {
            handle.set_gauge(id, u64::from(envoy_version::untested()));
        }
        // SAFETY: Envoy's buffers are valid for this call.
        let (name, raw) = unsafe { (name.bytes(), config.bytes()) };
        match EnvoyPolicy::new(Envoy::new(handle), name, raw) {
            Some(policy) => abi::share(Arc::new(policy)),
            None => abi::NO_MODULE,
        }
    })
}

/// # Safety
/// Envoy passes a configuration from config_new, once.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_lb_config_destroy(config_module: ModulePtr) {
    guarded("on_lb_config_destroy", (), || {
        // SAFETY: made by config_new with `share`; Envoy destroys it once.
        // LB instances hold their own references.
        unsafe { abi::release_shared::<EnvoyPolicy>(config_module) }
    })
}

/// # Safety
/// Envoy passes a configuration from config_new (or null) and its load
/// balancer (checked for null here).
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_lb_new(
    config_module: ModulePtr,
    lb_envoy: EnvoyPtr,
) -> ModulePtr {
    guarded("on_lb_new", abi::NO_MODULE, || {
        let Some(lb) = Lb::new(lb_envoy) else {
            return abi::NO_MODULE;
        };
        // SAFETY: made by config_new with `share`, alive until config_destroy.
        let Some(config) = (unsafe { abi::shared::<EnvoyPolicy>(config_module) }) else {
            return abi::NO_MODULE;
        };
        let instance = EnvoyLbInstance::new(config, lb.cluster_name(), &EnvoyHosts(lb));
        abi::own(Box::new(instance))
    })
}

/// # Safety
/// Envoy passes its load balancer and this module's instance from lb_new
/// (each checked for null here).
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_lb_on_host_membership_update(
    lb_envoy: EnvoyPtr,
    lb_module: ModulePtr,
    n_added: usize,
    n_removed: usize,
) {
    guarded("on_lb_on_host_membership_update", (), || {
        let Some(lb) = Lb::new(lb_envoy) else {
            return;
        };
        // SAFETY: made by lb_new with `own`, alive until lb_destroy; its
        // hooks run on its own thread only.
        if let Some(instance) = unsafe { abi::owned::<EnvoyLbInstance>(lb_module) } {
            instance.on_membership_update(&EnvoyHosts(lb), n_added, n_removed);
        }
    })
}

/// # Safety
/// Envoy passes its load balancer, this module's instance from lb_new, the
/// request's context (or null) and two writable `u32` slots (checked for
/// null here).
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_lb_choose_host(
    lb_envoy: EnvoyPtr,
    lb_module: ModulePtr,
    context: EnvoyPtr,
    out_priority: OutU32,
    out_healthy_index: OutU32,
) -> bool {
    guarded("on_lb_choose_host", false, || {
        let Some(lb) = Lb::new(lb_envoy) else {
            return false;
        };
        // SAFETY: made by lb_new with `own`, alive until lb_destroy; its
        // hooks run on its own thread only. The slots are Envoy's locals.
        let (instance, priority_slot, index_slot) = unsafe {
            (
                abi::owned::<EnvoyLbInstance>(lb_module),
                abi::out_slot(out_priority),
                abi::out_slot(out_healthy_index),
            )
        };
        let (Some(instance), Some(priority_slot), Some(index_slot)) =
            (instance, priority_slot, index_slot)
        else {
            return false;
        };
        let request = Context::new(context).map(|context| EnvoyRequest { lb, context });
        match instance.choose(&EnvoyHosts(lb), request.as_ref()) {
            Some((priority, index)) => {
                *priority_slot = priority;
                *index_slot = index;
                true
            }
            None => false,
        }
    })
}

/// # Safety
/// Envoy passes an instance from lb_new, once.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_lb_destroy(lb_module: ModulePtr) {
    guarded("on_lb_destroy", (), || {
        // SAFETY: made by lb_new with `own`; Envoy destroys it once. Its
        // drop gives back the cluster's share of the gauges.
        unsafe { abi::release_owned::<EnvoyLbInstance>(lb_module) }
    })
}
