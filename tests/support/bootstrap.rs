//! The pieces of an Envoy bootstrap (JSON), shared by the tests'
//! `EnvoyBuilder` and the benchmarks (`benches/`): listeners, the HTTP
//! connection manager, the wasm filter, the clusters and their load-balancing
//! policies (override_host with its round-robin fallback, the native module).

use std::path::Path;

use serde_json::{json, Value};

/// A loopback socket address.
pub fn socket(port: u16) -> Value {
    json!({"socket_address": {"address": "127.0.0.1", "port_value": port}})
}

/// The router, the last HTTP filter.
pub fn router() -> Value {
    json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
    })
}

/// A route of `prefix` to `cluster`.
pub fn route(prefix: &str, cluster: &str) -> Value {
    json!({"match": {"prefix": prefix}, "route": {"cluster": cluster}})
}

/// A route of `prefix` answered by Envoy itself: 200 and `body`.
pub fn direct_response(prefix: &str, body: &str) -> Value {
    json!({"match": {"prefix": prefix}, "direct_response": {"status": 200, "body": {"inline_string": body}}})
}

/// The HTTP connection manager (one virtual host for every domain) with
/// `filters` and then the router; `extra` keys are merged into its config
/// (`access_log`, `local_reply_config`).
pub fn http_connection_manager(
    stat_prefix: &str,
    routes: Vec<Value>,
    filters: Vec<Value>,
    extra: Value,
) -> Value {
    let mut http_filters = filters;
    http_filters.push(router());
    let mut config = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": stat_prefix,
        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}]},
        "http_filters": http_filters
    });
    if let (Some(c), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            c.insert(k.clone(), v.clone());
        }
    }
    json!({"name": "envoy.filters.network.http_connection_manager", "typed_config": config})
}

/// A listener on loopback `port` with one network filter.
pub fn listener(name: &str, port: u16, network_filter: Value) -> Value {
    json!({"name": name, "address": socket(port), "filter_chains": [{"filters": [network_filter]}]})
}

/// A file access log at `path` in `format`.
pub fn file_access_log(path: &Path, format: &str) -> Value {
    json!([{
        "name": "envoy.access_loggers.file",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": path.to_string_lossy(),
            "log_format": {"text_format_source": {"inline_string": format}}
        }
    }])
}

/// The serving_picker wasm filter (or any module) named `name`, from `module`,
/// with `configuration` when given, in the runtime `envoy::wasm_runtime`
/// names; `root_id` tells apart several plugins on one VM.
pub fn wasm_filter(
    name: &str,
    root_id: Option<&str>,
    module: &Path,
    configuration: Option<&str>,
) -> Value {
    let mut config = json!({
        "name": name,
        "vm_config": {
            "runtime": super::envoy::wasm_runtime(),
            "code": {"local": {"filename": module.to_string_lossy()}}
        }
    });
    if let Some(id) = root_id {
        config["root_id"] = json!(id);
    }
    if let Some(c) = configuration {
        config["configuration"] =
            json!({"@type": "type.googleapis.com/google.protobuf.StringValue", "value": c});
    }
    json!({
        "name": "envoy.filters.http.wasm",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm", "config": config}
    })
}

/// override_host on `header`, with round robin for requests without it.
pub fn override_host_policy(header: &str) -> Value {
    json!({"policies": [{"typed_extension_config": {
        "name": "envoy.load_balancing_policies.override_host",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
            "override_host_sources": [{"header": header}],
            "fallback_policy": {"policies": [{"typed_extension_config": {
                "name": "envoy.load_balancing_policies.round_robin",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"}
            }}]}
        }
    }}]})
}

/// The host statuses override_host may pick (every one a control plane
/// publishes for a serving endpoint): a cluster's `common_lb_config`.
pub fn override_host_statuses() -> Value {
    json!({"override_host_status": {"statuses": ["UNKNOWN", "HEALTHY", "DEGRADED", "DRAINING"]}})
}

/// The native module as the cluster's load-balancing policy, with its
/// configuration (JSON text).
pub fn native_lb_policy(policy_config: &str) -> Value {
    json!({"policies": [{"typed_extension_config": {
        "name": "envoy.load_balancing_policies.dynamic_modules",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.dynamic_modules.v3.DynamicModulesLoadBalancerConfig",
            "dynamic_module_config": {"name": "serving_picker"},
            "lb_policy_name": "serving_picker",
            "lb_policy_config": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": policy_config}
        }
    }}]})
}

/// A STATIC cluster of `lb_endpoints`.
pub fn static_cluster(name: &str, lb_endpoints: Vec<Value>) -> Value {
    json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": lb_endpoints}]}
    })
}

/// An lb_endpoint at loopback `port`, without metadata.
pub fn lb_endpoint(port: u16) -> Value {
    json!({"endpoint": {"address": socket(port)}})
}

/// An EDS cluster fed from the watched file `dir/eds.json`.
pub fn eds_cluster(name: &str, dir: &Path) -> Value {
    json!({
        "name": name,
        "type": "EDS",
        "connect_timeout": "1s",
        "eds_cluster_config": {"eds_config": {
            "resource_api_version": "V3",
            "path_config_source": {
                "path": dir.join("eds.json").to_string_lossy(),
                "watched_directory": {"path": dir.to_string_lossy()}
            }
        }}
    })
}

/// A bootstrap: admin on loopback `admin_port`, these listeners and clusters.
pub fn bootstrap(
    node: &str,
    admin_port: u16,
    listeners: Vec<Value>,
    clusters: Vec<Value>,
) -> Value {
    json!({
        "node": {"id": node, "cluster": node},
        "admin": {"address": socket(admin_port)},
        "static_resources": {"listeners": listeners, "clusters": clusters}
    })
}
