//! EDS from a watched file: endpoints with EndpointSlice conditions as host
//! metadata (`k8s.endpointslice`), written as a DiscoveryResponse to a new
//! file beside the watched one and renamed into place.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Map, Value};

pub const METADATA_NAMESPACE: &str = "k8s.endpointslice";

#[derive(Clone, Debug)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub ready: Option<Value>,
    pub serving: Option<Value>,
    pub terminating: Option<Value>,
    pub zone: Option<String>,
    pub weight: Option<u32>,
    /// EDS `health_status` (HEALTHY, UNHEALTHY, DRAINING, TIMEOUT, DEGRADED, UNKNOWN).
    pub health_status: Option<&'static str>,
    /// No `metadata` at all on the lb_endpoint.
    pub no_metadata: bool,
    /// More keys of the namespace (`hints_zones`, `hints_nodes`, `node_name`).
    pub more: Vec<(&'static str, String)>,
}

impl Endpoint {
    /// Only the address: an empty `k8s.endpointslice` metadata struct.
    pub fn bare(addr: SocketAddr) -> Endpoint {
        Endpoint {
            addr,
            ready: None,
            serving: None,
            terminating: None,
            zone: None,
            weight: None,
            health_status: None,
            no_metadata: false,
            more: Vec::new(),
        }
    }

    fn conditions(addr: SocketAddr, ready: bool, serving: bool, terminating: bool) -> Endpoint {
        Endpoint {
            ready: Some(Value::Bool(ready)),
            serving: Some(Value::Bool(serving)),
            terminating: Some(Value::Bool(terminating)),
            ..Endpoint::bare(addr)
        }
    }

    /// ready, serving, not terminating.
    pub fn serving(addr: SocketAddr) -> Endpoint {
        Self::conditions(addr, true, true, false)
    }

    /// Terminating but still serving (ready is false while terminating).
    pub fn serving_terminating(addr: SocketAddr) -> Endpoint {
        Self::conditions(addr, false, true, true)
    }

    /// Terminating and no longer serving.
    pub fn terminating_not_serving(addr: SocketAddr) -> Endpoint {
        Self::conditions(addr, false, false, true)
    }

    /// Not (yet) serving, not terminating (e.g. a new pod before readiness).
    pub fn not_serving(addr: SocketAddr) -> Endpoint {
        Self::conditions(addr, false, false, false)
    }

    /// No metadata at all.
    pub fn no_metadata(addr: SocketAddr) -> Endpoint {
        Endpoint {
            no_metadata: true,
            ..Endpoint::bare(addr)
        }
    }

    /// No metadata, only an EDS health_status.
    pub fn health(addr: SocketAddr, status: &'static str) -> Endpoint {
        Endpoint {
            no_metadata: true,
            health_status: Some(status),
            ..Endpoint::bare(addr)
        }
    }

    pub fn weight(mut self, w: u32) -> Endpoint {
        self.weight = Some(w);
        self
    }

    /// Topology hints as the companion writes them: comma-separated zone
    /// and node names ("" = no hints of that kind, the key left out).
    pub fn hints(mut self, zones: &str, nodes: &str) -> Endpoint {
        for (k, v) in [("hints_zones", zones), ("hints_nodes", nodes)] {
            if !v.is_empty() {
                self.more.push((k, v.to_string()));
            }
        }
        self
    }

    pub fn node_name(mut self, n: &str) -> Endpoint {
        self.more.push(("node_name", n.to_string()));
        self
    }

    pub fn zone(mut self, z: &str) -> Endpoint {
        self.zone = Some(z.to_string());
        self
    }

    pub fn health_status(mut self, s: &'static str) -> Endpoint {
        self.health_status = Some(s);
        self
    }

    /// The lb_endpoint JSON (shared by EDS files and STATIC load_assignments).
    pub fn to_lb_endpoint(&self) -> Value {
        let mut ep = Map::new();
        ep.insert(
            "endpoint".into(),
            json!({"address": {"socket_address": {
                "address": self.addr.ip().to_string(),
                "port_value": self.addr.port(),
            }}}),
        );
        if let Some(h) = self.health_status {
            ep.insert("health_status".into(), Value::String(h.to_string()));
        }
        if let Some(w) = self.weight {
            ep.insert("load_balancing_weight".into(), json!(w));
        }
        if !self.no_metadata {
            let mut md = Map::new();
            if let Some(v) = &self.ready {
                md.insert("ready".into(), v.clone());
            }
            if let Some(v) = &self.serving {
                md.insert("serving".into(), v.clone());
            }
            if let Some(v) = &self.terminating {
                md.insert("terminating".into(), v.clone());
            }
            if let Some(z) = &self.zone {
                md.insert("zone".into(), Value::String(z.clone()));
            }
            for (k, v) in &self.more {
                md.insert((*k).into(), Value::String(v.clone()));
            }
            ep.insert(
                "metadata".into(),
                json!({"filter_metadata": {METADATA_NAMESPACE: Value::Object(md)}}),
            );
        }
        Value::Object(ep)
    }
}

/// ClusterLoadAssignment for `cluster`.
pub fn load_assignment(cluster: &str, endpoints: &[Endpoint]) -> Value {
    let lb: Vec<Value> = endpoints.iter().map(Endpoint::to_lb_endpoint).collect();
    if lb.is_empty() {
        json!({"cluster_name": cluster, "endpoints": []})
    } else {
        json!({"cluster_name": cluster, "endpoints": [{"lb_endpoints": lb}]})
    }
}

/// The watched EDS file of one cluster (its own directory).
pub struct EdsFile {
    cluster: String,
    dir: PathBuf,
    path: PathBuf,
    version: AtomicU64,
}

impl EdsFile {
    /// Creates `dir` and writes the first version.
    pub fn create(cluster: &str, dir: &Path, endpoints: &[Endpoint]) -> EdsFile {
        let f = EdsFile::create_empty(cluster, dir);
        f.write(endpoints);
        f
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Version of the last file written.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    /// Creates `dir`, without a file yet (`write_assignment` writes one).
    pub fn create_empty(cluster: &str, dir: &Path) -> EdsFile {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        EdsFile {
            cluster: cluster.to_string(),
            dir: dir.to_path_buf(),
            path: dir.join("eds.json"),
            version: AtomicU64::new(0),
        }
    }

    /// Writes a new version: new file beside the watched one, renamed into place.
    pub fn write(&self, endpoints: &[Endpoint]) {
        self.write_assignment(load_assignment(&self.cluster, endpoints));
    }

    /// `write` of a ClusterLoadAssignment built elsewhere (localities, priorities).
    pub fn write_assignment(&self, cla: Value) {
        self.stage_assignment(cla).commit();
    }

    /// The next version written beside the watched file, renamed into place
    /// only by `commit`: several clusters' files can change back to back.
    pub fn stage_assignment(&self, mut cla: Value) -> StagedEds {
        let v = self.version.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(o) = cla.as_object_mut() {
            o.insert(
                "@type".into(),
                json!("type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"),
            );
        }
        let doc = json!({"version_info": v.to_string(), "resources": [cla]});
        let tmp = self.dir.join(format!(".eds.json.{v}.tmp"));
        let text = serde_json::to_string_pretty(&doc).unwrap_or_else(|e| panic!("eds json: {e}"));
        std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
        StagedEds {
            tmp,
            path: self.path.clone(),
        }
    }
}

/// An EDS file written beside the watched one, not yet in place.
pub struct StagedEds {
    tmp: PathBuf,
    path: PathBuf,
}

impl StagedEds {
    /// Renames it into place: Envoy takes it in.
    pub fn commit(self) {
        std::fs::rename(&self.tmp, &self.path).unwrap_or_else(|e| {
            panic!(
                "rename {} -> {}: {e}",
                self.tmp.display(),
                self.path.display()
            )
        });
    }
}
