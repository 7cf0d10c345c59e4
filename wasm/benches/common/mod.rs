//! Test data for the benches: deterministic (SplitMix64, fixed seeds) and
//! shaped like real Envoy 1.40 admin output (see tests/fixtures/README.md).
//!
//! Each bench includes this with `#[allow(dead_code)] mod common;`, since
//! every bench uses only part of it.

use serde::Serialize;
use serde_json::{json, Map, Value};
use serving_picker_core::contract::Tier;
use serving_picker_core::plan::{ClusterPlan, PlannedHost};
use serving_picker_wasm::codec;
use serving_picker_wasm::table::RoutingTable;

/// SplitMix64: small, fast, and good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True `per_mille` times in a thousand.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// A cluster name as a Kubernetes gateway names them (about 40 bytes, so the
/// hash lookup in `decide` costs what it costs in production).
pub fn cluster_name(i: usize) -> String {
    format!("httproute/ns-{:02}/backend-svc-{i:05}/rule/0", i % 17)
}

/// A distinct pod IP per host: 10.x.y.z.
pub fn pod_ip(global: usize) -> String {
    let k = global + 1;
    format!("10.{}.{}.{}", (k >> 16) & 0xff, (k >> 8) & 0xff, k & 0xff)
}

// ---------------------------------------------------------------- plans

/// Host weights: all 1, or mixed 1..=10 (which makes the picker an alias table).
pub fn weights(n: usize, weighted: bool, rng: &mut Rng) -> Vec<u32> {
    (0..n)
        .map(|_| {
            if weighted {
                1 + rng.below(10) as u32
            } else {
                1
            }
        })
        .collect()
}

pub fn plan(
    name: String,
    first_host: usize,
    n: usize,
    weighted: bool,
    rng: &mut Rng,
) -> ClusterPlan {
    let mut w = weights(n, weighted, rng);
    if weighted && n > 1 && w.iter().all(|x| *x == w[0]) {
        // Make sure "weighted" really is an alias table.
        w[0] = w[0] % 10 + 1;
    }
    ClusterPlan {
        cluster: name,
        tier: Tier::Ready,
        topology: Default::default(),
        hosts: w
            .into_iter()
            .enumerate()
            .map(|(i, weight)| PlannedHost {
                address: format!("{}:8080", pod_ip(first_host + i)),
                weight,
            })
            .collect(),
    }
}

/// `clusters` plans; cluster `target` has `target_hosts` hosts, every other
/// one `other_hosts`. Odd clusters are weighted, even ones not, except that
/// the target's weighting is `target_weighted`.
pub fn plans(
    clusters: usize,
    target: usize,
    target_hosts: usize,
    target_weighted: bool,
    other_hosts: usize,
) -> Vec<ClusterPlan> {
    let mut rng = Rng::new(0x5eed_0001);
    let mut next_host = 0;
    (0..clusters)
        .map(|c| {
            let (n, weighted) = if c == target {
                (target_hosts, target_weighted)
            } else {
                (other_hosts, c % 2 == 1)
            };
            let p = plan(cluster_name(c), next_host, n, weighted, &mut rng);
            next_host += n;
            p
        })
        .collect()
}

/// A table of `clusters` clusters (10 hosts each) plus the name of the one
/// with `hosts` hosts, as a worker has it (two retry alternates, the default).
pub fn table_with(clusters: usize, hosts: usize, weighted: bool) -> (RoutingTable, String) {
    let target = clusters / 2;
    let plans = plans(clusters, target, hosts, weighted, 10);
    let mut table = RoutingTable::new(2);
    table.update(&codec::encode(&plans)).unwrap();
    (table, cluster_name(target))
}

// ---------------------------------------------------------------- admin JSON

/// Admin output of one Envoy, as it sends it (pretty, one-space indent).
pub struct AdminJson {
    /// `/config_dump?include_eds&mask=static_endpoint_configs,dynamic_endpoint_configs`
    pub config_dump: Vec<u8>,
    /// `/clusters?format=json`
    pub clusters: Vec<u8>,
    /// Generated hosts (without the admin cluster's).
    pub hosts: usize,
}

/// What a host is, in both views: its EndpointSlice metadata (`None`: no
/// metadata at all), the config dump's coarse `health_status`, and the live
/// `/clusters` flags.
struct HostState {
    meta: Option<Value>,
    coarse: &'static str,
    live: Value,
}

fn host_state(rng: &mut Rng, zone: &str) -> HostState {
    let healthy = || json!({"eds_health_status": "HEALTHY"});
    let meta = |ready: bool, serving: bool, terminating: bool| {
        Some(json!({"ready": ready, "serving": serving, "terminating": terminating, "zone": zone}))
    };
    let roll = rng.below(1000);
    match roll {
        // Ready: 84 %.
        0..=839 => HostState {
            meta: meta(true, true, false),
            coarse: "HEALTHY",
            live: healthy(),
        },
        // A pod in preStop (serving, terminating): 4 %, half of them also EDS DRAINING.
        840..=859 => HostState {
            meta: meta(false, true, true),
            coarse: "HEALTHY",
            live: healthy(),
        },
        860..=879 => HostState {
            meta: meta(false, true, true),
            coarse: "UNHEALTHY",
            live: json!({"eds_health_status": "DRAINING"}),
        },
        // Terminating, no longer serving: 3 %.
        880..=909 => HostState {
            meta: meta(false, false, true),
            coarse: "UNHEALTHY",
            live: json!({"eds_health_status": "UNHEALTHY"}),
        },
        // Not ready yet: 2 %.
        910..=929 => HostState {
            meta: meta(false, false, false),
            coarse: "UNHEALTHY",
            live: json!({"eds_health_status": "UNHEALTHY"}),
        },
        // No metadata (a host not from an EndpointSlice): 3 %.
        930..=959 => HostState {
            meta: None,
            coarse: "HEALTHY",
            live: healthy(),
        },
        // Failing active health checks: 1 %.
        960..=969 => HostState {
            meta: meta(true, true, false),
            coarse: "UNHEALTHY",
            live: json!({"failed_active_health_check": true, "eds_health_status": "HEALTHY"}),
        },
        // Ejected by outlier detection: 1 %.
        970..=979 => HostState {
            meta: meta(true, true, false),
            coarse: "UNHEALTHY",
            live: json!({"failed_outlier_check": true, "eds_health_status": "HEALTHY"}),
        },
        // EDS DEGRADED: 1 %.
        980..=989 => HostState {
            meta: meta(true, true, false),
            coarse: "DEGRADED",
            live: json!({"eds_health_status": "DEGRADED"}),
        },
        // Values of the wrong type (read as absent, with a note): 1 %.
        _ => HostState {
            meta: Some(json!({"serving": "yes", "terminating": 1, "ready": true, "zone": zone})),
            coarse: "HEALTHY",
            live: healthy(),
        },
    }
}

/// The per-host `stats[]` of `/clusters`: counters as strings, omitted when
/// 0; gauges with `"type":"GAUGE"`. A host of a busy proxy.
fn host_stats(rng: &mut Rng) -> Value {
    let mut stat = |name: &str, gauge: bool, max: u64, zero_per_mille: u64| {
        let mut s = Map::new();
        if gauge {
            s.insert("type".into(), json!("GAUGE"));
        }
        s.insert("name".into(), json!(name));
        if !rng.chance(zero_per_mille) {
            s.insert("value".into(), json!((1 + rng.below(max)).to_string()));
        }
        Value::Object(s)
    };
    let total = stat("rq_total", false, 5_000_000, 20);
    json!([
        stat("cx_connect_fail", false, 20, 900),
        stat("cx_total", false, 5_000, 20),
        stat("rq_error", false, 2_000, 500),
        stat("rq_success", false, 5_000_000, 20),
        stat("rq_timeout", false, 100, 900),
        total,
        stat("cx_active", true, 64, 100),
        stat("rq_active", true, 16, 400),
        stat("rq_pending_active", true, 4, 950),
    ])
}

fn circuit_breakers() -> Value {
    let t = |prio: Option<&str>| {
        let mut m = Map::new();
        if let Some(p) = prio {
            m.insert("priority".into(), json!(p));
        }
        m.insert("max_connections".into(), json!(1024));
        m.insert("max_pending_requests".into(), json!(1024));
        m.insert("max_requests".into(), json!(1024));
        m.insert("max_retries".into(), json!(3));
        Value::Object(m)
    };
    json!({"thresholds": [t(None), t(Some("HIGH"))]})
}

fn socket(address: &str, port: u16) -> Value {
    json!({"socket_address": {"address": address, "port_value": port}})
}

fn lb_endpoint(ip: &str, port: u16, weight: u32, state: &HostState) -> Value {
    let mut e = Map::new();
    e.insert(
        "endpoint".into(),
        json!({"address": socket(ip, port), "health_check_config": {}}),
    );
    e.insert("health_status".into(), json!(state.coarse));
    if let Some(meta) = &state.meta {
        e.insert(
            "metadata".into(),
            json!({"filter_metadata": {"k8s.endpointslice": meta}}),
        );
    }
    e.insert("load_balancing_weight".into(), json!(weight));
    Value::Object(e)
}

fn load_assignment(cluster_name: &str, groups: Vec<Value>) -> Value {
    json!({"endpoint_config": {
        "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
        "cluster_name": cluster_name,
        "endpoints": groups,
        "policy": {"overprovisioning_factor": 140}
    }})
}

const ZONES: [&str; 3] = ["us-east-1a", "us-east-1b", "us-east-1c"];

/// Admin output for `clusters` CDS/EDS clusters of `hosts_per_cluster` hosts
/// each, plus the static `envoy_admin` cluster: a mix of conditions (84 %
/// ready, the rest preStop, terminating, not ready, failing checks, ejected,
/// degraded, without metadata or with odd metadata types), three zones,
/// 3 % of hosts at priority 1, weights all 1 in even clusters and 1..=10 in
/// odd ones (and in a single-cluster dump).
pub fn admin_json(clusters: usize, hosts_per_cluster: usize, seed: u64) -> AdminJson {
    let mut rng = Rng::new(seed);
    let mut dynamic = Vec::with_capacity(clusters);
    let mut statuses = Vec::with_capacity(clusters + 1);
    let mut global = 0;
    for c in 0..clusters {
        let name = cluster_name(c);
        // Some clusters have an EDS service name of their own: the dump lists them under it.
        let service = match c % 4 {
            0 => Some(name.clone()),
            1 => Some(format!("{name}/eds")),
            _ => None,
        };
        let weighted = c % 2 == 1 || clusters == 1;
        // Envoy groups lb_endpoints per (priority, locality).
        let mut groups: Vec<Vec<Value>> = vec![Vec::new(); 2 * ZONES.len()];
        let mut live_hosts = Vec::with_capacity(hosts_per_cluster);
        for _ in 0..hosts_per_cluster {
            let z = rng.below(ZONES.len() as u64) as usize;
            let priority = usize::from(rng.chance(30));
            let weight = if weighted {
                1 + rng.below(10) as u32
            } else {
                1
            };
            let state = host_state(&mut rng, ZONES[z]);
            let ip = pod_ip(global);
            global += 1;
            groups[priority * ZONES.len() + z].push(lb_endpoint(&ip, 8080, weight, &state));
            let mut h = Map::new();
            h.insert("address".into(), socket(&ip, 8080));
            h.insert("stats".into(), host_stats(&mut rng));
            h.insert("health_status".into(), state.live);
            h.insert("weight".into(), json!(weight));
            if priority > 0 {
                h.insert("priority".into(), json!(priority));
            }
            h.insert(
                "locality".into(),
                json!({"region": "us-east-1", "zone": ZONES[z]}),
            );
            live_hosts.push(Value::Object(h));
        }
        let groups: Vec<Value> = groups
            .into_iter()
            .enumerate()
            .filter(|(_, g)| !g.is_empty())
            .map(|(i, lb)| {
                let mut g = Map::new();
                g.insert(
                    "locality".into(),
                    json!({"region": "us-east-1", "zone": ZONES[i % ZONES.len()]}),
                );
                g.insert("lb_endpoints".into(), Value::Array(lb));
                g.insert("load_balancing_weight".into(), json!(0));
                if i >= ZONES.len() {
                    g.insert("priority".into(), json!(1));
                }
                Value::Object(g)
            })
            .collect();
        dynamic.push(load_assignment(service.as_deref().unwrap_or(&name), groups));
        let mut status = Map::new();
        status.insert("name".into(), json!(name));
        status.insert("added_via_api".into(), json!(true));
        status.insert("host_statuses".into(), Value::Array(live_hosts));
        status.insert("circuit_breakers".into(), circuit_breakers());
        status.insert("observability_name".into(), json!(name));
        if let Some(s) = &service {
            status.insert("eds_service_name".into(), json!(s));
        }
        statuses.push(Value::Object(status));
    }
    // The static admin cluster, in both (the filter never manages it).
    let admin_state = HostState {
        meta: None,
        coarse: "HEALTHY",
        live: json!({"eds_health_status": "HEALTHY"}),
    };
    let admin = load_assignment(
        "envoy_admin",
        vec![
            json!({"locality": {}, "lb_endpoints": [lb_endpoint("127.0.0.1", 9901, 1, &admin_state)], "load_balancing_weight": 0}),
        ],
    );
    statuses.push(json!({
        "name": "envoy_admin",
        "host_statuses": [{"address": socket("127.0.0.1", 9901), "stats": host_stats(&mut rng),
                           "health_status": {"eds_health_status": "HEALTHY"}, "weight": 1, "locality": {}}],
        "circuit_breakers": circuit_breakers(),
        "observability_name": "envoy_admin"
    }));
    let dump = json!({"configs": [{
        "@type": "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump",
        "static_endpoint_configs": [admin],
        "dynamic_endpoint_configs": dynamic
    }]});
    let live = json!({ "cluster_statuses": statuses });
    AdminJson {
        config_dump: pretty(&dump),
        clusters: pretty(&live),
        hosts: global,
    }
}

/// JSON as Envoy's admin prints it: pretty, one-space indent.
pub fn pretty(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(
        &mut out,
        serde_json::ser::PrettyFormatter::with_indent(b" "),
    );
    if value.serialize(&mut ser).is_err() {
        return Vec::new();
    }
    out.push(b'\n');
    out
}
