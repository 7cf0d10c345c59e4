//! A proxy-wasm HTTP filter that does nothing: every HTTP context returns
//! `Action::Continue`. Used by `make bench-e2e` to measure the fixed cost
//! of running any wasm filter in Envoy, so that the serving-picker module can
//! be compared against it rather than only against a plain Envoy.
//!
//! The host-call probe (`BENCH_PROBE=N` of `make bench-e2e`): with the configuration
//! `{"probe_property": N}` each request reads `xds.cluster_name` N times, with
//! `{"probe_replace": N}` it replaces a request header N times. The two host
//! calls serving-picker makes per request then cost N times over, which
//! stands out of this VM's noise: their per-call cost is the CPU per request
//! over the plain no-op's, divided by N. Without a configuration (the floor)
//! nothing of this runs.
//!
//! The override probe (`BENCH_DECOMPOSE=1` of `make bench-e2e`): with
//! `{"probe_override": "ADDR,ADDR,..."}` each request gets the override header
//! set once, to that list rotated by one address per request (as serving-picker
//! rotates its picks, so that requests spread over the same backends). That is
//! everything serving-picker makes Envoy do per request except its decision:
//! the header write, the route match Envoy repeats because a wasm filter
//! changed request headers, the override LB policy reading the list, and the
//! header going upstream. Add `"probe_property": 1` for the decision's host
//! call too (the cluster-name read; `"probe_path"` reads another property).
//! With `"probe_state": 1` the list goes to filter state (`wasm.sp_override`)
//! instead, for a native header_mutation filter to copy into the header: the
//! way around the route re-match, measured slower.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(NoopRoot) });
}}

/// The probe configuration, parsed once in `on_configure`. The default (no
/// configuration) makes no host call: the floor.
#[derive(Default)]
struct Probe {
    /// `xds.cluster_name` (or `path`) reads per request.
    property_reads: u32,
    /// The property read, as path components.
    path: Vec<String>,
    /// Header replaces per request.
    replaces: u32,
    /// The override header's values, one per rotation of the list (empty: off).
    overrides: Vec<String>,
    /// Write the override list to filter state (`wasm.sp_override`) instead.
    override_to_state: bool,
}

thread_local! {
    static PROBE: RefCell<Probe> = RefCell::new(Probe::default());
    /// Which rotation of the override list the next request gets.
    static NEXT_OVERRIDE: Cell<usize> = const { Cell::new(0) };
}
static PROBE_MISSED: AtomicBool = AtomicBool::new(false);
/// The header serving-picker sets (its default `override_header`).
const OVERRIDE_HEADER: &str = "x-gateway-destination-endpoint";

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

impl Probe {
    fn parse(text: &str) -> Probe {
        let path = string_after(text, "probe_path");
        let path = if path.is_empty() {
            "xds.cluster_name"
        } else {
            &path
        };
        Probe {
            property_reads: number_after(text, "probe_property"),
            path: path.split('.').map(str::to_string).collect(),
            replaces: number_after(text, "probe_replace"),
            overrides: rotations(&string_after(text, "probe_override")),
            override_to_state: number_after(text, "probe_state") == 1,
        }
    }
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
        PROBE.with(|p| *p.borrow_mut() = Probe::parse(&text));
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
        PROBE.with(|probe| {
            let probe = probe.borrow();
            for _ in 0..probe.property_reads {
                let path = probe.path.iter().map(String::as_str).collect();
                // A property Envoy does not have returns at once: that would cost nothing.
                if self.get_property(path).is_none() {
                    if !PROBE_MISSED.swap(true, Relaxed) {
                        let _ = proxy_wasm::hostcalls::log(
                            LogLevel::Critical,
                            "probe: the property read found nothing",
                        );
                    }
                    break;
                }
            }
            for _ in 0..probe.replaces {
                self.set_http_request_header("x-sp-probe", Some("127.0.0.1:21081"));
            }
            if !probe.overrides.is_empty() {
                let k = NEXT_OVERRIDE.with(|n| {
                    let k = n.get() % probe.overrides.len();
                    n.set(k + 1);
                    k
                });
                let value = probe.overrides[k].as_str();
                if probe.override_to_state {
                    self.set_property(vec!["sp_override"], Some(value.as_bytes()));
                } else {
                    self.set_http_request_header(OVERRIDE_HEADER, Some(value));
                }
            }
        });
        Action::Continue
    }
}
