//! The conditions companion in the chain: EndpointSlice files -> the real
//! `serving-picker-conditions eds` process -> Envoy (EDS over gRPC, ADS or
//! plain EDS) -> whatever form the EnvoyBuilder loads -> backends.
//!
//! Form-agnostic: `eds_from_companion` is a bootstrap hook that points every
//! EDS cluster of any EnvoyBuilder at the companion; the filter or LB policy
//! stays the builder's business (`plain_round_robin` and
//! `plain_least_request` swap the policy for Envoy's own, no module).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::eds::Endpoint;
use super::envoy::{fresh_dir, Envoy, Form};
use super::http::{self, Response};
use super::ports::free_port;
use super::tweak::cluster_mut;
use super::{
    assert_batch, expect_routing, no_serving_503, per_backend, picked, served_by, settle, Backend,
    BACKEND_HEADER, BATCH,
};

/// Name of the bootstrap cluster that reaches the companion.
pub const XDS_CLUSTER: &str = "serving_picker_conditions";
/// Namespace of the test Services.
pub const NAMESPACE: &str = "e2e";
/// Port name of the test Services.
pub const PORT_NAME: &str = "http";

/// `SERVING_PICKER_CONDITIONS`, or `<repo>/target/release/serving-picker-conditions`.
pub fn companion_bin() -> PathBuf {
    let p = std::env::var_os("SERVING_PICKER_CONDITIONS")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join("target/release/serving-picker-conditions"));
    if !p.is_file() {
        panic!(
            "companion binary not found at {} (SERVING_PICKER_CONDITIONS): run `make build` first",
            p.display()
        );
    }
    p
}

/// A JSON EndpointSlice (as kubectl prints it) for one endpoint of the
/// harness: its conditions (absent ones left nil), zone, port named `http`.
/// One slice per endpoint, since every test backend has its own port.
pub fn slice_for(service: &str, ep: &Endpoint) -> Value {
    let mut conditions = serde_json::Map::new();
    for (k, v) in [
        ("ready", &ep.ready),
        ("serving", &ep.serving),
        ("terminating", &ep.terminating),
    ] {
        if let Some(v) = v {
            conditions.insert(k.into(), v.clone());
        }
    }
    let mut endpoint = json!({
        "addresses": [ep.addr.ip().to_string()],
        "conditions": conditions,
    });
    if let Some(z) = &ep.zone {
        endpoint["zone"] = json!(z);
    }
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{service}-{}", ep.addr.port()),
            "namespace": NAMESPACE,
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": if ep.addr.is_ipv4() { "IPv4" } else { "IPv6" },
        "ports": [{"name": PORT_NAME, "port": ep.addr.port(), "protocol": "TCP"}],
        "endpoints": [endpoint],
    })
}

/// The directory of slice files the companion watches.
pub struct SliceDir {
    dir: PathBuf,
    writes: AtomicU64,
}

impl SliceDir {
    pub fn create(dir: &Path) -> SliceDir {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        SliceDir {
            dir: dir.to_path_buf(),
            writes: AtomicU64::new(0),
        }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Writes `file` (beside, then renamed into place).
    pub fn write_raw(&self, file: &str, text: &str) {
        let n = self.writes.fetch_add(1, Ordering::SeqCst);
        let tmp = self.dir.join(format!(".{file}.{n}.tmp"));
        std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
        let dst = self.dir.join(file);
        std::fs::rename(&tmp, &dst)
            .unwrap_or_else(|e| panic!("rename {} -> {}: {e}", tmp.display(), dst.display()));
    }

    /// `<service>.json`: a kubectl List of the Service's slices, one per endpoint.
    pub fn set_endpoints(&self, service: &str, endpoints: &[Endpoint]) {
        let items: Vec<Value> = endpoints.iter().map(|e| slice_for(service, e)).collect();
        let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
        self.write_raw(&format!("{service}.json"), &list.to_string());
    }
}

/// A running companion (`eds` mode over a slice directory).
pub struct Companion {
    child: Option<Child>,
    listen: SocketAddr,
    metrics: SocketAddr,
    args: Vec<String>,
    log: PathBuf,
    starts: u32,
}

impl Companion {
    /// Starts `serving-picker-conditions eds --slices-dir DIR` with one
    /// `--cluster CLUSTER=e2e/SERVICE:http` per (cluster, service) and
    /// `extra` arguments; waits for /healthz.
    pub fn start(slices: &Path, clusters: &[(&str, &str)], extra: &[&str]) -> Companion {
        let mut args = vec![
            "eds".to_string(),
            "--slices-dir".into(),
            slices.to_string_lossy().into_owned(),
        ];
        for (cluster, service) in clusters {
            args.push("--cluster".into());
            args.push(format!("{cluster}={NAMESPACE}/{service}:{PORT_NAME}"));
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let log_dir = fresh_dir("companion");
        let mut c = Companion {
            child: None,
            listen: SocketAddr::from(([127, 0, 0, 1], free_port())),
            metrics: SocketAddr::from(([127, 0, 0, 1], free_port())),
            args,
            log: log_dir.join("companion.log"),
            starts: 0,
        };
        c.spawn();
        c
    }

    fn spawn(&mut self) {
        self.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("open {}: {e}", self.log.display()));
        let err = log.try_clone().unwrap_or_else(|e| panic!("log clone: {e}"));
        let child = Command::new(companion_bin())
            .args(&self.args)
            .arg("--listen")
            .arg(self.listen.to_string())
            .arg("--metrics-listen")
            .arg(self.metrics.to_string())
            .env("RUST_LOG", "info,serving_picker_conditions=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn companion: {e}"));
        self.child = Some(child);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!(
                        "companion exited at start-up ({status}):\n{}",
                        self.log_text()
                    );
                }
            }
            if self.get("/healthz").status == 200 {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "companion /healthz not 200 within 10 s:\n{}",
            self.log_text()
        );
    }

    /// The gRPC address Envoy connects to.
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen
    }

    /// The metrics port (`/metrics`, `/debug/services`).
    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics
    }

    pub fn get(&self, path: &str) -> http::Response {
        http::request(self.metrics, "GET", path, &[], Duration::from_secs(2))
    }

    /// A metric's value (sum over its label sets when `name` has none).
    pub fn metric(&self, name: &str) -> Option<f64> {
        let r = self.get("/metrics");
        if r.status != 200 {
            return None;
        }
        let mut total = None;
        for line in r.body.lines() {
            let Some((k, v)) = line.rsplit_once(' ') else {
                continue;
            };
            let base = k.split('{').next().unwrap_or(k);
            if k == name || (base == name && !name.contains('{')) {
                if let Ok(v) = v.parse::<f64>() {
                    *total.get_or_insert(0.0) += v;
                }
            }
        }
        total
    }

    /// TLS handshakes refused for the client's identity or protocol, by reason. Leaves out
    /// the handshakes a client gave up on (`incomplete`, `timeout`: Envoy's 1 s connect
    /// timeout on a loaded machine, retried by Envoy) and `displaced` ones.
    pub fn identity_refusals(&self) -> Vec<(&'static str, f64)> {
        [
            "no_client_cert",
            "unknown_ca",
            "san_not_allowed",
            "bad_client_cert",
            "not_tls",
            "client_alert",
            "other",
        ]
        .into_iter()
        .filter_map(|reason| {
            self.metric(&format!(
                "serving_picker_conditions_tls_refusals_total{{reason=\"{reason}\"}}"
            ))
            .map(|n| (reason, n))
        })
        .collect()
    }

    /// SIGKILL, nothing flushed: a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts again on the same ports (after `kill`).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        self.log_text()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }

    pub fn starts(&self) -> u32 {
        self.starts
    }

    /// The running process's id (0 when killed).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }
}

impl Drop for Companion {
    fn drop(&mut self) {
        self.kill();
        print_log_tail_if_failing(&self.log);
    }
}

/// When the test is failing (a panic unwinds), the last 40 lines of a
/// companion's log, with the failure.
pub fn print_log_tail_if_failing(log: &Path) {
    if std::thread::panicking() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        eprintln!(
            "\n===== companion (log {}) =====\n{}\n===== end companion =====",
            log.display(),
            lines[lines.len().saturating_sub(40)..].join("\n")
        );
    }
}

/// A bootstrap edit, as `EnvoyBuilder::bootstrap_hook` takes it.
pub type BootstrapHook = Box<dyn Fn(&mut Value, &Path) + 'static>;

/// How the Envoy in the chain picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Picker {
    /// serving-picker in this form (the harness's builder loads it).
    Module(Form),
    /// No module, Envoy's round robin (the companion's tiered output).
    PlainRoundRobin,
    /// No module, Envoy's least request (Envoy Gateway's default policy).
    PlainLeastRequest,
}

impl Picker {
    /// No module: Envoy's own balancer decides.
    pub fn is_plain(self) -> bool {
        !matches!(self, Picker::Module(_))
    }

    /// A bootstrap hook putting cluster `name` on this picker's plain
    /// policy (`None` for a module: the builder's form sets it).
    pub fn plain_policy(self, name: &str) -> Option<BootstrapHook> {
        match self {
            Picker::Module(_) => None,
            Picker::PlainRoundRobin => Some(Box::new(plain_round_robin(name))),
            Picker::PlainLeastRequest => Some(Box::new(plain_least_request(name, false))),
        }
    }
}

/// Where a step's traffic must go.
pub enum Expect<'a> {
    To(&'a Backend),
    Nobody,
}

/// "goes to B" for this picker: the wasm filter names B in the override
/// header; the native policy and round robin leave no trace but B's answer.
pub fn goes_to(picker: Picker, b: &Backend) -> impl Fn(&Response) -> bool + '_ {
    move |r: &Response| match picker {
        Picker::Module(Form::Wasm) => picked(b)(r),
        _ => served_by(b)(r),
    }
}

/// Asserts where `envoy`'s traffic to `path` (cluster `cluster`) goes once
/// it settles; for `Nobody`, that none of `all` is reached.
pub fn expect(
    envoy: &Envoy,
    picker: Picker,
    (cluster, path): (&str, &str),
    what: &str,
    e: Expect<'_>,
    all: &[&Backend],
) {
    match e {
        Expect::To(b) => {
            let rs = expect_routing(envoy, path, &[], what, goes_to(picker, b));
            print_row_tally(picker, what, &rs, all);
        }
        Expect::Nobody => {
            let nobody = |r: &Response| match picker {
                // Both forms answer the same clear 503 (native: its local_reply_config).
                Picker::Module(_) => no_serving_503(cluster)(r),
                // Envoy's own answer for a cluster without a usable host.
                Picker::PlainRoundRobin | Picker::PlainLeastRequest => {
                    r.status == 503 && r.header(BACKEND_HEADER).is_none()
                }
            };
            settle(envoy, path, &[], what, nobody);
            for b in all {
                b.reset();
            }
            let rs = assert_batch(envoy, path, &[], BATCH, what, nobody);
            for b in all {
                assert_eq!(b.count(), 0, "{what}: {} got requests", b.name());
            }
            print_row_tally(picker, what, &rs, all);
        }
    }
}

/// One line per asserted step (`row-tally | picker | step | A n | B n |
/// 503 n | of N`): where the step's batch went, for the figures.
fn print_row_tally(picker: Picker, what: &str, rs: &[Response], all: &[&Backend]) {
    let served = per_backend(rs);
    let mut line = format!("row-tally | {picker:?} | {what}");
    for b in all {
        let n = served.get(b.name()).copied().unwrap_or(0);
        line.push_str(&format!(" | {} {n}", b.name()));
    }
    let refused = rs.iter().filter(|r| r.status == 503).count();
    line.push_str(&format!(" | 503 {refused} | of {}", rs.len()));
    println!("{line}");
}

/// How Envoy subscribes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdsApi {
    /// `eds_config: {ads: {}}` with `dynamic_resources.ads_config`.
    Ads,
    /// `eds_config: {api_config_source: {api_type: GRPC ...}}`.
    Eds,
    /// As `Ads`, incremental: `ads_config.api_type: DELTA_GRPC`.
    DeltaAds,
    /// As `Eds`, incremental: `api_type: DELTA_GRPC`.
    DeltaEds,
}

/// A bootstrap hook: a STATIC HTTP/2 cluster to the companion, and every
/// EDS cluster's endpoints from it.
pub fn eds_from_companion(addr: SocketAddr, api: XdsApi) -> impl Fn(&mut Value, &Path) + 'static {
    eds_from_companions(&[addr], api)
}

/// As `eds_from_companion`, with every address a host of the one xDS
/// cluster: replicas behind one Service as Envoy sees them (its gRPC
/// stream goes to one host, and to another when that one fails).
pub fn eds_from_companions(
    addrs: &[SocketAddr],
    api: XdsApi,
) -> impl Fn(&mut Value, &Path) + 'static {
    let addrs = addrs.to_vec();
    move |bootstrap: &mut Value, _dir: &Path| {
        let grpc = json!([{"envoy_grpc": {"cluster_name": XDS_CLUSTER}}]);
        let clusters = bootstrap["static_resources"]["clusters"]
            .as_array_mut()
            .unwrap_or_else(|| panic!("bootstrap without clusters"));
        for c in clusters.iter_mut() {
            if c["type"] == "EDS" {
                c["eds_cluster_config"]["eds_config"] = match api {
                    XdsApi::Ads | XdsApi::DeltaAds => {
                        json!({"resource_api_version": "V3", "ads": {}})
                    }
                    XdsApi::Eds | XdsApi::DeltaEds => {
                        json!({"resource_api_version": "V3", "api_config_source": {
                            "api_type": if api == XdsApi::Eds { "GRPC" } else { "DELTA_GRPC" },
                            "transport_api_version": "V3", "grpc_services": grpc
                        }})
                    }
                };
            }
        }
        clusters.push(json!({
            "name": XDS_CLUSTER,
            "type": "STATIC",
            "connect_timeout": "1s",
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}}
                }
            },
            "load_assignment": {"cluster_name": XDS_CLUSTER, "endpoints": [{"lb_endpoints":
                addrs.iter().map(|addr| json!(
                    {"endpoint": {"address": {"socket_address": {
                        "address": addr.ip().to_string(), "port_value": addr.port()
                    }}}}
                )).collect::<Vec<Value>>()
            }]}
        }));
        if matches!(api, XdsApi::Ads | XdsApi::DeltaAds) {
            bootstrap["dynamic_resources"] = json!({"ads_config": {
                "api_type": if api == XdsApi::Ads { "GRPC" } else { "DELTA_GRPC" },
                "transport_api_version": "V3", "grpc_services": grpc
            }});
        }
    }
}

/// The addresses of cluster `name`'s hosts as Envoy's admin `/clusters`
/// lists them now (an empty set when it lists none, or cannot be read).
pub fn envoy_hosts(envoy: &Envoy, name: &str) -> std::collections::BTreeSet<SocketAddr> {
    let r = envoy.admin_get("/clusters?format=json");
    let Ok(j) = serde_json::from_str::<Value>(&r.body) else {
        return Default::default();
    };
    j["cluster_statuses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["name"] == name)
        .flat_map(|c| c["host_statuses"].as_array().into_iter().flatten())
        .filter_map(|h| {
            let a = &h["address"]["socket_address"];
            let ip: std::net::IpAddr = a["address"].as_str()?.parse().ok()?;
            Some(SocketAddr::new(
                ip,
                u16::try_from(a["port_value"].as_u64()?).ok()?,
            ))
        })
        .collect()
}

/// A bootstrap hook: cluster `name` on Envoy's plain round robin (no
/// override_host, no module).
pub fn plain_round_robin(name: &str) -> impl Fn(&mut Value, &Path) + 'static {
    plain_policy_hook(name, round_robin_policy())
}

/// A bootstrap hook: cluster `name` on Envoy's least request (no
/// override_host, no module); `locality_weighted`: with the locality
/// weighted config Envoy Gateway writes on every cluster
/// (envoyproxy/gateway@v1.9.0 `internal/xds/translator/cluster.go`).
pub fn plain_least_request(
    name: &str,
    locality_weighted: bool,
) -> impl Fn(&mut Value, &Path) + 'static {
    plain_policy_hook(name, least_request_policy(locality_weighted))
}

/// Envoy's round robin as a `load_balancing_policy`.
pub fn round_robin_policy() -> Value {
    json!({"policies": [{"typed_extension_config": {
        "name": "envoy.load_balancing_policies.round_robin",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"}
    }}]})
}

/// Envoy's least request as a `load_balancing_policy` (see `plain_least_request`).
pub fn least_request_policy(locality_weighted: bool) -> Value {
    let mut typed = json!({"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest"});
    if locality_weighted {
        typed["locality_lb_config"] = json!({"locality_weighted_lb_config": {}});
    }
    json!({"policies": [{"typed_extension_config": {
        "name": "envoy.load_balancing_policies.least_request",
        "typed_config": typed
    }}]})
}

fn plain_policy_hook(name: &str, policy: Value) -> impl Fn(&mut Value, &Path) + 'static {
    let name = name.to_string();
    move |bootstrap: &mut Value, _dir: &Path| {
        let c = cluster_mut(bootstrap, &name);
        if let Some(o) = c.as_object_mut() {
            o.remove("common_lb_config");
            o.insert("load_balancing_policy".into(), policy.clone());
        }
    }
}
