//! A proxy-wasm HTTP filter that does nothing: every HTTP context returns
//! `Action::Continue`. Used by `benches/e2e/run.sh` to measure the fixed cost
//! of running any wasm filter in Envoy, so that the serving-picker module can
//! be compared against it rather than only against a plain Envoy.
//!
//! The host-call probe (`BENCH_PROBE=N` in run.sh): with the configuration
//! `{"probe_property": N}` each request reads `xds.cluster_name` N times, with
//! `{"probe_replace": N}` it replaces a request header N times. The two host
//! calls serving-picker makes per request then cost N times over, which
//! stands out of this VM's noise: their per-call cost is the CPU per request
//! over the plain no-op's, divided by N. Without a configuration (the floor)
//! nothing of this runs.
//!
//! The override probe (`BENCH_DECOMPOSE=1` in run.sh): with
//! `{"probe_override": "ADDR,ADDR,..."}` each request gets the override header
//! set once, to that list rotated by one address per request (as serving-picker
//! rotates its picks, so that requests spread over the same backends). That is
//! everything serving-picker makes Envoy do per request except its decision:
//! the header write, the route match Envoy repeats because a wasm filter
//! changed request headers, the override LB policy reading the list, and the
//! header going upstream. Add `"probe_property": 1` for the decision's host
//! call too (the cluster-name read). With
//! `"probe_state": 1` as well, the list goes to filter state
//! (`wasm.sp_override`) instead, for a native header_mutation filter to copy
//! into the header: the way around the route re-match, measured slower.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(NoopRoot) });
}}

/// Host calls per request (0: none, the plain no-op). Statics, so that the
/// HTTP context stays zero-sized and its Box allocates nothing, as before.
static PROBE_PROPERTY: AtomicU32 = AtomicU32::new(0);
static PROBE_REPLACE: AtomicU32 = AtomicU32::new(0);
static PROBE_MISSED: AtomicBool = AtomicBool::new(false);
/// The header serving-picker sets (its default `override_header`).
const OVERRIDE_HEADER: &str = "x-gateway-destination-endpoint";

thread_local! {
    /// The override probe's header values, one per rotation of the list (empty: off).
    static PROBE_OVERRIDE: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    static PROBE_OVERRIDE_NEXT: RefCell<usize> = const { RefCell::new(0) };
    /// The property the probe reads (dotted; default `xds.cluster_name`).
    static PROBE_PATH: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    /// Write the override list to filter state (`wasm.sp_override`) instead of the header.
    static PROBE_STATE: RefCell<bool> = const { RefCell::new(false) };
}

/// Every rotation of a comma-separated list: "a,b,c" -> ["a,b,c", "b,c,a", "c,a,b"].
fn rotations(list: &str) -> Vec<String> {
    if list.is_empty() {
        return Vec::new();
    }
    let items: Vec<&str> = list.split(',').collect();
    (0..items.len())
        .map(|k| [&items[k..], &items[..k]].concat().join(","))
        .collect()
}

/// The number after `"key":` in a flat JSON object, if any.
fn number_after(text: &str, key: &str) -> u32 {
    let Some(at) = text.find(&format!("\"{key}\"")) else {
        return 0;
    };
    let rest = &text[at + key.len() + 2..];
    let digits: String = rest
        .trim_start_matches([':', ' '])
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap_or(0)
}

/// The string after `"key":` in a flat JSON object (no escapes), if any.
fn string_after(text: &str, key: &str) -> String {
    let Some(at) = text.find(&format!("\"{key}\"")) else {
        return String::new();
    };
    let rest = text[at + key.len() + 2..].trim_start_matches([':', ' ']);
    let Some(value) = rest.strip_prefix('"') else {
        return String::new();
    };
    value.split('"').next().unwrap_or_default().to_string()
}

struct NoopRoot;

impl Context for NoopRoot {}

impl RootContext for NoopRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let config = self.get_plugin_configuration().unwrap_or_default();
        let text = String::from_utf8_lossy(&config);
        PROBE_PROPERTY.store(number_after(&text, "probe_property"), Relaxed);
        PROBE_REPLACE.store(number_after(&text, "probe_replace"), Relaxed);
        PROBE_OVERRIDE
            .with(|v| *v.borrow_mut() = rotations(&string_after(&text, "probe_override")));
        PROBE_STATE.with(|v| *v.borrow_mut() = number_after(&text, "probe_state") == 1);
        let path = string_after(&text, "probe_path");
        let path = if path.is_empty() {
            "xds.cluster_name".to_string()
        } else {
            path
        };
        PROBE_PATH.with(|v| *v.borrow_mut() = path.split('.').map(str::to_string).collect());
        true
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(NoopHttp))
    }
}

struct NoopHttp;

impl Context for NoopHttp {}

impl HttpContext for NoopHttp {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        for _ in 0..PROBE_PROPERTY.load(Relaxed) {
            // A property Envoy does not have returns at once: that would cost nothing.
            let found = PROBE_PATH.with(|path| {
                let path = path.borrow();
                self.get_property(path.iter().map(String::as_str).collect())
                    .is_some()
            });
            if !found {
                if !PROBE_MISSED.swap(true, Relaxed) {
                    let _ = proxy_wasm::hostcalls::log(
                        LogLevel::Critical,
                        "probe: the property read found nothing",
                    );
                }
                break;
            }
        }
        for _ in 0..PROBE_REPLACE.load(Relaxed) {
            self.set_http_request_header("x-sp-probe", Some("127.0.0.1:21081"));
        }
        PROBE_OVERRIDE.with(|values| {
            let values = values.borrow();
            if !values.is_empty() {
                let k = PROBE_OVERRIDE_NEXT.with(|n| {
                    let k = *n.borrow() % values.len();
                    *n.borrow_mut() = k + 1;
                    k
                });
                if PROBE_STATE.with(|v| *v.borrow()) {
                    self.set_property(vec!["sp_override"], Some(values[k].as_bytes()));
                } else {
                    self.set_http_request_header(OVERRIDE_HEADER, Some(values[k].as_str()));
                }
            }
        });
        Action::Continue
    }
}
