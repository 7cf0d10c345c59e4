//! Envoy Gateway's PostEndpointsModify hook, end to end, without Envoy
//! Gateway (it cannot run here): the test plays EG.
//!
//! EndpointSlice files -> the real `serving-picker-conditions envoy-gateway`
//! binary; the test sends it, as EG >= 1.6 would, the ClusterLoadAssignment
//! EG builds from the same slices (DRAINING when not ready, EG's cluster,
//! locality and `envoy-gateway` metadata), checks the answer, and hands the
//! answer's exact bytes to a real Envoy 1.40 as its EDS (a binary
//! DiscoveryResponse file, `eds.pb`, watched) -> serving-picker (wasm or
//! native form) or no module at all (Envoy's round robin, or least request
//! as EG writes it) -> backends.
//!
//! The seed table's rows and a one-replica rolling update are walked for
//! each path, on the companion's default (tiered) output; with no module
//! also with `--priorities` (accepted, the same output). Also, over the real binary: unmanaged assignments come back
//! byte-identical, other rpcs are UNIMPLEMENTED, metrics count the calls.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use envoy_types::pb::google::protobuf::{value::Kind, Any};
use prost::Message;
use serde_json::Value;
use serving_picker_conditions::envoy_gateway::hook::lb_addr;
use serving_picker_conditions::envoy_gateway::proto::{
    EnvoyGatewayExtensionClient, PostTranslateModifyRequest, RawPostEndpointsModifyRequest,
    RawPostTranslateModifyRequest,
};
use serving_picker_conditions::envoy_gateway::testing::{
    eg_draining, eg_rule_cluster, rule_assignments, rule_cluster, BackendRef, EgEndpoint,
};
use serving_picker_conditions::model::slice::ServiceKey;
use support::companion::{
    companion_bin, plain_least_request, plain_round_robin, Expect, Picker, SliceDir, NAMESPACE,
    PORT_NAME,
};
use support::envoy::fresh_dir;
use support::ports::free_port;
use support::*;

pub(super) const SERVICE: &str = "web";
const ROUTE: &str = "app";
const PATH: &str = "/x";
const CLA_TYPE_URL: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

fn cluster() -> String {
    rule_cluster(NAMESPACE, ROUTE, 0)
}

/// The companion in `envoy-gateway` mode over a slice directory.
pub(super) struct EgCompanion {
    child: Child,
    pub(super) listen: SocketAddr,
    metrics: SocketAddr,
    log: PathBuf,
}

impl EgCompanion {
    pub(super) fn start(slices: &Path, extra: &[&str]) -> EgCompanion {
        let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let log = fresh_dir("eg-companion").join("companion.log");
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let child = Command::new(companion_bin())
            .arg("envoy-gateway")
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--metrics-listen")
            .arg(metrics.to_string())
            .arg("--slices-dir")
            .arg(slices)
            .args(extra)
            .env("RUST_LOG", "info,serving_picker_conditions=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn companion: {e}"));
        let mut c = EgCompanion {
            child,
            listen,
            metrics,
            log,
        };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(status)) = c.child.try_wait() {
                panic!("companion exited ({status}):\n{}", c.log_text());
            }
            if c.get("/readyz").status == 200 {
                return c;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("companion not ready within 10 s:\n{}", c.log_text());
    }

    fn get(&self, path: &str) -> Response {
        support::http::request(self.metrics, "GET", path, &[], Duration::from_secs(2))
    }

    pub(super) fn metric(&self, line_prefix: &str) -> f64 {
        let body = self.get("/metrics").body;
        body.lines()
            .filter(|l| l.starts_with(line_prefix))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
            .sum()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, nothing flushed: a crash.
    pub(super) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for EgCompanion {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        support::companion::print_log_tail_if_failing(&self.log);
    }
}

/// The test's Envoy Gateway: a gRPC client of the hook.
pub(super) struct Eg {
    rt: tokio::runtime::Runtime,
    client: EnvoyGatewayExtensionClient,
}

impl Eg {
    /// Over TLS as EG's extension manager dials (grpc-go with its
    /// advancedtls credentials): the companion's certificate verified
    /// against `ca_pem` (EG's `certificateRef`) for `host` (the host of
    /// `service.fqdn`), and `identity` shown when given
    /// (`clientCertificateRef`). An error when the companion refuses.
    fn connect_tls(
        addr: SocketAddr,
        ca_pem: &str,
        host: &str,
        identity: Option<&support::pki::Leaf>,
    ) -> Result<Eg, String> {
        use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca_pem))
            .domain_name(host);
        if let Some(leaf) = identity {
            tls = tls.identity(Identity::from_pem(&leaf.cert_pem, &leaf.key_pem));
        }
        let client = rt.block_on(async {
            let channel = Endpoint::from_shared(format!("https://{addr}"))
                .map_err(|e| e.to_string())?
                .tls_config(tls)
                .map_err(|e| e.to_string())?
                .connect()
                .await
                .map_err(|e| format!("{e:?}"))?;
            Ok::<_, String>(EnvoyGatewayExtensionClient::new(channel))
        })?;
        let eg = Eg { rt, client };
        // The verdict on a client certificate comes with the first call.
        let mut c = eg.client.clone();
        let probe = RawPostEndpointsModifyRequest {
            load_assignment: Some(Vec::new().into()),
            post_endpoints_context: Some(Vec::new().into()),
        };
        eg.rt
            .block_on(c.post_endpoints_modify_raw(probe))
            .map_err(|e| format!("{e:?}"))?;
        Ok(eg)
    }

    pub(super) fn connect(addr: SocketAddr) -> Eg {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let client = rt
            .block_on(EnvoyGatewayExtensionClient::connect(format!(
                "http://{addr}"
            )))
            .unwrap();
        Eg { rt, client }
    }

    /// PostEndpointsModify: EG's assignment bytes -> the answer's bytes.
    fn modify_raw(&self, cla: Vec<u8>) -> Vec<u8> {
        self.try_modify_raw(cla).unwrap()
    }

    /// As `modify_raw`, the call's status when it fails.
    pub(super) fn try_modify_raw(&self, cla: Vec<u8>) -> Result<Vec<u8>, String> {
        let mut c = self.client.clone();
        let req = RawPostEndpointsModifyRequest {
            load_assignment: Some(cla.into()),
            post_endpoints_context: Some(Vec::new().into()),
        };
        let r = self
            .rt
            .block_on(c.post_endpoints_modify_raw(req))
            .map_err(|e| format!("{e:?}"))?;
        Ok(r.load_assignment
            .expect("an answer carries the assignment")
            .to_vec())
    }
}

fn cond(v: &Option<Value>) -> Option<bool> {
    v.as_ref().and_then(Value::as_bool)
}

/// What EG >= 1.6 sends for these endpoints of `service` (one backendRef,
/// Service port 80; EG's drain rule).
pub(super) fn eg_cla(service: &str, eps: &[Endpoint]) -> ClusterLoadAssignment {
    let r = BackendRef {
        service: ServiceKey {
            namespace: NAMESPACE.into(),
            name: service.into(),
        },
        port: 80,
        weight: None,
        endpoints: eps
            .iter()
            .map(|e| EgEndpoint {
                addr: e.addr,
                draining: eg_draining(cond(&e.ready), cond(&e.serving), cond(&e.terminating)),
                zone: e.zone.clone(),
            })
            .collect(),
    };
    rule_assignments(NAMESPACE, ROUTE, 0, &[r], false).remove(0)
}

/// An answered endpoint: address, priority, health, (serving, terminating).
type Answered = (SocketAddr, u32, i32, Option<(bool, bool)>);

fn answered(cla: &ClusterLoadAssignment) -> Vec<Answered> {
    let b = |s: &envoy_types::pb::google::protobuf::Struct, k: &str| match s
        .fields
        .get(k)
        .and_then(|v| v.kind.as_ref())
    {
        Some(Kind::BoolValue(b)) => Some(*b),
        _ => None,
    };
    cla.endpoints
        .iter()
        .flat_map(|l| {
            l.lb_endpoints.iter().map(move |lb| {
                let md = lb
                    .metadata
                    .as_ref()
                    .and_then(|m| m.filter_metadata.get("k8s.endpointslice"));
                (
                    lb_addr(lb).unwrap(),
                    l.priority,
                    lb.health_status,
                    md.and_then(|s| Some((b(s, "serving")?, b(s, "terminating")?))),
                )
            })
        })
        .collect()
}

/// Whether the answer carries the slices' conditions, health and (with
/// the tiered output) priorities.
fn answer_is_right(cla: &ClusterLoadAssignment, eps: &[Endpoint], priorities: bool) -> bool {
    let got = answered(cla);
    let mut want = Vec::new();
    // Priorities are renumbered without gaps: with no ready pod the
    // serving+terminating ones are at 0.
    let has_ready = eps.iter().any(|e| {
        let ready = cond(&e.ready).unwrap_or(true);
        cond(&e.serving).unwrap_or(ready) && !cond(&e.terminating).unwrap_or(false)
    });
    for e in eps {
        let ready = cond(&e.ready).unwrap_or(true);
        let serving = cond(&e.serving).unwrap_or(ready);
        let terminating = cond(&e.terminating).unwrap_or(false);
        let health = if serving { 1 } else { 2 }; // HEALTHY, UNHEALTHY
        if priorities && !serving {
            continue;
        }
        let p = u32::from(priorities && terminating && has_ready);
        want.push((e.addr, p, health, Some((serving, terminating))));
    }
    let mut g = got.clone();
    g.sort();
    want.sort();
    g == want
}

/// Asks the hook until its answer is right (the companion's file watcher
/// may not have read the slice change yet: EG would translate again on its
/// next change; here the test asks again). Returns the answer's bytes.
pub(super) fn ask(eg: &Eg, eps: &[Endpoint], priorities: bool, what: &str) -> Vec<u8> {
    let sent = eg_cla(SERVICE, eps).encode_to_vec();
    let start = Instant::now();
    let mut asks = 0;
    loop {
        asks += 1;
        let bytes = eg.modify_raw(sent.clone());
        let cla = ClusterLoadAssignment::decode(bytes.as_slice()).unwrap();
        if answer_is_right(&cla, eps, priorities) {
            if asks > 1 {
                eprintln!(
                    "{what}: right answer after {asks} asks ({:?})",
                    start.elapsed()
                );
            }
            return bytes;
        }
        if start.elapsed() > Duration::from_secs(5) {
            panic!(
                "{what}: the hook's answer is not right after {asks} asks: {:?}",
                answered(&cla)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

static PB_WRITES: AtomicU64 = AtomicU64::new(0);

/// Writes a binary DiscoveryResponse with this assignment to `path`
/// (beside it, then renamed into place).
fn write_pb(path: &Path, cla_bytes: Vec<u8>) {
    let n = PB_WRITES.fetch_add(1, Ordering::SeqCst) + 1;
    let doc = DiscoveryResponse {
        version_info: n.to_string(),
        resources: vec![Any {
            type_url: CLA_TYPE_URL.into(),
            value: cla_bytes,
        }],
        type_url: CLA_TYPE_URL.into(),
        ..Default::default()
    };
    let dir = path.parent().unwrap();
    let tmp = dir.join(format!(".eds.pb.{n}.tmp"));
    std::fs::write(&tmp, doc.encode_to_vec()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A bootstrap hook: `cluster`'s EDS file becomes `eds.pb` (binary), first
/// with an empty assignment.
fn eds_pb(cluster: String) -> impl Fn(&mut Value, &Path) + 'static {
    move |bootstrap: &mut Value, _dir: &Path| {
        let clusters = bootstrap["static_resources"]["clusters"]
            .as_array_mut()
            .unwrap();
        let c = clusters
            .iter_mut()
            .find(|c| c["name"] == cluster.as_str())
            .unwrap();
        let src = &mut c["eds_cluster_config"]["eds_config"]["path_config_source"];
        let json = PathBuf::from(src["path"].as_str().unwrap());
        let pb = json.with_file_name("eds.pb");
        src["path"] = Value::String(pb.to_string_lossy().into_owned());
        let empty = ClusterLoadAssignment {
            cluster_name: cluster.clone(),
            ..Default::default()
        };
        write_pb(&pb, empty.encode_to_vec());
    }
}

fn expect(envoy: &Envoy, picker: Picker, what: &str, e: Expect<'_>, all: &[&Backend]) {
    support::companion::expect(envoy, picker, (&cluster(), PATH), what, e, all);
}

struct Run {
    slices: SliceDir,
    companion: EgCompanion,
    eg: Eg,
    envoy: Envoy,
    picker: Picker,
    priorities: bool,
}

/// The companion (with `extra` flags), the test's EG and an Envoy with
/// `picker`; no module means EG's own policy on the cluster: least request
/// with its locality weighted config, as EG writes it
/// (envoyproxy/gateway@v1.9.0 `testdata/out/xds-ir/*.clusters.yaml`), or
/// round robin.
fn start(picker: Picker, first: &[Endpoint], extra: &[&str]) -> Run {
    let priorities = !extra.contains(&"--flat-output");
    let slices = SliceDir::create(&fresh_dir("eg-slices"));
    slices.set_endpoints(SERVICE, first);
    let companion = EgCompanion::start(slices.path(), extra);
    let eg = Eg::connect(companion.listen);
    let cluster = cluster();
    let b = EnvoyBuilder::new()
        .tag(&format!("eg-{picker:?}"))
        .eds_cluster(&cluster, &[])
        .bootstrap_hook(eds_pb(cluster.clone()));
    let envoy = match picker {
        Picker::Module(form) => b.form(form).start(),
        Picker::PlainRoundRobin => b
            .with_filter(None)
            .bootstrap_hook(plain_round_robin(&cluster))
            .start(),
        Picker::PlainLeastRequest => b
            .with_filter(None)
            .bootstrap_hook(plain_least_request(&cluster, true))
            .start(),
    };
    Run {
        slices,
        companion,
        eg,
        envoy,
        picker,
        priorities,
    }
}

impl Run {
    /// The slices change; EG translates and calls the hook; its answer goes to Envoy.
    fn step(&self, what: &str, eps: &[Endpoint], e: Expect<'_>, all: &[&Backend]) {
        eprintln!("step: {what}");
        self.slices.set_endpoints(SERVICE, eps);
        let answer = ask(&self.eg, eps, self.priorities, what);
        write_pb(&self.envoy.eds(&cluster()).dir().join("eds.pb"), answer);
        expect(&self.envoy, self.picker, what, e, all);
    }
}

fn seed_rows(picker: Picker, extra: &[&str]) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let all = [&a, &b];
    let r = start(picker, &[Endpoint::serving(a.addr())], extra);
    r.step(
        "row 1: A serving -> A",
        &[Endpoint::serving(a.addr())],
        Expect::To(&a),
        &all,
    );
    r.step(
        "row 2: A not serving -> nobody",
        &[Endpoint::not_serving(a.addr())],
        Expect::Nobody,
        &all,
    );
    r.step(
        "row 2: A terminating not serving -> nobody",
        &[Endpoint::terminating_not_serving(a.addr())],
        Expect::Nobody,
        &all,
    );
    r.step(
        "row 3: A serving+terminating -> A",
        &[Endpoint::serving_terminating(a.addr())],
        Expect::To(&a),
        &all,
    );
    // The row EG >= 1.6 gets wrong: both DRAINING there.
    r.step(
        "row 4: A serving+terminating, B not yet serving -> A",
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::not_serving(b.addr()),
        ],
        Expect::To(&a),
        &all,
    );
    r.step(
        "row 5: A serving+terminating, B serving -> B",
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b.addr()),
        ],
        Expect::To(&b),
        &all,
    );
    // The status page shows the terminating fallback at priority 1 (the
    // default output: the tiers as priorities).
    let a_row = |j: &Value| {
        j["services"][0]["endpoints"]
            .as_array()
            .and_then(|eps| {
                eps.iter()
                    .find(|e| e["address"] == a.addr().to_string().as_str())
                    .cloned()
            })
            .unwrap_or(Value::Null)
    };
    let tiered = !extra.contains(&"--flat-output");
    let shown = eventually(Duration::from_secs(5), || {
        let body = r.companion.get("/debug/services").body;
        serde_json::from_str::<Value>(&body).is_ok_and(|j| {
            let e = a_row(&j);
            e["tier"] == "terminating_fallback" && e["priority"] == u32::from(tiered)
        })
    });
    assert!(
        shown,
        "A at priority {} on the status page: {}",
        u32::from(tiered),
        r.companion.get("/debug/services").body
    );
    r.step(
        "row 6: A terminating not serving, B serving -> B",
        &[
            Endpoint::terminating_not_serving(a.addr()),
            Endpoint::serving(b.addr()),
        ],
        Expect::To(&b),
        &all,
    );
    assert!(
        r.companion
            .metric("serving_picker_conditions_eg_hook_calls_total{result=\"managed\"}")
            >= 7.0
    );
    // The status page and the serving-endpoints gauge show the Service port
    // as the hook last wrote it: A out (terminating, not serving), B serving.
    let port = format!("{NAMESPACE}/{SERVICE}:{PORT_NAME}");
    let shown = eventually(Duration::from_secs(5), || {
        let body = r.companion.get("/debug/services").body;
        let Ok(j) = serde_json::from_str::<Value>(&body) else {
            return false;
        };
        j["services"].as_array().is_some_and(|ports| {
            ports.iter().any(|p| {
                p["cluster"] == port.as_str()
                    && p["serving"] == 1
                    && p["endpoints"].as_array().map(Vec::len) == Some(2)
            })
        })
    });
    let body = r.companion.get("/debug/services").body;
    assert!(shown, "{port} with 1 of 2 serving: {}", body);
    assert_eq!(
        r.companion.metric(&format!(
            "serving_picker_conditions_service_serving_endpoints{{cluster=\"{port}\"}}"
        )),
        1.0
    );
}

/// One replica replaced, step by step, as EG sends each state.
fn rolling_update(picker: Picker, extra: &[&str]) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let all = [&a, &b];
    let r = start(picker, &[Endpoint::serving(a.addr())], extra);
    let steps: Vec<(&str, Vec<Endpoint>, Expect<'_>)> = vec![
        ("A ready", vec![Endpoint::serving(a.addr())], Expect::To(&a)),
        (
            "B created, not ready",
            vec![Endpoint::serving(a.addr()), Endpoint::not_serving(b.addr())],
            Expect::To(&a),
        ),
        (
            "A in preStop, B still starting",
            vec![
                Endpoint::serving_terminating(a.addr()),
                Endpoint::not_serving(b.addr()),
            ],
            Expect::To(&a),
        ),
        (
            "B ready, A draining",
            vec![
                Endpoint::serving_terminating(a.addr()),
                Endpoint::serving(b.addr()),
            ],
            Expect::To(&b),
        ),
        (
            "A stops serving",
            vec![
                Endpoint::terminating_not_serving(a.addr()),
                Endpoint::serving(b.addr()),
            ],
            Expect::To(&b),
        ),
        ("A gone", vec![Endpoint::serving(b.addr())], Expect::To(&b)),
    ];
    for (what, eps, e) in steps {
        r.step(what, &eps, e, &all);
    }
}

#[test]
fn seed_rows_wasm_form() {
    seed_rows(Picker::Module(Form::Wasm), &[]);
}

#[test]
fn seed_rows_native_form() {
    seed_rows(Picker::Module(Form::Native), &[]);
}

#[test]
fn seed_rows_priority_output_plain_round_robin() {
    seed_rows(Picker::PlainRoundRobin, &["--priorities"]);
}

/// No picker attached (the policy did not attach, the module did not
/// load): EG's own least request on the companion's default output.
#[test]
fn seed_rows_no_picker_least_request() {
    seed_rows(Picker::PlainLeastRequest, &[]);
}

#[test]
fn seed_rows_no_picker_round_robin() {
    seed_rows(Picker::PlainRoundRobin, &[]);
}

#[test]
fn rolling_update_wasm_form() {
    rolling_update(Picker::Module(Form::Wasm), &[]);
}

#[test]
fn rolling_update_native_form() {
    rolling_update(Picker::Module(Form::Native), &[]);
}

#[test]
fn rolling_update_priority_output_plain_round_robin() {
    rolling_update(Picker::PlainRoundRobin, &["--priorities"]);
}

#[test]
fn rolling_update_no_picker_least_request() {
    rolling_update(Picker::PlainLeastRequest, &[]);
}

/// Over the real binary, no Envoy: byte-identical echoes and UNIMPLEMENTED.
#[test]
fn unmanaged_assignments_come_back_byte_identical() {
    let slices = SliceDir::create(&fresh_dir("eg-slices"));
    let a: SocketAddr = "127.0.0.1:9".parse().unwrap();
    slices.set_endpoints(SERVICE, &[Endpoint::serving(a)]);
    let companion = EgCompanion::start(slices.path(), &[]);
    let eg = Eg::connect(companion.listen);
    // A Service without slices (not managed), plus an unknown field (99)
    // prost would drop: the answer is EG's bytes.
    let mut other = eg_cla("other", &[Endpoint::serving_terminating(a)]).encode_to_vec();
    other.extend_from_slice(&[0x9a, 0x06, 0x03, b'x', b'y', b'z']);
    assert_eq!(eg.modify_raw(other.clone()), other);
    // A locality without EG's metadata (EG < 1.4, or not a route backend).
    let mut bare = eg_cla(SERVICE, &[Endpoint::serving(a)]);
    bare.endpoints[0].metadata = None;
    let bare = bare.encode_to_vec();
    assert_eq!(eg.modify_raw(bare.clone()), bare);
    // The managed one is modified.
    let managed = eg_cla(SERVICE, &[Endpoint::serving(a)]).encode_to_vec();
    assert_ne!(eg.modify_raw(managed.clone()), managed);

    let mut c = eg.client.clone();
    let err = eg.rt.block_on(c.post_route_modify_empty()).unwrap_err();
    assert_eq!(err.code() as i32, 12, "UNIMPLEMENTED: {err:?}");
    assert_eq!(
        companion.metric("serving_picker_conditions_eg_hook_calls_total{result=\"unmanaged\"}"),
        2.0
    );
}

/// The host EG dials: `extensionManagers[0].service.fqdn.hostname` in the
/// shipped envoy-gateway-values.yaml.
fn shipped_eg_fqdn() -> String {
    let path = support::repo_root().join("deploy/envoy-gateway/envoy-gateway-values.yaml");
    let values: Value = serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    values["config"]["envoyGateway"]["extensionManagers"][0]["service"]["fqdn"]["hostname"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The hook over mutual TLS with a client that verifies the companion as
/// EG does, and EG's client certificate (a SPIFFE ID the companion's
/// `--client-san` allows): the seed rows' answers as over plaintext. A
/// client without a certificate, or with one whose SAN is not allowed,
/// gets no answer; neither does one that expects another server name.
#[test]
fn the_hook_over_mutual_tls_with_a_client_shaped_as_eg() {
    use support::pki::{refs, Ca, SecretVolume};
    let host = shipped_eg_fqdn();
    let eg_id = "spiffe://cluster.local/ns/serving-picker-gateway/sa/envoy-gateway";
    let ca = Ca::new("eg hook CA");
    let server = ca.server(&[&host]);
    let volume = SecretVolume::create(
        &fresh_dir("eg-tls").join("tls"),
        &refs(&support::pki::companion_files(&server, &ca.pem)),
    );
    let f = |n: &str| volume.file(n).display().to_string();
    let (cert, key, client_ca) = (f("tls.crt"), f("tls.key"), f("ca.crt"));
    let slices = SliceDir::create(&fresh_dir("eg-tls-slices"));
    let a: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let b: SocketAddr = "127.0.0.1:10".parse().unwrap();
    slices.set_endpoints(SERVICE, &[Endpoint::serving(a)]);
    let companion = EgCompanion::start(
        slices.path(),
        &[
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--client-ca",
            &client_ca,
            "--client-san",
            eg_id,
        ],
    );
    let eg_cert = ca.client(&[eg_id]);
    let eg = Eg::connect_tls(companion.listen, &ca.pem, &host, Some(&eg_cert)).unwrap();
    for eps in [
        vec![Endpoint::serving(a)],
        vec![Endpoint::serving_terminating(a), Endpoint::not_serving(b)],
        vec![Endpoint::serving_terminating(a), Endpoint::serving(b)],
    ] {
        slices.set_endpoints(SERVICE, &eps);
        ask(&eg, &eps, true, "over mTLS");
    }
    assert!(Eg::connect_tls(companion.listen, &ca.pem, &host, None).is_err());
    let stranger = ca.client(&["spiffe://cluster.local/ns/default/sa/someone"]);
    assert!(Eg::connect_tls(companion.listen, &ca.pem, &host, Some(&stranger)).is_err());
    assert!(Eg::connect_tls(companion.listen, &ca.pem, "other.example", Some(&eg_cert)).is_err());
    // Counted (tonic's channel dials again at once after a refusal: each
    // dial is one).
    for reason in ["no_client_cert", "san_not_allowed", "client_alert"] {
        let n = companion.metric(&format!(
            "serving_picker_conditions_tls_refusals_total{{reason=\"{reason}\"}}"
        ));
        assert!(n >= 1.0, "{reason}: {n}");
    }
    assert!(
        companion.metric("serving_picker_conditions_eg_hook_calls_total{result=\"managed\"}")
            >= 3.0
    );
}

/// The test's EG translation with `--native-lb-policy`: PostEndpointsModify
/// for the rule's assignment (asked until right), then PostTranslateModify
/// with EG's clusters (`eg_rule_cluster`, EG's testdata shape). Returns the
/// answered assignment and clusters.
fn translate(
    eg: &Eg,
    eps: &[Endpoint],
    clusters: &[Cluster],
    what: &str,
) -> (Vec<u8>, Vec<Vec<u8>>) {
    // Until the index has the change: earlier translations on this
    // connection, closed by a PostTranslateModify of no cluster (a verdict
    // counts only for its connection's next PostTranslateModify).
    ask(eg, eps, true, what);
    let mut c = eg.client.clone();
    let none = PostTranslateModifyRequest {
        post_translate_context: Some(Default::default()),
        ..Default::default()
    };
    let none = RawPostTranslateModifyRequest::decode(none.encode_to_vec().as_slice()).unwrap();
    eg.rt.block_on(c.post_translate_modify_raw(none)).unwrap();
    // This translation: one PostEndpointsModify, then PostTranslateModify.
    let cla = eg.modify_raw(eg_cla(SERVICE, eps).encode_to_vec());
    assert!(
        answer_is_right(
            &ClusterLoadAssignment::decode(cla.as_slice()).unwrap(),
            eps,
            true
        ),
        "{what}: the index settled"
    );
    let req = PostTranslateModifyRequest {
        post_translate_context: Some(Default::default()),
        clusters: clusters.to_vec(),
        ..Default::default()
    };
    let raw = RawPostTranslateModifyRequest::decode(req.encode_to_vec().as_slice()).unwrap();
    let answer = eg.rt.block_on(c.post_translate_modify_raw(raw)).unwrap();
    assert_eq!(
        answer.clusters.len(),
        clusters.len(),
        "{what}: every cluster back"
    );
    (cla, answer.clusters.iter().map(|b| b.to_vec()).collect())
}

/// A cluster EG would send over ADS, fed here from `eds.pb` instead (the
/// test's Envoy has no ADS server): only `eds_config` is changed.
fn eds_from_file(cluster: &[u8], eds_pb: &Path) -> Cluster {
    use envoy_types::pb::envoy::config::core::v3::{
        config_source, ApiVersion, ConfigSource, PathConfigSource, WatchedDirectory,
    };
    let mut c = Cluster::decode(cluster).unwrap();
    if let Some(eds) = c.eds_cluster_config.as_mut() {
        eds.eds_config = Some(ConfigSource {
            resource_api_version: ApiVersion::V3 as i32,
            config_source_specifier: Some(config_source::ConfigSourceSpecifier::PathConfigSource(
                PathConfigSource {
                    path: eds_pb.to_string_lossy().into_owned(),
                    watched_directory: Some(WatchedDirectory {
                        path: eds_pb.parent().unwrap().to_string_lossy().into_owned(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )),
            ..Default::default()
        });
    }
    c
}

static CDS_WRITES: AtomicU64 = AtomicU64::new(0);

/// Writes a binary CDS DiscoveryResponse with these clusters (beside, then renamed).
fn write_cds(path: &Path, clusters: &[Cluster]) {
    const CLUSTER_TYPE_URL: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    let n = CDS_WRITES.fetch_add(1, Ordering::SeqCst) + 1;
    let doc = DiscoveryResponse {
        version_info: n.to_string(),
        resources: clusters
            .iter()
            .map(|c| Any {
                type_url: CLUSTER_TYPE_URL.into(),
                value: c.encode_to_vec(),
            })
            .collect(),
        type_url: CLUSTER_TYPE_URL.into(),
        ..Default::default()
    };
    let tmp = path.with_file_name(format!(".cds.pb.{n}.tmp"));
    std::fs::write(&tmp, doc.encode_to_vec()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// `camelCase` protojson keys as Envoy's config dump writes them.
fn snake_keys(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let key = if k.starts_with('@') {
                        k.clone()
                    } else {
                        let mut s = String::new();
                        for ch in k.chars() {
                            if ch.is_ascii_uppercase() {
                                s.push('_');
                                s.push(ch.to_ascii_lowercase());
                            } else {
                                s.push(ch);
                            }
                        }
                        s
                    };
                    (key, snake_keys(v))
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(snake_keys).collect()),
        other => other.clone(),
    }
}

/// A cluster as Envoy's config dump has it, without what the test or the
/// hook sets (name, EDS source, policy, common_lb_config).
fn dumped_cluster(envoy: &Envoy, name: &str) -> Value {
    let r = envoy.admin_get("/config_dump?resource=dynamic_active_clusters");
    let j: Value = serde_json::from_str(&r.body).unwrap();
    j["configs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["cluster"].clone())
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no active cluster {name}: {}", r.body))
}

fn without(mut c: Value, keys: &[&str]) -> Value {
    if let Some(o) = c.as_object_mut() {
        for k in keys {
            o.remove(*k);
        }
        if let Some(eds) = o
            .get_mut("eds_cluster_config")
            .and_then(Value::as_object_mut)
        {
            eds.remove("eds_config");
            eds.remove("service_name");
        }
    }
    c
}

/// The native form with no EnvoyPatchPolicy: the hook's PostTranslateModify
/// answer for EG's own cluster, loaded by a real Envoy 1.40 as CDS with the
/// module on its search path, and its PostEndpointsModify answer as EDS.
/// Checked: EG's cluster as the test builds it is EG's testdata cluster
/// (v1.8.3 and v1.9.0, through Envoy's config dump); the hook changes only
/// its load-balancing policy and override set; the module is the cluster's
/// balancer (its counters move) and the seed rows go where the table says.
#[test]
fn the_hook_sets_the_native_policy_and_a_real_envoy_runs_it() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let all = [&a, &b];
    let slices = SliceDir::create(&fresh_dir("eg-native-slices"));
    slices.set_endpoints(SERVICE, &[Endpoint::serving(a.addr())]);
    let companion = EgCompanion::start(slices.path(), &["--native-lb-policy"]);
    let eg = Eg::connect(companion.listen);
    let name = cluster();
    // EG's cluster for the rule, and the same unmodified beside it.
    let eg_clusters = vec![eg_rule_cluster(&name)];
    let original = eg_rule_cluster("eg-original");
    let envoy = EnvoyBuilder::new()
        .tag("eg-native-hook")
        .eds_cluster(&name, &[])
        .bootstrap_hook(eds_pb(name.clone()))
        .form(Form::Native)
        .bootstrap_hook({
            let name = name.clone();
            let original = original.clone();
            move |bootstrap: &mut Value, dir: &Path| {
                // The rule's cluster comes from CDS (first the unmodified EG
                // cluster, replaced at the first translation below).
                let clusters = bootstrap["static_resources"]["clusters"]
                    .as_array_mut()
                    .unwrap();
                clusters.retain(|c| c["name"] != name.as_str());
                // The route names a cluster that comes from CDS.
                bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
                    ["typed_config"]["route_config"]["validate_clusters"] = false.into();
                let eds = dir.join("eds").join(&name).join("eds.pb");
                std::fs::create_dir_all(dir.join("cds")).unwrap();
                let cds = dir.join("cds").join("cds.pb");
                write_cds(
                    &cds,
                    &[
                        eds_from_file(&eg_rule_cluster(&name).encode_to_vec(), &eds),
                        eds_from_file(&original.encode_to_vec(), &eds),
                    ],
                );
                bootstrap["dynamic_resources"]["cds_config"] = serde_json::json!({
                    "resource_api_version": "V3",
                    "path_config_source": {
                        "path": cds.to_string_lossy(),
                        "watched_directory": {"path": dir.join("cds").to_string_lossy()}
                    }
                });
            }
        })
        .start();
    let eds = envoy.eds(&name).dir().join("eds.pb");
    let cds = envoy.dir().join("cds").join("cds.pb");
    let step = |what: &str, eps: &[Endpoint], e: Expect<'_>| {
        eprintln!("step: {what}");
        slices.set_endpoints(SERVICE, eps);
        let (cla, clusters) = translate(&eg, eps, &eg_clusters, what);
        write_pb(&eds, cla);
        write_cds(
            &cds,
            &[
                eds_from_file(&clusters[0], &eds),
                eds_from_file(&original.encode_to_vec(), &eds),
            ],
        );
        expect(&envoy, Picker::Module(Form::Native), what, e, &all);
    };
    step(
        "row 1: A serving -> A",
        &[Endpoint::serving(a.addr())],
        Expect::To(&a),
    );

    // EG's cluster is EG's testdata cluster, and the hook changed only the
    // policy and the override set.
    let dumped = dumped_cluster(&envoy, &name);
    let policy = dumped["load_balancing_policy"].to_string();
    assert!(
        policy.contains("envoy.load_balancing_policies.dynamic_modules"),
        "{policy}"
    );
    assert!(policy.contains("serving_picker"), "{policy}");
    assert_eq!(
        dumped["common_lb_config"]["override_host_status"]["statuses"],
        serde_json::json!(["UNKNOWN", "HEALTHY"])
    );
    let eg_dumped = dumped_cluster(&envoy, "eg-original");
    let volatile = ["name", "load_balancing_policy", "common_lb_config"];
    assert_eq!(
        without(dumped.clone(), &volatile),
        without(eg_dumped.clone(), &volatile)
    );
    for tag in ["v1.8.3", "v1.9.0"] {
        let path =
            support::repo_root().join(format!("platforms/eg-xds/{tag}/http-route.clusters.yaml"));
        let fixture: Value =
            serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let fixture = snake_keys(&fixture[0]);
        assert_eq!(
            without(eg_dumped.clone(), &["name", "@type"]),
            without(fixture, &["name", "@type"]),
            "EG's cluster as the test builds it is EG's {tag} testdata cluster"
        );
    }

    step(
        "row 4: A serving+terminating, B not yet serving -> A",
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::not_serving(b.addr()),
        ],
        Expect::To(&a),
    );
    step(
        "row 5: A serving+terminating, B serving -> B",
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b.addr()),
        ],
        Expect::To(&b),
    );
    step(
        "row 6: A terminating not serving, B serving -> B",
        &[
            Endpoint::terminating_not_serving(a.addr()),
            Endpoint::serving(b.addr()),
        ],
        Expect::To(&b),
    );
    step(
        "row 2: B not serving -> nobody",
        &[Endpoint::not_serving(b.addr())],
        Expect::Nobody,
    );
    step(
        "row 3: B serving+terminating -> B",
        &[Endpoint::serving_terminating(b.addr())],
        Expect::To(&b),
    );
    // The module picked: its own counters moved on this Envoy.
    let picks: u64 = envoy
        .stats_matching("dynamicmodulescustom.")
        .iter()
        .filter(|(k, _)| k.ends_with(".pick.ready") || k.ends_with(".pick.terminating_fallback"))
        .filter_map(|(_, v)| v.parse::<u64>().ok())
        .sum();
    assert!(
        picks > 0,
        "the module's pick counters: {:?}",
        envoy.stats_matching("dynamicmodulescustom.")
    );
    assert!(
        companion.metric("serving_picker_conditions_eg_native_lb_clusters_total{outcome=\"set\"}")
            >= 6.0
    );
}
