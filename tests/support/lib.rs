//! The harness of every real-Envoy run (crate `serving-picker-harness`, lib
//! `support`): real backends, a real Envoy with the real serving_picker.wasm
//! or native module, EDS files Envoy watches, the companion, paced load, and
//! a tiny HTTP client.
//!
//! The end-to-end test binary (`tests/e2e/`), the benchmarks (`benches/`)
//! and the demo's backends (`bin/demo_backends.rs`) use it as `support`.
// Test harness: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// Test machinery that ships nowhere: each file's `//!` says its job; its
// items are read beside the tests that call them (CONTRIBUTING.md, lints).
#![allow(missing_docs)]

pub mod admin_stub;
pub mod backend;
pub mod bootstrap;
pub mod companion;
pub mod cpu;
pub mod drain_setups;
pub mod eds;
pub mod envoy;
pub mod http;
pub mod load;
pub mod mtls;
pub mod ports;
pub mod process;
pub mod scenario;
pub mod streams;
pub mod test_binary;
pub mod tweak;

#[cfg(test)]
mod layout;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

pub use backend::Backend;
pub use eds::Endpoint;
pub use envoy::{Envoy, EnvoyBuilder, Form};
/// The tests' certificates (crate `serving-picker-pki`), as `support::pki`.
pub use pki;

thread_local! {
    /// The form of the Envoy this thread queried last (`Envoy::get` sets it):
    /// what the routing predicates below check a response against.
    static CURRENT_FORM: std::cell::Cell<Form> = const { std::cell::Cell::new(Form::Wasm) };
}

/// For each scenario `fn name(form: Form)`, a module `name` with the tests
/// `wasm` and `native` (run as `name::wasm`, `name::native`): every scenario
/// that applies to both forms runs against both.
#[macro_export]
macro_rules! both_forms {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn wasm() {
                    super::$name($crate::Form::Wasm)
                }
                #[test]
                fn native() {
                    super::$name($crate::Form::Native)
                }
            }
        )*
    };
}

/// `name { Scenario fields }` rows (`scenario::Scenario`): a `fn name(form)`
/// running that scenario, and its tests `name::wasm` and `name::native`.
#[macro_export]
macro_rules! scenarios {
    ($($(#[$attr:meta])* $fn:ident { $($field:ident: $value:expr),* $(,)? })*) => {
        $(
            $(#[$attr])*
            fn $fn(form: $crate::Form) {
                const SCENARIO: $crate::scenario::Scenario =
                    $crate::scenario::Scenario { $($field: $value),* };
                SCENARIO.run(form);
            }
        )*
        $crate::both_forms!($($fn),*);
    };
}

/// The repository's root (this crate is its `tests/support/` folder): where
/// the default paths of Envoy, the modules and the shipped configs start.
pub fn repo_root() -> &'static std::path::Path {
    let support = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    support.ancestors().nth(2).unwrap_or(support)
}

/// The build identity the shipped artefacts must name, `0.1.0 (commit …)`
/// (`serving_picker_core::build_info`): the workspace version and the commit
/// in SERVING_PICKER_COMMIT (the Makefile exports the one it builds them with;
/// test-release passes the images' revision label), else the tree's own
/// (`scripts/version.sh commit`).
pub fn expected_build_identity() -> String {
    let commit = std::env::var("SERVING_PICKER_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| {
            let out = std::process::Command::new(repo_root().join("scripts/version.sh"))
                .arg("commit")
                .output()
                .unwrap();
            assert!(out.status.success(), "scripts/version.sh commit: {out:?}");
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        });
    format!("{} (commit {commit})", env!("CARGO_PKG_VERSION"))
}

pub fn set_current_form(form: Form) {
    CURRENT_FORM.with(|f| f.set(form));
}

pub fn current_form() -> Form {
    CURRENT_FORM.with(|f| f.get())
}
pub use http::Response;

/// Header the filter sets (and the cluster's override_host policy reads).
pub const OVERRIDE_HEADER: &str = "x-gateway-destination-endpoint";
/// Response header every backend adds: its name.
pub const BACKEND_HEADER: &str = "x-backend";
/// Response header every backend adds: the value(s) of OVERRIDE_HEADER it
/// received on that request, joined with ","; "-" when it received none.
pub const SAW_OVERRIDE_HEADER: &str = "x-backend-saw-override";

/// How long to wait for the expected routing to set in.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between two polling requests.
pub const POLL_EVERY: Duration = Duration::from_millis(50);
/// Consecutive good answers that end the polling.
pub const CONSECUTIVE: usize = 10;
/// Size of the batch asserted once the routing has settled.
pub const BATCH: usize = 40;

/// Whether `lines` (a warning a poller logs once: a refresh failure, the
/// gate going off) came at most once from each thread, and from no more
/// threads than there were pollers: the first, plus one per handover from a
/// worker that won the lease at start-up to the main thread's context.
pub fn once_per_poller(envoy: &Envoy, lines: &[String]) -> bool {
    // `[time][thread id][level]...`
    let thread = |line: &String| line.split('[').nth(2).map(str::to_string);
    let threads: std::collections::BTreeSet<String> = lines.iter().filter_map(thread).collect();
    let handovers = envoy.log_lines("an idle context takes over").len();
    !lines.is_empty() && lines.len() == threads.len() && threads.len() <= 1 + handovers
}

/// The plugin configuration tests use, with `extra` keys merged in
/// (`extra` must be a JSON object or null). Requests before the first
/// snapshot are held (`before_first_snapshot: hold`, not the default), so
/// that a test that counts every request since Envoy's start sees only the
/// filter's picks; the tests of the other modes say so.
pub fn plugin_config(extra: serde_json::Value) -> String {
    let mut cfg = serde_json::json!({"refresh_interval_ms": 100, "before_first_snapshot": "hold"});
    if let (Some(obj), Some(extra)) = (cfg.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            obj.insert(k.clone(), v.clone());
        }
    }
    cfg.to_string()
}

/// One line that says what a response was, for tallies and failure messages.
pub fn label(r: &Response) -> String {
    if r.status == 0 {
        return format!("transport error: {}", r.body);
    }
    match r.header(BACKEND_HEADER) {
        Some(b) if r.status == 200 => b.to_string(),
        Some(b) => format!("{} from {}", r.status, b),
        None => {
            let picker = r.header("x-serving-picker").unwrap_or("-");
            let body: String = r.body.chars().take(80).collect();
            format!("{} x-serving-picker={} body={:?}", r.status, picker, body)
        }
    }
}

/// Counts responses by `label`.
pub fn tally(responses: &[Response]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in responses {
        *m.entry(label(r)).or_insert(0) += 1;
    }
    m
}

/// Counts of 200 responses per backend name.
pub fn per_backend(responses: &[Response]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in responses {
        if r.status == 200 {
            if let Some(b) = r.header(BACKEND_HEADER) {
                *m.entry(b.to_string()).or_insert(0) += 1;
            }
        }
    }
    m
}

/// The addresses in an override header value as received by a backend
/// (",", possibly with spaces; "-" = none).
pub fn override_list(saw: &str) -> Vec<String> {
    if saw == "-" {
        return Vec::new();
    }
    saw.split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// A 200 from `backend` that the filter routed there: the backend received
/// the override header with its own address first. The filter may append
/// retry alternates of the same tier; with a single-host tier the value names
/// only the backend's address (repeated, one entry per retry).
pub fn picked(backend: &Backend) -> impl Fn(&Response) -> bool + '_ {
    move |r: &Response| picked_among(r, backend, &[backend])
}

/// A 200 from one of `backends` (one tier) that the filter routed there: the
/// override value starts with the serving backend's address, and any
/// alternates after it are members of `backends` too, each once before any
/// repeats (the filter cycles the tier to give every retry an entry).
pub fn picked_any<'a>(backends: &'a [&'a Backend]) -> impl Fn(&Response) -> bool + 'a {
    move |r: &Response| backends.iter().any(|b| picked_among(r, b, backends))
}

fn picked_among(r: &Response, served: &Backend, tier: &[&Backend]) -> bool {
    if r.status != 200 || r.header(BACKEND_HEADER) != Some(served.name()) {
        return false;
    }
    if current_form() == Form::Native {
        // The module is the cluster's load balancer: no header is involved,
        // and none may reach the backend.
        return r.header(SAW_OVERRIDE_HEADER) == Some("-");
    }
    let Some(saw) = r.header(SAW_OVERRIDE_HEADER) else {
        return false;
    };
    let list = override_list(saw);
    let allowed: Vec<String> = tier.iter().map(|b| b.addr().to_string()).collect();
    // The tier is cycled to give every retry an entry: no host repeats
    // before every host of the tier is listed.
    let mut seen = std::collections::BTreeSet::new();
    list.first() == Some(&served.addr().to_string())
        && list.iter().all(|a| allowed.contains(a))
        && list.iter().take(tier.len()).all(|a| seen.insert(a.clone()))
}

/// A 200 from `b` whose override header (set by the filter) names `b` first
/// (whatever alternates follow).
pub fn filter_routed_to(b: &Backend) -> impl Fn(&Response) -> bool + '_ {
    move |r: &Response| {
        if current_form() == Form::Native {
            return picked_among(r, b, &[b]);
        }
        r.status == 200
            && r.header(BACKEND_HEADER) == Some(b.name())
            && r.header(SAW_OVERRIDE_HEADER)
                .and_then(|v| v.split(',').next())
                == Some(b.addr().to_string().as_str())
    }
}

/// A 200 that Envoy's own load balancer routed: no override header reached
/// the backend (the filter neither set it nor let the client's through).
pub fn passed_through(r: &Response) -> bool {
    r.status == 200
        && r.header(BACKEND_HEADER).is_some()
        && r.header(SAW_OVERRIDE_HEADER) == Some("-")
}

/// A 200 from `backend`, however it got there.
pub fn served_by(backend: &Backend) -> impl Fn(&Response) -> bool + '_ {
    move |r: &Response| r.status == 200 && r.header(BACKEND_HEADER) == Some(backend.name())
}

/// The filter's local reply for a cluster without any serving host.
pub fn no_serving_503(cluster: &str) -> impl Fn(&Response) -> bool + '_ {
    move |r: &Response| {
        r.status == 503
            && r.header("x-serving-picker") == Some("no-serving-endpoint")
            && r.body.contains("no-serving-endpoint")
            && r.body.contains(cluster)
            && r.header(BACKEND_HEADER).is_none()
    }
}

/// `builder`'s Envoy with the EDS cluster `backend`: A serving, B not.
pub fn a_serving_b_not(builder: EnvoyBuilder) -> (Envoy, Backend, Backend) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let envoy = builder
        .eds_cluster(
            "backend",
            &[Endpoint::serving(a.addr()), Endpoint::not_serving(b.addr())],
        )
        .start();
    (envoy, a, b)
}

/// Sends `n` requests one after the other.
pub fn batch(envoy: &Envoy, path: &str, headers: &[(&str, &str)], n: usize) -> Vec<Response> {
    (0..n).map(|_| envoy.get(path, headers)).collect()
}

/// Polls (one request every POLL_EVERY) until CONSECUTIVE answers in a row
/// satisfy `pred`; panics after SETTLE_TIMEOUT with what was seen.
pub fn settle<F: Fn(&Response) -> bool>(
    envoy: &Envoy,
    path: &str,
    headers: &[(&str, &str)],
    what: &str,
    pred: F,
) {
    settle_for(
        envoy,
        path,
        headers,
        what,
        SETTLE_TIMEOUT,
        CONSECUTIVE,
        pred,
    )
}

pub fn settle_for<F: Fn(&Response) -> bool>(
    envoy: &Envoy,
    path: &str,
    headers: &[(&str, &str)],
    what: &str,
    timeout: Duration,
    consecutive: usize,
    pred: F,
) {
    let start = Instant::now();
    let mut run = 0usize;
    let mut seen: Vec<Response> = Vec::new();
    while start.elapsed() < timeout {
        let r = envoy.get(path, headers);
        let ok = pred(&r);
        seen.push(r);
        if ok {
            run += 1;
            if run >= consecutive {
                return;
            }
        } else {
            run = 0;
        }
        std::thread::sleep(POLL_EVERY);
    }
    let mut msg = format!(
        "routing never settled to: {what}\n  path {path} headers {headers:?}: no {consecutive} good answers in a row within {timeout:?}\n  all {} answers: {:?}\n  last answers:\n",
        seen.len(),
        tally(&seen)
    );
    for r in seen.iter().rev().take(5).rev() {
        let _ = writeln!(msg, "    {}", r.summary());
    }
    panic!("{msg}");
}

/// Sends a batch and asserts every answer satisfies `pred`.
pub fn assert_batch<F: Fn(&Response) -> bool>(
    envoy: &Envoy,
    path: &str,
    headers: &[(&str, &str)],
    n: usize,
    what: &str,
    pred: F,
) -> Vec<Response> {
    let rs = batch(envoy, path, headers, n);
    assert_all(
        &rs,
        &format!("{what}\n  path {path} headers {headers:?}"),
        pred,
    );
    rs
}

/// Asserts that every one of `responses` is `what`; else says how many were
/// not, the tally and the first five.
pub fn assert_all<F: Fn(&Response) -> bool>(responses: &[Response], what: &str, pred: F) {
    let bad: Vec<&Response> = responses.iter().filter(|r| !pred(r)).collect();
    if !bad.is_empty() {
        let mut msg = format!(
            "{} of {} answers were not: {what}\n  tally: {:?}\n  first bad answers:\n",
            bad.len(),
            responses.len(),
            tally(responses)
        );
        for r in bad.iter().take(5) {
            let _ = writeln!(msg, "    {}", r.summary());
        }
        panic!("{msg}");
    }
}

/// settle + assert_batch: the usual shape of a routing assertion.
pub fn expect_routing<F: Fn(&Response) -> bool>(
    envoy: &Envoy,
    path: &str,
    headers: &[(&str, &str)],
    what: &str,
    pred: F,
) -> Vec<Response> {
    settle(envoy, path, headers, what, &pred);
    assert_batch(envoy, path, headers, BATCH, what, &pred)
}

/// Waits until `cond` holds (checked every 20 ms) or panics after `timeout`.
pub fn wait_until<F: FnMut() -> bool>(what: &str, timeout: Duration, cond: F) {
    if !eventually(timeout, cond) {
        panic!("timed out after {timeout:?} waiting for: {what}");
    }
}

/// Whether `cond` holds within `timeout` (checked every 20 ms): for figures
/// that lag (counters handed to Envoy on a tick), asserted afterwards.
pub fn eventually<F: FnMut() -> bool>(timeout: Duration, mut cond: F) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Client-supplied override headers, each a named set: sends `n` requests
/// with each and asserts every answer is `what` despite them.
pub fn assert_despite_each<F: Fn(&Response) -> bool>(
    envoy: &Envoy,
    path: &str,
    variants: &[(&str, Vec<(&str, &str)>)],
    n: usize,
    what: &str,
    pred: F,
) {
    for (variant, headers) in variants {
        assert_batch(
            envoy,
            path,
            headers,
            n,
            &format!("{what} despite {variant}"),
            &pred,
        );
    }
}

/// Asserts that every override value `b` received is its own address: no
/// client's value got through.
pub fn assert_no_foreign_override(b: &Backend) {
    let own = b.addr().to_string();
    let leaked: Vec<String> = b
        .override_values()
        .iter()
        .flat_map(|v| override_list(v))
        .filter(|v| *v != own)
        .collect();
    assert!(
        leaked.is_empty(),
        "{} received client-supplied override values: {leaked:?}",
        b.name()
    );
}
