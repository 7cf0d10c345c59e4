//! The scale scenario, shared by its regression test (small) and its
//! benchmark (`make bench-cluster`, at Kubernetes' limits): the API server
//! double ([`crate::apiserver`]) serving a cluster's slices
//! ([`crate::cluster`]), the companion binary watching it in mode `eds`
//! with `--manage`, fleets of subscribers, churn, and the companion read
//! from outside.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::apiserver::FakeApi;
use crate::cluster::{Cluster, MANAGE_LABEL};
use crate::probe::{self, free_port};
use crate::{subscribe, Connection, Received, Subscription};

/// The API double with a cluster's slices in it, served on loopback.
pub struct Api {
    pub api: FakeApi,
    pub url: String,
    pub cluster: Mutex<Cluster>,
}

impl Api {
    pub async fn start(cluster: Cluster) -> Api {
        let api = FakeApi::default();
        api.apply_all(cluster.all_slices());
        let url = api.clone().start().await;
        Api {
            api,
            url,
            cluster: Mutex::new(cluster),
        }
    }

    /// One transition among `services`: its slice written, with its
    /// trigger time.
    pub fn transition(&self, services: std::ops::Range<usize>) -> usize {
        let mut c = self.cluster.lock().unwrap();
        let (i, k) = c.transition(services);
        let slice = c.slice(i, k, Some(SystemTime::now()));
        drop(c);
        self.api.apply(slice);
        i
    }

    /// Writes one step of a roll (see `Cluster::roll`).
    pub fn write(&self, (i, k): (usize, usize)) {
        let slice = self
            .cluster
            .lock()
            .unwrap()
            .slice(i, k, Some(SystemTime::now()));
        self.api.apply(slice);
    }

    /// A kubeconfig naming this API server (no credentials).
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: nobody\nusers:\n- name: nobody\n  user: {{}}\ncurrent-context: fake\n",
                self.url
            ),
        )
        .unwrap();
        path
    }
}

/// The companion process.
pub struct Companion {
    pub child: Child,
    pub grpc: SocketAddr,
    pub metrics: SocketAddr,
    pub log: PathBuf,
    pub started: Instant,
}

impl Companion {
    /// `serving-picker-conditions eds --manage` against `api`.
    pub fn start(bin: &Path, api: &Api, dir: &Path, extra: &[&str], log_level: &str) -> Companion {
        let grpc = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let log = dir.join("companion.log");
        let started = Instant::now();
        let child = Command::new(bin)
            .args(["eds", "--listen", &grpc.to_string()])
            .args(["--metrics-listen", &metrics.to_string()])
            .args(["--manage", &format!("{MANAGE_LABEL}=true")])
            .args(extra)
            .env("KUBECONFIG", api.kubeconfig(dir))
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("RUST_LOG", log_level)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .unwrap();
        Companion {
            child,
            grpc,
            metrics,
            log,
            started,
        }
    }

    pub fn get(&self, path: &str) -> String {
        probe::http_get(self.metrics, path)
    }

    pub fn metrics_text(&self) -> String {
        self.get("/metrics")
    }

    pub fn metric(&self, name: &str) -> f64 {
        probe::metric(&self.metrics_text(), name)
    }

    pub fn ready(&self) -> bool {
        self.get("/readyz").starts_with("HTTP/1.1 200")
    }

    pub fn rss_mb(&self) -> f64 {
        probe::status_mb(self.child.id(), "VmRSS")
    }

    pub fn cpu_seconds(&self) -> f64 {
        let (u, s) = probe::cpu_split(&self.child.id().to_string());
        u + s
    }

    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Companion {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Subscribers running in the background, each on its own connection.
pub struct Fleet {
    pub received: Vec<Arc<Received>>,
}

impl Fleet {
    /// `n` subscribers of `names` (node ids `<tag>-<i>`), delta or not.
    pub fn start(
        rt: &tokio::runtime::Runtime,
        addr: SocketAddr,
        tag: &str,
        n: usize,
        names: &[String],
        delta: bool,
    ) -> Fleet {
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut received = Vec::with_capacity(n);
        for i in 0..n {
            let r = Arc::new(Received::default());
            let mut sub = if delta {
                Subscription::delta_ads(format!("{tag}-{i}"), &refs)
            } else {
                Subscription::ads(format!("{tag}-{i}"), &refs)
            };
            sub.node_on_first_only = false;
            let rr = r.clone();
            rt.spawn(async move {
                match Connection::open_like_envoy(addr).await {
                    Ok(conn) => {
                        subscribe(&conn, &sub, &rr, Instant::now()).await;
                    }
                    Err(e) => *rr.ended.lock().unwrap() = Some(format!("connect: {e}")),
                }
            });
            received.push(r);
        }
        Fleet { received }
    }

    /// Resources received over the fleet.
    pub fn resources(&self) -> u64 {
        self.received
            .iter()
            .map(|r| r.resources.load(Ordering::SeqCst))
            .sum()
    }

    pub fn bytes(&self) -> u64 {
        self.received
            .iter()
            .map(|r| r.bytes.load(Ordering::SeqCst))
            .sum()
    }

    pub fn ended(&self) -> Vec<String> {
        self.received.iter().filter_map(|r| r.ended()).collect()
    }
}

/// Waits (up to `limit`) for `ok`; a liveness bound, not a timing assert.
pub fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A Prometheus histogram's quantile from its buckets (`name` without
/// `_bucket`), as `histogram_quantile` reads it (upper bounds, linear in a
/// bucket); and its count.
pub fn histogram(text: &str, name: &str) -> (Vec<(f64, f64)>, f64) {
    let prefix = format!("{name}_bucket{{le=\"");
    let mut buckets = Vec::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix(&prefix) {
            if let Some((le, v)) = rest.split_once("\"} ") {
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(f64::INFINITY)
                };
                buckets.push((le, v.parse().unwrap_or(0.0)));
            }
        }
    }
    let count = probe::metric(text, &format!("{name}_count"));
    (buckets, count)
}

/// `q`-quantile of the observations between two readings of a histogram.
pub fn quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> f64 {
    let diff: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, v)| {
            let b = before
                .iter()
                .find(|(l, _)| l == le)
                .map_or(0.0, |(_, v)| *v);
            (*le, v - b)
        })
        .collect();
    let total = diff.last().map_or(0.0, |(_, v)| *v);
    if total == 0.0 {
        return 0.0;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for (le, c) in &diff {
        if *c >= rank {
            if le.is_infinite() {
                return prev.0;
            }
            let span = c - prev.1;
            let frac = if span > 0.0 {
                (rank - prev.1) / span
            } else {
                1.0
            };
            return prev.0 + (le - prev.0) * frac;
        }
        prev = (*le, *c);
    }
    prev.0
}

/// The highest bucket bound that received an observation between two
/// readings (the max, to a bucket).
pub fn max_bucket(before: &[(f64, f64)], after: &[(f64, f64)]) -> f64 {
    let mut last = 0.0;
    let mut prev_count = 0.0;
    for (le, v) in after {
        let b = before
            .iter()
            .find(|(l, _)| l == le)
            .map_or(0.0, |(_, v)| *v);
        let c = v - b;
        if c > prev_count {
            last = *le;
        }
        prev_count = c;
    }
    last
}
