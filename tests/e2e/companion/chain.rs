//! The chain: EndpointSlice files -> `serving-picker-conditions eds` (the
//! real binary) -> Envoy 1.40 (EDS over gRPC from the companion) ->
//! serving-picker -> real backends.
//!
//! - the seed table's rows, walked through slice changes, on the
//!   companion's default (tiered) output: with the wasm form (ADS), both
//!   forms over mutual TLS (ADS, envoy-companion.yaml's transport socket),
//!   the native form over EDS, and with no module at all, Envoy's round robin
//!   (ADS; and with `--priorities`, plain EDS) and least request (plain
//!   EDS); the flat output with no module, to show what it misroutes;
//! - the seed rows again beside 1,000 xDS streams that never read (half
//!   with a window of 0, half that stop reading), subscribed to the same
//!   cluster and to a 2,000-endpoint one that changes all along: Envoy gets
//!   every change, each stuck stream holds at most one response;
//! - two Envoys on one companion; an Envoy restarted (gets the current
//!   state); the companion killed and restarted (Envoy keeps the last
//!   assignment, then follows the new process); a malformed slice file
//!   (logged, last good state kept);
//! - a companion-fed cluster that CDS updates (Envoy re-creates it): over
//!   ADS it warms from the companion's answer to the repeated ACK; over
//!   delta ADS Envoy asks nothing, and it warms from Envoy's cache at its
//!   initial fetch timeout.
//!
//! "goes to X" with the module: 200 from X, which received the override
//! header naming X first (the filter picked it). With plain round robin:
//! every answer from X.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use serving_picker_xds_load::{open_stuck, raise_fd_limit};

use support::companion::{eds_from_companion, Companion, Expect, Picker, SliceDir, XdsApi};
use support::envoy::fresh_dir;
use support::load::{Load, LoadConfig};
use support::mtls::Mtls;
use support::*;

const CLUSTER: &str = "backend";
const SERVICE: &str = "web";
const PATH: &str = "/backend/x";

fn envoy_on(companion: &Companion, tag: &str, picker: Picker, api: XdsApi) -> Envoy {
    envoy_over(companion, tag, picker, api, None)
}

/// As `envoy_on`, over mutual TLS when `mtls` is given.
fn envoy_over(
    companion: &Companion,
    tag: &str,
    picker: Picker,
    api: XdsApi,
    mtls: Option<&Mtls>,
) -> Envoy {
    let mut b = EnvoyBuilder::new()
        .tag(tag)
        .eds_cluster(CLUSTER, &[])
        .bootstrap_hook(eds_from_companion(companion.listen_addr(), api));
    if let Some(m) = mtls {
        b = b.bootstrap_hook(m.envoy_hook());
    }
    match (picker, picker.plain_policy(CLUSTER)) {
        (Picker::Module(form), _) => b.form(form).start(),
        (_, Some(policy)) => b.with_filter(None).bootstrap_hook(policy).start(),
        (_, None) => unreachable!("a plain picker has a policy"),
    }
}

struct Chain {
    slices: SliceDir,
    companion: Companion,
}

fn chain(first: &[Endpoint], extra: &[&str]) -> Chain {
    let slices = SliceDir::create(&fresh_dir("slices"));
    slices.set_endpoints(SERVICE, first);
    let companion = Companion::start(slices.path(), &[(CLUSTER, SERVICE)], extra);
    Chain { slices, companion }
}

fn expect(envoy: &Envoy, picker: Picker, what: &str, e: Expect<'_>, all: &[&Backend]) {
    support::companion::expect(envoy, picker, (CLUSTER, PATH), what, e, all);
}

/// Distinct assignments `walk_seed_rows` sends, the first included, with
/// the tiered output (steps that change only pods that are not serving
/// change nothing Envoy sees).
const SEED_WALK_ASSIGNMENTS: u64 = 8;

/// Every seed-table row, as a sequence of slice changes on one Envoy.
fn walk_seed_rows(c: &Chain, envoy: &Envoy, picker: Picker, a: &Backend, b: &Backend) {
    let all = [a, b];
    let step = |what: &str, eps: &[Endpoint], e: Expect<'_>| {
        c.slices.set_endpoints(SERVICE, eps);
        eprintln!("step: {what}");
        expect(envoy, picker, what, e, &all);
    };
    step(
        "row 1: A serving -> A",
        &[Endpoint::serving(a.addr())],
        Expect::To(a),
    );
    step(
        "A serving, B not yet serving -> A",
        &[Endpoint::serving(a.addr()), Endpoint::not_serving(b.addr())],
        Expect::To(a),
    );
    step(
        "row 4: A serving+terminating, B not yet serving -> A",
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::not_serving(b.addr()),
        ],
        Expect::To(a),
    );
    step(
        "row 5: A serving+terminating, B serving -> B",
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b.addr()),
        ],
        Expect::To(b),
    );
    step(
        "row 6: A terminating not serving, B serving -> B",
        &[
            Endpoint::terminating_not_serving(a.addr()),
            Endpoint::serving(b.addr()),
        ],
        Expect::To(b),
    );
    step(
        "B alone -> B",
        &[Endpoint::serving(b.addr())],
        Expect::To(b),
    );
    step(
        "row 2: B not serving -> nobody",
        &[Endpoint::not_serving(b.addr())],
        Expect::Nobody,
    );
    step(
        "row 2: B terminating not serving -> nobody",
        &[Endpoint::terminating_not_serving(b.addr())],
        Expect::Nobody,
    );
    step(
        "row 3: B serving+terminating only -> B",
        &[Endpoint::serving_terminating(b.addr())],
        Expect::To(b),
    );
    // Nil conditions read as ready (the API's rule): a bare endpoint serves.
    step(
        "nil conditions: A ready by default -> A",
        &[
            Endpoint::bare(a.addr()),
            Endpoint::serving_terminating(b.addr()),
        ],
        Expect::To(a),
    );
    // The Service loses every slice: an empty assignment, not an error.
    c.slices.write_raw(
        &format!("{SERVICE}.json"),
        r#"{"apiVersion": "v1", "kind": "List", "items": []}"#,
    );
    let nobody_what = "no slices: empty assignment -> nobody";
    expect(envoy, picker, nobody_what, Expect::Nobody, &all);
}

fn seed_rows(picker: Picker, api: XdsApi, extra: &[&str]) -> Chain {
    seed_rows_over(picker, api, extra, None)
}

fn seed_rows_over(picker: Picker, api: XdsApi, extra: &[&str], mtls: Option<&Mtls>) -> Chain {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    args.extend(mtls.iter().flat_map(|m| m.companion_args()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let c = chain(&[Endpoint::serving(a.addr())], &args);
    let tag = format!("companion-rows-{picker:?}-{api:?}");
    let envoy = envoy_over(&c.companion, &tag, picker, api, mtls);
    walk_seed_rows(&c, &envoy, picker, &a, &b);
    assert_eq!(
        c.companion
            .metric("serving_picker_conditions_xds_nacks_total"),
        Some(0.0)
    );
    c
}

#[test]
fn seed_rows_wasm_form_over_ads() {
    let c = seed_rows(Picker::Module(Form::Wasm), XdsApi::Ads, &[]);
    // Every assignment of the walk ACKed: eight distinct ones (the tiered
    // output leaves not serving pods out, so some steps change nothing).
    assert!(
        c.companion
            .metric("serving_picker_conditions_xds_acks_total")
            .unwrap_or(0.0)
            >= SEED_WALK_ASSIGNMENTS as f64
    );
}

/// Both forms over mutual TLS, as envoy-companion.yaml reaches the
/// companion (its transport socket, SDS from files): handshakes counted,
/// none refused for its certificates. A handshake Envoy gives up on (its
/// 1 s connect timeout on a loaded machine: `incomplete`, `timeout`) is
/// retried by Envoy and not a refusal of its identity.
fn seed_rows_over_mtls(form: Form, name: &str) {
    let m = Mtls::new(name);
    let c = seed_rows_over(Picker::Module(form), XdsApi::Ads, &[], Some(&m));
    assert!(
        c.companion
            .metric("serving_picker_conditions_tls_handshakes_total")
            .unwrap_or(0.0)
            >= 1.0
    );
    let refused = c.companion.identity_refusals();
    assert!(refused.is_empty(), "refused: {refused:?}");
}

#[test]
fn seed_rows_native_form_over_ads_mtls() {
    seed_rows_over_mtls(Form::Native, "rows");
}

#[test]
fn seed_rows_wasm_form_over_ads_mtls() {
    seed_rows_over_mtls(Form::Wasm, "rows-wasm");
}

/// Incremental xDS (`api_type: DELTA_GRPC`, as Envoy Gateway and Istio
/// run Envoy): the same rows, ACKed, nothing refused.
#[test]
fn seed_rows_wasm_form_over_delta_ads() {
    let c = seed_rows(Picker::Module(Form::Wasm), XdsApi::DeltaAds, &[]);
    assert!(
        c.companion
            .metric("serving_picker_conditions_xds_acks_total")
            .unwrap_or(0.0)
            >= SEED_WALK_ASSIGNMENTS as f64
    );
    // Each change's programming latency, measured at Envoy's ACK (the
    // first assignment is a subscription, not a change).
    assert!(
        c.companion
            .metric("serving_picker_conditions_programming_duration_seconds_count")
            .unwrap_or(0.0)
            >= (SEED_WALK_ASSIGNMENTS - 1) as f64
    );
}

/// Delta over mutual TLS, plain EDS: the same authentication as state of
/// the world.
#[test]
fn seed_rows_native_form_over_delta_eds_mtls() {
    let m = Mtls::new("rows-delta");
    let c = seed_rows_over(
        Picker::Module(Form::Native),
        XdsApi::DeltaEds,
        &[],
        Some(&m),
    );
    assert!(
        c.companion
            .metric("serving_picker_conditions_tls_handshakes_total")
            .unwrap_or(0.0)
            >= 1.0
    );
}

/// Two clusters over state of the world, changing one at a time: a
/// response carries only the changed one, and Envoy keeps the other's
/// endpoints (EDS resources left out of a response are not removed).
#[test]
fn a_response_with_one_cluster_leaves_the_other_in_envoy() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let slices = SliceDir::create(&fresh_dir("slices-two"));
    slices.set_endpoints(SERVICE, &[Endpoint::serving(a.addr())]);
    slices.set_endpoints("other", &[Endpoint::serving(b.addr())]);
    let companion = Companion::start(
        slices.path(),
        &[(CLUSTER, SERVICE), ("other", "other")],
        &[],
    );
    let envoy = EnvoyBuilder::new()
        .tag("companion-two-clusters")
        .eds_cluster(CLUSTER, &[])
        .eds_cluster("other", &[])
        .bootstrap_hook(eds_from_companion(companion.listen_addr(), XdsApi::Ads))
        .form(Form::Wasm)
        .start();
    expect_routing(&envoy, PATH, &[], "A", picked(&a));
    let other_updates = envoy.stat("cluster.other.update_success").unwrap_or(0);
    let backend_updates = envoy.stat("cluster.backend.update_success").unwrap_or(0);
    // Only "backend" changes: "other" is in no response, so Envoy takes no
    // update for it.
    slices.set_endpoints(
        SERVICE,
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    expect_routing(&envoy, PATH, &[], "B", picked(&b));
    assert!(envoy.stat("cluster.backend.update_success").unwrap_or(0) > backend_updates);
    assert_eq!(
        envoy.stat("cluster.other.update_success").unwrap_or(0),
        other_updates
    );
    let clusters = envoy.admin_get("/clusters?format=json");
    let v: serde_json::Value = serde_json::from_str(&clusters.body).unwrap();
    let hosts = v["cluster_statuses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "other")
        .and_then(|c| c["host_statuses"].as_array().cloned())
        .unwrap_or_default();
    assert_eq!(
        hosts.len(),
        1,
        "Envoy keeps the cluster left out: {hosts:?}"
    );
}

#[test]
fn seed_rows_native_form_over_eds() {
    seed_rows(Picker::Module(Form::Native), XdsApi::Eds, &[]);
}

/// `--priorities` is still accepted: the default output, the same rows.
#[test]
fn seed_rows_priority_output_plain_round_robin_over_eds() {
    seed_rows(Picker::PlainRoundRobin, XdsApi::Eds, &["--priorities"]);
}

/// No module at all, the companion's default output: Envoy's own round
/// robin follows every row (the tiers are EDS priorities).
#[test]
fn seed_rows_default_output_no_module_round_robin_over_ads() {
    seed_rows(Picker::PlainRoundRobin, XdsApi::Ads, &[]);
}

/// The same with least request, Envoy Gateway's default policy.
#[test]
fn seed_rows_default_output_no_module_least_request_over_eds() {
    seed_rows(Picker::PlainLeastRequest, XdsApi::Eds, &[]);
}

/// The flat output with no module: what the tiers prevent. Row 5 (A
/// serving+terminating, B serving) spreads new requests over A too, and
/// row 2 (nothing serving) reaches the not serving pod through Envoy's
/// panic mode. Kept as the reason `--flat-output` is never the default.
#[test]
fn flat_output_with_no_module_misroutes_rows_5_and_2() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let c = chain(&[Endpoint::serving(a.addr())], &["--flat-output"]);
    let envoy = envoy_on(
        &c.companion,
        "companion-flat",
        Picker::PlainRoundRobin,
        XdsApi::Eds,
    );
    settle(&envoy, PATH, &[], "A serves", served_by(&a));
    c.slices.set_endpoints(
        SERVICE,
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    wait_until("B serves (EDS applied)", Duration::from_secs(10), || {
        per_backend(&batch(&envoy, PATH, &[], 4)).contains_key("B")
    });
    let rs = batch(&envoy, PATH, &[], BATCH);
    let to_a = per_backend(&rs).get("A").copied().unwrap_or(0);
    println!(
        "row-tally | flat output, round robin | row 5 | A {to_a} | of {}",
        rs.len()
    );
    assert!(
        to_a > 0,
        "row 5 with the flat output: A got none of {}",
        rs.len()
    );
    c.slices
        .set_endpoints(SERVICE, &[Endpoint::not_serving(b.addr())]);
    settle(&envoy, PATH, &[], "the no-serving row applied", |r| {
        r.status == 200 && r.header(BACKEND_HEADER) == Some("B")
    });
    let rs = batch(&envoy, PATH, &[], BATCH);
    let to_b = per_backend(&rs).get("B").copied().unwrap_or(0);
    println!(
        "row-tally | flat output, round robin | row 2 | B {to_b} | of {}",
        rs.len()
    );
    assert_eq!(
        to_b,
        rs.len(),
        "panic mode sends everything to the UNHEALTHY pod"
    );
}

/// A Service of 2,000 endpoints in 20 slices; `n` moves one of them to
/// serving+terminating, so every `n` is a new assignment.
fn big_service(n: usize) -> String {
    let slices: Vec<serde_json::Value> = (0..20)
        .map(|s| {
            let endpoints: Vec<serde_json::Value> = (0..100)
                .map(|i| {
                    let terminating = s * 100 + i == n % 2000;
                    serde_json::json!({
                        "addresses": [format!("10.9.{s}.{}", i + 1)],
                        "conditions": {"ready": !terminating, "serving": true, "terminating": terminating},
                    })
                })
                .collect();
            serde_json::json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": format!("big-{s}"), "namespace": support::companion::NAMESPACE,
                             "labels": {"kubernetes.io/service-name": "big"}},
                "addressType": "IPv4",
                "ports": [{"name": support::companion::PORT_NAME, "port": 8080, "protocol": "TCP"}],
                "endpoints": endpoints,
            })
        })
        .collect();
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": slices}).to_string()
}

/// The seed rows through a real Envoy while 1,000 streams that never read
/// sit on the same companion, and a 2,000-endpoint cluster they subscribe
/// to changes every 100 ms: Envoy still gets every change (each row is
/// routed as it must be), NACKs nothing, and the stuck streams hold at
/// most one response each (the companion's own counters), in bounded memory.
#[test]
fn seed_rows_beside_1000_stuck_streams() {
    assert!(
        raise_fd_limit() >= 2500,
        "ulimit -n too low for 1,000 streams"
    );
    let a = Backend::start("A");
    let b = Backend::start("B");
    let slices = SliceDir::create(&fresh_dir("slices-stuck"));
    slices.set_endpoints(SERVICE, &[Endpoint::serving(a.addr())]);
    slices.write_raw("big.json", &big_service(0));
    let companion = Companion::start(
        slices.path(),
        &[(CLUSTER, SERVICE), ("big", "big")],
        &[
            "--send-timeout",
            "10m",
            "--max-streams",
            "4096",
            "--max-connections",
            "4096",
            "--max-connections-per-peer",
            "4096",
            "--max-streams-per-peer",
            "4096",
        ],
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let addr = companion.listen_addr();
    let (stuck, error) = rt.block_on(open_stuck(addr, 1000, &[CLUSTER, "big"]));
    assert!(error.is_none(), "opening stuck streams: {error:?}");
    wait_until("1,000 stuck streams", Duration::from_secs(30), || {
        companion.metric("serving_picker_conditions_xds_streams") == Some(1000.0)
    });
    // The big cluster changes all along.
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (stop, dir) = (stop.clone(), slices.path().to_path_buf());
        std::thread::spawn(move || {
            let big = SliceDir::create(&dir);
            let mut n = 1;
            while !stop.load(Ordering::SeqCst) {
                big.write_raw("big.json", &big_service(n));
                n += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            n
        })
    };
    let picker = Picker::Module(Form::Wasm);
    let envoy = envoy_on(&companion, "companion-beside-stuck", picker, XdsApi::Ads);
    let c = Chain { slices, companion };
    walk_seed_rows(&c, &envoy, picker, &a, &b);
    stop.store(true, Ordering::SeqCst);
    let big_changes = churn.join().unwrap();
    let m = |name: &str| c.companion.metric(name).unwrap_or(0.0);
    assert_eq!(m("serving_picker_conditions_xds_nacks_total"), 0.0);
    assert!(envoy.stat("cluster.backend.update_success").unwrap_or(0) >= SEED_WALK_ASSIGNMENTS);
    // Envoy's responses are ACKed; every other response started went to a
    // stuck stream, at most one each, while the big cluster changed
    // {big_changes} times.
    let started = m("serving_picker_conditions_xds_pushes_total");
    let acked = m("serving_picker_conditions_xds_acks_total");
    assert!(
        started - acked <= 1000.0 + 1.0,
        "{started} responses started, {acked} ACKed by Envoy, {big_changes} changes"
    );
    assert!(m("serving_picker_conditions_xds_coalesced_total") >= 1000.0);
    let rss_kb: f64 = std::fs::read_to_string(format!("/proc/{}/status", c.companion.pid()))
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    eprintln!(
        "companion RSS beside 1,000 stuck streams: {:.1} MB",
        rss_kb / 1024.0
    );
    assert!(rss_kb < 150.0 * 1024.0, "companion RSS {rss_kb} kB");
    assert!(stuck.iter().all(|s| !s.is_closed()));
}

/// The assignment Envoy holds carries the conditions as metadata and the
/// health status (config dump), for an endpoint of each state, with the
/// flat output (`--flat-output`: every endpoint at priority 0, the not
/// serving one UNHEALTHY).
#[test]
fn envoy_holds_conditions_metadata_and_health() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let c = chain(
        &[
            Endpoint::serving_terminating(a.addr()).zone("zone-a"),
            Endpoint::not_serving(b.addr()),
        ],
        &["--flat-output"],
    );
    let envoy = envoy_on(
        &c.companion,
        "companion-dump",
        Picker::Module(Form::Wasm),
        XdsApi::Ads,
    );
    expect_routing(&envoy, PATH, &[], "A picked", picked(&a));
    let dump = envoy.admin_get("/config_dump?include_eds");
    let v: serde_json::Value = serde_json::from_str(&dump.body).unwrap();
    let mut found = Vec::new();
    for cfg in v["configs"].as_array().unwrap() {
        for key in ["static_endpoint_configs", "dynamic_endpoint_configs"] {
            for ec in cfg[key].as_array().into_iter().flatten() {
                let ec = &ec["endpoint_config"];
                if ec["cluster_name"] != CLUSTER {
                    continue;
                }
                for group in ec["endpoints"].as_array().into_iter().flatten() {
                    for lb in group["lb_endpoints"].as_array().into_iter().flatten() {
                        found.push((
                            lb["endpoint"]["address"]["socket_address"]["port_value"]
                                .as_u64()
                                .unwrap(),
                            lb["metadata"]["filter_metadata"]["k8s.endpointslice"].clone(),
                            group["locality"]["zone"].clone(),
                        ));
                    }
                }
            }
        }
    }
    found.sort_by_key(|f| f.0);
    assert_eq!(found.len(), 2, "{found:?}");
    let (_, md_a, zone_a) = &found
        .iter()
        .find(|f| f.0 == u64::from(a.addr().port()))
        .unwrap();
    assert_eq!(md_a["ready"], false);
    assert_eq!(md_a["serving"], true);
    assert_eq!(md_a["terminating"], true);
    assert_eq!(md_a["zone"], "zone-a");
    assert_eq!(*zone_a, "zone-a");
    let (_, md_b, _) = &found
        .iter()
        .find(|f| f.0 == u64::from(b.addr().port()))
        .unwrap();
    assert_eq!(md_b["serving"], false);
    // EDS health from /clusters: A healthy, B unhealthy.
    let clusters = envoy.admin_get("/clusters?format=json");
    let v: serde_json::Value = serde_json::from_str(&clusters.body).unwrap();
    let statuses: Vec<(u64, String)> = v["cluster_statuses"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] == CLUSTER)
        .flat_map(|c| c["host_statuses"].as_array().cloned().unwrap_or_default())
        .map(|h| {
            (
                h["address"]["socket_address"]["port_value"]
                    .as_u64()
                    .unwrap(),
                h["health_status"]["eds_health_status"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            )
        })
        .collect();
    assert!(
        statuses.contains(&(u64::from(a.addr().port()), "HEALTHY".into()))
            && statuses.contains(&(u64::from(b.addr().port()), "UNHEALTHY".into())),
        "{statuses:?}"
    );
}

/// The default output as Envoy holds it (config dump and /clusters): the
/// ready pod at priority 0, the serving+terminating one at priority 1, both
/// HEALTHY with their conditions as metadata, the not serving one not in
/// Envoy at all, and the overprovisioning factor that keeps priority 1 idle
/// while priority 0 has a healthy host.
#[test]
fn envoy_holds_the_tiers_as_priorities_by_default() {
    let (a, b, d) = (
        Backend::start("A"),
        Backend::start("B"),
        Backend::start("D"),
    );
    let c = chain(
        &[
            Endpoint::serving_terminating(a.addr()).zone("zone-a"),
            Endpoint::not_serving(b.addr()),
            Endpoint::serving(d.addr()),
        ],
        &[],
    );
    let envoy = envoy_on(
        &c.companion,
        "companion-dump-tiers",
        Picker::Module(Form::Native),
        XdsApi::Ads,
    );
    expect_routing(&envoy, PATH, &[], "D serves", served_by(&d));
    let dump = envoy.admin_get("/config_dump?include_eds");
    let v: serde_json::Value = serde_json::from_str(&dump.body).unwrap();
    let mut found = Vec::new();
    let mut factor = None;
    for cfg in v["configs"].as_array().unwrap() {
        for key in ["static_endpoint_configs", "dynamic_endpoint_configs"] {
            for ec in cfg[key].as_array().into_iter().flatten() {
                let ec = &ec["endpoint_config"];
                if ec["cluster_name"] != CLUSTER {
                    continue;
                }
                factor = ec["policy"]["overprovisioning_factor"].as_u64();
                for group in ec["endpoints"].as_array().into_iter().flatten() {
                    for lb in group["lb_endpoints"].as_array().into_iter().flatten() {
                        found.push((
                            lb["endpoint"]["address"]["socket_address"]["port_value"]
                                .as_u64()
                                .unwrap(),
                            group["priority"].as_u64().unwrap_or(0),
                            lb["metadata"]["filter_metadata"]["k8s.endpointslice"]["terminating"]
                                .clone(),
                        ));
                    }
                }
            }
        }
    }
    found.sort_by_key(|f| f.0);
    let port = |b: &Backend| u64::from(b.addr().port());
    let mut want = vec![
        (port(&a), 1, serde_json::json!(true)),
        (port(&d), 0, serde_json::json!(false)),
    ];
    want.sort_by_key(|f| f.0);
    assert_eq!(found, want, "B (not serving) is not sent");
    assert_eq!(factor, Some(100_000));
}

#[test]
fn two_envoys_one_companion_and_an_envoy_restart() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let c = chain(&[Endpoint::serving(a.addr())], &[]);
    let e1 = envoy_on(
        &c.companion,
        "companion-two-1",
        Picker::Module(Form::Wasm),
        XdsApi::Ads,
    );
    let e2 = envoy_on(
        &c.companion,
        "companion-two-2",
        Picker::Module(Form::Wasm),
        XdsApi::Eds,
    );
    expect_routing(&e1, PATH, &[], "e1: A", picked(&a));
    expect_routing(&e2, PATH, &[], "e2: A", picked(&a));
    c.slices.set_endpoints(
        SERVICE,
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    expect_routing(&e1, PATH, &[], "e1: B", picked(&b));
    expect_routing(&e2, PATH, &[], "e2: B", picked(&b));
    assert_eq!(
        c.companion.metric("serving_picker_conditions_xds_streams"),
        Some(2.0)
    );
    // e1 goes away; a fresh Envoy (a restart) gets the current state.
    drop(e1);
    let e3 = envoy_on(
        &c.companion,
        "companion-two-3",
        Picker::Module(Form::Wasm),
        XdsApi::Ads,
    );
    expect_routing(&e3, PATH, &[], "restarted Envoy: B", picked(&b));
    wait_until(
        "the dropped stream to be counted out",
        Duration::from_secs(5),
        || c.companion.metric("serving_picker_conditions_xds_streams") == Some(2.0),
    );
}

/// The companion killed (SIGKILL) and restarted while a steady load runs:
/// Envoy keeps the last assignment while it is away (no failure), then
/// follows the new process.
#[test]
fn companion_restart_under_load_loses_nothing() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let mut c = chain(&[Endpoint::serving(a.addr())], &[]);
    let envoy = envoy_on(
        &c.companion,
        "companion-restart",
        Picker::Module(Form::Wasm),
        XdsApi::Ads,
    );
    expect_routing(&envoy, PATH, &[], "A", picked(&a));
    let load = Load::start(
        envoy.listen_addr(),
        LoadConfig {
            threads: 4,
            rate_per_thread: 100.0,
            path: PATH.into(),
            timeout: Duration::from_secs(5),
        },
        "A serving, companion up",
    );
    std::thread::sleep(Duration::from_millis(500));
    load.phase("companion killed");
    c.companion.kill();
    std::thread::sleep(Duration::from_millis(1500));
    load.phase("companion restarting");
    c.companion.restart();
    wait_until("Envoy to reconnect", Duration::from_secs(30), || {
        c.companion.metric("serving_picker_conditions_xds_streams") == Some(1.0)
    });
    load.phase("reconnected; B serving, A serving+terminating");
    c.slices.set_endpoints(
        SERVICE,
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    settle(&envoy, PATH, &[], "B after the restart", picked(&b));
    std::thread::sleep(Duration::from_millis(300));
    let report = load.finish();
    report.assert_no_failures(
        "companion restart under load",
        "requests failed around the restart",
    );
    let during = report.phase_start("companion killed");
    let back = report.phase_start("companion restarting");
    assert!(
        report.served_by_in("A", during, back) > 0,
        "A kept serving while the companion was away"
    );
    assert_eq!(c.companion.starts(), 2);
}

#[test]
fn malformed_slice_file_is_logged_and_the_last_good_state_kept() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let c = chain(&[Endpoint::serving(a.addr())], &[]);
    let envoy = envoy_on(
        &c.companion,
        "companion-malformed",
        Picker::Module(Form::Wasm),
        XdsApi::Ads,
    );
    expect_routing(&envoy, PATH, &[], "A", picked(&a));
    let pushes = c
        .companion
        .metric("serving_picker_conditions_xds_pushes_total")
        .unwrap();
    c.slices.write_raw(
        &format!("{SERVICE}.json"),
        "{\"kind\": \"List\", \"items\": [",
    );
    wait_until("the error to be logged", Duration::from_secs(5), || {
        !c.companion.log_lines("malformed slice file").is_empty()
    });
    // Still A, and nothing was pushed.
    assert_batch(&envoy, PATH, &[], BATCH, "A still", picked(&a));
    assert_eq!(
        c.companion
            .metric("serving_picker_conditions_xds_pushes_total"),
        Some(pushes)
    );
    assert_eq!(
        c.companion
            .metric("serving_picker_conditions_source_errors_total{kind=\"file\"}"),
        Some(1.0)
    );
    // A good version again is followed.
    c.slices.set_endpoints(
        SERVICE,
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    expect_routing(&envoy, PATH, &[], "B after the fix", picked(&b));
    // A second malformed version of the file is logged again (once).
    c.slices
        .write_raw(&format!("{SERVICE}.json"), "not json at all");
    wait_until("the second error", Duration::from_secs(5), || {
        c.companion.log_lines("malformed slice file").len() == 2
    });
    assert_batch(&envoy, PATH, &[], BATCH, "B still", picked(&b));
    assert_eq!(c.companion.get("/readyz").status, 200);
}

/// Why `--flat-output` exists: Envoy keeps a host that leaves EDS while it
/// passes active health checks (unless the cluster sets
/// `ignore_health_on_host_removal`, as Envoy Gateway does). A pod whose
/// readiness fails but that still answers the check (B here) then keeps its
/// traffic under the tiered output, which leaves it out; the flat output
/// marks it UNHEALTHY and Envoy drops it at once. Round robin, no module,
/// A and B ready, then B not serving: the share B gets afterwards, per
/// output and setting.
#[test]
fn active_health_checks_keep_a_pod_that_leaves_eds_unless_the_cluster_ignores_them() {
    let run = |flags: &[&str], ignore_on_removal: bool, tag: &str| -> usize {
        let a = Backend::start("A");
        let b = Backend::start("B");
        let c = chain(
            &[Endpoint::serving(a.addr()), Endpoint::serving(b.addr())],
            flags,
        );
        let mut extra = json!({"health_checks": [{
            "timeout": "0.2s",
            "interval": "0.2s",
            "no_traffic_interval": "0.2s",
            "unhealthy_threshold": 2,
            "healthy_threshold": 1,
            "http_health_check": {"path": "/healthz"}
        }]});
        if ignore_on_removal {
            extra["ignore_health_on_host_removal"] = json!(true);
        }
        let envoy = EnvoyBuilder::new()
            .tag(tag)
            .eds_cluster(CLUSTER, &[])
            .bootstrap_hook(eds_from_companion(c.companion.listen_addr(), XdsApi::Eds))
            .with_filter(None)
            .bootstrap_hook(support::companion::plain_round_robin(CLUSTER))
            .bootstrap_hook(support::tweak::merge_cluster(CLUSTER, extra))
            .start();
        wait_until(
            "B serves (both checked healthy)",
            Duration::from_secs(10),
            || per_backend(&batch(&envoy, PATH, &[], 4)).contains_key("B"),
        );
        c.slices.set_endpoints(
            SERVICE,
            &[Endpoint::serving(a.addr()), Endpoint::not_serving(b.addr())],
        );
        // The change reaches Envoy: A alone, or B's pending removal.
        std::thread::sleep(Duration::from_millis(1500));
        let rs = batch(&envoy, PATH, &[], BATCH);
        let to_b = per_backend(&rs).get("B").copied().unwrap_or(0);
        println!(
            "row-tally | active health checks, {tag} | B not serving | B {to_b} | of {}",
            rs.len()
        );
        to_b
    };
    assert!(
        run(&[], false, "tiered") > 0,
        "tiered output, active checks: the removed pod keeps traffic while it passes them"
    );
    assert_eq!(
        run(&[], true, "tiered-ignore-on-removal"),
        0,
        "ignore_health_on_host_removal: the pod goes with its EDS entry"
    );
    assert_eq!(
        run(&["--flat-output"], false, "flat"),
        0,
        "flat output: the pod is UNHEALTHY at once"
    );
}

/// Cluster `name`'s EDS counters that say how a warming ended:
/// (update_success, init_fetch_timeout, assignment_use_cached).
fn eds_counters(envoy: &Envoy, name: &str) -> (u64, u64, u64) {
    let stat = |s: &str| envoy.stat_or_zero(&format!("cluster.{name}.{s}"));
    (
        stat("update_success"),
        stat("init_fetch_timeout"),
        stat("assignment_use_cached"),
    )
}

/// Whether cluster `name` is active on least request and nothing warms.
fn runs_least_request(envoy: &Envoy, name: &str) -> bool {
    let active = envoy.admin_get("/config_dump?resource=dynamic_active_clusters");
    let warming = envoy.admin_get("/config_dump?resource=dynamic_warming_clusters");
    let Ok(j) = serde_json::from_str::<serde_json::Value>(&active.body) else {
        return false;
    };
    let swapped = j["configs"].as_array().into_iter().flatten().any(|c| {
        c["cluster"]["name"] == name
            && c["cluster"]["load_balancing_policy"]
                .to_string()
                .contains("least_request")
    });
    swapped
        && !warming.body.contains(name)
        && envoy.stat_or_zero("cluster_manager.warming_clusters") == 0
}

/// What a CDS update of a companion-fed cluster did.
struct Swapped {
    companion: Companion,
    /// `eds_counters` before and after the swap.
    before: (u64, u64, u64),
    after: (u64, u64, u64),
    /// The companion's responses (xds_pushes) before and after.
    pushes: (f64, f64),
}

/// Cluster "backend" from a watched CDS file on plain round robin, and a
/// static EDS cluster "other", both fed by the companion over `api` (with
/// an initial fetch timeout of 2 s, so that a warming that waits for it
/// ends soon). CDS swaps "backend" to least request: Envoy re-creates it,
/// and the new cluster warms.
fn cds_swap(api: XdsApi) -> Swapped {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let slices = SliceDir::create(&fresh_dir("slices-cds"));
    slices.set_endpoints(SERVICE, &[Endpoint::serving(a.addr())]);
    slices.set_endpoints("other", &[Endpoint::serving(b.addr())]);
    let companion = Companion::start(
        slices.path(),
        &[(CLUSTER, SERVICE), ("other", "other")],
        &[],
    );
    let envoy = EnvoyBuilder::new()
        .tag(&format!("companion-cds-swap-{api:?}"))
        .eds_cluster(CLUSTER, &[])
        .eds_cluster("other", &[])
        .with_filter(None)
        .bootstrap_hook(support::companion::plain_round_robin(CLUSTER))
        .bootstrap_hook(eds_from_companion(companion.listen_addr(), api))
        .bootstrap_hook(|bootstrap: &mut serde_json::Value, _: &std::path::Path| {
            let c = support::tweak::cluster_mut(bootstrap, CLUSTER);
            c["eds_cluster_config"]["eds_config"]["initial_fetch_timeout"] = json!("2s");
        })
        .bootstrap_hook(support::tweak::cluster_from_cds_file(CLUSTER))
        .start();
    settle(&envoy, PATH, &[], "A serves", served_by(&a));
    settle(&envoy, "/other/x", &[], "B serves other", served_by(&b));
    let before = eds_counters(&envoy, CLUSTER);
    let pushes_before = companion
        .metric("serving_picker_conditions_xds_pushes_total")
        .unwrap_or(0.0);
    support::tweak::CdsFile::in_envoy_dir(envoy.dir())
        .set_policy(CLUSTER, support::companion::least_request_policy(false));
    wait_until(
        "the cluster runs least request, nothing warming",
        Duration::from_secs(10),
        || runs_least_request(&envoy, CLUSTER),
    );
    let after = eds_counters(&envoy, CLUSTER);
    let pushes_after = companion
        .metric("serving_picker_conditions_xds_pushes_total")
        .unwrap_or(0.0);
    // The new cluster has A and follows the companion from now on.
    expect_routing(&envoy, PATH, &[], "A after the swap", served_by(&a));
    slices.set_endpoints(
        SERVICE,
        &[
            Endpoint::terminating_not_serving(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    expect_routing(&envoy, PATH, &[], "B after a change", served_by(&b));
    expect_routing(&envoy, "/other/x", &[], "other keeps B", served_by(&b));
    Swapped {
        companion,
        before,
        after,
        pushes: (pushes_before, pushes_after),
    }
}

/// Over ADS (state of the world) the re-created cluster's watch repeats
/// Envoy's last ACK on the shared stream; the companion answers it, and
/// the cluster warms from that EDS update, not from its initial fetch
/// timeout.
#[test]
fn a_cluster_cds_re_creates_over_ads_warms_from_the_companion() {
    let s = cds_swap(XdsApi::Ads);
    let (updates, fetch_timeouts, cached) = s.after;
    assert_eq!(
        (fetch_timeouts, cached),
        (0, 0),
        "warmed at the initial fetch timeout, from Envoy's cache"
    );
    assert!(
        updates > s.before.0,
        "no EDS update reached the new cluster"
    );
    assert!(
        s.pushes.1 > s.pushes.0,
        "the companion sent nothing for the swap"
    );
    assert_eq!(
        s.companion
            .metric("serving_picker_conditions_xds_nacks_total"),
        Some(0.0)
    );
}

/// Over delta ADS Envoy asks nothing when it re-creates a cluster whose
/// name another watch (the old cluster's) already subscribes
/// (`NewGrpcMuxImpl::updateWatch` sends only names new to the
/// subscription), so no server sees it: the cluster warms at its initial
/// fetch timeout, from Envoy's cached assignment (with the hosts it had),
/// then follows the companion.
#[test]
fn a_cluster_cds_re_creates_over_delta_ads_warms_from_envoys_cache() {
    let s = cds_swap(XdsApi::DeltaAds);
    let (_, fetch_timeouts, cached) = s.after;
    assert_eq!(
        (
            fetch_timeouts.saturating_sub(s.before.1),
            cached.saturating_sub(s.before.2)
        ),
        (1, 1),
        "the new cluster warmed at its initial fetch timeout from the cache"
    );
    assert_eq!(s.pushes.1, s.pushes.0, "Envoy asked the companion nothing");
}
