//! A generated `DumpSpec` rendered as Envoy's admin output (the config dump
//! and `/clusters?format=json`), with what the parsers must read from it.
//! Each builder renders one JSON object of the output and records what the
//! parsers must make of it.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use rustc_hash::FxBuildHasher;
use serde_json::{json, Map, Value};
use serving_picker_core::contract::{EdsHealth, MetaFlags};
use serving_picker_core::health::Health;
use serving_picker_wasm::admin_json::{HostRecord, LiveCluster, LiveHealth, LiveHost};
use serving_picker_wasm::config::{PluginConfig, SelectionConfig};

use super::{Addr, ClusterSpec, DumpSpec, GroupSpec, HostSpec, LiveSpec, Shape};
use crate::common::NS;

/// What the generated admin output must parse to.
pub(crate) struct Rendered {
    pub(crate) dump_body: Vec<u8>,
    pub(crate) clusters_body: Vec<u8>,
    /// Dump entries in order: (listed name, hosts with a valid address).
    pub(crate) dump: Vec<(String, Vec<HostRecord>)>,
    pub(crate) skipped: usize,
    pub(crate) odd: usize,
    pub(crate) live: LiveHealth,
    pub(crate) config: PluginConfig,
}

type LiveHosts = HashMap<String, LiveHost, FxBuildHasher>;

fn socket(address: &str, port: impl Into<Value>) -> Value {
    json!({"socket_address": {"address": address, "port_value": port.into()}})
}

fn expanded_v6(ip: Ipv6Addr) -> String {
    ip.segments()
        .iter()
        .map(|s| format!("{s:04X}"))
        .collect::<Vec<_>>()
        .join(":")
}

impl HostSpec {
    /// The JSON `address` (or none), and the expected `IP:PORT` if valid.
    fn address(&self, index: usize) -> (Option<Value>, Option<String>) {
        let v4 = |high: u16| Ipv4Addr::from((u32::from(high) << 16) | index as u32);
        match &self.addr {
            Addr::V4(high) => {
                let ip = v4(*high);
                (
                    Some(socket(&ip.to_string(), self.port)),
                    Some(format!("{ip}:{}", self.port)),
                )
            }
            Addr::V6(high, expanded) => {
                let ip = Ipv6Addr::from((u128::from(*high) << 64) | index as u128);
                let written = if *expanded {
                    expanded_v6(ip)
                } else {
                    ip.to_string()
                };
                (
                    Some(socket(&written, self.port)),
                    Some(format!("[{ip}]:{}", self.port)),
                )
            }
            Addr::Name(name) => (Some(socket(name, self.port)), None),
            Addr::Port0 => (Some(socket(&v4(1).to_string(), 0)), None),
            Addr::PortAbove(p) => (Some(socket(&v4(1).to_string(), *p)), None),
            Addr::NoPort => (
                Some(json!({"socket_address": {"address": v4(1).to_string()}})),
                None,
            ),
            Addr::Pipe => (Some(json!({"pipe": {"path": "/tmp/x.sock"}})), None),
            Addr::NoAddress | Addr::NoEndpoint => (None, None),
        }
    }

    /// The config dump's `lb_endpoints` entry of the host at `index`.
    fn lb_endpoint(&self, index: usize, address: Option<&Value>) -> Value {
        let mut lb = Map::new();
        if !matches!(self.addr, Addr::NoEndpoint) {
            let mut e = Map::new();
            if let Some(a) = address {
                e.insert("address".into(), a.clone());
            }
            e.insert("health_check_config".into(), json!({}));
            if self.hostname {
                e.insert("hostname".into(), json!(format!("pod-{index}.example")));
            }
            lb.insert("endpoint".into(), Value::Object(e));
        }
        if let Some(s) = self.coarse {
            lb.insert("health_status".into(), json!(s));
        }
        if self.meta.is_some() || self.other_ns.is_some() {
            let mut fm = Map::new();
            if let Some(m) = &self.meta {
                fm.insert(NS.into(), m.clone());
            }
            if let Some(o) = &self.other_ns {
                fm.insert("envoy.lb".into(), o.clone());
            }
            lb.insert("metadata".into(), json!({ "filter_metadata": fm }));
        }
        if let Some(w) = self.weight {
            lb.insert("load_balancing_weight".into(), json!(w));
        }
        Value::Object(lb)
    }

    /// The record the dump parser must make of a host at `address` (valid),
    /// and how many odd values its metadata holds.
    fn expected_record(&self, group: &GroupSpec, address: &str) -> (HostRecord, usize) {
        let (flags, zone, odd) = read_ns(self.meta.as_ref());
        let record = HostRecord {
            address: address.to_string(),
            weight: self.weight.unwrap_or(1).max(1),
            priority: group.priority,
            flags,
            zone: zone.or_else(|| group.zone.filter(|z| !z.is_empty()).map(String::from)),
            topology: Default::default(),
            health: Health {
                eds: None,
                coarse: EdsHealth::from_name(self.coarse),
                failing: false,
            },
        };
        (record, odd)
    }
}

impl LiveSpec {
    /// `/clusters`' `host_statuses` entry of a host at `address` (valid),
    /// the `index`th of its cluster.
    fn host_status(&self, address: &str, weight: u32, priority: u32, index: usize) -> Value {
        let mut flags = Map::new();
        for (k, on) in [
            ("failed_active_health_check", self.failed_hc),
            ("failed_outlier_check", self.outlier),
            ("active_hc_timeout", self.hc_timeout),
            ("excluded_via_immediate_hc_fail", self.excluded),
            ("pending_dynamic_removal", self.pending_removal),
        ] {
            if on {
                flags.insert(k.into(), json!(true));
            }
        }
        if let Some(e) = self.eds {
            flags.insert("eds_health_status".into(), json!(e));
        }
        let mut s = Map::new();
        // /clusters writes the canonical form.
        let (ip, port) = address.rsplit_once(':').unwrap();
        let ip = ip.trim_start_matches('[').trim_end_matches(']');
        s.insert("address".into(), socket(ip, port.parse::<u16>().unwrap()));
        s.insert("stats".into(), stats(self.stats));
        if !flags.is_empty() || !index.is_multiple_of(3) {
            s.insert("health_status".into(), Value::Object(flags));
        }
        s.insert("weight".into(), json!(weight));
        if priority > 0 {
            s.insert("priority".into(), json!(priority));
        }
        s.insert("locality".into(), json!({}));
        Value::Object(s)
    }

    /// The live health the clusters parser must read from `host_status`.
    fn live_host(&self) -> LiveHost {
        LiveHost {
            // Pending removal drains (unless EDS refuses it anyway).
            eds: match EdsHealth::from_name(self.eds) {
                EdsHealth::Unhealthy => EdsHealth::Unhealthy,
                EdsHealth::Timeout => EdsHealth::Timeout,
                _ if self.pending_removal => EdsHealth::Draining,
                e => e,
            },
            failing: self.failed_hc || self.outlier || self.hc_timeout || self.excluded,
        }
    }
}

impl GroupSpec {
    /// The config dump's locality group holding `lbs`.
    fn locality_group(&self, lbs: Vec<Value>) -> Value {
        let mut group = Map::new();
        group.insert(
            "locality".into(),
            match self.zone {
                Some(z) => json!({"region": "r1", "zone": z}),
                None => json!({}),
            },
        );
        if !lbs.is_empty() {
            group.insert("lb_endpoints".into(), Value::Array(lbs));
        }
        group.insert("load_balancing_weight".into(), json!(0));
        if self.priority > 0 {
            group.insert("priority".into(), json!(self.priority));
        }
        Value::Object(group)
    }
}

/// Expected flags, zone and number of odd values of one namespace value.
fn read_ns(ns: Option<&Value>) -> (MetaFlags, Option<String>, usize) {
    let Some(Value::Object(m)) = ns else {
        let odd = usize::from(!matches!(ns, None | Some(Value::Null)));
        return (MetaFlags::default(), None, odd);
    };
    let mut odd = 0;
    let mut flag = |k: &str| match m.get(k) {
        Some(Value::Bool(b)) => Some(*b),
        None | Some(Value::Null) => None,
        Some(_) => {
            odd += 1;
            None
        }
    };
    let flags = MetaFlags {
        ready: flag("ready"),
        serving: flag("serving"),
        terminating: flag("terminating"),
    };
    let zone = match m.get("zone") {
        None | Some(Value::Null) => None,
        Some(Value::String(z)) if !z.is_empty() => Some(z.clone()),
        Some(_) => {
            odd += 1;
            None
        }
    };
    (flags, zone, odd)
}

fn stats(n: usize) -> Value {
    let names = [
        ("cx_connect_fail", false),
        ("cx_total", false),
        ("rq_error", false),
        ("rq_success", false),
        ("rq_timeout", false),
        ("rq_total", false),
        ("cx_active", true),
        ("rq_active", true),
        ("rq_pending_active", true),
    ];
    Value::Array(
        names
            .iter()
            .take(n)
            .enumerate()
            .map(|(i, (name, gauge))| {
                let mut s = Map::new();
                if *gauge {
                    s.insert("type".into(), json!("GAUGE"));
                }
                s.insert("name".into(), json!(name));
                if i % 2 == 0 {
                    s.insert("value".into(), json!((i * 7).to_string()));
                }
                Value::Object(s)
            })
            .collect(),
    )
}

/// One cluster rendered: its dump groups, the records the dump must parse
/// to, its `/clusters` host statuses and the live health they carry.
#[derive(Default)]
struct ClusterParts {
    groups: Vec<Value>,
    records: Vec<HostRecord>,
    host_statuses: Vec<Value>,
    live_hosts: LiveHosts,
    skipped: usize,
    odd: usize,
}

impl ClusterParts {
    /// Renders every group and host of `c`.
    fn of(c: &ClusterSpec) -> ClusterParts {
        let mut parts = ClusterParts::default();
        let mut index = 0;
        for g in &c.groups {
            let mut lbs = Vec::new();
            for h in &g.hosts {
                index += 1;
                lbs.push(parts.host(g, h, index));
            }
            parts.groups.push(g.locality_group(lbs));
        }
        parts.extra_live(c.extra_live);
        parts
    }

    /// One host: its `lb_endpoints` entry (returned), its record, its live
    /// status; a host without a valid address is skipped by the parser.
    fn host(&mut self, g: &GroupSpec, h: &HostSpec, index: usize) -> Value {
        let (address, valid) = h.address(index);
        let lb = h.lb_endpoint(index, address.as_ref());
        let Some(valid) = valid else {
            self.skipped += 1;
            if let (Some(l), Some(a)) = (&h.live, &address) {
                self.host_statuses
                    .push(json!({"address": a, "stats": stats(l.stats),
                    "health_status": {"eds_health_status": "HEALTHY"}, "weight": 1}));
            }
            return lb;
        };
        let (record, odd) = h.expected_record(g, &valid);
        self.odd += odd;
        let weight = record.weight;
        self.records.push(record);
        if let Some(l) = &h.live {
            self.host_statuses
                .push(l.host_status(&valid, weight, g.priority, index));
            self.live_hosts.insert(valid, l.live_host());
        }
        lb
    }

    /// Hosts only /clusters has (not in the dump: ignored by the join).
    fn extra_live(&mut self, n: usize) {
        for k in 0..n {
            let ip = Ipv4Addr::from(0xC000_0200 | (0x8000 + k as u32));
            self.host_statuses.push(
                json!({"address": socket(&ip.to_string(), 80), "stats": stats(3),
                "health_status": {"eds_health_status": "HEALTHY"}, "weight": 1, "locality": {}}),
            );
            self.live_hosts.insert(
                format!("{ip}:80"),
                LiveHost {
                    eds: EdsHealth::Healthy,
                    failing: false,
                },
            );
        }
    }
}

/// The config dump's entry of a cluster listed as `listed`.
fn endpoint_config(listed: &str, groups: Vec<Value>) -> Value {
    let mut assignment = Map::new();
    assignment.insert(
        "@type".into(),
        json!("type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"),
    );
    assignment.insert("cluster_name".into(), json!(listed));
    if !groups.is_empty() {
        assignment.insert("endpoints".into(), Value::Array(groups));
    }
    assignment.insert("policy".into(), json!({"overprovisioning_factor": 140}));
    json!({ "endpoint_config": assignment })
}

/// `/clusters`' `cluster_statuses` entry of the Envoy cluster `owner`.
fn cluster_status(
    owner: &str,
    dynamic: bool,
    service: Option<&String>,
    host_statuses: &[Value],
) -> Value {
    let mut s = Map::new();
    s.insert("name".into(), json!(owner));
    if dynamic {
        s.insert("added_via_api".into(), json!(true));
    }
    if !host_statuses.is_empty() {
        s.insert("host_statuses".into(), Value::Array(host_statuses.to_vec()));
    }
    s.insert(
        "circuit_breakers".into(),
        json!({"thresholds": [{"max_connections": 1024}]}),
    );
    s.insert("observability_name".into(), json!(owner));
    if let Some(svc) = service {
        s.insert("eds_service_name".into(), json!(svc));
    }
    Value::Object(s)
}

/// The config dump's `configs`, in the spec's shape, around its static and
/// dynamic endpoint configs.
fn configs(shape: Shape, statics: &[Value], dynamics: &[Value]) -> Vec<Value> {
    let mut masked = Map::new();
    masked.insert(
        "@type".into(),
        json!("type.googleapis.com/envoy.admin.v3.EndpointsConfigDump"),
    );
    if !statics.is_empty() {
        masked.insert(
            "static_endpoint_configs".into(),
            Value::Array(statics.to_vec()),
        );
    }
    if !dynamics.is_empty() {
        masked.insert(
            "dynamic_endpoint_configs".into(),
            Value::Array(dynamics.to_vec()),
        );
    }
    match shape {
        Shape::Masked => vec![Value::Object(masked)],
        Shape::Full => vec![
            json!({"@type": "type.googleapis.com/envoy.admin.v3.BootstrapConfigDump",
                   "bootstrap": {"node": {"id": "n"}}, "last_updated": "2026-12-02T00:00:00Z"}),
            json!({"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
                   "static_clusters": [{"cluster": {"name": "x"}}]}),
            Value::Object(masked),
            json!({"@type": "type.googleapis.com/envoy.admin.v3.ListenersConfigDump"}),
        ],
        Shape::Resource => {
            let typed = |entry: &Value, kind: &str| {
                let mut e = entry.as_object().unwrap().clone();
                e.insert(
                    "@type".into(),
                    json!(format!(
                        "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump.{kind}"
                    )),
                );
                Value::Object(e)
            };
            statics
                .iter()
                .map(|e| typed(e, "StaticEndpointConfig"))
                .chain(dynamics.iter().map(|e| typed(e, "DynamicEndpointConfig")))
                .collect()
        }
    }
}

/// Everything rendered so far, cluster by cluster.
#[derive(Default)]
struct Output {
    statics: Vec<Value>,
    dynamics: Vec<Value>,
    expected_static: Vec<(String, Vec<HostRecord>)>,
    expected_dynamic: Vec<(String, Vec<HostRecord>)>,
    statuses: Vec<Value>,
    live: LiveHealth,
    skipped: usize,
    odd: usize,
    /// Every name a `clusters` allow list may pick from.
    candidates: Vec<String>,
}

impl Output {
    /// Cluster `ci` of the spec: its dump entry, and its `/clusters` entries
    /// (the cluster itself, and others on the same EDS service).
    fn cluster(&mut self, spec: &DumpSpec, ci: usize) {
        let c = &spec.clusters[ci];
        let (name, listed) = spec.names(ci);
        self.candidates.push(name.clone());
        self.candidates.push(listed.clone());
        let parts = ClusterParts::of(c);
        self.skipped += parts.skipped;
        self.odd += parts.odd;
        let entry = endpoint_config(&listed, parts.groups);
        if c.dynamic {
            self.dynamics.push(entry);
            self.expected_dynamic.push((listed.clone(), parts.records));
        } else {
            self.statics.push(entry);
            self.expected_static.push((listed.clone(), parts.records));
        }
        let mut owners = Vec::new();
        if c.in_live {
            let service = if c.service {
                Some(listed.clone())
            } else if c.empty_service {
                Some(String::new())
            } else {
                None
            };
            owners.push((name.clone(), service));
        }
        for k in 0..c.aliases {
            let alias = format!("{name}-alias{k}");
            self.candidates.push(alias.clone());
            owners.push((alias, Some(listed.clone())));
        }
        for (owner, service) in owners {
            self.statuses.push(cluster_status(
                &owner,
                c.dynamic,
                service.as_ref(),
                &parts.host_statuses,
            ));
            self.live.clusters.insert(
                owner,
                LiveCluster {
                    eds_service_name: service.filter(|s| !s.is_empty()),
                    hosts: parts.live_hosts.clone(),
                },
            );
        }
    }
}

impl DumpSpec {
    fn names(&self, i: usize) -> (String, String) {
        if self.admin && i == 0 {
            return ("envoy_admin".into(), "envoy_admin".into());
        }
        let name = format!("{}{i}", self.prefix);
        let listed = if self.clusters[i].service {
            format!("{name}/svc")
        } else {
            name.clone()
        };
        (name, listed)
    }

    /// The plugin configuration: the spec's selection, and an allow list of
    /// some of `candidates` (and a name the dump does not have).
    fn plugin_config(&self, candidates: &[String]) -> PluginConfig {
        let allow = self.allow.map(|mask| {
            let mut list: Vec<String> = candidates
                .iter()
                .enumerate()
                .filter(|(i, _)| mask >> (i % 64) & 1 == 1)
                .map(|(_, n)| n.clone())
                .collect();
            list.push("not-in-the-dump".into());
            list
        });
        PluginConfig {
            selection: SelectionConfig {
                local_zone: self.local_zone.map(String::from),
                local_zone_min_share: self.min_share,
                ..SelectionConfig::default()
            },
            clusters: allow,
            retry_alternates: self.alternates,
            ..PluginConfig::default()
        }
    }

    fn write(&self, v: &Value) -> Vec<u8> {
        if self.pretty {
            serde_json::to_vec_pretty(v).unwrap()
        } else {
            serde_json::to_vec(v).unwrap()
        }
    }

    pub(crate) fn render(&self) -> Rendered {
        let mut out = Output::default();
        for ci in 0..self.clusters.len() {
            out.cluster(self, ci);
        }
        let configs = configs(self.shape, &out.statics, &out.dynamics);
        let config = self.plugin_config(&out.candidates);
        let mut dump = out.expected_static;
        dump.extend(out.expected_dynamic);
        Rendered {
            dump_body: self.write(&json!({ "configs": configs })),
            clusters_body: self.write(&json!({ "cluster_statuses": out.statuses })),
            dump,
            skipped: out.skipped,
            odd: out.odd,
            live: out.live,
            config,
        }
    }
}
