//! The Envoy configurations the benchmark runs: the backend (three
//! direct_response listeners) and the front Envoy of each config, whose HTTP
//! filters (and, for native, its cluster's policy) are all that differ.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use support::bootstrap::{
    bootstrap, direct_response, http_connection_manager, listener, native_lb_policy,
    override_host_policy, override_host_statuses, route, socket, static_cluster, wasm_filter,
};
use support::eds::Endpoint;

use crate::{Knobs, BACKEND_ADMIN, BACKEND_PORTS, OVERRIDE_HEADER};

/// The 3-address list serving-picker sends, rotated by one per request as
/// its picks rotate, so that every config spreads over the same backends.
pub const OVERRIDE_ROTATIONS: [&str; 3] = [
    "127.0.0.1:21081,127.0.0.1:21082,127.0.0.1:21083",
    "127.0.0.1:21082,127.0.0.1:21083,127.0.0.1:21081",
    "127.0.0.1:21083,127.0.0.1:21081,127.0.0.1:21082",
];

/// The modules as copied into the work dir at the start: a rebuild while the
/// benchmark runs cannot put two different modules into one run's rounds.
pub struct Modules {
    pub sp_wasm: PathBuf,
    pub noop_wasm: PathBuf,
    pub native_dir: PathBuf,
}

/// The backend Envoy: three direct_response listeners.
pub fn backend_bootstrap() -> Value {
    let listeners = BACKEND_PORTS
        .iter()
        .map(|p| {
            listener(
                &format!("backend_{p}"),
                *p,
                http_connection_manager(
                    &format!("backend_{p}"),
                    vec![direct_response("/", &format!("ok {p}\n"))],
                    Vec::new(),
                    json!({}),
                ),
            )
        })
        .collect();
    bootstrap("bench-e2e-backend", BACKEND_ADMIN, listeners, Vec::new())
}

/// `BENCH_STACK` copies of a wasm filter, each its own plugin on the one VM.
pub fn wasm_stack(k: &Knobs, name: &str, module: &Path, config: Option<&str>) -> Vec<Value> {
    (1..=k.stack)
        .map(|i| wasm_filter(name, Some(&format!("copy{i}")), module, config))
        .collect()
}

/// A native filter setting the override header from the filter state the
/// no-op probe wrote (wasm.sp_override), after removing the client's.
pub fn header_from_state() -> Value {
    json!({
        "name": "envoy.filters.http.header_mutation",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
            "mutations": {"request_mutations": [
                {"remove": OVERRIDE_HEADER},
                {"append": {
                    "header": {"key": OVERRIDE_HEADER, "value": "%FILTER_STATE(wasm.sp_override:PLAIN)%"},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"
                }}
            ]}
        }
    })
}

/// The front Envoy of config `c` on `port`/`admin`: only its HTTP filters (and
/// for native, the cluster's policy) differ between the configs.
pub fn front_bootstrap(k: &Knobs, m: &Modules, c: &str, port: u16, admin: u16) -> Value {
    let noop = |config: String| wasm_stack(k, "noop_filter", &m.noop_wasm, Some(&config));
    let first = OVERRIDE_ROTATIONS[0];
    let filters = match c {
        "noop" => wasm_stack(k, "noop_filter", &m.noop_wasm, None),
        "serving-picker" => wasm_stack(k, "serving_picker", &m.sp_wasm, Some(&k.sp_config)),
        "probe-property" => noop(format!(
            r#"{{"probe_property": {}, "probe_path": "{}"}}"#,
            k.probe, k.probe_path
        )),
        "probe-replace" => noop(format!(r#"{{"probe_replace": {}}}"#, k.probe)),
        "override-header" => noop(format!(r#"{{"probe_override": "{first}"}}"#)),
        "override-read" => noop(format!(
            r#"{{"probe_property": 1, "probe_path": "{}", "probe_override": "{first}"}}"#,
            k.probe_path
        )),
        "override-state" => {
            let mut f = noop(format!(
                r#"{{"probe_state": 1, "probe_override": "{first}"}}"#
            ));
            f.push(header_from_state());
            f
        }
        _ => Vec::new(),
    };
    let endpoints = BACKEND_PORTS
        .iter()
        .map(|p| Endpoint::serving(SocketAddr::from(([127, 0, 0, 1], *p))).to_lb_endpoint())
        .collect();
    let mut backend = static_cluster("backend", endpoints);
    if c == "native" {
        backend["load_balancing_policy"] = native_lb_policy("{}");
    } else {
        backend["common_lb_config"] = override_host_statuses();
        backend["load_balancing_policy"] = override_host_policy(OVERRIDE_HEADER);
    }
    let admin_cluster = static_cluster(
        "envoy_admin",
        vec![json!({"endpoint": {"address": socket(admin)}})],
    );
    let hcm = http_connection_manager("ingress", vec![route("/", "backend")], filters, json!({}));
    bootstrap(
        "bench-e2e-front",
        admin,
        vec![listener("main", port, hcm)],
        vec![backend, admin_cluster],
    )
}

/// wrk's script for override-client: the client sends the override header,
/// a different rotation on each request (built in init(), once wrk knows the
/// Host header).
pub fn override_client_lua() -> String {
    let mut s = String::from("local requests = {}\nfunction init(args)\n");
    for v in OVERRIDE_ROTATIONS {
        let _ = writeln!(
            s,
            "  table.insert(requests, wrk.format(nil, nil, {{[\"{OVERRIDE_HEADER}\"] = \"{v}\"}}))"
        );
    }
    s.push_str(
        "end\nlocal n = 0\nrequest = function() n = n % #requests + 1; return requests[n] end\n",
    );
    s
}
