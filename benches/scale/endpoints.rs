//! The endpoints of a scenario: pods in EndpointSlice states, their EDS
//! files (one watched directory per cluster, zones as localities), the
//! rolling-update steps that change them, and the bootstraps that read them.

use crate::{now_ms, ADMIN, BACKEND, LISTEN, PLUGIN_CONFIG, PORT, ZONES};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use support::bootstrap::{
    bootstrap, direct_response, eds_cluster, file_access_log, http_connection_manager, lb_endpoint,
    listener, override_host_policy, route, static_cluster, wasm_filter,
};
use support::eds::{EdsFile, Endpoint};

/// A small deterministic generator (xorshift64*): the same endpoints in every run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pod {
    Ready,
    ServingTerminating,
    TerminatingNotServing,
    NotReady,
}

impl Pod {
    /// ~90% ready, ~5% serving+terminating, ~5% not serving.
    pub fn pick(rng: &mut Rng) -> Pod {
        let r = rng.unit();
        if r < 0.90 {
            Pod::Ready
        } else if r < 0.95 {
            Pod::ServingTerminating
        } else if rng.unit() < 0.5 {
            Pod::TerminatingNotServing
        } else {
            Pod::NotReady
        }
    }
}

#[derive(Clone, Debug)]
pub struct Host {
    pub g: usize,
    pub pod: Pod,
    pub zone: usize,
    pub weight: u32,
}

impl Host {
    /// Global host index -> 127.1.x.y (nothing listens there).
    pub fn ip(&self) -> Ipv4Addr {
        let g = self.g;
        Ipv4Addr::new(
            127,
            (1 + g / 62500) as u8,
            ((g / 250) % 250) as u8,
            (g % 250 + 1) as u8,
        )
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((self.ip(), PORT))
    }

    pub fn endpoint(&self) -> Endpoint {
        let a = self.addr();
        let e = match self.pod {
            Pod::Ready => Endpoint::serving(a),
            Pod::ServingTerminating => Endpoint::serving_terminating(a),
            Pod::TerminatingNotServing => Endpoint::terminating_not_serving(a),
            Pod::NotReady => Endpoint::not_serving(a),
        };
        e.zone(ZONES[self.zone]).weight(self.weight)
    }
}

pub struct Cluster {
    pub name: String,
    pub hosts: Vec<Host>,
    pub eds: EdsFile,
}

impl Cluster {
    /// What the filter's plan keeps (all priority 0, no local_zone): ready
    /// hosts if any, else serving ones (serving+terminating), else none.
    pub fn tier(&self) -> Vec<&Host> {
        let ready: Vec<&Host> = self.hosts.iter().filter(|h| h.pod == Pod::Ready).collect();
        if !ready.is_empty() {
            return ready;
        }
        self.hosts
            .iter()
            .filter(|h| h.pod == Pod::ServingTerminating)
            .collect()
    }

    /// The ClusterLoadAssignment: one locality per zone.
    pub fn assignment(&self) -> Value {
        let mut by_zone: BTreeMap<usize, Vec<Value>> = BTreeMap::new();
        for h in &self.hosts {
            by_zone
                .entry(h.zone)
                .or_default()
                .push(h.endpoint().to_lb_endpoint());
        }
        let localities: Vec<Value> = by_zone
            .into_iter()
            .map(|(z, eps)| json!({"locality": {"region": "region-1", "zone": ZONES[z]}, "priority": 0, "lb_endpoints": eps}))
            .collect();
        json!({"cluster_name": self.name, "endpoints": localities})
    }
}

pub struct State {
    pub clusters: Vec<Cluster>,
    pub next_g: usize,
}

/// What a change did, and what the snapshot must then hold.
pub struct Change {
    pub expect_hosts: usize,
    pub flipped: usize,
    pub added: usize,
    pub files: usize,
    pub renamed_ms: i64,
}

impl State {
    pub fn generate(dir: &Path, nclusters: usize, nhosts: usize) -> State {
        let mut rng = Rng::new((1000 * nclusters + nhosts) as u64);
        let width = 3.max((nclusters.saturating_sub(1)).to_string().len());
        let mut g = 0;
        let mut clusters = Vec::new();
        for c in 0..nclusters {
            let mut hosts = Vec::new();
            for j in 0..nhosts {
                let pod = if nhosts == 3 {
                    // The baseline: like the demo, one of each.
                    [Pod::Ready, Pod::ServingTerminating, Pod::NotReady][j]
                } else if j == 0 {
                    Pod::Ready
                } else {
                    Pod::pick(&mut rng)
                };
                let zone = rng.below(3);
                let r = rng.unit();
                let weight = if r < 0.80 {
                    1
                } else if r < 0.95 {
                    2
                } else {
                    5
                };
                hosts.push(Host {
                    g,
                    pod,
                    zone,
                    weight,
                });
                g += 1;
            }
            let name = format!("svc-{c:0width$}");
            let eds = EdsFile::create_empty(&name, &dir.join("eds").join(&name));
            let cluster = Cluster { name, hosts, eds };
            cluster.eds.write_assignment(cluster.assignment());
            clusters.push(cluster);
        }
        State {
            clusters,
            next_g: g,
        }
    }

    /// The tiers' hosts, plus real_backend's (STATIC, one host without
    /// metadata: serving); envoy_admin is not managed.
    pub fn expected_hosts(&self) -> usize {
        self.clusters.iter().map(|c| c.tier().len()).sum::<usize>() + 1
    }

    pub fn endpoints(&self) -> usize {
        self.clusters.iter().map(|c| c.hosts.len()).sum()
    }

    /// A rolling-update step on `fraction` of every cluster's endpoints (at
    /// least one each), or of cluster `only` alone: that many ready pods
    /// become serving+terminating and as many new, not yet ready pods
    /// appear. Every file is written first, then all renamed back to back.
    pub fn change(&mut self, fraction: f64, only: Option<usize>) -> Change {
        let mut rng = Rng::new(7);
        let (mut flipped, mut added) = (0, 0);
        let n = self.clusters.len();
        let picked: Vec<usize> = match only {
            Some(i) => vec![i % n],
            None => (0..n).collect(),
        };
        let mut staged = Vec::new();
        for i in picked {
            let c = &mut self.clusters[i];
            let k = 1.max((c.hosts.len() as f64 * fraction).round() as usize);
            let mut ready: Vec<usize> = (0..c.hosts.len())
                .filter(|&j| c.hosts[j].pod == Pod::Ready)
                .collect();
            for _ in 0..k.min(ready.len()) {
                let j = ready.swap_remove(rng.below(ready.len()));
                c.hosts[j].pod = Pod::ServingTerminating;
                flipped += 1;
            }
            for _ in 0..k {
                c.hosts.push(Host {
                    g: self.next_g,
                    pod: Pod::NotReady,
                    zone: rng.below(3),
                    weight: 1,
                });
                self.next_g += 1;
                added += 1;
            }
            staged.push(c.eds.stage_assignment(c.assignment()));
        }
        let files = staged.len();
        for s in staged {
            s.commit();
        }
        Change {
            expect_hosts: self.expected_hosts(),
            flipped,
            added,
            files,
            renamed_ms: now_ms(),
        }
    }

    /// A copy of the pods' states, to put back after the reference run.
    pub fn snapshot(&self) -> (Vec<Vec<Host>>, usize) {
        (
            self.clusters.iter().map(|c| c.hosts.clone()).collect(),
            self.next_g,
        )
    }

    pub fn restore(&mut self, (hosts, next_g): (Vec<Vec<Host>>, usize)) {
        for (c, h) in self.clusters.iter_mut().zip(hosts) {
            c.hosts = h;
            c.eds.write_assignment(c.assignment());
        }
        self.next_g = next_g;
    }
}

pub fn scale_bootstrap(dir: &Path, names: &[String], wasm: Option<&Path>) -> Value {
    let outlier = json!({
        "consecutive_5xx": 5, "consecutive_local_origin_failure": 2,
        "split_external_local_origin_errors": true, "interval": "1s", "base_ejection_time": "10s"
    });
    let mut clusters = vec![static_cluster("envoy_admin", vec![lb_endpoint(ADMIN)])];
    let mut real = static_cluster("real_backend", vec![lb_endpoint(BACKEND)]);
    real["load_balancing_policy"] = override_host_policy(support::OVERRIDE_HEADER);
    clusters.push(real);
    let mut routes = Vec::new();
    for n in names {
        let mut c = eds_cluster(n, &dir.join("eds").join(n));
        // As in envoy.yaml: an ejected host is read as not serving.
        c["outlier_detection"] = outlier.clone();
        c["load_balancing_policy"] = override_host_policy(support::OVERRIDE_HEADER);
        clusters.push(c);
        routes.push(route(&format!("/c/{n}/"), n));
    }
    routes.push(route("/", "real_backend"));
    let filters = wasm
        .map(|w| vec![wasm_filter("serving_picker", None, w, Some(PLUGIN_CONFIG))])
        .unwrap_or_default();
    let access = file_access_log(
        &dir.join("access.log"),
        "ACCESS %REQ(:PATH)% code=%RESPONSE_CODE% flags=%RESPONSE_FLAGS% cluster=%UPSTREAM_CLUSTER% override=%REQ(X-GATEWAY-DESTINATION-ENDPOINT)% upstream=%UPSTREAM_HOST%\n",
    );
    let main = http_connection_manager("ingress", routes, filters, json!({"access_log": access}));
    // The one real upstream: a direct_response listener of the same Envoy.
    let backend = http_connection_manager(
        "backend",
        vec![direct_response("/", "ok\n")],
        Vec::new(),
        json!({}),
    );
    bootstrap(
        "bench-scale",
        ADMIN,
        vec![
            listener("main", LISTEN, main),
            listener("backend", BACKEND, backend),
        ],
        clusters,
    )
}
