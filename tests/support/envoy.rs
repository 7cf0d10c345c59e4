//! Bootstrap builder and Envoy process for the e2e tests.
//!
//! Every Envoy gets its own temp dir (bootstrap, EDS files, logs), its own
//! ports, `--concurrency 2`, `--disable-hot-restart`, and is stopped in Drop.
//! When a test panics, Drop prints the tail of the Envoy log and the access
//! log (shown by the test harness with the failure) and keeps the dir.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::bootstrap::{
    bootstrap, eds_cluster, file_access_log, http_connection_manager, lb_endpoint, listener,
    native_lb_policy, override_host_policy, override_host_statuses, route, static_cluster,
    wasm_filter,
};
use super::eds::{load_assignment, EdsFile, Endpoint};
use super::http::{self, Response};
use super::ports::free_port;
use super::process::terminate;
use super::OVERRIDE_HEADER;

static DIR_COUNTER: AtomicU64 = AtomicU64::new(0);

const READY_TIMEOUT: Duration = Duration::from_secs(20);
const START_ATTEMPTS: usize = 4;

/// `ENVOY_BIN`, or `<repo>/.venv/bin/envoy`; panics if missing.
pub fn envoy_bin() -> PathBuf {
    let p = std::env::var_os("ENVOY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join(".venv/bin/envoy"));
    if !p.is_file() {
        panic!(
            "Envoy binary not found at {} (ENVOY_BIN): run `make envoy build` first",
            p.display()
        );
    }
    p
}

/// `SERVING_PICKER_WASM`, or `<repo>/target/serving_picker.wasm`; panics if missing.
pub fn wasm_module() -> PathBuf {
    let p = std::env::var_os("SERVING_PICKER_WASM")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join("target/serving_picker.wasm"));
    if !p.is_file() {
        panic!(
            "serving_picker wasm module not found at {} (SERVING_PICKER_WASM): run `make envoy build` first",
            p.display()
        );
    }
    p
}

/// `SERVING_PICKER_NATIVE`, or `<repo>/target/release/libserving_picker.so`;
/// panics if missing.
pub fn native_module() -> PathBuf {
    let p = std::env::var_os("SERVING_PICKER_NATIVE")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join("target/release/libserving_picker.so"));
    if !p.is_file() {
        panic!(
            "serving_picker native module not found at {} (SERVING_PICKER_NATIVE): run `make build` first",
            p.display()
        );
    }
    p
}

/// The Envoy release of `ENVOY_BIN` ("1.40.0"), from `envoy --version`.
pub fn envoy_release() -> String {
    envoy_release_of(&envoy_bin())
}

/// The Envoy release of an Envoy executable ("1.40.0").
pub fn envoy_release_of(bin: &Path) -> String {
    let out = Command::new(bin)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("envoy --version: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    // "<path>  version: <commit>/1.40.0/Clean/RELEASE/BoringSSL"
    text.split("version: ")
        .nth(1)
        .and_then(|v| v.split('/').nth(1))
        .filter(|v| v.split('.').count() == 3)
        .unwrap_or_else(|| panic!("no version in `envoy --version`: {text}"))
        .to_string()
}

/// The wasm runtime the filter runs in: `SERVING_PICKER_WASM_RUNTIME` (v8,
/// wasmtime, or a full `envoy.wasm.runtime.*` name), default V8.
pub fn wasm_runtime() -> String {
    let r = std::env::var("SERVING_PICKER_WASM_RUNTIME").unwrap_or_else(|_| "v8".into());
    if r.starts_with("envoy.wasm.runtime.") {
        r
    } else {
        format!("envoy.wasm.runtime.{r}")
    }
}

/// Which form of serving-picker an Envoy runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// The proxy-wasm filter steering through the override_host policy.
    Wasm,
    /// The dynamic-module load-balancing policy (libserving_picker.so),
    /// with the `local_reply_config` of envoy-native.yaml.
    Native,
}

impl Form {
    pub const BOTH: [Form; 2] = [Form::Wasm, Form::Native];

    pub fn name(self) -> &'static str {
        match self {
            Form::Wasm => "wasm",
            Form::Native => "native",
        }
    }
}

/// The policy JSON of the native form for a plugin configuration: the keys
/// both forms share (the wasm filter's own keys do not apply).
pub fn native_policy_config(plugin_config_json: &str) -> String {
    let v: Value = serde_json::from_str(plugin_config_json).unwrap_or(Value::Null);
    let mut out = serde_json::Map::new();
    if let Some(obj) = v.as_object() {
        for k in [
            "metadata_namespace",
            "local_zone",
            "local_node",
            "local_zone_min_share",
        ] {
            if let Some(x) = obj.get(k) {
                out.insert(k.into(), x.clone());
            }
        }
    }
    Value::Object(out).to_string()
}

/// The `local_reply_config` the native form ships (envoy-native.yaml): a
/// `no healthy upstream` (flag UH) becomes the wasm form's no-serving 503.
pub fn native_local_reply_config() -> Value {
    json!({"mappers": [{
        "filter": {"response_flag_filter": {"flags": ["UH"]}},
        "status_code": 503,
        "headers_to_add": [{"header": {"key": "x-serving-picker", "value": "no-serving-endpoint"},
                            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}],
        "body_format_override": {"text_format_source": {"inline_string":
            "no-serving-endpoint: cluster \"%UPSTREAM_CLUSTER%\" has no serving endpoint\n"}}
    }]})
}

/// A fresh directory under the system temp dir, named with pid + counter.
pub fn fresh_dir(tag: &str) -> PathBuf {
    let n = DIR_COUNTER.fetch_add(1, Ordering::SeqCst);
    let d = std::env::temp_dir().join(format!(
        "serving-picker-e2e-{}-{}-{}",
        std::process::id(),
        n,
        tag
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
    d
}

enum ClusterKind {
    /// Endpoints, and the EDS service name when it differs from the cluster's.
    Eds(Vec<Endpoint>, Option<String>),
    Static(Vec<Endpoint>),
}

struct ClusterSpec {
    name: String,
    kind: ClusterKind,
}

pub struct EnvoyBuilder {
    tag: String,
    clusters: Vec<ClusterSpec>,
    filter: Option<String>,
    retry_policy: Option<Value>,
    admin_cluster_port: Option<u16>,
    override_header: String,
    hooks: Vec<BootstrapHook>,
    form: Form,
    /// The native policy's JSON verbatim (else derived from the filter's).
    native_config: Option<String>,
    /// Command-line arguments after the harness's own.
    extra_args: Vec<String>,
    /// The Envoy executable (else `envoy_bin()`).
    bin: Option<PathBuf>,
    /// The listener's port (else a free one per start attempt).
    listen_port: Option<u16>,
}

/// Edits the generated bootstrap (and may write files into the Envoy's dir)
/// before Envoy starts; see `EnvoyBuilder::bootstrap_hook`.
pub type BootstrapHook = Box<dyn Fn(&mut Value, &Path)>;

impl Default for EnvoyBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl EnvoyBuilder {
    /// Defaults: the wasm filter with `{"refresh_interval_ms": 100}`, no clusters.
    pub fn new() -> EnvoyBuilder {
        EnvoyBuilder {
            tag: "envoy".into(),
            clusters: Vec::new(),
            filter: Some(super::plugin_config(Value::Null)),
            retry_policy: None,
            admin_cluster_port: None,
            override_header: OVERRIDE_HEADER.into(),
            hooks: Vec::new(),
            form: Form::Wasm,
            native_config: None,
            extra_args: Vec::new(),
            bin: None,
            listen_port: None,
        }
    }

    /// Runs this Envoy executable instead of `ENVOY_BIN` (another release,
    /// in an upgrade).
    pub fn binary(mut self, path: &Path) -> Self {
        self.bin = Some(path.to_path_buf());
        self
    }

    /// Listens on this port (the one a restarted Envoy takes over) instead
    /// of a free one.
    pub fn listen_port(mut self, port: u16) -> Self {
        self.listen_port = Some(port);
        self
    }

    /// One more Envoy command-line argument (e.g. `--service-zone`).
    pub fn arg(mut self, arg: &str) -> Self {
        self.extra_args.push(arg.to_string());
        self
    }

    /// Which form of serving-picker runs (default: wasm). With `Native`,
    /// clusters use the dynamic-module policy with the shared keys of the
    /// plugin configuration, and the listener gets the native local reply.
    pub fn form(mut self, form: Form) -> Self {
        self.form = form;
        self
    }

    /// The native policy's JSON exactly as given (e.g. a bad one).
    pub fn native_config(mut self, json: &str) -> Self {
        self.native_config = Some(json.to_string());
        self
    }

    /// Edits the bootstrap JSON before Envoy starts, for what the builder has
    /// no option for (health checks, outlier detection, LDS from a file...).
    /// Called on every start attempt with the bootstrap and the Envoy's dir.
    pub fn bootstrap_hook(mut self, hook: impl Fn(&mut Value, &Path) + 'static) -> Self {
        self.hooks.push(Box::new(hook));
        self
    }

    /// Names the temp dir (handy when reading a kept dir after a failure).
    pub fn tag(mut self, tag: &str) -> Self {
        self.tag = tag
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        self
    }

    /// An EDS cluster fed from a watched file, with these first endpoints.
    pub fn eds_cluster(mut self, name: &str, endpoints: &[Endpoint]) -> Self {
        self.clusters.push(ClusterSpec {
            name: name.into(),
            kind: ClusterKind::Eds(endpoints.to_vec(), None),
        });
        self
    }

    /// An EDS cluster whose endpoints come as EDS service `service_name`
    /// (the name Envoy's config dump then lists them under).
    pub fn eds_service_cluster(
        mut self,
        name: &str,
        service_name: &str,
        endpoints: &[Endpoint],
    ) -> Self {
        self.clusters.push(ClusterSpec {
            name: name.into(),
            kind: ClusterKind::Eds(endpoints.to_vec(), Some(service_name.into())),
        });
        self
    }

    /// A STATIC cluster.
    pub fn static_cluster(mut self, name: &str, endpoints: &[Endpoint]) -> Self {
        self.clusters.push(ClusterSpec {
            name: name.into(),
            kind: ClusterKind::Static(endpoints.to_vec()),
        });
        self
    }

    /// `Some(plugin_config_json)`: the serving_picker filter with that
    /// configuration; `None`: no wasm filter at all (a control Envoy).
    pub fn with_filter(mut self, plugin_config_json: Option<&str>) -> Self {
        self.filter = plugin_config_json.map(str::to_string);
        self
    }

    /// A route `retry_policy` (RetryPolicy JSON) on every route.
    pub fn retry_policy(mut self, policy: Value) -> Self {
        self.retry_policy = Some(policy);
        self
    }

    /// Points the `envoy_admin` cluster at this port instead of the admin
    /// port (e.g. a closed port, to model an unreachable admin API).
    pub fn admin_cluster_port(mut self, port: u16) -> Self {
        self.admin_cluster_port = Some(port);
        self
    }

    /// Header the clusters' override_host policy reads (default
    /// x-gateway-destination-endpoint); pair with the plugin's `override_header`.
    pub fn override_header(mut self, name: &str) -> Self {
        self.override_header = name.into();
        self
    }

    fn lb_policy(&self) -> Value {
        if let (Form::Native, Some(cfg)) = (self.form, &self.filter) {
            let policy = self
                .native_config
                .clone()
                .unwrap_or_else(|| native_policy_config(cfg));
            return native_lb_policy(&policy);
        }
        override_host_policy(&self.override_header)
    }

    /// The bootstrap JSON for these ports and dir.
    fn bootstrap(
        &self,
        dir: &Path,
        listen_port: u16,
        admin_port: u16,
        wasm: Option<&Path>,
    ) -> Value {
        let admin_cluster_port = self.admin_cluster_port.unwrap_or(admin_port);
        let mut clusters = vec![static_cluster(
            "envoy_admin",
            vec![lb_endpoint(admin_cluster_port)],
        )];
        for c in &self.clusters {
            let mut cl = match &c.kind {
                ClusterKind::Eds(_, service_name) => {
                    let mut cl = eds_cluster(&c.name, &eds_dir(dir, &c.name));
                    if let Some(service) = service_name {
                        cl["eds_cluster_config"]["service_name"] = json!(service);
                    }
                    cl
                }
                ClusterKind::Static(eps) => json!({
                    "name": c.name,
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": load_assignment(&c.name, eps),
                }),
            };
            cl["common_lb_config"] = override_host_statuses();
            cl["load_balancing_policy"] = self.lb_policy();
            clusters.push(cl);
        }

        let mut routes: Vec<Value> = self
            .clusters
            .iter()
            .map(|c| route(&format!("/{}/", c.name), &c.name))
            .chain(self.clusters.first().map(|first| route("/", &first.name)))
            .collect();
        for r in &mut routes {
            if let Some(rp) = &self.retry_policy {
                r["route"]["retry_policy"] = rp.clone();
            }
        }

        if self.form == Form::Native {
            // Retries avoid the host already tried: the module asks Envoy's
            // retry host predicate (envoy-native.yaml does the same).
            for r in &mut routes {
                if let Some(rp) = r["route"]["retry_policy"].as_object_mut() {
                    rp.entry("retry_host_predicate").or_insert(json!([{
                        "name": "envoy.retry_host_predicates.previous_hosts",
                        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}
                    }]));
                    rp.entry("host_selection_retry_max_attempts")
                        .or_insert(json!(3));
                }
            }
        }
        let filters = match (&self.filter, wasm) {
            (Some(cfg), Some(wasm)) => vec![wasm_filter("serving_picker", None, wasm, Some(cfg))],
            _ => Vec::new(),
        };
        let mut extra = json!({"access_log": file_access_log(
            &dir.join("access.log"),
            "[%START_TIME%] \"%REQ(:METHOD)% %REQ(:PATH)%\" %RESPONSE_CODE% %RESPONSE_FLAGS% cluster=%UPSTREAM_CLUSTER% upstream=%UPSTREAM_HOST% override=%REQ(X-GATEWAY-DESTINATION-ENDPOINT)% picker=%RESP(X-SERVING-PICKER)% details=%RESPONSE_CODE_DETAILS%\n",
        )});
        if self.form == Form::Native && self.filter.is_some() {
            extra["local_reply_config"] = native_local_reply_config();
        }
        let hcm = http_connection_manager("ingress", routes, filters, extra);
        bootstrap(
            "serving-picker-e2e",
            admin_port,
            vec![listener("main", listen_port, hcm)],
            clusters,
        )
    }

    /// Writes the bootstrap and EDS files, starts Envoy and waits for /ready.
    pub fn start(self) -> Envoy {
        let bin = self.bin.clone().unwrap_or_else(envoy_bin);
        let native = (self.form == Form::Native && self.filter.is_some()).then(native_module);
        let wasm = if self.filter.is_some() && self.form == Form::Wasm {
            Some(wasm_module())
        } else {
            None
        };
        let dir = fresh_dir(&self.tag);
        let mut eds = BTreeMap::new();
        for c in &self.clusters {
            if let ClusterKind::Eds(eps, service_name) = &c.kind {
                let listed_as = service_name.as_deref().unwrap_or(&c.name);
                eds.insert(
                    c.name.clone(),
                    EdsFile::create(listed_as, &eds_dir(&dir, &c.name), eps),
                );
            }
        }
        let mut last_err = String::new();
        for attempt in 1..=START_ATTEMPTS {
            let listen_port = self.listen_port.unwrap_or_else(free_port);
            let admin_port = free_port();
            let mut bootstrap = self.bootstrap(&dir, listen_port, admin_port, wasm.as_deref());
            for hook in &self.hooks {
                hook(&mut bootstrap, &dir);
            }
            let bpath = dir.join("bootstrap.json");
            let text = serde_json::to_string_pretty(&bootstrap)
                .unwrap_or_else(|e| panic!("bootstrap json: {e}"));
            std::fs::write(&bpath, text)
                .unwrap_or_else(|e| panic!("write {}: {e}", bpath.display()));
            let log = dir.join("envoy.log");
            let _ = std::fs::remove_file(&log);
            let child = spawn_envoy(
                &bin,
                &bpath,
                &log,
                &dir,
                native.as_deref(),
                &self.extra_args,
            );
            let mut envoy = Envoy {
                child: Some(child),
                dir: dir.clone(),
                listen: SocketAddr::from(([127, 0, 0, 1], listen_port)),
                admin: SocketAddr::from(([127, 0, 0, 1], admin_port)),
                eds: std::mem::take(&mut eds),
                quiet: false,
                bin: bin.clone(),
                form: self.form,
            };
            match envoy.wait_ready() {
                Ok(()) => return envoy,
                Err(e) => {
                    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
                    let bind_race = log_text.contains("ddress already in use")
                        || log_text.contains("cannot bind");
                    eds = std::mem::take(&mut envoy.eds);
                    envoy.quiet = true;
                    envoy.kill();
                    last_err = format!(
                        "attempt {attempt}: {e}\n--- envoy log tail ({}) ---\n{}",
                        log.display(),
                        tail(&log_text, 60)
                    );
                    if !bind_race {
                        let validate = validate_bootstrap(&bin, &bpath);
                        drop(envoy);
                        panic!(
                            "Envoy did not become ready; bootstrap {}\n{last_err}\n--- envoy --mode validate ---\n{validate}",
                            bpath.display()
                        );
                    }
                    drop(envoy);
                }
            }
        }
        panic!("Envoy did not start after {START_ATTEMPTS} attempts (port races?)\n{last_err}");
    }
}

fn eds_dir(dir: &Path, cluster: &str) -> PathBuf {
    dir.join("eds").join(cluster)
}

fn spawn_envoy(
    bin: &Path,
    bootstrap: &Path,
    log: &Path,
    dir: &Path,
    native: Option<&Path>,
    extra_args: &[String],
) -> Child {
    let stdout = std::fs::File::create(dir.join("stdout.log")).ok();
    let stderr = std::fs::File::create(dir.join("stderr.log")).ok();
    let mut cmd = Command::new(bin);
    cmd.arg("-c")
        .arg(bootstrap)
        // Two workers unless the test asks for another count.
        .args(if extra_args.iter().any(|a| a == "--concurrency") {
            &["--disable-hot-restart"][..]
        } else {
            &["--concurrency", "2", "--disable-hot-restart"][..]
        })
        .args([
            "-l",
            "info",
            "--component-log-level",
            "wasm:debug,dynamic_modules:debug",
        ])
        .arg("--log-path")
        .arg(log)
        .args(["--file-flush-interval-msec", "100"])
        .args(extra_args)
        .stdin(Stdio::null())
        .stdout(stdout.map(Stdio::from).unwrap_or_else(Stdio::null))
        .stderr(stderr.map(Stdio::from).unwrap_or_else(Stdio::null))
        .current_dir(dir);
    if let Some(so) = native {
        // Envoy loads lib<name>.so from here (`dynamic_module_config: {name: serving_picker}`).
        cmd.env(
            "ENVOY_DYNAMIC_MODULES_SEARCH_PATH",
            so.parent().unwrap_or_else(|| Path::new(".")),
        );
    }
    cmd.spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()))
}

/// `envoy --mode validate` on a bootstrap: its output (both streams).
pub fn validate_bootstrap(bin: &Path, bootstrap: &Path) -> String {
    match Command::new(bin)
        .arg("--mode")
        .arg("validate")
        .arg("-c")
        .arg(bootstrap)
        .args(["--disable-hot-restart", "-l", "warn"])
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) => format!(
            "exit {:?}\n{}{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => format!("could not run validate: {e}"),
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

pub struct Envoy {
    child: Option<Child>,
    dir: PathBuf,
    listen: SocketAddr,
    admin: SocketAddr,
    eds: BTreeMap<String, EdsFile>,
    quiet: bool,
    bin: PathBuf,
    form: Form,
}

impl Envoy {
    fn wait_ready(&mut self) -> Result<(), String> {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < READY_TIMEOUT {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("Envoy exited during start-up: {status}"));
                }
            }
            let r = http::request(self.admin, "GET", "/ready", &[], Duration::from_secs(2));
            if r.status == 200 {
                return Ok(());
            }
            last = r.summary();
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!(
            "admin /ready not 200 within {READY_TIMEOUT:?}; last answer: {last}"
        ))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn listen_addr(&self) -> SocketAddr {
        self.listen
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    pub fn bootstrap_path(&self) -> PathBuf {
        self.dir.join("bootstrap.json")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("envoy.log")
    }

    /// The EDS file of an EDS cluster.
    pub fn eds(&self, cluster: &str) -> &EdsFile {
        self.eds
            .get(cluster)
            .unwrap_or_else(|| panic!("no EDS cluster {cluster:?} (have {:?})", self.eds.keys()))
    }

    /// Writes a new EDS version for `cluster`.
    pub fn set_endpoints(&self, cluster: &str, endpoints: &[Endpoint]) {
        self.eds(cluster).write(endpoints);
    }

    /// Which form of serving-picker this Envoy runs.
    pub fn form(&self) -> Form {
        self.form
    }

    /// GET through the listener.
    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        super::set_current_form(self.form);
        http::get(self.listen, path, headers)
    }

    /// GET on the admin API.
    pub fn admin_get(&self, path: &str) -> Response {
        http::get(self.admin, path, &[])
    }

    /// A counter or gauge from admin /stats: `name` exactly, or with
    /// Envoy's `wasmcustom.` prefix for the filter's own metrics.
    pub fn stat(&self, name: &str) -> Option<u64> {
        let r = self.admin_get("/stats");
        if r.status != 200 {
            return None;
        }
        let prefixed = format!("wasmcustom.{name}");
        let native = format!("dynamicmodulescustom.{name}");
        for line in r.body.lines() {
            if let Some((k, v)) = line.split_once(": ") {
                if k == name || k == prefixed || k == native {
                    return v.trim().parse().ok();
                }
            }
        }
        None
    }

    /// `stat`, 0 when Envoy has no such stat (yet).
    pub fn stat_or_zero(&self, name: &str) -> u64 {
        self.stat(name).unwrap_or(0)
    }

    /// All stats whose name contains `needle`, as (name, value text).
    pub fn stats_matching(&self, needle: &str) -> Vec<(String, String)> {
        let r = self.admin_get("/stats");
        r.body
            .lines()
            .filter_map(|l| l.split_once(": "))
            .filter(|(k, _)| k.contains(needle))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Per-worker downstream connection counts of the main listener.
    pub fn worker_connections(&self) -> Vec<u64> {
        let prefix = format!("listener.127.0.0.1_{}.worker_", self.listen.port());
        let mut v: Vec<(String, u64)> = self
            .stats_matching(&prefix)
            .into_iter()
            .filter(|(k, _)| k.ends_with(".downstream_cx_total"))
            .filter_map(|(k, val)| val.trim().parse().ok().map(|n| (k, n)))
            .collect();
        v.sort();
        v.into_iter().map(|(_, n)| n).collect()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Lines of the Envoy log that mention `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }

    /// The name of this Envoy's thread `tid` (as Envoy's log prints it):
    /// "envoy" for the main thread, "wrk:worker_N" for workers.
    pub fn thread_name(&self, tid: &str) -> Option<String> {
        let pid = self.child.as_ref()?.id();
        let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
        Some(comm.trim().to_string())
    }

    /// Is the process still running?
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// `envoy --mode validate` on this Envoy's bootstrap.
    pub fn validate(&self) -> String {
        validate_bootstrap(&self.bin, &self.bootstrap_path())
    }

    /// SIGTERM, and how the process ended (None if it had to be killed
    /// after 10 s or was gone already): a clean shutdown exits 0, a crash
    /// shows a signal.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        terminate(&mut child, Duration::from_secs(10))
    }

    /// SIGTERM (so the logs get flushed), then SIGKILL after 3 s.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            terminate(&mut child, Duration::from_secs(3));
        }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        self.kill();
        if panicking && !self.quiet {
            let log = self.log();
            // Skip the start-up inventory (extension lists, header maps).
            let useful: Vec<String> = log
                .lines()
                .filter(|l| !l.contains("server.cc:467]") && !l.contains("server.cc:547]"))
                .map(|l| l.chars().take(400).collect())
                .collect();
            let wasm: Vec<&String> = useful
                .iter()
                .filter(|l| {
                    l.contains("][wasm]")
                        || l.contains("serving_picker")
                        || l.contains("serving-picker")
                })
                .collect();
            let wasm_tail: Vec<&str> = wasm[wasm.len().saturating_sub(40)..]
                .iter()
                .map(|s| s.as_str())
                .collect();
            let access = std::fs::read_to_string(self.dir.join("access.log")).unwrap_or_default();
            eprintln!(
                "\n===== Envoy (kept in {}) =====\n--- last wasm/filter log lines ---\n{}\n--- envoy log tail ---\n{}\n--- access log tail ---\n{}\n===== end Envoy =====",
                self.dir.display(),
                wasm_tail.join("\n"),
                useful[useful.len().saturating_sub(40)..].join("\n"),
                tail(&access, 20)
            );
        } else if !panicking && !self.quiet {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
