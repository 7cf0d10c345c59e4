//! Bootstrap edits for `EnvoyBuilder::bootstrap_hook`: what envoy.yaml has
//! and the builder has no option for (outlier detection, active health
//! checks, the retry policy), and moving the listener to LDS from a watched
//! file so that its filter configuration can be changed at run time.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

/// envoy.yaml's route retry policy.
pub fn envoy_yaml_retry_policy() -> Value {
    json!({
        "retry_on": "connect-failure,reset,refused-stream",
        "num_retries": 2,
        "retry_host_predicate": [{
            "name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}
        }],
        "host_selection_retry_max_attempts": 3
    })
}

/// envoy.yaml's outlier detection on the backend cluster.
pub fn envoy_yaml_outlier_detection() -> Value {
    json!({
        "consecutive_5xx": 5,
        "consecutive_local_origin_failure": 2,
        "split_external_local_origin_errors": true,
        "interval": "1s",
        "base_ejection_time": "10s"
    })
}

/// Envoy's own zone: bootstrap `node.locality.zone` (what `--service-zone`
/// would override).
pub fn node_zone(zone: &str) -> impl Fn(&mut Value, &Path) + 'static {
    let zone = zone.to_string();
    move |bootstrap: &mut Value, _dir: &Path| {
        bootstrap["node"]["locality"] = json!({"zone": zone});
    }
}

/// The cluster named `name` in a bootstrap; panics if there is none.
pub fn cluster_mut<'a>(bootstrap: &'a mut Value, name: &str) -> &'a mut Value {
    let clusters = bootstrap["static_resources"]["clusters"]
        .as_array_mut()
        .unwrap_or_else(|| panic!("bootstrap without static_resources.clusters"));
    clusters
        .iter_mut()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("bootstrap has no cluster {name:?}"))
}

/// A hook that sets these keys on cluster `name` (e.g. `outlier_detection`).
pub fn merge_cluster(name: &str, extra: Value) -> impl Fn(&mut Value, &Path) + 'static {
    let name = name.to_string();
    move |bootstrap: &mut Value, _dir: &Path| {
        let cluster = cluster_mut(bootstrap, &name);
        if let (Some(c), Some(extra)) = (cluster.as_object_mut(), extra.as_object()) {
            for (k, v) in extra {
                c.insert(k.clone(), v.clone());
            }
        }
    }
}

/// A hook that gives the endpoint `addr` of STATIC cluster `name` its own
/// health-check port (`health_check_config.port_value`).
pub fn health_check_port(name: &str, addr: SocketAddr, port: u16) -> impl Fn(&mut Value, &Path) {
    let name = name.to_string();
    move |bootstrap: &mut Value, _dir: &Path| {
        let cluster = cluster_mut(bootstrap, &name);
        let groups = cluster["load_assignment"]["endpoints"]
            .as_array_mut()
            .unwrap_or_else(|| panic!("cluster {name:?} has no load_assignment (STATIC only)"));
        let mut found = false;
        for group in groups {
            for ep in group["lb_endpoints"].as_array_mut().into_iter().flatten() {
                let sa = &ep["endpoint"]["address"]["socket_address"];
                if sa["address"] == addr.ip().to_string() && sa["port_value"] == addr.port() {
                    ep["endpoint"]["health_check_config"] = json!({"port_value": port});
                    found = true;
                }
            }
        }
        assert!(found, "cluster {name:?} has no endpoint {addr}");
    }
}

/// The listener as LDS from a watched file: `<dir>/lds/lds.json`.
pub struct LdsFile {
    dir: PathBuf,
}

impl LdsFile {
    pub fn in_envoy_dir(envoy_dir: &Path) -> LdsFile {
        LdsFile {
            dir: envoy_dir.join("lds"),
        }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join("lds.json")
    }

    /// The listener currently in the file.
    pub fn listener(&self) -> Value {
        let text = std::fs::read_to_string(self.path())
            .unwrap_or_else(|e| panic!("read {}: {e}", self.path().display()));
        let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("lds json: {e}"));
        let mut l = doc["resources"][0].clone();
        if let Some(o) = l.as_object_mut() {
            o.remove("@type");
        }
        l
    }

    fn version(&self) -> u64 {
        std::fs::read_to_string(self.path())
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|d| d["version_info"].as_str().and_then(|v| v.parse().ok()))
            .unwrap_or(0)
    }

    /// Writes a new version (new file beside the watched one, renamed into place).
    pub fn write(&self, listener: &Value) -> u64 {
        std::fs::create_dir_all(&self.dir)
            .unwrap_or_else(|e| panic!("create {}: {e}", self.dir.display()));
        let v = self.version() + 1;
        let mut l = listener.clone();
        if let Some(o) = l.as_object_mut() {
            o.insert(
                "@type".into(),
                json!("type.googleapis.com/envoy.config.listener.v3.Listener"),
            );
        }
        let doc = json!({"version_info": v.to_string(), "resources": [l]});
        let tmp = self.dir.join(format!(".lds.json.{v}.tmp"));
        let text = serde_json::to_string_pretty(&doc).unwrap_or_else(|e| panic!("lds json: {e}"));
        std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
        std::fs::rename(&tmp, self.path())
            .unwrap_or_else(|e| panic!("rename {}: {e}", tmp.display()));
        v
    }

    /// The serving_picker plugin configuration (JSON text) of the listener.
    pub fn plugin_config(&self) -> String {
        let l = self.listener();
        wasm_config_value(&l)
            .unwrap_or_else(|| panic!("listener has no serving_picker filter: {l}"))
    }

    /// Writes a new version whose serving_picker plugin configuration is `config`.
    pub fn set_plugin_config(&self, config: &str) -> u64 {
        let mut l = self.listener();
        let value = wasm_config_value_mut(&mut l)
            .unwrap_or_else(|| panic!("listener has no serving_picker filter"));
        *value = Value::String(config.to_string());
        self.write(&l)
    }
}

fn http_filters_mut(listener: &mut Value) -> Option<&mut Vec<Value>> {
    listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"].as_array_mut()
}

fn wasm_config_value_mut(listener: &mut Value) -> Option<&mut Value> {
    http_filters_mut(listener)?
        .iter_mut()
        .find(|f| f["name"] == "envoy.filters.http.wasm")
        .map(|f| &mut f["typed_config"]["config"]["configuration"]["value"])
}

fn wasm_config_value(listener: &Value) -> Option<String> {
    let mut l = listener.clone();
    wasm_config_value_mut(&mut l).and_then(|v| v.as_str().map(str::to_string))
}

/// A hook that moves the (only) static listener to LDS from a watched file
/// (`LdsFile::in_envoy_dir(dir)`), as a control plane would serve it.
pub fn listener_from_lds_file() -> impl Fn(&mut Value, &Path) + 'static {
    move |bootstrap: &mut Value, dir: &Path| {
        let listeners = bootstrap["static_resources"]
            .as_object_mut()
            .and_then(|o| o.remove("listeners"))
            .unwrap_or_else(|| panic!("bootstrap without static listeners"));
        let listener = listeners[0].clone();
        let lds = LdsFile::in_envoy_dir(dir);
        let _ = std::fs::remove_file(lds.path());
        lds.write(&listener);
        bootstrap["dynamic_resources"] = json!({
            "lds_config": {
                "resource_api_version": "V3",
                "path_config_source": {
                    "path": lds.path().to_string_lossy(),
                    "watched_directory": {"path": lds.dir.to_string_lossy()}
                }
            }
        });
    }
}

/// Clusters as CDS from a watched file: `<dir>/cds/cds.json`, so that a
/// cluster's load-balancing policy can be swapped at run time, as a control
/// plane that drops a patch (or a policy that no longer attaches) does.
pub struct CdsFile {
    dir: PathBuf,
}

impl CdsFile {
    pub fn in_envoy_dir(envoy_dir: &Path) -> CdsFile {
        CdsFile {
            dir: envoy_dir.join("cds"),
        }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join("cds.json")
    }

    /// The clusters currently in the file.
    pub fn clusters(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.path())
            .unwrap_or_else(|e| panic!("read {}: {e}", self.path().display()));
        let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("cds json: {e}"));
        doc["resources"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|mut c| {
                if let Some(o) = c.as_object_mut() {
                    o.remove("@type");
                }
                c
            })
            .collect()
    }

    fn version(&self) -> u64 {
        std::fs::read_to_string(self.path())
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|d| d["version_info"].as_str().and_then(|v| v.parse().ok()))
            .unwrap_or(0)
    }

    /// Writes a new version (new file beside the watched one, renamed into place).
    pub fn write(&self, clusters: &[Value]) -> u64 {
        std::fs::create_dir_all(&self.dir)
            .unwrap_or_else(|e| panic!("create {}: {e}", self.dir.display()));
        let v = self.version() + 1;
        let resources: Vec<Value> = clusters
            .iter()
            .map(|c| {
                let mut c = c.clone();
                if let Some(o) = c.as_object_mut() {
                    o.insert(
                        "@type".into(),
                        json!("type.googleapis.com/envoy.config.cluster.v3.Cluster"),
                    );
                }
                c
            })
            .collect();
        let doc = json!({"version_info": v.to_string(), "resources": resources});
        let tmp = self.dir.join(format!(".cds.json.{v}.tmp"));
        let text = serde_json::to_string_pretty(&doc).unwrap_or_else(|e| panic!("cds json: {e}"));
        std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
        std::fs::rename(&tmp, self.path())
            .unwrap_or_else(|e| panic!("rename {}: {e}", tmp.display()));
        v
    }

    /// Writes a new version where cluster `name` has this
    /// `load_balancing_policy` and no `common_lb_config`.
    pub fn set_policy(&self, name: &str, policy: Value) -> u64 {
        let mut clusters = self.clusters();
        let c = clusters
            .iter_mut()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("cds has no cluster {name:?}"));
        if let Some(o) = c.as_object_mut() {
            o.remove("common_lb_config");
            o.insert("load_balancing_policy".into(), policy);
        }
        self.write(&clusters)
    }
}

/// A hook that moves the static cluster `name` to CDS from a watched file
/// (`CdsFile::in_envoy_dir(dir)`). Runs after the hooks that shape the
/// cluster; keeps the other `dynamic_resources` (ADS); static route
/// configurations stop validating cluster names at start-up.
pub fn cluster_from_cds_file(name: &str) -> impl Fn(&mut Value, &Path) + 'static {
    let name = name.to_string();
    move |bootstrap: &mut Value, dir: &Path| {
        let clusters = bootstrap["static_resources"]["clusters"]
            .as_array_mut()
            .unwrap_or_else(|| panic!("bootstrap without static_resources.clusters"));
        let at = clusters
            .iter()
            .position(|c| c["name"] == name.as_str())
            .unwrap_or_else(|| panic!("bootstrap has no cluster {name:?}"));
        let cluster = clusters.remove(at);
        let cds = CdsFile::in_envoy_dir(dir);
        let _ = std::fs::remove_file(cds.path());
        cds.write(&[cluster]);
        bootstrap["dynamic_resources"]["cds_config"] = json!({
            "resource_api_version": "V3",
            "path_config_source": {
                "path": cds.path().to_string_lossy(),
                "watched_directory": {"path": cds.dir.to_string_lossy()}
            }
        });
        // Static routes to a CDS cluster: Envoy checks them only once it is there.
        for l in bootstrap["static_resources"]["listeners"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            for chain in l["filter_chains"].as_array_mut().into_iter().flatten() {
                for f in chain["filters"].as_array_mut().into_iter().flatten() {
                    if f["typed_config"]["route_config"].is_object() {
                        f["typed_config"]["route_config"]["validate_clusters"] = json!(false);
                    }
                }
            }
        }
    }
}
