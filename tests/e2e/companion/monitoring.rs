//! The shipped alerts (deploy/monitoring/) against what the real processes
//! expose: every metric a rule reads is scraped from a running companion
//! (`eds` over mutual TLS, and `envoy-gateway`) or from a real Envoy 1.40's
//! /stats/prometheus with each form, not copied from code; and the
//! PrometheusRule holds the rule file's groups. `make monitoring` runs
//! `promtool check rules` and `promtool test rules` on them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
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
                    if !w.contains(':')
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
