//! The stream-drain HTTP filter's hooks (`envoy_dynamic_module_on_http_filter_*`), and only
//! them: each checks its pointers, catches any panic and hands over to `http_filter` (what a
//! stream is and how it ends) and `drain` (the board of open streams). Envoy looks up every
//! hook of its HTTP filter ABI when the filter is configured (the ones for callouts and
//! watermarks the filter does not use answer nothing).
//!
//! A stream is tracked when its response starts (the upstream host is known then) on a
//! cluster whose serving_picker policy sets `drain_window_ms`, and leaves the board when its
//! response ends, when it completes, or when its filter is destroyed. The timer thread
//! (`drain::start_timer`) commits an event to a due stream's scheduler; Envoy runs
//! `on_http_filter_scheduled` on the stream's worker, which ends it
//! (`http_filter::end_stream`) as its last act: Envoy may destroy the filter during that call.

// Envoy finds the hooks by their unmangled names (`#[no_mangle]`).
#![allow(unsafe_code)]

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serving_picker_core::drain::OpenStream;

use crate::abi::{self, EnvoyBuffer, EnvoyPtr, HttpConfigHandle, HttpFilter, ModulePtr};
use crate::drain::{self, Opened};
use crate::envoy_host;
use crate::hooks::guarded;
use crate::http_filter::{
    self, parse_config, protocol_of, DrainCounter, Protocol, Stream, FILTER_NAME,
    OPEN_STREAMS_GAUGE,
};
use crate::policy::Level;

/// `Continue`, the answer of every header, body and trailer hook (each status enum's 0).
const CONTINUE: u32 = 0;

/// Stream ids: the board's keys, the scheduler's event ids, the deadline's spread key.
static NEXT_STREAM: AtomicU64 = AtomicU64::new(1);

/// The filter configuration: its counters' and gauge's ids.
pub struct DrainFilterConfig {
    counters: [Option<usize>; DrainCounter::ALL.len()],
    open_streams: Option<usize>,
}

/// One stream's filter.
pub struct DrainFilter {
    config: Arc<DrainFilterConfig>,
    id: u64,
    protocol: Cell<Protocol>,
    tracked: Cell<bool>,
}

impl DrainFilter {
    fn count(&self, envoy: HttpFilter, counter: DrainCounter) {
        if let Some(Some(id)) = self.config.counters.get(counter.index()) {
            envoy.increment_counter(*id, 1);
        }
    }

    fn show_open(&self, envoy: HttpFilter, open: usize) {
        if let Some(id) = self.config.open_streams {
            envoy.set_gauge(id, open as u64);
        }
    }

    /// The response started: tracked if its cluster drains streams.
    fn response_started(&self, envoy: HttpFilter) {
        let stream = EnvoyStream(envoy);
        let (Some(cluster), Some(address)) = (stream.cluster(), stream.upstream_address()) else {
            return;
        };
        let mut board = drain::board();
        if !board.configured(&cluster) {
            return;
        }
        let Some(scheduler) = envoy.scheduler() else {
            return;
        };
        let draining = board.draining(&cluster, &address);
        let (opened, back) = board.open(
            self.id,
            OpenStream {
                cluster,
                address,
                opened_ms: drain::now_ms(),
                spread_key: self.id,
            },
            scheduler,
        );
        if let Some(scheduler) = back {
            scheduler.delete();
        }
        let open = board.len();
        drop(board);
        self.show_open(envoy, open);
        match opened {
            Opened::Tracked => {
                self.tracked.set(true);
                if draining {
                    drain::nudge();
                }
            }
            Opened::Full => self.count(envoy, DrainCounter::Untracked),
            Opened::NotConfigured => {}
        }
    }

    /// The stream leaves the board (its scheduler is deleted); the gauge shows it when Envoy's
    /// filter is at hand (not in `destroy`, which follows `stream_complete`).
    fn done(&self, envoy: Option<HttpFilter>) {
        if self.tracked.replace(false) {
            // Deleted under the board's lock: the timer commits under it too.
            let mut board = drain::board();
            if let Some(scheduler) = board.close(self.id) {
                scheduler.delete();
            }
            let open = board.len();
            drop(board);
            if let Some(envoy) = envoy {
                self.show_open(envoy, open);
            }
        }
    }
}

/// Envoy's side of one stream, for `http_filter`.
struct EnvoyStream(HttpFilter);

impl Stream for EnvoyStream {
    fn request_header(&self, name: &str) -> Option<String> {
        self.0.request_header(name)
    }
    fn http_version(&self) -> Option<String> {
        self.0.http_version()
    }
    fn cluster(&self) -> Option<String> {
        self.0.cluster_name()
    }
    fn upstream_address(&self) -> Option<String> {
        self.0.upstream_address()
    }
    fn send_trailers(&self, trailers: &[(&str, &str)]) {
        self.0.send_trailers(trailers)
    }
    fn reset(&self) {
        self.0.reset(http_filter::RESET_DETAILS)
    }
}

/// A refused configuration (another filter name, a key) is answered with null, which makes
/// Envoy reject the listener's configuration.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy: EnvoyPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> ModulePtr {
    guarded("on_http_filter_config_new", abi::NO_MODULE, || {
        let Some(handle) = HttpConfigHandle::new(config_envoy) else {
            envoy_host::log(Level::Error, "serving_picker: no filter config from Envoy");
            return abi::NO_MODULE;
        };
        // SAFETY: Envoy's buffers are valid for this call.
        let (name, raw) = unsafe { (name.bytes(), config.bytes()) };
        if name != FILTER_NAME.as_bytes() {
            envoy_host::log(
                Level::Error,
                &format!(
                    "serving_picker: filter_name {:?} refused: this module's HTTP filter is {FILTER_NAME:?}",
                    String::from_utf8_lossy(name)
                ),
            );
            return abi::NO_MODULE;
        }
        if let Err(e) = parse_config(raw) {
            envoy_host::log(
                Level::Error,
                &format!("serving_picker: {FILTER_NAME} filter_config refused: {e}"),
            );
            return abi::NO_MODULE;
        }
        let mut counters = [None; DrainCounter::ALL.len()];
        for c in DrainCounter::ALL {
            let id = handle.define_counter(c.name());
            if id.is_none() {
                envoy_host::log(
                    Level::Warn,
                    &format!("serving_picker: could not define metric {}", c.name()),
                );
            }
            if let Some(slot) = counters.get_mut(c.index()) {
                *slot = id;
            }
        }
        let open_streams = handle.define_gauge(OPEN_STREAMS_GAUGE);
        if open_streams.is_none() {
            envoy_host::log(
                Level::Warn,
                &format!("serving_picker: could not define metric {OPEN_STREAMS_GAUGE}"),
            );
        }
        if let Err(e) = drain::start_timer() {
            envoy_host::log(
                Level::Error,
                &format!(
                    "serving_picker: {FILTER_NAME}: the drain timer thread did not start ({e}): no stream is ended early"
                ),
            );
        }
        envoy_host::log(
            Level::Info,
            &format!(
                "serving_picker: {FILTER_NAME} configured: streams on clusters whose serving_picker policy sets drain_window_ms end within the window when their host drains"
            ),
        );
        abi::share(Arc::new(DrainFilterConfig {
            counters,
            open_streams,
        }))
    })
}

/// # Safety
/// Envoy passes a configuration from config_new, once.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: ModulePtr) {
    guarded("on_http_filter_config_destroy", (), || {
        // SAFETY: made by config_new with `share`; filters hold their own references.
        unsafe { abi::release_shared::<DrainFilterConfig>(config) }
    })
}

/// # Safety
/// Envoy passes a configuration from config_new (or null) and its filter (checked here).
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: ModulePtr,
    filter_envoy: EnvoyPtr,
) -> ModulePtr {
    guarded("on_http_filter_new", abi::NO_MODULE, || {
        if filter_envoy.is_null() {
            return abi::NO_MODULE;
        }
        // SAFETY: made by config_new with `share`, alive until config_destroy.
        let Some(config) = (unsafe { abi::shared::<DrainFilterConfig>(config) }) else {
            return abi::NO_MODULE;
        };
        abi::own(Box::new(DrainFilter {
            config,
            id: NEXT_STREAM.fetch_add(1, Ordering::Relaxed),
            protocol: Cell::new(Protocol::Http2),
            tracked: Cell::new(false),
        }))
    })
}

/// The module's filter and Envoy's, both non-null, or `None`.
///
/// # Safety
/// `module` is null or a live filter from filter_new, used on its worker only.
unsafe fn filter<'a>(envoy: EnvoyPtr, module: ModulePtr) -> Option<(HttpFilter, &'a DrainFilter)> {
    let envoy = HttpFilter::new(envoy)?;
    // SAFETY: the caller vouches for `module`.
    let filter = unsafe { abi::owned::<DrainFilter>(module) }?;
    Some((envoy, filter))
}

/// # Safety
/// Envoy passes its filter and this module's filter from filter_new (checked for null).
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    envoy: EnvoyPtr,
    module: ModulePtr,
    _end_of_stream: bool,
) -> u32 {
    guarded("on_http_filter_request_headers", CONTINUE, || {
        // SAFETY: as the hook's contract says.
        if let Some((envoy, f)) = unsafe { filter(envoy, module) } {
            f.protocol.set(protocol_of(&EnvoyStream(envoy)));
        }
        CONTINUE
    })
}

/// # Safety
/// Envoy passes its filter and this module's filter from filter_new (checked for null).
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    envoy: EnvoyPtr,
    module: ModulePtr,
    end_of_stream: bool,
) -> u32 {
    guarded("on_http_filter_response_headers", CONTINUE, || {
        if end_of_stream {
            return CONTINUE;
        }
        // SAFETY: as the hook's contract says.
        if let Some((envoy, f)) = unsafe { filter(envoy, module) } {
            f.response_started(envoy);
        }
        CONTINUE
    })
}

/// # Safety
/// Envoy passes its filter and this module's filter from filter_new (checked for null).
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    envoy: EnvoyPtr,
    module: ModulePtr,
    end_of_stream: bool,
) -> u32 {
    guarded("on_http_filter_response_body", CONTINUE, || {
        if end_of_stream {
            // SAFETY: as the hook's contract says.
            if let Some((envoy, f)) = unsafe { filter(envoy, module) } {
                f.done(Some(envoy));
            }
        }
        CONTINUE
    })
}

/// # Safety
/// Envoy passes its filter and this module's filter from filter_new (checked for null).
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    envoy: EnvoyPtr,
    module: ModulePtr,
) -> u32 {
    guarded("on_http_filter_response_trailers", CONTINUE, || {
        // SAFETY: as the hook's contract says.
        if let Some((envoy, f)) = unsafe { filter(envoy, module) } {
            f.done(Some(envoy));
        }
        CONTINUE
    })
}

/// # Safety
/// Envoy passes its filter and this module's filter from filter_new (checked for null).
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    envoy: EnvoyPtr,
    module: ModulePtr,
) {
    guarded("on_http_filter_stream_complete", (), || {
        // SAFETY: as the hook's contract says.
        if let Some((envoy, f)) = unsafe { filter(envoy, module) } {
            f.done(Some(envoy));
        }
    })
}

/// # Safety
/// Envoy passes a filter from filter_new, once.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module: ModulePtr) {
    guarded("on_http_filter_destroy", (), || {
        // SAFETY: a live filter from filter_new (or null).
        if let Some(f) = unsafe { abi::owned::<DrainFilter>(module) } {
            f.done(None);
        }
        // SAFETY: made by filter_new with `own`; Envoy destroys it once.
        unsafe { abi::release_owned::<DrainFilter>(module) }
    })
}

/// The timer woke this stream: its deadline has come. It leaves the board, is counted, and
/// is ended, the last thing this hook does (Envoy may destroy the filter meanwhile).
///
/// # Safety
/// Envoy passes its filter and this module's filter from filter_new (checked for null).
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    envoy: EnvoyPtr,
    module: ModulePtr,
    event_id: u64,
) {
    guarded("on_http_filter_scheduled", (), || {
        // SAFETY: as the hook's contract says.
        let Some((envoy, f)) = (unsafe { filter(envoy, module) }) else {
            return;
        };
        if event_id != f.id || !f.tracked.get() {
            return;
        }
        f.done(Some(envoy));
        let protocol = f.protocol.get();
        f.count(envoy, DrainCounter::ended(protocol, protocol.end()));
        // The filter is not touched after this call.
        http_filter::end_stream(&EnvoyStream(envoy), protocol);
    })
}

/// Request bodies pass.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    _envoy: EnvoyPtr,
    _module: ModulePtr,
    _end_of_stream: bool,
) -> u32 {
    CONTINUE
}

/// Request trailers pass.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _envoy: EnvoyPtr,
    _module: ModulePtr,
) -> u32 {
    CONTINUE
}

// Hooks Envoy requires of every HTTP filter module; the drain filter makes no callouts and
// does not watch the downstream's buffer, so they never fire for it.

/// Unused: the filter makes no HTTP callouts.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _envoy: EnvoyPtr,
    _module: ModulePtr,
    _callout_id: u64,
    _result: u32,
    _headers: *const std::ffi::c_void,
    _headers_size: usize,
    _body: *const std::ffi::c_void,
    _body_size: usize,
) {
}

/// Unused: the filter opens no HTTP streams.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _envoy: EnvoyPtr,
    _module: ModulePtr,
    _stream_id: u64,
    _headers: *const std::ffi::c_void,
    _headers_size: usize,
    _end_stream: bool,
) {
}

/// Unused: the filter opens no HTTP streams.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _envoy: EnvoyPtr,
    _module: ModulePtr,
    _stream_id: u64,
    _data: *const std::ffi::c_void,
    _data_count: usize,
    _end_stream: bool,
) {
}

/// Unused: the filter opens no HTTP streams.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _envoy: EnvoyPtr,
    _module: ModulePtr,
    _stream_id: u64,
    _trailers: *const std::ffi::c_void,
    _trailers_size: usize,
) {
}

/// Unused: the filter opens no HTTP streams.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _envoy: EnvoyPtr,
    _module: ModulePtr,
    _stream_id: u64,
) {
}

/// Unused: the filter opens no HTTP streams.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _envoy: EnvoyPtr,
    _module: ModulePtr,
    _stream_id: u64,
    _reason: u32,
) {
}

/// Unused: the filter is not terminal.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _envoy: EnvoyPtr,
    _module: ModulePtr,
) {
}

/// Unused: the filter is not terminal.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _envoy: EnvoyPtr,
    _module: ModulePtr,
) {
}
