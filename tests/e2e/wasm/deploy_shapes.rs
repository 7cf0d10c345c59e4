//! Deployment shapes users run (issue 16): cluster names that collide with
//! EDS service names, the admin cluster Envoy Gateway and Istio already ship,
//! Istio's stats matcher, what happens before the first snapshot.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

/// STATIC cluster `svc` (A) and EDS cluster `other` whose `service_name` is
/// `svc` (B): Envoy's config dump lists both under `svc`. Each cluster must be
/// steered to its own host (before the fix `svc` answered no-serving-endpoint
/// for good).
#[test]
fn cluster_named_like_another_clusters_service_name() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let envoy = EnvoyBuilder::new()
        .tag("shape-name-collision")
        .static_cluster("svc", &[Endpoint::serving(a.addr())])
        .eds_service_cluster("other", "svc", &[Endpoint::serving(b.addr())])
        .start();
    expect_routing(&envoy, "/svc/x", &[], "svc: A picked", picked(&a));
    expect_routing(&envoy, "/other/x", &[], "other: B picked", picked(&b));
    // And the EDS side still follows its conditions.
    envoy.set_endpoints("other", &[Endpoint::not_serving(b.addr())]);
    expect_routing(
        &envoy,
        "/other/x",
        &[],
        "other: 503",
        no_serving_503("other"),
    );
    expect_routing(&envoy, "/svc/x", &[], "svc: still A", picked(&a));
}

/// Active health checks keep a host that left EDS while it still passes them
/// (`pending_dynamic_removal` in `/clusters`): a pod that left the Service.
/// It must rank below the ready hosts: B alone once A is removed, A not even
/// a retry alternate (before the fix A stayed in the ready tier).
#[test]
fn host_pending_dynamic_removal_ranks_below_ready() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let envoy = EnvoyBuilder::new()
        .tag("shape-pending-removal")
        .eds_cluster(
            "backend",
            &[Endpoint::serving(a.addr()), Endpoint::serving(b.addr())],
        )
        .bootstrap_hook(support::tweak::merge_cluster(
            "backend",
            json!({"health_checks": [{
                "timeout": "0.5s",
                "interval": "0.2s",
                "no_traffic_interval": "0.2s",
                "unhealthy_threshold": 2,
                "healthy_threshold": 1,
                "http_health_check": {"path": "/healthz"}
            }]}),
        ))
        .start();
    let both = |r: &Response| filter_routed_to(&a)(r) || filter_routed_to(&b)(r);
    let rs = expect_routing(&envoy, "/backend/x", &[], "A or B picked", both);
    assert_eq!(per_backend(&rs).len(), 2, "{:?}", per_backend(&rs));
    envoy.set_endpoints("backend", &[Endpoint::serving(b.addr())]);
    wait_until("A pending removal", Duration::from_secs(10), || {
        envoy.admin_get("/clusters").body.contains(&format!(
            "{}::health_flags::/pending_dynamic_removal",
            a.addr()
        ))
    });
    expect_routing(&envoy, "/backend/x", &[], "B alone", picked(&b));
    // Still there, still healthy: Envoy keeps it until its checks fail.
    assert!(envoy.admin_get("/clusters").body.contains(&format!(
        "{}::health_flags::/pending_dynamic_removal",
        a.addr()
    )));
}

/// Istio's bootstrap `stats_matcher` (istio/istio `pkg/bootstrap`, the
/// `inclusionList` prefixes of its golden bootstraps): the change gate's stats
/// answer keeps only `cluster_manager.*` lines, none of the clusters'. The gate
/// must notice (no `membership_total` of a managed cluster), say so once, and
/// refresh fully on every poll: an EDS change reaches traffic within a few
/// polls, not after `full_refresh_interval_ms` (30 s here; before the fix the
/// change waited for it).
#[test]
fn istio_stats_matcher_does_not_blind_the_change_gate() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let config = plugin_config(json!({"full_refresh_interval_ms": 30000}));
    let envoy = EnvoyBuilder::new()
        .tag("shape-istio-stats-matcher")
        .with_filter(Some(&config))
        .eds_cluster(
            "backend",
            &[Endpoint::serving(a.addr()), Endpoint::not_serving(b.addr())],
        )
        .bootstrap_hook(|bootstrap: &mut Value, _dir: &std::path::Path| {
            let prefixes = [
                "reporter=",
                "cluster_manager",
                "listener_manager",
                "server",
                "cluster.xds-grpc",
                "wasm",
                "component",
            ];
            let patterns: Vec<Value> = prefixes.iter().map(|p| json!({"prefix": p})).collect();
            bootstrap["stats_config"] =
                json!({"stats_matcher": {"inclusion_list": {"patterns": patterns}}});
        })
        .start();
    expect_routing(&envoy, "/backend/x", &[], "A picked", picked(&a));
    // The matcher really hides the clusters' stats.
    let stats = envoy.admin_get("/stats?filter=membership_total").body;
    assert!(!stats.contains("cluster.backend."), "{stats}");
    std::thread::sleep(Duration::from_millis(500));
    let changed = Instant::now();
    envoy.set_endpoints(
        "backend",
        &[Endpoint::not_serving(a.addr()), Endpoint::serving(b.addr())],
    );
    settle_for(
        &envoy,
        "/backend/x",
        &[],
        "B picked within a few polls",
        Duration::from_secs(5),
        5,
        picked(&b),
    );
    println!("EDS change seen after {} ms", changed.elapsed().as_millis());
    let warned = envoy.log_lines("has no cluster.backend.membership_total");
    assert!(once_per_poller(&envoy, &warned), "{warned:?}");
}

/// Priorities (issue 16): P0 holds one ready host of four, P1 two ready
/// hosts. Envoy's priority load gives P0 min(100%, 1.4 x 1/4) = 35% and P1
/// 65%: about a third per ready host. Before the fix the lone P0 host took
/// every request. Not-serving and terminating hosts take none.
#[test]
fn priorities_share_load_like_envoys_priority_load() {
    let names = ["A", "C", "D", "F", "B", "E"];
    let backends: Vec<Backend> = names.iter().map(|n| Backend::start(n)).collect();
    let [a, c, d, f, b, e] = [0, 1, 2, 3, 4, 5].map(|i| &backends[i]);
    let endpoints = [
        Endpoint::serving(a.addr()),
        Endpoint::not_serving(c.addr()),
        Endpoint::not_serving(d.addr()),
        Endpoint::serving_terminating(f.addr()),
        Endpoint::serving(b.addr()),
        Endpoint::serving(e.addr()),
    ];
    let envoy = EnvoyBuilder::new()
        .tag("shape-priorities")
        .static_cluster("prio", &endpoints)
        .bootstrap_hook(|bootstrap: &mut Value, _dir: &std::path::Path| {
            let cluster = support::tweak::cluster_mut(bootstrap, "prio");
            let group = &cluster["load_assignment"]["endpoints"][0];
            let all = group["lb_endpoints"].as_array().unwrap().clone();
            cluster["load_assignment"]["endpoints"] = json!([
                {"priority": 0, "lb_endpoints": all[..4]},
                {"priority": 1, "lb_endpoints": all[4..]},
            ]);
        })
        .start();
    let tier = [a, b, e];
    settle(
        &envoy,
        "/prio/x",
        &[],
        "A, B or E picked",
        picked_any(&tier),
    );
    // No reset after settling: before the first snapshot requests are held.
    let rs = assert_batch(
        &envoy,
        "/prio/x",
        &[],
        300,
        "A, B or E picked",
        picked_any(&tier),
    );
    let counts = per_backend(&rs);
    println!("priority load over 300 requests: {counts:?}");
    for name in ["A", "B", "E"] {
        let n = counts.get(name).copied().unwrap_or(0);
        assert!(
            (60..=150).contains(&n),
            "{name}: {n} of 300 (expected ~100): {counts:?}"
        );
    }
    assert_eq!(c.count() + d.count() + f.count(), 0, "{counts:?}");
}

/// Zones (issue 16): the local zone z1 holds a fifth of the weight (A; B to
/// E in z2). It takes its even share's worth: 0.2 x 2 zones = 40% of the
/// requests, the rest spills to z2 (before: z1 took all of them, the default
/// `local_zone_min_share` being 0.2).
#[test]
fn local_zone_takes_its_share_not_everything() {
    let names = ["A", "B", "C", "D", "E"];
    let backends: Vec<Backend> = names.iter().map(|n| Backend::start(n)).collect();
    let endpoints: Vec<Endpoint> = backends
        .iter()
        .enumerate()
        .map(|(i, bk)| Endpoint::serving(bk.addr()).zone(if i == 0 { "z1" } else { "z2" }))
        .collect();
    let config = plugin_config(json!({"local_zone": "z1"}));
    let envoy = EnvoyBuilder::new()
        .tag("shape-zones")
        .with_filter(Some(&config))
        .eds_cluster("backend", &endpoints)
        .start();
    let all: Vec<&Backend> = backends.iter().collect();
    settle(&envoy, "/backend/x", &[], "any picked", picked_any(&all));
    let rs = assert_batch(
        &envoy,
        "/backend/x",
        &[],
        300,
        "any picked",
        picked_any(&all),
    );
    let counts = per_backend(&rs);
    println!("local zone share over 300 requests: {counts:?}");
    let local = counts.get("A").copied().unwrap_or(0);
    assert!(
        (90..=150).contains(&local),
        "A (z1): {local} of 300, expected ~120: {counts:?}"
    );
}

/// Envoy Gateway's bootstrap already has an admin cluster: STATIC
/// `prometheus_stats` -> the admin address (connect_timeout 0.250s, round
/// robin), reached from a stats listener whose only route is
/// `GET /stats/prometheus` (envoyproxy/gateway, internal/xds/bootstrap,
/// testdata/render/enable-prometheus.yaml). With `admin_cluster:
/// prometheus_stats` the filter works through it unpatched: its admin calls
/// go to the cluster, not through that listener's route, so every path it
/// needs (stats, config_dump, clusters) passes; the listener still refuses
/// them to outsiders.
#[test]
fn envoy_gateways_prometheus_stats_cluster_serves_as_admin_cluster() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let stats_port = support::ports::free_port();
    let config = plugin_config(json!({"admin_cluster": "prometheus_stats"}));
    let envoy = EnvoyBuilder::new()
        .tag("shape-eg-prometheus-stats")
        .with_filter(Some(&config))
        .eds_cluster(
            "backend",
            &[Endpoint::serving(a.addr()), Endpoint::not_serving(b.addr())],
        )
        .bootstrap_hook(move |bootstrap: &mut Value, _dir: &std::path::Path| {
            let admin = support::tweak::cluster_mut(bootstrap, "envoy_admin");
            admin["name"] = json!("prometheus_stats");
            admin["connect_timeout"] = json!("0.250s");
            admin["lb_policy"] = json!("ROUND_ROBIN");
            admin["load_assignment"]["cluster_name"] = json!("prometheus_stats");
            let listeners = bootstrap["static_resources"]["listeners"].as_array_mut().unwrap();
            listeners.push(json!({
                "name": "envoy-gateway-proxy-stats",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": stats_port}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "eg-stats-http",
                        "normalize_path": true,
                        "route_config": {"name": "local_route", "virtual_hosts": [{
                            "name": "prometheus_stats", "domains": ["*"],
                            "routes": [{"match": {"path": "/stats/prometheus", "headers": [
                                {"name": ":method", "string_match": {"exact": "GET"}}]},
                                "route": {"cluster": "prometheus_stats"}}]}]},
                        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
                    }
                }]}]
            }));
        })
        .start();
    expect_routing(&envoy, "/backend/x", &[], "A picked", picked(&a));
    envoy.set_endpoints(
        "backend",
        &[Endpoint::not_serving(a.addr()), Endpoint::serving(b.addr())],
    );
    expect_routing(&envoy, "/backend/x", &[], "B picked", picked(&b));
    assert!(
        envoy.stat_or_zero("serving_picker.snapshot.refresh_skipped_unchanged") > 0,
        "gate on"
    );
    let stats_listener = std::net::SocketAddr::from(([127, 0, 0, 1], stats_port));
    let outsider = support::http::get(stats_listener, "/config_dump", &[]);
    assert_eq!(
        outsider.status, 404,
        "the stats listener serves only /stats/prometheus"
    );
    let prom = support::http::get(stats_listener, "/stats/prometheus", &[]);
    assert_eq!(prom.status, 200);
}

/// The wasm form's other path to a host: Envoy's own balancer, the
/// override_host policy's fallback round robin (`passthrough` settings, a
/// cluster the snapshot does not know, a picked host that left Envoy before
/// the next refresh). It sees EDS health only: the companion marks
/// not-serving endpoints UNHEALTHY, but with one healthy host of four Envoy
/// is in panic (below 50%) and balances over all of them. With
/// `healthy_panic_threshold: 0` (the shipped configs) it never panics, so
/// the fallback reaches no not-serving host. Here without the filter, so
/// every request takes the fallback.
#[test]
fn the_fallback_balancer_reaches_no_unhealthy_host_without_panic() {
    for threshold in [None, Some(0)] {
        let names = ["A", "B", "C", "D"];
        let backends: Vec<Backend> = names.iter().map(|n| Backend::start(n)).collect();
        let endpoints: Vec<Endpoint> = backends
            .iter()
            .enumerate()
            .map(|(i, bk)| match i {
                0 => Endpoint::serving(bk.addr()),
                _ => Endpoint::not_serving(bk.addr()).health_status("UNHEALTHY"),
            })
            .collect();
        let mut builder = EnvoyBuilder::new()
            .tag("shape-fallback-panic")
            .with_filter(None)
            .eds_cluster("backend", &endpoints);
        if let Some(t) = threshold {
            builder = builder.bootstrap_hook(support::tweak::merge_cluster(
                "backend",
                json!({"common_lb_config": {"healthy_panic_threshold": {"value": t}}}),
            ));
        }
        let envoy = builder.start();
        let a = &backends[0];
        wait_until("A reachable", Duration::from_secs(15), || {
            served_by(a)(&envoy.get("/backend/x", &[]))
        });
        let rs = batch(&envoy, "/backend/x", &[], 40);
        let others: u64 = backends[1..].iter().map(|b| b.count()).sum();
        println!(
            "fallback round robin, healthy_panic_threshold {threshold:?}: {:?}",
            tally(&rs)
        );
        match threshold {
            None => assert!(others > 0, "expected panic mode to reach B, C, D"),
            Some(_) => {
                assert_eq!(others, 0, "{:?}", tally(&rs));
                assert!(rs.iter().all(served_by(a)), "{:?}", tally(&rs));
            }
        }
    }
}

/// One row: what it is, the pods and how each is, where the traffic goes.
type IstioRow = (
    &'static str,
    &'static [(&'static str, IstioPod)],
    support::scenario::Expect,
);

/// A pod as Istio 1.31 sees it (its EndpointSlice conditions).
#[derive(Clone, Copy, Debug)]
enum IstioPod {
    Ready,
    /// Not ready, not terminating (starting).
    NotReady,
    /// Serving and terminating (in its preStop).
    ServingTerminating,
    /// Terminating, no longer serving.
    TerminatingNotServing,
}

/// What istiod 1.31 sends Envoy for a pod of a Service labelled
/// `istio.io/persistent-session` (istio/istio@1.31.0-rc.0):
/// `pilot/pkg/serviceregistry/kube/controller/endpointslice.go`
/// `endpointHealthStatus` (ready: Healthy; not ready but serving and
/// terminating, with the label: Draining; other terminating: Terminating;
/// else UnHealthy), `pilot/pkg/xds/endpoints/endpoint_builder.go` (Terminating
/// never sent; UnHealthy sent, `PILOT_AUTO_SEND_UNHEALTHY_ENDPOINTS` being
/// true by default from 1.31; Draining sent to persistent-session Services),
/// as the EDS `health_status` of model.HealthStatus (1 HEALTHY, 2 UNHEALTHY,
/// 3 DRAINING), and no conditions metadata.
fn istio_1_31(pod: IstioPod, addr: std::net::SocketAddr) -> Option<Endpoint> {
    match pod {
        IstioPod::Ready => Some(Endpoint::health(addr, "HEALTHY")),
        IstioPod::NotReady => Some(Endpoint::health(addr, "UNHEALTHY")),
        IstioPod::ServingTerminating => Some(Endpoint::health(addr, "DRAINING")),
        IstioPod::TerminatingNotServing => None,
    }
}

/// The wasm form under Istio 1.31's marking, through every row of the
/// table on one real Envoy: EDS as istiod 1.31 sends it for a Service with
/// the persistent-session label (above), and the cluster as it writes it
/// when unhealthy endpoints are sent: `common_lb_config.healthy_panic_threshold`
/// 0 (`pilot/pkg/networking/core/cluster_traffic_policy.go`), with the
/// example's override_host policy merged in (examples/istio/serving-picker.yaml).
/// Every row goes where kube-proxy sends it: the not-ready pod arrives
/// UNHEALTHY (no longer left out), and is never picked; the draining pod is
/// picked only while no pod is ready; a row with no pod serving is the
/// filter's clear 503, not Envoy's panic over unready pods.
#[test]
fn istio_1_31_marking_through_every_row() {
    use support::scenario::{expect as expect_where, Backends, Expect, CLUSTER};
    use IstioPod::*;
    let rows: [IstioRow; 7] = [
        (
            "row 1: A serving -> A",
            &[("A", Ready)],
            Expect::Picked(&["A"]),
        ),
        (
            "row 2: A not ready -> 503",
            &[("A", NotReady)],
            Expect::NoServing,
        ),
        (
            "row 2: A terminating, not serving (not sent) -> 503",
            &[("A", TerminatingNotServing)],
            Expect::NoServing,
        ),
        (
            "row 3: A serving+terminating -> A",
            &[("A", ServingTerminating)],
            Expect::Picked(&["A"]),
        ),
        (
            "row 4: A serving+terminating, B not yet serving -> A",
            &[("A", ServingTerminating), ("B", NotReady)],
            Expect::Picked(&["A"]),
        ),
        (
            "row 5: A serving+terminating, B serving -> B",
            &[("A", ServingTerminating), ("B", Ready)],
            Expect::Picked(&["B"]),
        ),
        (
            "row 6: A terminating not serving (not sent), B serving -> B",
            &[("A", TerminatingNotServing), ("B", Ready)],
            Expect::Picked(&["B"]),
        ),
    ];
    let backends = Backends::start(["A", "B"]);
    let eds = |pods: &[(&str, IstioPod)]| -> Vec<Endpoint> {
        pods.iter()
            .filter_map(|(name, pod)| istio_1_31(*pod, backends.get(name).addr()))
            .collect()
    };
    let (first, rest) = rows.split_first().unwrap();
    let envoy = EnvoyBuilder::new()
        .tag("shape-istio-1-31")
        .eds_cluster(CLUSTER, &eds(first.1))
        .bootstrap_hook(support::tweak::merge_cluster(
            CLUSTER,
            json!({"common_lb_config": {"healthy_panic_threshold": {"value": 0}}}),
        ))
        .start();
    let dump = envoy
        .admin_get("/config_dump?resource=dynamic_active_clusters")
        .body
        + &envoy
            .admin_get("/config_dump?resource=static_clusters")
            .body;
    assert!(dump.contains("healthy_panic_threshold"), "{dump}");
    expect_where(&envoy, &backends, first.2, first.0, true);
    for (what, pods, want) in rest {
        envoy.set_endpoints(CLUSTER, &eds(pods));
        eprintln!("Istio 1.31 EDS v{}: {what}", envoy.eds(CLUSTER).version());
        expect_where(&envoy, &backends, *want, what, false);
    }
    // And what Envoy itself makes of it: the UNHEALTHY pod stays in the host
    // set (not left out as before 1.31) but out of the healthy list.
    envoy.set_endpoints(CLUSTER, &eds(&[("A", ServingTerminating), ("B", NotReady)]));
    let b = backends.get("B").addr().to_string();
    wait_until(
        "B listed, failing its EDS health",
        Duration::from_secs(10),
        || {
            envoy
                .admin_get("/clusters")
                .body
                .lines()
                .any(|l| l.contains(&format!("{b}::health_flags::/failed_eds_health")))
        },
    );
}

/// Every wasm configuration serving-picker ships: the serving_picker filter
/// of each Envoy config at the repository's root, the EnvoyExtensionPolicy
/// and the WasmPlugins of examples/. Expected: each parses, lists the
/// clusters it manages (`clusters`), and leaves requests to Envoy's own
/// balancer before the first snapshot (`before_first_snapshot: passthrough`).
#[test]
fn every_shipped_wasm_configuration_lists_its_clusters_and_passes_through_first() {
    use serving_picker_wasm::config::{parse_config, BeforeFirstSnapshot};
    let root = support::repo_root();
    let read = |path: &str| -> Vec<Value> {
        let text = std::fs::read_to_string(root.join(path)).unwrap();
        serde_saphyr::from_multiple::<Value>(&text).unwrap()
    };
    // (where, the configuration as JSON text)
    let mut configs: Vec<(String, String)> = Vec::new();
    fn wasm_filters(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(o) => {
                if o.get("name").and_then(Value::as_str) == Some("envoy.filters.http.wasm") {
                    if let Some(c) = v["typed_config"]["config"]["configuration"]["value"].as_str()
                    {
                        out.push(c.to_string());
                    }
                }
                o.values().for_each(|x| wasm_filters(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| wasm_filters(x, out)),
            _ => {}
        }
    }
    for file in std::fs::read_dir(root).unwrap() {
        let name = file.unwrap().file_name().to_string_lossy().to_string();
        if name.starts_with("envoy") && name.ends_with(".yaml") {
            let mut found = Vec::new();
            for doc in read(&name) {
                wasm_filters(&doc, &mut found);
            }
            configs.extend(found.into_iter().map(|c| (name.clone(), c)));
        }
    }
    for path in [
        "examples/envoy-gateway/serving-picker.yaml",
        "examples/istio/serving-picker.yaml",
        "examples/istio/canary.yaml",
    ] {
        for doc in read(path) {
            match doc["kind"].as_str() {
                Some("EnvoyExtensionPolicy") => {
                    for w in doc["spec"]["wasm"].as_array().unwrap() {
                        configs.push((path.to_string(), w["config"].to_string()));
                    }
                }
                Some("WasmPlugin") => {
                    configs.push((path.to_string(), doc["spec"]["pluginConfig"].to_string()))
                }
                _ => {}
            }
        }
    }
    let roots: Vec<&str> = configs.iter().map(|(w, _)| w.as_str()).collect();
    for expected in ["envoy.yaml", "envoy-companion.yaml", "envoy-sessions.yaml"] {
        assert!(roots.contains(&expected), "no filter found in {expected}");
    }
    assert!(configs.len() >= 7, "{roots:?}");
    for (at, raw) in &configs {
        let c = parse_config(raw.as_bytes()).unwrap_or_else(|e| panic!("{at}: {e}"));
        let clusters = c.clusters.unwrap_or_else(|| panic!("{at}: no `clusters`"));
        assert!(!clusters.is_empty(), "{at}");
        assert_eq!(
            c.before_first_snapshot,
            BeforeFirstSnapshot::Passthrough,
            "{at}"
        );
        println!("{at}: clusters {clusters:?}");
    }
}
