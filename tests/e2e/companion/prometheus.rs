//! A real Prometheus (Debian's, `apt-get install prometheus`) with the
//! shipped rules, started by `scripts/prometheus.sh` as `make run` starts
//! it, scraping a running companion and an Envoy fed by it (wasm form):
//! a Service's only pod stops serving and `ServingPickerServiceWithoutServingEndpoint`
//! fires, read from Prometheus' own HTTP API (`/api/v1/alerts`); the pod
//! serves again and the alert resolves. Scrape and evaluation every second,
//! so the round trip takes seconds. Fails when Prometheus is not installed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::companion::{eds_from_companion, Companion, SliceDir, XdsApi};
use support::envoy::fresh_dir;
use support::ports::free_port;
use support::*;

const ALERT: &str = "ServingPickerServiceWithoutServingEndpoint";

/// Prometheus as `scripts/prometheus.sh` runs it; stopped on drop.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    log: std::path::PathBuf,
}

impl Prometheus {
    fn start(targets: &[String]) -> Prometheus {
        let dir = fresh_dir("prometheus");
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let log = dir.join("prometheus.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(support::repo_root().join("scripts/prometheus.sh"))
            .arg(&dir)
            .arg(addr.to_string())
            .arg("1s")
            .args(targets)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .unwrap();
        let mut p = Prometheus { child, addr, log };
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = p.child.try_wait() {
                panic!(
                    "scripts/prometheus.sh exited ({status}): is Debian's prometheus installed? \
                     (apt-get install prometheus)\n{}",
                    std::fs::read_to_string(&p.log).unwrap_or_default()
                );
            }
            if p.get("/-/ready").status == 200 {
                return p;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "Prometheus not ready in 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn get(&self, path: &str) -> support::http::Response {
        support::http::request(self.addr, "GET", path, &[], Duration::from_secs(5))
    }

    fn api(&self, path: &str) -> Value {
        let r = self.get(path);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        serde_json::from_str(&r.body).unwrap()
    }

    /// The state of `alert` for cluster `cluster` ("firing", "pending"), if any.
    fn alert_state(&self, alert: &str, cluster: &str) -> Option<String> {
        let v = self.api("/api/v1/alerts");
        v["data"]["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["labels"]["alertname"] == alert && a["labels"]["cluster"] == cluster)
            .map(|a| a["state"].as_str().unwrap_or_default().to_string())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> (T, Duration) {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return (v, start.elapsed());
        }
        assert!(start.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_no_serving_alert_fires_and_resolves_in_a_real_prometheus() {
    let a = Backend::start("A");
    let slices = SliceDir::create(&fresh_dir("prometheus-slices"));
    slices.set_endpoints("web", &[Endpoint::serving(a.addr())]);
    let companion = Companion::start(slices.path(), &[("backend", "web")], &[]);
    let envoy = EnvoyBuilder::new()
        .tag("prometheus")
        .eds_cluster("backend", &[])
        .bootstrap_hook(eds_from_companion(companion.listen_addr(), XdsApi::Ads))
        .form(Form::Wasm)
        .start();
    let prom = Prometheus::start(&[
        format!(
            "serving-picker-conditions@{}/metrics",
            companion.metrics_addr()
        ),
        format!("envoy@{}/stats/prometheus", envoy.admin_addr()),
    ]);
    // Both targets up, the rules loaded, the gauge scraped at 1.
    wait_for("both targets up", Duration::from_secs(30), || {
        let t = prom.api("/api/v1/targets");
        let up = t["data"]["activeTargets"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["health"] == "up")
            .count();
        (up == 2).then_some(())
    });
    let rules = prom.api("/api/v1/rules");
    assert!(rules.to_string().contains(ALERT), "{rules}");
    wait_for("the gauge at 1", Duration::from_secs(30), || {
        let q = prom.api("/api/v1/query?query=serving_picker_conditions_service_serving_endpoints%7Bcluster%3D%22backend%22%7D");
        let v = q["data"]["result"][0]["value"][1]
            .as_str()
            .map(str::to_string);
        (v.as_deref() == Some("1")).then_some(())
    });
    assert_eq!(prom.alert_state(ALERT, "backend"), None);

    // The only pod stops serving: the no-serving 503, and the alert fires.
    let t0 = Instant::now();
    slices.set_endpoints("web", &[Endpoint::not_serving(a.addr())]);
    settle(
        &envoy,
        "/backend/x",
        &[],
        "the no-serving 503",
        no_serving_503("backend"),
    );
    let (_, fired) = wait_for("the alert firing", Duration::from_secs(60), || {
        (prom.alert_state(ALERT, "backend").as_deref() == Some("firing")).then_some(())
    });
    let fired = fired.max(t0.elapsed());
    // The wasm form's counter of labelled 503s reached Prometheus too.
    wait_for(
        "the 503s scraped from Envoy",
        Duration::from_secs(30),
        || {
            let q = prom.api("/api/v1/query?query=serving_picker_reject_no_serving");
            let v = q["data"]["result"][0]["value"][1]
                .as_str()
                .map(str::to_string);
            v.and_then(|v| v.parse::<f64>().ok()).filter(|v| *v > 0.0)
        },
    );

    // It serves again: the alert resolves.
    let t1 = Instant::now();
    slices.set_endpoints("web", &[Endpoint::serving(a.addr())]);
    let (_, _) = wait_for("the alert resolved", Duration::from_secs(60), || {
        prom.alert_state(ALERT, "backend").is_none().then_some(())
    });
    let resolved = t1.elapsed();
    eprintln!(
        "Prometheus round trip (1 s scrape and evaluation): {ALERT} firing {:.1} s after the slice change, resolved {:.1} s after the restore",
        fired.as_secs_f64(),
        resolved.as_secs_f64()
    );
}
