//! The Envoy dynamic-module ABI this module uses: the callbacks Envoy
//! exports (declared here, and only here), safe wrappers around them, and
//! the conversions of the opaque pointers the hooks receive and return.
//! This is the one file with raw pointers into Envoy.
//!
//! The declarations hold for every Envoy this module runs in (1.38, 1.39,
//! 1.40: docs/compatibility.md says how each signature was compared). A
//! callback whose signature differed in some release would need a
//! declaration per release here, chosen by the release `envoy_version`
//! identifies at load time; none does.
//! Every declared callback is checked against each supported Envoy binary
//! (`nm -D --defined-only envoy`, tests/e2e/native/abi.rs) and its behaviour
//! against the real Envoys (the e2e tests, `make test-compat`).

// The module's raw pointers into Envoy live here and only here.
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr};
use std::os::raw::{c_char, c_int};
use std::sync::Arc;

/// A buffer owned by Envoy (`envoy_dynamic_module_type_envoy_buffer`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EnvoyBuffer {
    /// The first byte; may be null when `length` is 0.
    pub ptr: *const u8,
    /// How many bytes.
    pub length: usize,
}

impl EnvoyBuffer {
    /// No bytes (a null pointer, length 0).
    pub const EMPTY: EnvoyBuffer = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };

    /// The bytes, valid as long as Envoy says the buffer is (the hook call).
    ///
    /// # Safety
    /// `ptr` must point to `length` readable bytes for the returned lifetime.
    pub unsafe fn bytes<'a>(self) -> &'a [u8] {
        if self.ptr.is_null() || self.length == 0 {
            &[]
        } else {
            // SAFETY: non-null, and the caller vouches for the length.
            unsafe { std::slice::from_raw_parts(self.ptr, self.length) }
        }
    }
}

/// A buffer owned by the module (`envoy_dynamic_module_type_module_buffer`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ModuleBuffer {
    /// The first byte, borrowed from the module for the callback's duration.
    pub ptr: *const u8,
    /// How many bytes.
    pub length: usize,
}

impl ModuleBuffer {
    /// `s`'s bytes, borrowed: `s` must outlive the callback it is passed to.
    pub fn of(s: &str) -> ModuleBuffer {
        ModuleBuffer {
            ptr: s.as_ptr(),
            length: s.len(),
        }
    }
}

/// An object Envoy owns and passes to a hook (`*_envoy_ptr`): checked for
/// null by the wrappers that take it.
pub type EnvoyPtr = *mut c_void;
/// An object this module made and Envoy keeps for it (`*_module_ptr`).
pub type ModulePtr = *const c_void;
/// The answer "no object" (a refused configuration, a failed LB).
pub const NO_MODULE: ModulePtr = std::ptr::null();
/// `envoy_dynamic_module_type_abi_version_module_ptr`: a NUL-terminated
/// string, or null to refuse the load.
pub type AbiVersionPtr = *const c_char;
/// The answer "refused" to the ABI-version hook: Envoy does not load the module.
pub const NO_ABI_VERSION: AbiVersionPtr = std::ptr::null();
/// A `uint32_t*` out-parameter of a hook.
pub type OutU32 = *mut u32;

/// The ABI version string handed to Envoy (static: valid for ever).
pub fn abi_version_ptr(version: &'static CStr) -> AbiVersionPtr {
    version.as_ptr()
}

/// Hands Envoy an object shared with the module's own holders (a policy
/// configuration, which every LB instance of it keeps).
pub fn share<T>(value: Arc<T>) -> ModulePtr {
    Arc::into_raw(value).cast()
}

/// Another holder of an object from `share`.
///
/// # Safety
/// `ptr` is null or came from `share::<T>` and is not yet released.
pub unsafe fn shared<T>(ptr: ModulePtr) -> Option<Arc<T>> {
    if ptr.is_null() {
        return None;
    }
    let ptr = ptr.cast::<T>();
    // SAFETY: a live Arc<T> made by `share`: one more strong count, then
    // an Arc that owns it.
    unsafe {
        Arc::increment_strong_count(ptr);
        Some(Arc::from_raw(ptr))
    }
}

/// Envoy's reference from `share`, given back (config_destroy).
///
/// # Safety
/// `ptr` is null or came from `share::<T>`; Envoy releases it once.
pub unsafe fn release_shared<T>(ptr: ModulePtr) {
    if !ptr.is_null() {
        // SAFETY: the Arc reference `share` leaked to Envoy.
        drop(unsafe { Arc::from_raw(ptr.cast::<T>()) });
    }
}

/// Hands Envoy an object it alone holds (an LB instance).
pub fn own<T>(value: Box<T>) -> ModulePtr {
    Box::into_raw(value).cast_const().cast()
}

/// The object behind a pointer from `own`, for one hook call.
///
/// # Safety
/// `ptr` is null or came from `own::<T>` and is not yet released; the
/// reference is used on the object's own thread during the hook call.
pub unsafe fn owned<'a, T>(ptr: ModulePtr) -> Option<&'a T> {
    // SAFETY: null or a live Box<T> (the caller vouches).
    unsafe { ptr.cast::<T>().as_ref() }
}

/// The object from `own`, given back and dropped (lb_destroy).
///
/// # Safety
/// `ptr` is null or came from `own::<T>`; Envoy releases it once.
pub unsafe fn release_owned<T>(ptr: ModulePtr) {
    if !ptr.is_null() {
        // SAFETY: the Box `own` leaked to Envoy.
        drop(unsafe { Box::from_raw(ptr.cast::<T>().cast_mut()) });
    }
}

/// A hook's out-parameter, if Envoy passed one.
///
/// # Safety
/// `ptr` is null or points to a writable `u32` for the hook call.
pub unsafe fn out_slot<'a>(ptr: OutU32) -> Option<&'a mut u32> {
    // SAFETY: null or Envoy's local (the caller vouches).
    unsafe { ptr.as_mut() }
}

// `envoy_dynamic_module_type_log_level`.
/// The debug level of Envoy's `dynamic_modules` logger.
pub const LOG_DEBUG: c_int = 1;
/// Its info level.
pub const LOG_INFO: c_int = 2;
/// Its warn level.
pub const LOG_WARN: c_int = 3;
/// Its error level.
pub const LOG_ERROR: c_int = 4;

// `envoy_dynamic_module_type_host_health` as Envoy 1.38 to 1.40 return it.
/// Envoy does not offer the host (failed checks, ejection, EDS unhealthy or draining).
pub const HEALTH_UNHEALTHY: c_int = 0;
/// Envoy offers the host only when too few are healthy.
pub const HEALTH_DEGRADED: c_int = 1;
/// Envoy offers the host.
pub const HEALTH_HEALTHY: c_int = 2;

// The callbacks, named as Envoy exports them. The symbol test
// (tests/e2e/native/abi.rs) parses every `fn envoy_dynamic_module_callback_*(`
// of this file and looks each up in the pinned Envoy binary.
extern "C" {
    fn envoy_dynamic_module_callback_log(level: c_int, message: ModuleBuffer);
    fn envoy_dynamic_module_callback_log_enabled(level: c_int) -> bool;

    fn envoy_dynamic_module_callback_lb_get_cluster_name(lb: *mut c_void, out: *mut EnvoyBuffer);
    fn envoy_dynamic_module_callback_lb_get_priority_set_size(lb: *mut c_void) -> usize;
    fn envoy_dynamic_module_callback_lb_get_hosts_count(lb: *mut c_void, priority: u32) -> usize;
    fn envoy_dynamic_module_callback_lb_get_healthy_hosts_count(
        lb: *mut c_void,
        priority: u32,
    ) -> usize;
    fn envoy_dynamic_module_callback_lb_get_healthy_host_address(
        lb: *mut c_void,
        priority: u32,
        index: usize,
        out: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_lb_get_host_address(
        lb: *mut c_void,
        priority: u32,
        index: usize,
        out: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_lb_get_host_weight(
        lb: *mut c_void,
        priority: u32,
        index: usize,
    ) -> u32;
    fn envoy_dynamic_module_callback_lb_get_host_health(
        lb: *mut c_void,
        priority: u32,
        index: usize,
    ) -> c_int;
    fn envoy_dynamic_module_callback_lb_get_host_locality(
        lb: *mut c_void,
        priority: u32,
        index: usize,
        region: *mut EnvoyBuffer,
        zone: *mut EnvoyBuffer,
        sub_zone: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_lb_get_host_metadata_bool(
        lb: *mut c_void,
        priority: u32,
        index: usize,
        filter_name: ModuleBuffer,
        key: ModuleBuffer,
        out: *mut bool,
    ) -> bool;
    fn envoy_dynamic_module_callback_lb_get_host_metadata_string(
        lb: *mut c_void,
        priority: u32,
        index: usize,
        filter_name: ModuleBuffer,
        key: ModuleBuffer,
        out: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_lb_context_get_host_selection_retry_count(
        context: *mut c_void,
    ) -> u32;
    fn envoy_dynamic_module_callback_lb_context_should_select_another_host(
        lb: *mut c_void,
        context: *mut c_void,
        priority: u32,
        index: usize,
    ) -> bool;

    fn envoy_dynamic_module_callback_lb_config_define_counter(
        config: *mut c_void,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        out_id: *mut usize,
    ) -> c_int;
    fn envoy_dynamic_module_callback_lb_config_increment_counter(
        config: *mut c_void,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> c_int;
    fn envoy_dynamic_module_callback_lb_config_define_gauge(
        config: *mut c_void,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        out_id: *mut usize,
    ) -> c_int;
    fn envoy_dynamic_module_callback_lb_config_set_gauge(
        config: *mut c_void,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> c_int;
    fn envoy_dynamic_module_callback_lb_config_increment_gauge(
        config: *mut c_void,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> c_int;
    fn envoy_dynamic_module_callback_lb_config_decrement_gauge(
        config: *mut c_void,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> c_int;
}

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

extern "C" {
    // libc (not Envoy): the calling thread's CPU time.
    fn clock_gettime(clock: c_int, out: *mut Timespec) -> c_int;
}

/// The calling thread's CPU time in microseconds (0 if unavailable): what a
/// rebuild costs the thread, apart from waiting for a core.
pub fn thread_cpu_micros() -> u64 {
    const CLOCK_THREAD_CPUTIME_ID: c_int = 3;
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    if unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec.max(0) as u64) * 1_000_000 + (ts.tv_nsec.max(0) as u64) / 1_000
}

/// Logs through Envoy's logger (component `dynamic_modules`).
pub fn log(level: c_int, message: &str) {
    // SAFETY: the buffer points into `message`, alive for the call.
    unsafe { envoy_dynamic_module_callback_log(level, ModuleBuffer::of(message)) }
}

/// Whether Envoy would print a line at this level (skip building it if not).
pub fn log_enabled(level: c_int) -> bool {
    // SAFETY: plain value in, plain value out.
    unsafe { envoy_dynamic_module_callback_log_enabled(level) }
}

fn utf8(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes).ok()
}

/// Envoy's load balancer object (`lb_envoy_ptr`), non-null, valid for the
/// duration of the hook call it was passed to.
#[derive(Clone, Copy)]
pub struct Lb(*mut c_void);

impl Lb {
    /// The load balancer behind `ptr`; `None` for null.
    pub fn new(ptr: *mut c_void) -> Option<Lb> {
        (!ptr.is_null()).then_some(Lb(ptr))
    }

    /// The cluster's name (copied).
    pub fn cluster_name(&self) -> String {
        let mut out = EnvoyBuffer::EMPTY;
        // SAFETY: non-null lb pointer from Envoy, `out` is a valid buffer slot;
        // the name lives as long as the cluster and is copied right away.
        unsafe {
            envoy_dynamic_module_callback_lb_get_cluster_name(self.0, &mut out);
            String::from_utf8_lossy(out.bytes()).into_owned()
        }
    }

    /// How many priorities the cluster's host set has.
    pub fn priority_count(&self) -> usize {
        // SAFETY: non-null lb pointer from Envoy.
        unsafe { envoy_dynamic_module_callback_lb_get_priority_set_size(self.0) }
    }

    /// How many hosts priority `priority` has.
    pub fn host_count(&self, priority: u32) -> usize {
        // SAFETY: non-null lb pointer; Envoy checks the priority.
        unsafe { envoy_dynamic_module_callback_lb_get_hosts_count(self.0, priority) }
    }

    /// How many of them Envoy counts healthy.
    pub fn healthy_count(&self, priority: u32) -> usize {
        // SAFETY: as above.
        unsafe { envoy_dynamic_module_callback_lb_get_healthy_hosts_count(self.0, priority) }
    }

    /// Address of a host of the healthy list; borrowed from Envoy's host
    /// (alive for the hook call: the host set does not change during it).
    pub fn healthy_address(&self, priority: u32, index: usize) -> Option<&str> {
        let mut out = EnvoyBuffer::EMPTY;
        // SAFETY: Envoy bounds-checks and fills `out` with a view of the
        // host's address string, which outlives this hook call.
        unsafe {
            envoy_dynamic_module_callback_lb_get_healthy_host_address(
                self.0, priority, index, &mut out,
            )
            .then(|| utf8(out.bytes()))
            .flatten()
        }
    }

    /// Address of host `index` of priority `priority`, borrowed from Envoy's host (alive for the
    /// hook call).
    pub fn address(&self, priority: u32, index: usize) -> Option<&str> {
        let mut out = EnvoyBuffer::EMPTY;
        // SAFETY: as for `healthy_address`.
        unsafe {
            envoy_dynamic_module_callback_lb_get_host_address(self.0, priority, index, &mut out)
                .then(|| utf8(out.bytes()))
                .flatten()
        }
    }

    /// The host's load-balancing weight (0 out of range).
    pub fn weight(&self, priority: u32, index: usize) -> u32 {
        // SAFETY: Envoy bounds-checks (0 when out of range).
        unsafe { envoy_dynamic_module_callback_lb_get_host_weight(self.0, priority, index) }
    }

    /// The host's health as Envoy sees it (`HEALTH_*`; unhealthy out of range).
    pub fn health(&self, priority: u32, index: usize) -> c_int {
        // SAFETY: Envoy bounds-checks (Unhealthy when out of range).
        unsafe { envoy_dynamic_module_callback_lb_get_host_health(self.0, priority, index) }
    }

    /// The zone of the host's locality; `None` when it has no locality or the zone is not UTF-8.
    pub fn locality_zone(&self, priority: u32, index: usize) -> Option<&str> {
        let (mut region, mut zone, mut sub_zone) =
            (EnvoyBuffer::EMPTY, EnvoyBuffer::EMPTY, EnvoyBuffer::EMPTY);
        // SAFETY: three valid buffer slots; the views point into the host's
        // locality, alive for the hook call.
        unsafe {
            envoy_dynamic_module_callback_lb_get_host_locality(
                self.0,
                priority,
                index,
                &mut region,
                &mut zone,
                &mut sub_zone,
            )
            .then(|| utf8(zone.bytes()))
            .flatten()
        }
    }

    /// A bool in the host's filter_metadata[`ns`][`key`]; `None` when absent
    /// or not a bool.
    pub fn metadata_bool(&self, priority: u32, index: usize, ns: &str, key: &str) -> Option<bool> {
        let mut out = false;
        // SAFETY: module buffers point into live &strs; `out` is a valid slot.
        unsafe {
            envoy_dynamic_module_callback_lb_get_host_metadata_bool(
                self.0,
                priority,
                index,
                ModuleBuffer::of(ns),
                ModuleBuffer::of(key),
                &mut out,
            )
        }
        .then_some(out)
    }

    /// A string in the host's filter_metadata[`ns`][`key`]; `None` when
    /// absent, not a string or not UTF-8.
    pub fn metadata_str(&self, priority: u32, index: usize, ns: &str, key: &str) -> Option<&str> {
        let mut out = EnvoyBuffer::EMPTY;
        // SAFETY: as for `metadata_bool`; the view points into the host's
        // metadata, which only the main thread replaces: the module calls
        // this on the main thread (`metadata_board`), or on a worker before
        // the cluster's first copy exists, and copies the bytes at once.
        unsafe {
            envoy_dynamic_module_callback_lb_get_host_metadata_string(
                self.0,
                priority,
                index,
                ModuleBuffer::of(ns),
                ModuleBuffer::of(key),
                &mut out,
            )
            .then(|| utf8(out.bytes()))
            .flatten()
        }
    }
}

/// The request's `LoadBalancerContext`, non-null, valid during choose_host.
#[derive(Clone, Copy)]
pub struct Context(*mut c_void);

impl Context {
    /// The request context behind `ptr`; `None` for null.
    pub fn new(ptr: *mut c_void) -> Option<Context> {
        (!ptr.is_null()).then_some(Context(ptr))
    }

    /// The route's `host_selection_retry_max_attempts` (0 without one).
    pub fn host_selection_retry_count(&self) -> u32 {
        // SAFETY: non-null context pointer from Envoy.
        unsafe { envoy_dynamic_module_callback_lb_context_get_host_selection_retry_count(self.0) }
    }

    /// Whether the route's retry host predicates (e.g. previous_hosts) ask
    /// for another host than host `index` (all hosts of `priority`).
    pub fn should_select_another_host(&self, lb: Lb, priority: u32, index: usize) -> bool {
        // SAFETY: both pointers non-null and from this choose_host call;
        // Envoy bounds-checks priority and index.
        unsafe {
            envoy_dynamic_module_callback_lb_context_should_select_another_host(
                lb.0, self.0, priority, index,
            )
        }
    }
}

/// Envoy's LB config object (`lb_config_envoy_ptr`): metrics are defined on
/// it in config_new and updated through it from any thread.
#[derive(Clone, Copy)]
pub struct ConfigHandle(*mut c_void);

// SAFETY: Envoy's metric updates through this pointer are thread-safe
// (atomic stats, read-only id tables after config_new); it outlives every
// LB instance of the config.
unsafe impl Send for ConfigHandle {}
// SAFETY: as above.
unsafe impl Sync for ConfigHandle {}

impl ConfigHandle {
    /// The configuration object behind `ptr`; `None` for null.
    pub fn new(ptr: *mut c_void) -> Option<ConfigHandle> {
        (!ptr.is_null()).then_some(ConfigHandle(ptr))
    }

    /// Defines an unlabelled counter (config_new only); its id.
    pub fn define_counter(&self, name: &str) -> Option<usize> {
        let mut id = 0usize;
        // SAFETY: no labels (null, 0); `id` is a valid slot.
        let rc = unsafe {
            envoy_dynamic_module_callback_lb_config_define_counter(
                self.0,
                ModuleBuffer::of(name),
                std::ptr::null_mut(),
                0,
                &mut id,
            )
        };
        (rc == 0).then_some(id)
    }

    /// Defines an unlabelled gauge (config_new only); its id.
    pub fn define_gauge(&self, name: &str) -> Option<usize> {
        let mut id = 0usize;
        // SAFETY: as for `define_counter`.
        let rc = unsafe {
            envoy_dynamic_module_callback_lb_config_define_gauge(
                self.0,
                ModuleBuffer::of(name),
                std::ptr::null_mut(),
                0,
                &mut id,
            )
        };
        (rc == 0).then_some(id)
    }

    /// Adds `by` to counter `id`.
    pub fn increment_counter(&self, id: usize, by: u64) {
        // SAFETY: an id this config defined, no labels.
        unsafe {
            envoy_dynamic_module_callback_lb_config_increment_counter(
                self.0,
                id,
                std::ptr::null_mut(),
                0,
                by,
            );
        }
    }

    /// Sets gauge `id` to `value`.
    pub fn set_gauge(&self, id: usize, value: u64) {
        // SAFETY: as above.
        unsafe {
            envoy_dynamic_module_callback_lb_config_set_gauge(
                self.0,
                id,
                std::ptr::null_mut(),
                0,
                value,
            );
        }
    }

    /// Moves gauge `id` by `delta`, up or down.
    pub fn add_gauge(&self, id: usize, delta: i64) {
        // SAFETY: as above.
        unsafe {
            if delta >= 0 {
                envoy_dynamic_module_callback_lb_config_increment_gauge(
                    self.0,
                    id,
                    std::ptr::null_mut(),
                    0,
                    delta.unsigned_abs(),
                );
            } else {
                envoy_dynamic_module_callback_lb_config_decrement_gauge(
                    self.0,
                    id,
                    std::ptr::null_mut(),
                    0,
                    delta.unsigned_abs(),
                );
            }
        }
    }
}

// The stream-drain HTTP filter's callbacks (every one exported by 1.38, 1.39 and 1.40:
// native/abi/envoy-<minor>.callbacks). Signatures as abi.h declares them; checked against
// each Envoy by the e2e tests (tests/e2e/native/).
extern "C" {
    fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config: *mut c_void,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        out_id: *mut usize,
    ) -> c_int;
    fn envoy_dynamic_module_callback_http_filter_config_define_gauge(
        config: *mut c_void,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        out_id: *mut usize,
    ) -> c_int;
    fn envoy_dynamic_module_callback_http_filter_set_gauge(
        filter: *mut c_void,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> c_int;
    fn envoy_dynamic_module_callback_http_filter_increment_counter(
        filter: *mut c_void,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> c_int;
    fn envoy_dynamic_module_callback_http_get_header(
        filter: *mut c_void,
        header_type: c_int,
        key: ModuleBuffer,
        out: *mut EnvoyBuffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        filter: *mut c_void,
        attribute_id: c_int,
        out: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_cluster_name(
        filter: *mut c_void,
        out: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_filter_scheduler_new(filter: *mut c_void) -> *mut c_void;
    fn envoy_dynamic_module_callback_http_filter_scheduler_commit(
        scheduler: *mut c_void,
        event_id: u64,
    );
    fn envoy_dynamic_module_callback_http_filter_scheduler_delete(scheduler: *mut c_void);
    fn envoy_dynamic_module_callback_http_send_response_trailers(
        filter: *mut c_void,
        trailers: *mut ModuleHttpHeader,
        trailers_length: usize,
    );
    fn envoy_dynamic_module_callback_http_filter_reset_stream(
        filter: *mut c_void,
        reason: c_int,
        details: ModuleBuffer,
    );
}

/// A header the module owns (`envoy_dynamic_module_type_module_http_header`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ModuleHttpHeader {
    key_ptr: *const u8,
    key_length: usize,
    value_ptr: *const u8,
    value_length: usize,
}

impl ModuleHttpHeader {
    /// `key: value`, borrowed: both must outlive the callback it is passed to.
    pub fn of(key: &str, value: &str) -> ModuleHttpHeader {
        ModuleHttpHeader {
            key_ptr: key.as_ptr(),
            key_length: key.len(),
            value_ptr: value.as_ptr(),
            value_length: value.len(),
        }
    }
}

/// `envoy_dynamic_module_type_http_header_type_RequestHeader`.
const REQUEST_HEADER: c_int = 0;
/// `envoy_dynamic_module_type_attribute_id_RequestProtocol` (`request.protocol`).
const ATTRIBUTE_REQUEST_PROTOCOL: c_int = 10;
/// `envoy_dynamic_module_type_attribute_id_UpstreamAddress` (`upstream.address`: the upstream
/// host's `IP:PORT`).
const ATTRIBUTE_UPSTREAM_ADDRESS: c_int = 41;
/// `envoy_dynamic_module_type_http_filter_stream_reset_reason_LocalReset`.
const RESET_LOCAL: c_int = 0;

/// Envoy's HTTP filter configuration (`filter_config_envoy_ptr`): counters are defined on it
/// in `on_http_filter_config_new` only.
#[derive(Clone, Copy)]
pub struct HttpConfigHandle(*mut c_void);

impl HttpConfigHandle {
    /// The configuration behind `ptr`; `None` for null.
    pub fn new(ptr: *mut c_void) -> Option<HttpConfigHandle> {
        (!ptr.is_null()).then_some(HttpConfigHandle(ptr))
    }

    /// Defines an unlabelled counter (config_new only); its id.
    pub fn define_counter(&self, name: &str) -> Option<usize> {
        let mut id = 0usize;
        // SAFETY: non-null config pointer from config_new; no labels (null, 0); `id` is a
        // valid slot.
        let rc = unsafe {
            envoy_dynamic_module_callback_http_filter_config_define_counter(
                self.0,
                ModuleBuffer::of(name),
                std::ptr::null_mut(),
                0,
                &mut id,
            )
        };
        (rc == 0).then_some(id)
    }

    /// Defines an unlabelled gauge (config_new only); its id.
    pub fn define_gauge(&self, name: &str) -> Option<usize> {
        let mut id = 0usize;
        // SAFETY: as for `define_counter`.
        let rc = unsafe {
            envoy_dynamic_module_callback_http_filter_config_define_gauge(
                self.0,
                ModuleBuffer::of(name),
                std::ptr::null_mut(),
                0,
                &mut id,
            )
        };
        (rc == 0).then_some(id)
    }
}

/// Envoy's HTTP filter of one stream (`filter_envoy_ptr`), non-null, valid during the hook
/// call it was passed to, on the stream's worker.
#[derive(Clone, Copy)]
pub struct HttpFilter(*mut c_void);

impl HttpFilter {
    /// The filter behind `ptr`; `None` for null.
    pub fn new(ptr: *mut c_void) -> Option<HttpFilter> {
        (!ptr.is_null()).then_some(HttpFilter(ptr))
    }

    fn copied(found: bool, out: EnvoyBuffer) -> Option<String> {
        // SAFETY: Envoy filled `out` with a view valid for the hook call; copied at once.
        found
            .then(|| unsafe { utf8(out.bytes()).map(str::to_string) })
            .flatten()
    }

    /// A request header's first value (copied).
    pub fn request_header(&self, name: &str) -> Option<String> {
        let mut out = EnvoyBuffer::EMPTY;
        // SAFETY: non-null filter pointer; the key borrows `name` for the call; `out` is a
        // valid slot and the size pointer may be null.
        let found = unsafe {
            envoy_dynamic_module_callback_http_get_header(
                self.0,
                REQUEST_HEADER,
                ModuleBuffer::of(name),
                &mut out,
                0,
                std::ptr::null_mut(),
            )
        };
        Self::copied(found && !out.ptr.is_null(), out)
    }

    fn attribute(&self, id: c_int) -> Option<String> {
        let mut out = EnvoyBuffer::EMPTY;
        // SAFETY: non-null filter pointer; `out` is a valid slot.
        let found = unsafe {
            envoy_dynamic_module_callback_http_filter_get_attribute_string(self.0, id, &mut out)
        };
        Self::copied(found, out)
    }

    /// The request's HTTP version (`HTTP/1.1`, `HTTP/2`).
    pub fn http_version(&self) -> Option<String> {
        self.attribute(ATTRIBUTE_REQUEST_PROTOCOL)
    }

    /// The upstream host's `IP:PORT` (once the response has started).
    pub fn upstream_address(&self) -> Option<String> {
        self.attribute(ATTRIBUTE_UPSTREAM_ADDRESS)
    }

    /// The name of the cluster the route chose.
    pub fn cluster_name(&self) -> Option<String> {
        let mut out = EnvoyBuffer::EMPTY;
        // SAFETY: non-null filter pointer; `out` is a valid slot.
        let found =
            unsafe { envoy_dynamic_module_callback_http_get_cluster_name(self.0, &mut out) };
        Self::copied(found, out)
    }

    /// A scheduler that posts events to this stream's worker; `None` if Envoy gave none.
    pub fn scheduler(&self) -> Option<Scheduler> {
        // SAFETY: non-null filter pointer; the scheduler is given back by `Scheduler::delete`.
        let ptr = unsafe { envoy_dynamic_module_callback_http_filter_scheduler_new(self.0) };
        (!ptr.is_null()).then_some(Scheduler(ptr))
    }

    /// Adds `by` to counter `id` (defined on this filter's configuration).
    pub fn increment_counter(&self, id: usize, by: u64) {
        // SAFETY: non-null filter pointer; an id its configuration defined; no labels.
        unsafe {
            envoy_dynamic_module_callback_http_filter_increment_counter(
                self.0,
                id,
                std::ptr::null_mut(),
                0,
                by,
            );
        }
    }

    /// Sets gauge `id` (defined on this filter's configuration) to `value`.
    pub fn set_gauge(&self, id: usize, value: u64) {
        // SAFETY: non-null filter pointer; an id its configuration defined; no labels.
        unsafe {
            envoy_dynamic_module_callback_http_filter_set_gauge(
                self.0,
                id,
                std::ptr::null_mut(),
                0,
                value,
            );
        }
    }

    /// Ends the response with `trailers`. Envoy may destroy the filter during the call.
    pub fn send_trailers(&self, trailers: &[(&str, &str)]) {
        let mut headers: Vec<ModuleHttpHeader> = trailers
            .iter()
            .map(|(k, v)| ModuleHttpHeader::of(k, v))
            .collect();
        // SAFETY: non-null filter pointer; the headers borrow `trailers`, alive for the call.
        unsafe {
            envoy_dynamic_module_callback_http_send_response_trailers(
                self.0,
                headers.as_mut_ptr(),
                headers.len(),
            )
        }
    }

    /// Resets the stream. Envoy may destroy the filter during the call.
    pub fn reset(&self, details: &str) {
        // SAFETY: non-null filter pointer; the details borrow `details` for the call.
        unsafe {
            envoy_dynamic_module_callback_http_filter_reset_stream(
                self.0,
                RESET_LOCAL,
                ModuleBuffer::of(details),
            )
        }
    }
}

/// A stream's scheduler (`envoy_dynamic_module_type_http_filter_scheduler_module_ptr`):
/// commits events to the stream's worker from any thread, until deleted.
#[derive(Debug)]
pub struct Scheduler(*mut c_void);

// SAFETY: Envoy's scheduler posts to the worker's dispatcher, which is thread-safe; the
// module commits and deletes it under the drain board's lock only, so never concurrently.
unsafe impl Send for Scheduler {}

impl Scheduler {
    /// Posts `event_id` to the stream's worker (`on_http_filter_scheduled`); a stream
    /// already gone is skipped by Envoy (the scheduler holds a weak reference to it).
    pub fn commit(&self, event_id: u64) {
        // SAFETY: a live scheduler from `scheduler_new`, not yet deleted.
        unsafe { envoy_dynamic_module_callback_http_filter_scheduler_commit(self.0, event_id) }
    }

    /// Gives the scheduler back to Envoy (a scheduler dropped without it is leaked, never
    /// used again).
    pub fn delete(self) {
        // SAFETY: a live scheduler from `scheduler_new`; `self` is consumed, so once.
        unsafe { envoy_dynamic_module_callback_http_filter_scheduler_delete(self.0) }
    }
}
