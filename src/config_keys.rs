//! The registry of configuration keys: every key either form takes, with the forms that take it,
//! its validator and its line in docs/configuration.md. The wasm filter's parser
//! (wasm/src/config.rs) reads each key through it, the native policy (native/src/config.rs)
//! takes the keys it lists for both forms and refuses the wasm filter's own by name, and the key
//! tables of docs/configuration.md are its [`table`] (a test compares them).
//!
//! A key is a [`Key`]: its [`KeyInfo`] (name, forms, docs) and a validator that reads its JSON
//! value into a typed one, naming the key in every error. Relations between keys (a timeout
//! within ten poll intervals, and the like) are the parsing form's.

use crate::config::{bounded_u64, err, non_empty, typed, ConfigError};
use crate::drain::{DrainConfig, DRAIN_WINDOW_KEY};
use serde_json::Value;

/// A form of serving-picker that takes configuration keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// The proxy-wasm filter (`configuration` of the wasm filter).
    Wasm,
    /// The dynamic-module load-balancing policy (`lb_policy_config`).
    Native,
}

/// Which forms take a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forms {
    /// The wasm filter only: the native policy refuses it, saying so.
    Wasm,
    /// The native policy only: the wasm filter refuses it, saying so.
    Native,
    /// Both forms, with the same meaning.
    Both,
}

impl Forms {
    /// Whether `form` takes the key.
    pub fn take(self, form: Form) -> bool {
        matches!(
            (self, form),
            (Forms::Both, _) | (Forms::Wasm, Form::Wasm) | (Forms::Native, Form::Native)
        )
    }
}

/// A key's row in a docs table: its default and its meaning, as Markdown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Doc {
    /// The default column.
    pub default: &'static str,
    /// The meaning column.
    pub meaning: &'static str,
}

/// Everything about a key but its validator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyInfo {
    /// Which key it is, for a form's exhaustive `match`.
    pub id: KeyId,
    /// The key as the configuration spells it.
    pub name: &'static str,
    /// The forms that take it.
    pub forms: Forms,
    /// Its docs row (the wasm filter's table when the wasm filter takes it).
    pub doc: Doc,
    /// Its row in the native policy's table when that differs from `doc`.
    pub native_doc: Option<Doc>,
    /// A JSON value the key accepts alone (the tests give it to every form that takes the key).
    pub example: &'static str,
}

impl KeyInfo {
    /// Its docs row for `form`; `None` when `form` does not take it.
    pub fn doc_for(&self, form: Form) -> Option<Doc> {
        match form {
            _ if !self.forms.take(form) => None,
            Form::Native => Some(self.native_doc.unwrap_or(self.doc)),
            Form::Wasm => Some(self.doc),
        }
    }
}

/// A configuration key: what it is, and its validator.
#[derive(Clone, Copy, Debug)]
pub struct Key<T> {
    /// Name, forms, docs.
    pub info: KeyInfo,
    read: fn(&str, Value) -> Result<T, ConfigError>,
}

impl<T> Key<T> {
    /// The key as the configuration spells it.
    pub const fn name(&self) -> &'static str {
        self.info.name
    }

    /// `value` checked and read; errors name the key.
    pub fn read(&self, value: Value) -> Result<T, ConfigError> {
        (self.read)(self.info.name, value)
    }
}

/// Every key, in the docs tables' order.
pub const ALL: [&KeyInfo; 20] = [
    &ADMIN_CLUSTER.info,
    &ADMIN_PATH.info,
    &ADMIN_HEALTH_PATH.info,
    &ADMIN_STATS_PATH.info,
    &FULL_REFRESH_INTERVAL_MS.info,
    &PARTIAL_REFRESH.info,
    &ADMIN_TIMEOUT_MS.info,
    &MAX_ADMIN_BODY_BYTES.info,
    &METADATA_NAMESPACE.info,
    &OVERRIDE_HEADER.info,
    &REFRESH_INTERVAL_MS.info,
    &ON_NO_SERVING.info,
    &CLUSTERS.info,
    &LOCAL_ZONE.info,
    &LOCAL_NODE.info,
    &LOCAL_ZONE_MIN_SHARE.info,
    &RETRY_ALTERNATES.info,
    &BEFORE_FIRST_SNAPSHOT.info,
    &DRAIN_WINDOW_MS.info,
    &MAX_SNAPSHOT_AGE_MS.info,
];

/// The key named `name`, if any form takes one so named.
pub fn find(name: &str) -> Option<&'static KeyInfo> {
    ALL.iter().copied().find(|k| k.name == name)
}

/// The names of the keys `form` takes, in the docs tables' order.
pub fn names_for(form: Form) -> impl Iterator<Item = &'static str> {
    ALL.iter()
        .filter(move |k| k.forms.take(form))
        .map(|k| k.name)
}

/// `form`'s key table in docs/configuration.md, as Markdown (header and one row a key).
pub fn table(form: Form) -> String {
    let mut out = String::from("| key | default | meaning |\n|---|---|---|\n");
    for key in ALL {
        if let Some(doc) = key.doc_for(form) {
            out.push_str(&format!(
                "| `{}` | {} | {} |\n",
                key.name, doc.default, doc.meaning
            ));
        }
    }
    out
}

/// What a request gets when its cluster has no serving host (`on_no_serving`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnNoServing {
    /// Answer a local 503 that says why.
    Reject,
    /// Leave host selection to Envoy's own load balancer.
    Passthrough,
}

/// What a managed cluster's requests get before the wasm filter has a snapshot
/// (`before_first_snapshot`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BeforeFirstSnapshot {
    /// Wait for it (at most `admin_timeout_ms`), then a 503 that says why.
    Hold,
    /// A 503 that says why, at once.
    Reject,
    /// Envoy's own load balancer: what Envoy does without the filter.
    Passthrough,
}

/// The shortest `refresh_interval_ms` (and `full_refresh_interval_ms`) taken.
pub const MIN_REFRESH_INTERVAL_MS: u64 = 100;

/// An admin API path: starts with '/', no spaces or control characters (`""` too when
/// `allow_empty`).
fn admin_path(key: &str, value: Value, allow_empty: bool) -> Result<String, ConfigError> {
    let s: String = typed(key, value)?;
    if s.is_empty() && allow_empty {
        return Ok(s);
    }
    if !s.starts_with('/') || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(err(key, "must be a path starting with '/' without spaces"));
    }
    Ok(s)
}

/// Live health's path. It cannot be turned off: only `/clusters` tells DRAINING from failed
/// checks and ejections (the dump says UNHEALTHY for all three) and maps EDS service names back
/// to clusters. It is fetched only when the dump leaves a host open.
fn health_path(key: &str, value: Value) -> Result<String, ConfigError> {
    let path = admin_path(key, value, false)?;
    if !path.contains("format=json") {
        return Err(err(key, "must ask for JSON (`/clusters?format=json`)"));
    }
    Ok(path)
}

/// Headers the filter must not overwrite: HTTP framing and routing, and the
/// ones Envoy itself reads or sets (`x-envoy-*` too).
const RESERVED_HEADERS: [&str; 15] = [
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
    "te",
    "trailer",
    "expect",
    "cookie",
    "authorization",
    "x-forwarded-for",
    "x-request-id",
];

/// HTTP header names as Envoy stores them: lowercase token characters, and
/// not one Envoy or HTTP itself gives a meaning.
fn header_name(key: &str, value: Value) -> Result<String, ConfigError> {
    let s: String = typed(key, value)?;
    let token =
        |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.!#$%&'*+^`|~".contains(c);
    if s.is_empty() || s.starts_with(':') || !s.chars().all(token) {
        return Err(err(
            key,
            format!("{s:?} is not a lowercase HTTP header name"),
        ));
    }
    if RESERVED_HEADERS.contains(&s.as_str()) || s.starts_with("x-envoy-") {
        return Err(err(key, format!("{s:?} is a header HTTP or Envoy uses")));
    }
    Ok(s)
}

fn on_no_serving(key: &str, value: Value) -> Result<OnNoServing, ConfigError> {
    match typed::<String>(key, value)?.as_str() {
        "reject" => Ok(OnNoServing::Reject),
        "passthrough" => Ok(OnNoServing::Passthrough),
        _ => Err(err(key, "must be \"reject\" or \"passthrough\"")),
    }
}

fn before_first_snapshot(key: &str, value: Value) -> Result<BeforeFirstSnapshot, ConfigError> {
    match typed::<String>(key, value)?.as_str() {
        "hold" => Ok(BeforeFirstSnapshot::Hold),
        "reject" => Ok(BeforeFirstSnapshot::Reject),
        "passthrough" => Ok(BeforeFirstSnapshot::Passthrough),
        _ => Err(err(key, "must be \"hold\", \"reject\" or \"passthrough\"")),
    }
}

/// An allow-list of cluster names: not empty, no empty name.
fn cluster_list(key: &str, value: Value) -> Result<Vec<String>, ConfigError> {
    let list: Vec<String> = typed(key, value)?;
    if list.iter().any(|c| c.is_empty()) {
        return Err(err(key, "cluster names must not be empty"));
    }
    if list.is_empty() {
        return Err(err(
            key,
            "an empty list would manage nothing; leave it out for all",
        ));
    }
    Ok(list)
}

/// A share of weight in (0, 1].
fn share(key: &str, value: Value) -> Result<f64, ConfigError> {
    let share: f64 = typed(key, value)?;
    if share > 0.0 && share <= 1.0 {
        Ok(share)
    } else {
        Err(err(key, format!("{share} is outside (0, 1]")))
    }
}

/// Which key a [`KeyInfo`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyId {
    /// `admin_cluster`.
    AdminCluster,
    /// `admin_path`.
    AdminPath,
    /// `admin_health_path`.
    AdminHealthPath,
    /// `admin_stats_path`.
    AdminStatsPath,
    /// `full_refresh_interval_ms`.
    FullRefreshIntervalMs,
    /// `partial_refresh`.
    PartialRefresh,
    /// `admin_timeout_ms`.
    AdminTimeoutMs,
    /// `max_admin_body_bytes`.
    MaxAdminBodyBytes,
    /// `metadata_namespace`.
    MetadataNamespace,
    /// `override_header`.
    OverrideHeader,
    /// `refresh_interval_ms`.
    RefreshIntervalMs,
    /// `on_no_serving`.
    OnNoServing,
    /// `clusters`.
    Clusters,
    /// `local_zone`.
    LocalZone,
    /// `local_node`.
    LocalNode,
    /// `local_zone_min_share`.
    LocalZoneMinShare,
    /// `retry_alternates`.
    RetryAlternates,
    /// `before_first_snapshot`.
    BeforeFirstSnapshot,
    /// `drain_window_ms`.
    DrainWindowMs,
    /// `max_snapshot_age_ms`.
    MaxSnapshotAgeMs,
}

/// `admin_cluster`.
pub const ADMIN_CLUSTER: Key<String> = Key {
    info: KeyInfo {
        id: KeyId::AdminCluster,
        name: "admin_cluster",
        forms: Forms::Wasm,
        doc: Doc {
            default: r#"`"envoy_admin"`"#,
            meaning: r#"cluster that points at Envoy's own admin listener (`prometheus_stats` in Envoy Gateway and Istio); never managed itself"#,
        },
        native_doc: None,
        example: r#""adm""#,
    },
    read: non_empty,
};

/// `admin_path`.
pub const ADMIN_PATH: Key<String> = Key {
    info: KeyInfo {
        id: KeyId::AdminPath,
        name: "admin_path",
        forms: Forms::Wasm,
        doc: Doc {
            default: r#"`"/config_dump?include_eds&mask=static_endpoint_configs,dynamic_endpoint_configs"`"#,
            meaning: r#"endpoints and metadata; a path starting with `/`, no spaces"#,
        },
        native_doc: None,
        example: r#""/config_dump?include_eds""#,
    },
    read: |k, v| admin_path(k, v, false),
};

/// `admin_health_path`.
pub const ADMIN_HEALTH_PATH: Key<String> = Key {
    info: KeyInfo {
        id: KeyId::AdminHealthPath,
        name: "admin_health_path",
        forms: Forms::Wasm,
        doc: Doc {
            default: r#"`"/clusters?format=json"`"#,
            meaning: r#"EDS status and live health; must ask for JSON (`format=json`) and cannot be turned off: only `/clusters` tells DRAINING from failed checks and ejections, and maps EDS service names back (it is read only when the dump leaves a host open)"#,
        },
        native_doc: None,
        example: r#""/clusters?format=json""#,
    },
    read: health_path,
};

/// `admin_stats_path`.
pub const ADMIN_STATS_PATH: Key<String> = Key {
    info: KeyInfo {
        id: KeyId::AdminStatsPath,
        name: "admin_stats_path",
        forms: Forms::Wasm,
        doc: Doc {
            default: r#"`/stats?filter=` + the regex below, percent-encoded"#,
            meaning: r#"the change gate's stats (text format); `""` disables the gate: every poll is a full refresh"#,
        },
        native_doc: None,
        example: r#""""#,
    },
    read: |k, v| admin_path(k, v, true),
};

/// `full_refresh_interval_ms`.
pub const FULL_REFRESH_INTERVAL_MS: Key<u64> = Key {
    info: KeyInfo {
        id: KeyId::FullRefreshIntervalMs,
        name: "full_refresh_interval_ms",
        forms: Forms::Wasm,
        doc: Doc {
            default: r#"`10000`"#,
            meaning: r#"a full refresh at least this often whatever the stats say, but no sooner than 50 times the last one's duration (100..86400000; not shorter than `refresh_interval_ms`; left out, it is raised to a longer `refresh_interval_ms`)"#,
        },
        native_doc: None,
        example: r#"20000"#,
    },
    read: |k, v| bounded_u64(k, v, MIN_REFRESH_INTERVAL_MS, 86_400_000),
};

/// `partial_refresh`.
pub const PARTIAL_REFRESH: Key<bool> = Key {
    info: KeyInfo {
        id: KeyId::PartialRefresh,
        name: "partial_refresh",
        forms: Forms::Wasm,
        doc: Doc {
            default: r#"`true`"#,
            meaning: r#"when the stats pin a change to a few clusters, fetch only their endpoints (`name_regex`); `false`: every refresh fetches all"#,
        },
        native_doc: None,
        example: r#"false"#,
    },
    read: typed,
};

/// `admin_timeout_ms`.
pub const ADMIN_TIMEOUT_MS: Key<u64> = Key {
    info: KeyInfo {
        id: KeyId::AdminTimeoutMs,
        name: "admin_timeout_ms",
        forms: Forms::Wasm,
        doc: Doc {
            default: r#"`5000`"#,
            meaning: r#"per admin call (10..60000; at most ten refresh intervals, counting an interval under 1 s as 1 s)"#,
        },
        native_doc: None,
        example: r#"500"#,
    },
    read: |k, v| bounded_u64(k, v, 10, 60_000),
};

/// `max_admin_body_bytes`.
pub const MAX_ADMIN_BODY_BYTES: Key<u64> = Key {
    info: KeyInfo {
        id: KeyId::MaxAdminBodyBytes,
        name: "max_admin_body_bytes",
        forms: Forms::Wasm,
        doc: Doc {
            default: r#"`67108864`"#,
            meaning: r#"larger admin answers are refused, the last good snapshot stays (1024..1073741824)"#,
        },
        native_doc: None,
        example: r#"2048"#,
    },
    read: |k, v| bounded_u64(k, v, 1024, 1 << 30),
};

/// `metadata_namespace`.
pub const METADATA_NAMESPACE: Key<String> = Key {
    info: KeyInfo {
        id: KeyId::MetadataNamespace,
        name: "metadata_namespace",
        forms: Forms::Both,
        doc: Doc {
            default: r#"`"k8s.endpointslice"`"#,
            meaning: r#"filter_metadata namespace of the conditions (not empty)"#,
        },
        native_doc: Some(Doc {
            default: r#"`"k8s.endpointslice"`"#,
            meaning: r#"filter_metadata namespace of the conditions"#,
        }),
        example: r#""ns""#,
    },
    read: non_empty,
};

/// `override_header`.
pub const OVERRIDE_HEADER: Key<String> = Key {
    info: KeyInfo {
        id: KeyId::OverrideHeader,
        name: "override_header",
        forms: Forms::Wasm,
        doc: Doc {
            default: r#"`"x-gateway-destination-endpoint"`"#,
            meaning: r#"must match the cluster's `override_host_sources` header; a lowercase header name; HTTP's and Envoy's own (`host`, `content-length`, `cookie`, `authorization`, `x-forwarded-for`, `x-request-id`, `x-envoy-*`...) are refused"#,
        },
        native_doc: None,
        example: r#""x-pick""#,
    },
    read: header_name,
};

/// `refresh_interval_ms`.
pub const REFRESH_INTERVAL_MS: Key<u64> = Key {
    info: KeyInfo {
        id: KeyId::RefreshIntervalMs,
        name: "refresh_interval_ms",
        forms: Forms::Wasm,
        doc: Doc {
            default: r#"`1000`"#,
            meaning: r#"poll interval (the change gate's stats; full refreshes when they moved), 100..3600000"#,
        },
        native_doc: None,
        example: r#"2000"#,
    },
    read: |k, v| bounded_u64(k, v, MIN_REFRESH_INTERVAL_MS, 3_600_000),
};

/// `on_no_serving`.
pub const ON_NO_SERVING: Key<OnNoServing> = Key {
    info: KeyInfo {
        id: KeyId::OnNoServing,
        name: "on_no_serving",
        forms: Forms::Wasm,
        doc: Doc {
            default: r#"`"reject"`"#,
            meaning: r#"`"reject"`: local 503 with `x-serving-picker: no-serving-endpoint` and a body saying so; `"passthrough"`: leave it to Envoy's LB"#,
        },
        native_doc: None,
        example: r#""passthrough""#,
    },
    read: on_no_serving,
};

/// `clusters`.
pub const CLUSTERS: Key<Vec<String>> = Key {
    info: KeyInfo {
        id: KeyId::Clusters,
        name: "clusters",
        forms: Forms::Wasm,
        doc: Doc {
            default: r#"all"#,
            meaning: r#"allow-list of cluster names (not empty); others pass through untouched (the client's override header is still removed)"#,
        },
        native_doc: None,
        example: r#"["a", "b"]"#,
    },
    read: cluster_list,
};

/// `local_zone`.
pub const LOCAL_ZONE: Key<String> = Key {
    info: KeyInfo {
        id: KeyId::LocalZone,
        name: "local_zone",
        forms: Forms::Both,
        doc: Doc {
            default: r#"Envoy's `node.locality.zone` (bootstrap or `--service-zone`), else none"#,
            meaning: r#"this Envoy's zone: zone hints, and prefer hosts of this zone inside the chosen tier when no hints are in play ([decision.md](decision.md))"#,
        },
        native_doc: Some(Doc {
            default: r#"none"#,
            meaning: r#"this Envoy's zone: zone hints, and prefer hosts of this zone inside the chosen tier when no hints are in play (no default: the ABI cannot read Envoy's locality)"#,
        }),
        example: r#""z1""#,
    },
    read: non_empty,
};

/// `local_node`.
pub const LOCAL_NODE: Key<String> = Key {
    info: KeyInfo {
        id: KeyId::LocalNode,
        name: "local_node",
        forms: Forms::Both,
        doc: Doc {
            default: r#"none"#,
            meaning: r#"this Envoy's Kubernetes node name, for node hints ([decision.md](decision.md#topology-hints))"#,
        },
        native_doc: Some(Doc {
            default: r#"none"#,
            meaning: r#"this Envoy's Kubernetes node name, for node hints"#,
        }),
        example: r#""node-1""#,
    },
    read: non_empty,
};

/// `local_zone_min_share`.
pub const LOCAL_ZONE_MIN_SHARE: Key<f64> = Key {
    info: KeyInfo {
        id: KeyId::LocalZoneMinShare,
        name: "local_zone_min_share",
        forms: Forms::Both,
        doc: Doc {
            default: r#"`0.2`"#,
            meaning: r#"prefer the local zone only when it holds at least this share of the tier's weight, in (0, 1]"#,
        },
        native_doc: Some(Doc {
            default: r#"`0.2`"#,
            meaning: r#"prefer the local zone only when it holds at least this share of the tier's weight, in (0, 1]"#,
        }),
        example: r#"0.5"#,
    },
    read: share,
};

/// `retry_alternates`.
pub const RETRY_ALTERNATES: Key<u64> = Key {
    info: KeyInfo {
        id: KeyId::RetryAlternates,
        name: "retry_alternates",
        forms: Forms::Wasm,
        doc: Doc {
            default: r#"`2`"#,
            meaning: r#"addresses of the tier listed after the pick, cycled, one per retry (0..8): set it to at least the route's `num_retries`"#,
        },
        native_doc: None,
        example: r#"0"#,
    },
    read: |k, v| bounded_u64(k, v, 0, 8),
};

/// `before_first_snapshot`.
pub const BEFORE_FIRST_SNAPSHOT: Key<BeforeFirstSnapshot> = Key {
    info: KeyInfo {
        id: KeyId::BeforeFirstSnapshot,
        name: "before_first_snapshot",
        forms: Forms::Wasm,
        doc: Doc {
            default: r#"`"passthrough"`"#,
            meaning: r#"until the first snapshot: `"passthrough"` (Envoy's LB, what Envoy does without the filter), `"hold"` (wait, at most `admin_timeout_ms`, then 503 `no-snapshot-yet`) or `"reject"` (that 503 at once)"#,
        },
        native_doc: None,
        example: r#""hold""#,
    },
    read: before_first_snapshot,
};

/// `drain_window_ms`.
pub const DRAIN_WINDOW_MS: Key<DrainConfig> = Key {
    info: KeyInfo {
        id: KeyId::DrainWindowMs,
        name: DRAIN_WINDOW_KEY,
        forms: Forms::Both,
        doc: Doc {
            default: r#"none (no stream ends)"#,
            meaning: r#"streams open to a host that turns terminating while its cluster has a ready host end within this many milliseconds, spread over the window's last nine tenths (1000..3600000; the shipped examples: 15000); never in rows 3 and 4 ([wasm.md](wasm.md#long-lived-streams-drain_window_ms))"#,
        },
        native_doc: Some(Doc {
            default: r#"none (off)"#,
            meaning: r#"streams open to a host of this cluster that turns terminating while a ready host exists end within this many milliseconds, spread over the window (1000..3600000; the shipped example sets 15000); needs the module's HTTP filter `serving_picker_drain` on the listener ([native.md](native.md#stream-drain))"#,
        }),
        example: r#"15000"#,
    },
    read: |_, v| DrainConfig::parse(v),
};

/// `max_snapshot_age_ms`.
pub const MAX_SNAPSHOT_AGE_MS: Key<u64> = Key {
    info: KeyInfo {
        id: KeyId::MaxSnapshotAgeMs,
        name: "max_snapshot_age_ms",
        forms: Forms::Wasm,
        doc: Doc {
            default: r#"`15000`, and at least four refresh intervals and `admin_timeout_ms`"#,
            meaning: r#"a snapshot no refresh has confirmed for this long (the admin API fails) is set aside: every request passes through to Envoy's LB until a refresh succeeds (1000..86400000; not under four refresh intervals and `admin_timeout_ms`, so that a change of poller does not set it aside)"#,
        },
        native_doc: None,
        example: r#"60000"#,
    },
    read: |k, v| bounded_u64(k, v, 1000, 86_400_000),
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// The table under `heading` in docs/configuration.md: its lines from `| key |` to the
    /// first line that is not a row.
    fn docs_table(docs: &str, heading: &str) -> String {
        let section = docs.split(heading).nth(1).unwrap_or_default();
        let mut out = String::new();
        for line in section
            .lines()
            .skip_while(|l| !l.starts_with("| key |"))
            .take_while(|l| l.starts_with('|'))
        {
            out.push_str(line);
            out.push('\n');
        }
        out
    }

    #[test]
    fn the_docs_tables_are_the_registry() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
        let docs = std::fs::read_to_string(path).unwrap();
        for (heading, form) in [
            ("## Wasm filter", Form::Wasm),
            ("## Native policy", Form::Native),
        ] {
            let expected = table(form);
            if docs_table(&docs, heading) != expected {
                eprintln!("docs/configuration.md, under {heading:?}, should read:\n{expected}");
            }
            assert_eq!(
                docs_table(&docs, heading),
                expected,
                "docs/configuration.md's table under {heading:?} is not the registry's \
                 (src/config_keys.rs): the table it should read is printed above"
            );
        }
    }

    #[test]
    fn names_and_ids_are_unique_and_found() {
        let names: HashSet<_> = ALL.iter().map(|k| k.name).collect();
        let ids: HashSet<_> = ALL.iter().map(|k| k.id).collect();
        assert_eq!((names.len(), ids.len()), (ALL.len(), ALL.len()));
        for key in ALL {
            assert_eq!(find(key.name), Some(key));
            assert!(
                serde_json::from_str::<Value>(key.example).is_ok(),
                "{}",
                key.name
            );
            // A native row of its own only where the native policy takes the key.
            assert!(key.native_doc.is_none() || key.forms.take(Form::Native));
        }
        assert_eq!(find("refresh_interval"), None);
        assert_eq!(DRAIN_WINDOW_MS.name(), DRAIN_WINDOW_KEY);
    }

    #[test]
    fn the_forms_keys() {
        let native: Vec<_> = names_for(Form::Native).collect();
        assert_eq!(
            native,
            [
                "metadata_namespace",
                "local_zone",
                "local_node",
                "local_zone_min_share",
                "drain_window_ms"
            ]
        );
        assert_eq!(names_for(Form::Wasm).count(), ALL.len());
        assert!(Forms::Both.take(Form::Wasm) && Forms::Both.take(Form::Native));
        assert!(Forms::Wasm.take(Form::Wasm) && !Forms::Wasm.take(Form::Native));
        assert!(!Forms::Native.take(Form::Wasm) && Forms::Native.take(Form::Native));
        assert_eq!(
            LOCAL_ZONE.info.doc_for(Form::Native),
            LOCAL_ZONE.info.native_doc
        );
        assert_eq!(ADMIN_PATH.info.doc_for(Form::Native), None);
    }

    #[test]
    fn validators_read_their_examples_and_name_their_key() {
        let value = |k: &KeyInfo| serde_json::from_str::<Value>(k.example).unwrap();
        assert_eq!(
            ADMIN_CLUSTER.read(value(&ADMIN_CLUSTER.info)).unwrap(),
            "adm"
        );
        assert_eq!(
            ON_NO_SERVING.read(value(&ON_NO_SERVING.info)).unwrap(),
            OnNoServing::Passthrough
        );
        assert_eq!(
            BEFORE_FIRST_SNAPSHOT
                .read(value(&BEFORE_FIRST_SNAPSHOT.info))
                .unwrap(),
            BeforeFirstSnapshot::Hold
        );
        assert_eq!(CLUSTERS.read(value(&CLUSTERS.info)).unwrap(), ["a", "b"]);
        assert_eq!(
            LOCAL_ZONE_MIN_SHARE
                .read(value(&LOCAL_ZONE_MIN_SHARE.info))
                .unwrap(),
            0.5
        );
        let e = REFRESH_INTERVAL_MS.read(Value::from(99)).unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.reason.as_str()),
            ("refresh_interval_ms", "99 is outside 100..=3600000")
        );
        let e = ADMIN_HEALTH_PATH
            .read(Value::from("/clusters"))
            .unwrap_err();
        assert_eq!(e.reason, "must ask for JSON (`/clusters?format=json`)");
        assert!(ADMIN_STATS_PATH.read(Value::from("")).is_ok());
        assert!(ADMIN_PATH.read(Value::from("")).is_err());
    }
}
