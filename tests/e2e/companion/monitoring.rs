//! The shipped alerts (deploy/monitoring/) against what the real processes
//! expose: every metric a rule reads is scraped from a running companion
//! (`eds` over mutual TLS, and `envoy-gateway`) or from a real Envoy 1.40's
//! /stats/prometheus with each form, not copied from code; and the
//! PrometheusRule holds the rule file's groups. `make monitoring` runs
//! `promtool check rules` and `promtool test rules` on them.
//!
//! Then the rules run on what real processes export: each is scraped twice,
//! a few seconds apart, and promtool evaluates every alert on those series
//! held for 30 minutes (counters growing at the rate seen, timestamps
//! advancing when they moved, gauges as they were; `up` 1, or 0 for a
//! process that stopped). Healthy processes, plaintext and TLS, fire
//! nothing; each fault fires the alert that names it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::companion::{companion_bin, Companion, SliceDir};
use support::envoy::fresh_dir;
use support::mtls::Mtls;
use support::ports::free_port;
use support::*;

fn read_yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(support::repo_root().join(path)).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

/// Every metric name the rules' expressions read (recording rules' own
/// `a:b:c` names excluded).
fn metrics_in_rules() -> BTreeSet<String> {
    let rules = read_yaml("deploy/monitoring/serving-picker.rules.yaml");
    let re = regex_lite(&rules);
    assert!(re.len() >= 10, "{re:?}");
    re
}

fn regex_lite(rules: &Value) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let expr = rule["expr"].as_str().unwrap();
            let bytes = expr.as_bytes();
            let mut i = 0;
            while i < bytes.len() {
                let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
                if word(bytes[i]) && (i == 0 || !word(bytes[i - 1])) {
                    let start = i;
                    while i < bytes.len() && word(bytes[i]) {
                        i += 1;
                    }
                    let w = &expr[start..i];
                    // A label name (`name="..."`, `name!~...`) is no metric.
                    let label = expr[i..].trim_start().starts_with(['=', '!']);
                    if !w.contains(':')
                        && !label
                        && (w.starts_with("serving_picker_")
                            || w.starts_with("envoy_dynamicmodulescustom_"))
                    {
                        names.insert(w.to_string());
                    }
                } else {
                    i += 1;
                }
            }
        }
    }
    names
}

/// Names a Prometheus text exposition shows: its samples, and its families
/// (`# TYPE`; a counter family `x` is sampled as `x_total`).
fn exposed(text: &str, into: &mut BTreeSet<String>) {
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut w = rest.split_whitespace();
            let (name, kind) = (w.next().unwrap_or_default(), w.next().unwrap_or_default());
            into.insert(name.to_string());
            if kind == "counter" && !name.ends_with("_total") {
                into.insert(format!("{name}_total"));
            }
        } else if !line.starts_with('#') {
            if let Some(name) = line.split(['{', ' ']).next() {
                into.insert(name.to_string());
            }
        }
    }
}

fn eg_companion_metrics(slices: &std::path::Path) -> String {
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut child = Command::new(companion_bin())
        .args([
            "envoy-gateway",
            "--listen",
            &listen.to_string(),
            "--metrics-listen",
            &metrics.to_string(),
            "--slices-dir",
        ])
        .arg(slices)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let body = loop {
        let r = support::http::request(metrics, "GET", "/metrics", &[], Duration::from_secs(2));
        if r.status == 200 {
            break r.body;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "envoy-gateway companion not up"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    body
}

#[test]
fn every_metric_the_rules_read_is_exposed_by_the_running_processes() {
    let mut names = BTreeSet::new();
    let slices = SliceDir::create(&fresh_dir("monitoring-slices"));
    slices.set_endpoints("web", &[]);
    let m = Mtls::new("monitoring");
    let args = m.companion_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let companion = Companion::start(slices.path(), &[("backend", "web")], &args);
    exposed(&companion.get("/metrics").body, &mut names);
    exposed(&eg_companion_metrics(slices.path()), &mut names);
    for form in [Form::Wasm, Form::Native] {
        let envoy = EnvoyBuilder::new()
            .tag(&format!("monitoring-{}", form.name()))
            .eds_cluster("backend", &[])
            .form(form)
            .start();
        std::thread::sleep(Duration::from_millis(1500));
        exposed(&envoy.admin_get("/stats/prometheus").body, &mut names);
    }
    let missing: Vec<String> = metrics_in_rules()
        .into_iter()
        .filter(|n| !names.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "rules read metrics no process exposes: {missing:?}"
    );
}

#[test]
fn the_prometheus_rule_holds_the_rule_files_groups() {
    let rules = read_yaml("deploy/monitoring/serving-picker.rules.yaml");
    let object = read_yaml("deploy/monitoring/prometheusrule.yaml");
    assert_eq!(object["kind"], "PrometheusRule");
    assert_eq!(object["spec"]["groups"], rules["groups"]);
    // Every alert has a runbook section.
    let runbook = std::fs::read_to_string(support::repo_root().join("docs/runbook.md")).unwrap();
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            if let Some(alert) = rule["alert"].as_str() {
                assert!(
                    runbook.contains(&format!("## {alert}")),
                    "docs/runbook.md has no section {alert}"
                );
                let url = rule["annotations"]["runbook_url"].as_str().unwrap();
                assert!(
                    url.ends_with(&format!("#{}", alert.to_lowercase())),
                    "{alert}: {url}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The rules on real processes' series

/// The job the shipped scrape configuration gives every companion.
const COMPANION_JOB: &str = "serving-picker-conditions";

/// One scrape target: its labels, and two scrapes `gap_s` apart (the second
/// at Unix time `wall`). `None` scrapes: the target did not answer (`up` 0).
struct Target {
    labels: Vec<(String, String)>,
    first: Option<String>,
    second: Option<String>,
    gap_s: f64,
    wall: f64,
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

impl Target {
    /// Scrapes `fetch` twice, `gap` apart.
    fn scrape(
        labels: &[(&str, &str)],
        gap: Duration,
        fetch: impl Fn() -> Option<String>,
    ) -> Target {
        let first = fetch();
        let t0 = Instant::now();
        std::thread::sleep(gap);
        let second = fetch();
        Target {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            first,
            second,
            gap_s: t0.elapsed().as_secs_f64(),
            wall: unix_now(),
        }
    }

    fn companion(instance: &str, c: &Companion, gap: Duration) -> Target {
        Target::scrape(
            &[("job", COMPANION_JOB), ("instance", instance)],
            gap,
            || {
                let r = c.get("/metrics");
                (r.status == 200).then_some(r.body)
            },
        )
    }

    fn envoy(labels: &[(&str, &str)], envoy: &Envoy, gap: Duration) -> Target {
        Target::scrape(labels, gap, || {
            let r = envoy.admin_get("/stats/prometheus");
            (r.status == 200).then_some(r.body)
        })
    }
}

/// Samples (`name{labels}` -> value) and the families' types.
fn samples(text: &str) -> (BTreeMap<String, f64>, BTreeMap<String, String>) {
    let mut values = BTreeMap::new();
    let mut types = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut w = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (w.next(), w.next()) {
                types.insert(name.to_string(), kind.to_string());
            }
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        if let Ok(v) = value.parse::<f64>() {
            if v.is_finite() {
                values.insert(series.to_string(), v);
            }
        }
    }
    (values, types)
}

/// `series` with `labels` added (they win over the target's own).
fn with_labels(series: &str, labels: &[(String, String)]) -> String {
    let (name, own) = match series.split_once('{') {
        Some((n, rest)) => (n, rest.trim_end_matches('}')),
        None => (series, ""),
    };
    let mut parts: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    if !own.is_empty() {
        parts.push(own.to_string());
    }
    format!("{name}{{{}}}", parts.join(","))
}

/// The family a sample belongs to (`x_bucket`, `x_sum`, `x_count` of a
/// histogram `x`; `x_total` of a counter `x`).
fn family<'a>(name: &'a str, types: &BTreeMap<String, String>) -> Option<&'a str> {
    if types.contains_key(name) {
        return Some(name);
    }
    ["_bucket", "_sum", "_count", "_total"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix).filter(|f| types.contains_key(*f)))
}

const MINUTES: usize = 30;

/// The promtool input series of `t` over `MINUTES` minutes after its second
/// scrape (promtool's time 0 is that scrape).
fn input_series(t: &Target) -> Vec<(String, String)> {
    let up = with_labels("up", &t.labels);
    let (Some(first), Some(second)) = (&t.first, &t.second) else {
        return vec![(up, format!("0x{MINUTES}"))];
    };
    let (before, _) = samples(first);
    let (after, types) = samples(second);
    let mut out = vec![(up, format!("1x{MINUTES}"))];
    for (series, v2) in &after {
        let name = series.split('{').next().unwrap_or(series);
        let v1 = before.get(series).copied().unwrap_or(*v2);
        let kind = family(name, &types)
            .and_then(|f| types.get(f))
            .map_or("untyped", String::as_str);
        // Unix times become seconds from the second scrape; one that moved
        // between the scrapes is kept current, one that did not stays put.
        let time_like =
            name.ends_with("_timestamp_seconds") || name.ends_with("_not_after_seconds");
        let (start, per_second) = if time_like && *v2 > 0.0 {
            (v2 - t.wall, if v2 > &v1 { 1.0 } else { 0.0 })
        } else if matches!(kind, "counter" | "histogram" | "summary") {
            (*v2, ((v2 - v1) / t.gap_s).max(0.0))
        } else {
            (*v2, 0.0)
        };
        let values: Vec<String> = (0..=MINUTES)
            .map(|m| format!("{}", start + per_second * 60.0 * m as f64))
            .collect();
        out.push((with_labels(series, &t.labels), values.join(" ")));
    }
    out
}

/// Every alert of the shipped rules that fires at any minute of `MINUTES`
/// on these targets' series: (alert, instance) pairs.
fn firing_alerts(tag: &str, targets: &[Target]) -> BTreeSet<(String, String)> {
    let rules = read_yaml("deploy/monitoring/serving-picker.rules.yaml");
    let alerts: Vec<String> = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect();
    let mut test = String::new();
    test += &format!(
        "rule_files:\n- {}\nevaluation_interval: 1m\ntests:\n- interval: 1m\n  input_series:\n",
        support::repo_root()
            .join("deploy/monitoring/serving-picker.rules.yaml")
            .display()
    );
    for t in targets {
        for (series, values) in input_series(t) {
            test += &format!(
                "  - series: '{}'\n    values: '{values}'\n",
                series.replace('\'', "''")
            );
        }
    }
    test += "  alert_rule_test:\n";
    for m in (0..=MINUTES).step_by(5) {
        for a in &alerts {
            test += &format!("  - eval_time: {m}m\n    alertname: {a}\n    exp_alerts: []\n");
        }
    }
    let dir = fresh_dir(&format!("promtool-{tag}"));
    let file = dir.join("test.yaml");
    std::fs::write(&file, &test).unwrap();
    let out = Command::new("promtool")
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("promtool (apt-get install prometheus): {e}"));
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let mut firing = BTreeSet::new();
    let mut alert = String::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("alertname: ") {
            alert = rest.split(',').next().unwrap_or_default().to_string();
        } else if let Some(labels) = line.strip_prefix("Labels:") {
            let instance = labels
                .split("instance=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("-");
            firing.insert((alert.clone(), instance.to_string()));
        }
    }
    assert!(
        out.status.success() || !firing.is_empty(),
        "promtool failed without naming an alert ({}):\n{text}",
        file.display()
    );
    firing
}

/// A companion in `eds` mode reading the Kubernetes API at an address that
/// refuses every connection (it can never list).
fn companion_without_api_server(tag: &str) -> (std::process::Child, SocketAddr) {
    let dir = fresh_dir(tag);
    let port = free_port();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n\
             users: [{{name: u, user: {{}}}}]\n\
             contexts: [{{name: c, context: {{cluster: c, user: u}}}}]\n"
        ),
    )
    .unwrap();
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let child = Command::new(companion_bin())
        .args(["eds", "--cluster", "backend=e2e/web:http"])
        .args(["--listen", &listen.to_string()])
        .args(["--metrics-listen", &metrics.to_string()])
        .env("KUBECONFIG", &kubeconfig)
        .env("HOME", &dir)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (child, metrics)
}

/// A hook that moves cluster `name` from the bootstrap to CDS from a
/// watched file (`<dir>/cds/cds.json`).
fn cluster_from_cds_file(name: &str) -> impl Fn(&mut Value, &std::path::Path) + 'static {
    let name = name.to_string();
    move |bootstrap: &mut Value, dir: &std::path::Path| {
        let clusters = bootstrap["static_resources"]["clusters"]
            .as_array_mut()
            .unwrap();
        let at = clusters.iter().position(|c| c["name"] == name).unwrap();
        let mut cluster = clusters.remove(at);
        cluster["@type"] = serde_json::json!("type.googleapis.com/envoy.config.cluster.v3.Cluster");
        let cds = dir.join("cds");
        std::fs::create_dir_all(&cds).unwrap();
        let doc = serde_json::json!({"version_info": "1", "resources": [cluster]});
        let tmp = cds.join(".cds.json.tmp");
        std::fs::write(&tmp, doc.to_string()).unwrap();
        std::fs::rename(&tmp, cds.join("cds.json")).unwrap();
        // As with RDS (Envoy Gateway's): routes may name a cluster CDS has not brought.
        bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
            ["typed_config"]["route_config"]["validate_clusters"] = serde_json::json!(false);
        bootstrap["dynamic_resources"] = serde_json::json!({"cds_config": {
            "resource_api_version": "V3",
            "path_config_source": {
                "path": cds.join("cds.json").to_string_lossy(),
                "watched_directory": {"path": cds.to_string_lossy()}
            }
        }});
    }
}

fn print_firing(what: &str, firing: &BTreeSet<(String, String)>) {
    let names: Vec<String> = firing.iter().map(|(a, i)| format!("{a} ({i})")).collect();
    println!(
        "alerts firing, {what}: {}",
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        }
    );
}

/// Healthy processes as shipped, plaintext and TLS: a companion in `eds`
/// mode over mutual TLS and one plaintext (both exporting their certificate
/// gauges: 0 without a certificate), one in `envoy-gateway` mode, an Envoy
/// with the wasm form and one with the native form (labelled as the native
/// proxies' scrape labels them). No alert fires in 30 minutes.
#[test]
fn no_alert_fires_on_healthy_processes_plaintext_or_tls() {
    let gap = Duration::from_secs(3);
    let a = Backend::start("A");
    let slices = SliceDir::create(&fresh_dir("healthy-slices"));
    slices.set_endpoints("web", &[Endpoint::serving(a.addr())]);
    let m = Mtls::new("healthy");
    let args = m.companion_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let tls = Companion::start(slices.path(), &[("backend", "web")], &args);
    let plain = Companion::start(slices.path(), &[("backend", "web")], &[]);
    assert_eq!(
        plain.metric("serving_picker_conditions_tls_certificate_not_after_seconds"),
        Some(0.0),
        "a plaintext companion exports the certificate gauge at 0"
    );
    let wasm = EnvoyBuilder::new()
        .tag("healthy-wasm")
        .eds_cluster("backend", &[Endpoint::serving(a.addr())])
        .form(Form::Wasm)
        .start();
    let native = EnvoyBuilder::new()
        .tag("healthy-native")
        .eds_cluster("backend", &[Endpoint::serving(a.addr())])
        .form(Form::Native)
        .start();
    settle(&wasm, "/backend/x", &[], "A picked (wasm)", picked(&a));
    settle(&native, "/backend/x", &[], "A (native)", served_by(&a));
    let eg_slices = slices.path().to_path_buf();
    let eg = std::thread::spawn(move || {
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut child = Command::new(companion_bin())
            .args(["envoy-gateway", "--listen", &listen.to_string()])
            .args(["--metrics-listen", &metrics.to_string(), "--slices-dir"])
            .arg(&eg_slices)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let get = || {
            let r = support::http::request(metrics, "GET", "/metrics", &[], Duration::from_secs(2));
            (r.status == 200).then_some(r.body)
        };
        let start = Instant::now();
        while get().is_none() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let t = Target::scrape(
            &[("job", COMPANION_JOB), ("instance", "eg-plain")],
            Duration::from_secs(3),
            get,
        );
        let _ = child.kill();
        let _ = child.wait();
        t
    });
    // Traffic through both Envoys while they are scraped.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let load = std::thread::scope(|s| {
        let driver = s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = wasm.get("/backend/x", &[]);
                let _ = native.get("/backend/x", &[]);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let targets = vec![
            Target::companion("eds-tls", &tls, gap),
            Target::companion("eds-plain", &plain, gap),
            Target::envoy(&[("job", "envoy"), ("instance", "wasm")], &wasm, gap),
            Target::envoy(
                &[
                    ("job", "gateway-proxies"),
                    ("instance", "native"),
                    ("serving_picker_form", "native"),
                ],
                &native,
                gap,
            ),
        ];
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        driver.join().unwrap();
        targets
    });
    let mut targets = load;
    targets.push(eg.join().unwrap());
    for t in &targets {
        assert!(t.second.is_some(), "{:?} not scraped", t.labels);
    }
    let firing = firing_alerts("healthy", &targets);
    print_firing(
        "healthy processes (eds TLS and plaintext, envoy-gateway, wasm, native)",
        &firing,
    );
    assert!(
        firing.is_empty(),
        "alerts fire on healthy processes: {firing:?}"
    );
}

/// Each fault a real process can show here, scraped as above, fires the
/// alert that names it (and says which others fire with it):
/// - the wasm filter with a configuration it cannot parse
///   (ServingPickerWasmConfigInvalid);
/// - an Envoy labelled for the native form on which no cluster uses the
///   module (ServingPickerNativeNotAttached);
/// - the wasm filter whose admin API never answers (ServingPickerWasmSnapshotStale);
/// - a companion that can never list (ServingPickerSourceFailing,
///   ServingPickerCompanionNotReady);
/// - the native module refusing its configuration, the cluster coming by
///   CDS: Envoy rejects that cluster alone (its route 503, the other
///   route served) (ServingPickerNativeRefused);
/// - a companion killed (ServingPickerCompanionDown).
#[test]
fn each_fault_fires_the_alert_that_names_it() {
    let gap = Duration::from_secs(3);
    let a = Backend::start("A");
    let mut seen = Vec::new();
    let mut check = |what: &str, expected: &str, targets: Vec<Target>| {
        let firing = firing_alerts(&expected.to_lowercase(), &targets);
        print_firing(what, &firing);
        assert!(
            firing.iter().any(|(alert, _)| alert == expected),
            "{what}: {expected} does not fire; firing: {firing:?}"
        );
        seen.push(expected.to_string());
    };

    let bad = EnvoyBuilder::new()
        .tag("fault-config-invalid")
        .with_filter(Some(r#"{"clusters": 5}"#))
        .eds_cluster("backend", &[Endpoint::serving(a.addr())])
        .start();
    for _ in 0..20 {
        let _ = bad.get("/backend/x", &[]);
    }
    check(
        "wasm configuration {\"clusters\": 5}",
        "ServingPickerWasmConfigInvalid",
        vec![Target::envoy(
            &[("job", "envoy"), ("instance", "bad-config")],
            &bad,
            gap,
        )],
    );
    drop(bad);

    let bare = EnvoyBuilder::new()
        .tag("fault-not-attached")
        .with_filter(None)
        .eds_cluster("backend", &[Endpoint::serving(a.addr())])
        .start();
    check(
        "an Envoy labelled native without the module",
        "ServingPickerNativeNotAttached",
        vec![Target::envoy(
            &[
                ("job", "gateway-proxies"),
                ("instance", "bare"),
                ("serving_picker_form", "native"),
            ],
            &bare,
            gap,
        )],
    );
    drop(bare);

    // The module refuses its configuration; the cluster comes by CDS from a
    // watched file, as on Envoy Gateway: Envoy rejects it alone.
    let c = Backend::start("C");
    let refused = EnvoyBuilder::new()
        .tag("fault-native-refused")
        .form(Form::Native)
        .native_config(r#"{"no_such_key": 1}"#)
        .eds_cluster("backend", &[Endpoint::serving(a.addr())])
        .static_cluster("other", &[Endpoint::serving(c.addr())])
        .bootstrap_hook(support::companion::plain_round_robin("other"))
        .bootstrap_hook(cluster_from_cds_file("backend"))
        .start();
    assert_all(
        &batch(&refused, "/other/x", &[], 5),
        "the other cluster",
        served_by(&c),
    );
    let r = refused.get("/backend/x", &[]);
    assert_eq!(r.status, 503, "the refused cluster is missing: {r:?}");
    assert!(refused.stat_or_zero("cluster_manager.cds.update_rejected") >= 1);
    check(
        "the native module refusing its configuration (CDS)",
        "ServingPickerNativeRefused",
        vec![Target::envoy(
            &[
                ("job", "gateway-proxies"),
                ("instance", "refused"),
                ("serving_picker_form", "native"),
            ],
            &refused,
            gap,
        )],
    );
    drop(refused);

    let closed = free_port();
    let no_admin = EnvoyBuilder::new()
        .tag("fault-admin-unreachable")
        .admin_cluster_port(closed)
        .eds_cluster("backend", &[Endpoint::serving(a.addr())])
        .start();
    check(
        "wasm filter whose admin API never answers",
        "ServingPickerWasmSnapshotStale",
        vec![Target::envoy(
            &[("job", "envoy"), ("instance", "no-admin")],
            &no_admin,
            gap,
        )],
    );
    drop(no_admin);

    let (mut child, metrics) = companion_without_api_server("fault-no-api");
    let get = || {
        let r = support::http::request(metrics, "GET", "/metrics", &[], Duration::from_secs(2));
        (r.status == 200).then_some(r.body)
    };
    let start = Instant::now();
    while get().is_none() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Two scrapes with a failed list between them, its error series in
    // both (a counter read once is no increase): the source retries with
    // kube's backoff (0.8 s doubling to 30 s), so a fixed gap can fall
    // between two attempts, or before the first; scrape again until one
    // error series has grown between the two.
    let grew = |t: &Target| -> bool {
        let (Some(first), Some(second)) = (&t.first, &t.second) else {
            return false;
        };
        let before = samples(first).0;
        samples(second).0.iter().any(|(series, v2)| {
            series.starts_with("serving_picker_conditions_source_errors_total")
                && before.get(series).is_some_and(|v1| v2 > v1)
        })
    };
    let mut t = Target::scrape(&[("job", COMPANION_JOB), ("instance", "no-api")], gap, get);
    let waited = Instant::now();
    while !grew(&t) && waited.elapsed() < Duration::from_secs(60) {
        t = Target::scrape(&[("job", COMPANION_JOB), ("instance", "no-api")], gap, get);
    }
    let _ = child.kill();
    let _ = child.wait();
    check(
        "a companion that can never list",
        "ServingPickerSourceFailing",
        vec![t],
    );

    let slices = SliceDir::create(&fresh_dir("fault-down-slices"));
    slices.set_endpoints("web", &[Endpoint::serving(a.addr())]);
    let mut down = Companion::start(slices.path(), &[("backend", "web")], &[]);
    down.kill();
    check(
        "a companion killed",
        "ServingPickerCompanionDown",
        vec![Target::companion("killed", &down, gap)],
    );
    println!("faults checked: {}", seen.join(", "));
}
