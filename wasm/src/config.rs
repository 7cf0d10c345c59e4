//! Plugin configuration: parsed and validated once, in on_configure. Every
//! key and its validator is the core's registry
//! (`serving_picker_core::config_keys`); the keys that choose hosts are the
//! core's `SelectionConfig`, shared with the native form; the rest are the
//! filter's own. Relations between keys are checked here.

use serde_json::Value;
use serving_picker_core::config::{err, json_object};
pub use serving_picker_core::config::{ConfigError, SelectionConfig};
use serving_picker_core::config_keys::{self as keys, KeyId};
pub use serving_picker_core::config_keys::{
    BeforeFirstSnapshot, OnNoServing, MIN_REFRESH_INTERVAL_MS,
};
use serving_picker_core::drain::DrainConfig;

/// The filter's configuration (`docs/configuration.md` lists every key).
#[derive(Clone, Debug, PartialEq)]
pub struct PluginConfig {
    /// `admin_cluster`: the cluster that reaches Envoy's own admin listener; never managed itself.
    pub admin_cluster: String,
    /// `admin_path`: the config dump's path (endpoints and their metadata).
    pub admin_path: String,
    /// Live health (`/clusters?format=json`); empty disables the merge.
    pub admin_health_path: String,
    /// The change gate's small stats answer; empty disables the gate.
    pub admin_stats_path: String,
    /// A full refresh at least this often, whatever the stats say.
    pub full_refresh_interval_ms: u64,
    /// When the stats pin a change to a few clusters, fetch only theirs.
    pub partial_refresh: bool,
    /// `admin_timeout_ms`: the timeout of each admin call.
    pub admin_timeout_ms: u64,
    /// `max_admin_body_bytes`: larger admin answers are refused and the last good snapshot stays.
    pub max_admin_body_bytes: usize,
    /// `metadata_namespace`, `local_zone`, `local_zone_min_share`.
    pub selection: SelectionConfig,
    /// `override_header`: the header the filter sets, the cluster's `override_host_sources`; the
    /// client's own is always removed.
    pub override_header: String,
    /// `refresh_interval_ms`: how often the leader polls (the change gate's stats).
    pub refresh_interval_ms: u64,
    /// `on_no_serving`: what a request gets when its cluster has no serving host.
    pub on_no_serving: OnNoServing,
    /// `None` means every cluster.
    pub clusters: Option<Vec<String>>,
    /// Hosts of the tier listed after the picked one (cycled), one per retry.
    pub retry_alternates: usize,
    /// What requests get until this filter has its first snapshot.
    pub before_first_snapshot: BeforeFirstSnapshot,
    /// A snapshot no refresh confirmed for this long is set aside: every
    /// request passes through to Envoy's load balancer until one does.
    pub max_snapshot_age_ms: u64,
    /// `drain_window_ms`: streams open to a host that drains (terminating while a ready host
    /// exists) end within this window; `None` (the default) never ends a stream.
    pub drain: Option<DrainConfig>,
}

/// `admin_path` when not given: the endpoint configs only.
pub const DEFAULT_ADMIN_PATH: &str =
    "/config_dump?include_eds&mask=static_endpoint_configs,dynamic_endpoint_configs";
/// `admin_health_path` when not given.
pub const DEFAULT_HEALTH_PATH: &str = "/clusters?format=json";
/// `/stats?filter=` with `STATS_FILTER`, percent-encoded (a test checks that
/// they agree). Envoy decodes the query and matches the regex with RE2.
pub const DEFAULT_STATS_PATH: &str = "/stats?filter=%5Ecluster%5C..%2B%5C.%28update_success%7Cupdate_empty%7Cmembership_%28change%7Chealthy%7Cdegraded%7Cexcluded%7Ctotal%29%7Chealth_check%5C.%28healthy%7Cdegraded%29%7Coutlier_detection%5C.ejections_%28active%7Cenforced_total%29%29%24%7C%5Ecluster_manager%5C.%28cluster_added%7Ccluster_modified%7Ccluster_removed%7Cactive_clusters%7Cwarming_clusters%29%24";
/// The stats the change gate compares: per cluster the ones that move when
/// endpoints, EDS health, active checks or ejections change, and the cluster
/// manager's. All stay put at steady state (no `health_check.attempt` and
/// the like, which tick on every check).
pub const STATS_FILTER: &str = concat!(
    r"^cluster\..+\.(update_success|update_empty",
    r"|membership_(change|healthy|degraded|excluded|total)",
    r"|health_check\.(healthy|degraded)",
    r"|outlier_detection\.ejections_(active|enforced_total))$",
    r"|^cluster_manager\.(cluster_added|cluster_modified|cluster_removed|active_clusters|warming_clusters)$",
);
/// `full_refresh_interval_ms` when not given.
pub const DEFAULT_FULL_REFRESH_INTERVAL_MS: u64 = 10_000;

impl Default for PluginConfig {
    fn default() -> Self {
        PluginConfig {
            admin_cluster: "envoy_admin".into(),
            admin_path: DEFAULT_ADMIN_PATH.into(),
            admin_health_path: DEFAULT_HEALTH_PATH.into(),
            admin_stats_path: DEFAULT_STATS_PATH.into(),
            full_refresh_interval_ms: DEFAULT_FULL_REFRESH_INTERVAL_MS,
            partial_refresh: true,
            // A large dump takes Envoy a while to render (docs/performance.md): leave room.
            admin_timeout_ms: 5000,
            max_admin_body_bytes: 64 << 20,
            selection: SelectionConfig::default(),
            override_header: "x-gateway-destination-endpoint".into(),
            refresh_interval_ms: 1000,
            on_no_serving: OnNoServing::Reject,
            clusters: None,
            retry_alternates: 2,
            // Without a snapshot the filter knows nothing Envoy does not: it
            // leaves the request to Envoy rather than hold or fail it (an
            // admin API that never answers must not take the route down).
            before_first_snapshot: BeforeFirstSnapshot::Passthrough,
            max_snapshot_age_ms: default_max_snapshot_age_ms(1000, 5000),
            drain: None,
        }
    }
}

/// The default `max_snapshot_age_ms`: 15 s, and never less than the
/// shortest age allowed.
fn default_max_snapshot_age_ms(refresh_interval_ms: u64, admin_timeout_ms: u64) -> u64 {
    min_snapshot_age_ms(refresh_interval_ms, admin_timeout_ms).max(15_000)
}

/// The shortest `max_snapshot_age_ms` allowed: a leader hand-over (the
/// lease's time to live, `poller::lease_ttl_ms`) and one more poll, so that
/// neither a new leader nor one slow admin answer sets the snapshot aside.
fn min_snapshot_age_ms(refresh_interval_ms: u64, admin_timeout_ms: u64) -> u64 {
    refresh_interval_ms * 4 + admin_timeout_ms
}

/// Parses and validates the plugin configuration. Empty or whitespace-only
/// input (no configuration at all) means every default.
pub fn parse_config(raw: &[u8]) -> Result<PluginConfig, ConfigError> {
    let mut config = PluginConfig::default();
    let Some(object) = json_object(raw)? else {
        return Ok(config);
    };
    let mut full_refresh_set = false;
    let mut max_age_set = false;
    for (key, value) in object {
        // The registry (`serving_picker_core::config_keys`) knows every key and reads its value.
        let Some(info) = keys::find(&key) else {
            return Err(err(&key, "unknown key"));
        };
        match info.id {
            KeyId::MetadataNamespace
            | KeyId::LocalZone
            | KeyId::LocalNode
            | KeyId::LocalZoneMinShare => config.selection.set(&key, value)?,
            KeyId::AdminCluster => config.admin_cluster = keys::ADMIN_CLUSTER.read(value)?,
            KeyId::AdminPath => config.admin_path = keys::ADMIN_PATH.read(value)?,
            KeyId::AdminHealthPath => {
                config.admin_health_path = keys::ADMIN_HEALTH_PATH.read(value)?
            }
            KeyId::AdminStatsPath => {
                config.admin_stats_path = keys::ADMIN_STATS_PATH.read(value)?
            }
            KeyId::FullRefreshIntervalMs => {
                full_refresh_set = true;
                config.full_refresh_interval_ms = keys::FULL_REFRESH_INTERVAL_MS.read(value)?
            }
            KeyId::PartialRefresh => config.partial_refresh = keys::PARTIAL_REFRESH.read(value)?,
            KeyId::AdminTimeoutMs => {
                config.admin_timeout_ms = keys::ADMIN_TIMEOUT_MS.read(value)?
            }
            KeyId::MaxAdminBodyBytes => {
                config.max_admin_body_bytes = keys::MAX_ADMIN_BODY_BYTES.read(value)? as usize
            }
            KeyId::OverrideHeader => config.override_header = keys::OVERRIDE_HEADER.read(value)?,
            KeyId::RefreshIntervalMs => {
                config.refresh_interval_ms = keys::REFRESH_INTERVAL_MS.read(value)?
            }
            KeyId::OnNoServing => config.on_no_serving = keys::ON_NO_SERVING.read(value)?,
            KeyId::BeforeFirstSnapshot => {
                config.before_first_snapshot = keys::BEFORE_FIRST_SNAPSHOT.read(value)?
            }
            KeyId::Clusters => config.clusters = Some(keys::CLUSTERS.read(value)?),
            KeyId::RetryAlternates => {
                config.retry_alternates = keys::RETRY_ALTERNATES.read(value)? as usize
            }
            KeyId::MaxSnapshotAgeMs => {
                max_age_set = true;
                config.max_snapshot_age_ms = keys::MAX_SNAPSHOT_AGE_MS.read(value)?
            }
            KeyId::DrainWindowMs => config.drain = Some(keys::DRAIN_WINDOW_MS.read(value)?),
        }
    }
    if config.admin_timeout_ms > config.refresh_interval_ms.max(1000) * 10 {
        return Err(err(
            "admin_timeout_ms",
            "must not exceed ten refresh intervals",
        ));
    }
    // The default follows a longer poll interval; a value given must not be shorter.
    if config.full_refresh_interval_ms < config.refresh_interval_ms {
        if full_refresh_set {
            return Err(err(
                "full_refresh_interval_ms",
                "must not be shorter than refresh_interval_ms",
            ));
        }
        config.full_refresh_interval_ms = config.refresh_interval_ms;
    }
    let min_age = min_snapshot_age_ms(config.refresh_interval_ms, config.admin_timeout_ms);
    if !max_age_set {
        config.max_snapshot_age_ms =
            default_max_snapshot_age_ms(config.refresh_interval_ms, config.admin_timeout_ms);
    } else if config.max_snapshot_age_ms < min_age {
        return Err(err(
            "max_snapshot_age_ms",
            format!(
                "must be at least four refresh intervals and admin_timeout_ms ({min_age} ms here)"
            ),
        ));
    }
    Ok(config)
}

/// The override header a configuration that does not parse most likely
/// names: its `override_header` when that is a usable header name once in
/// lower case, else the default. A filter on such a configuration still
/// strips it, so that clients never steer.
pub fn salvage_override_header(raw: &[u8]) -> String {
    let named = serde_json::from_slice::<Value>(raw)
        .ok()
        .and_then(|v| {
            v.get("override_header")?
                .as_str()
                .map(str::to_ascii_lowercase)
        })
        .and_then(|name| keys::OVERRIDE_HEADER.read(Value::String(name)).ok());
    named.unwrap_or_else(|| PluginConfig::default().override_header)
}

impl PluginConfig {
    /// `local_zone` from the configuration wins; without it, `envoy_zone`
    /// (Envoy's own `node.locality.zone`; empty means unset). Says where the
    /// zone in use came from, for the log.
    pub fn default_local_zone(&mut self, envoy_zone: Option<Vec<u8>>) -> &'static str {
        let zone = &mut self.selection.local_zone;
        if zone.is_some() {
            return "local_zone";
        }
        *zone = envoy_zone
            .and_then(|z| String::from_utf8(z).ok())
            .filter(|z| !z.is_empty());
        if zone.is_some() {
            "Envoy's node.locality.zone"
        } else {
            "nowhere: no zone preference"
        }
    }

    /// Whether the filter manages this cluster (allow-list; the admin cluster never).
    pub fn manages(&self, cluster: &str) -> bool {
        if cluster == self.admin_cluster {
            return false;
        }
        match &self.clusters {
            None => true,
            Some(list) => list.iter().any(|c| c == cluster),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<PluginConfig, ConfigError> {
        parse_config(s.as_bytes())
    }

    #[test]
    fn empty_means_defaults() {
        assert_eq!(parse(""), Ok(PluginConfig::default()));
        assert_eq!(parse("  \n"), Ok(PluginConfig::default()));
        assert_eq!(parse("{}"), Ok(PluginConfig::default()));
    }

    #[test]
    fn every_key_parses() {
        let c = parse(
            r#"{"admin_cluster":"adm","admin_path":"/config_dump?include_eds",
               "admin_health_path":"/clusters?format=json&x","admin_stats_path":"","full_refresh_interval_ms":200,
               "partial_refresh":false,"admin_timeout_ms":500,"max_admin_body_bytes":2048,
               "metadata_namespace":"ns","override_header":"x-pick","refresh_interval_ms":100,
               "on_no_serving":"passthrough","clusters":["a","b"],"local_zone":"z1",
               "local_zone_min_share":0.5,"retry_alternates":0,"before_first_snapshot":"reject",
               "max_snapshot_age_ms":60000}"#,
        )
        .unwrap();
        assert_eq!(c.admin_cluster, "adm");
        assert_eq!(c.admin_path, "/config_dump?include_eds");
        assert_eq!(c.admin_health_path, "/clusters?format=json&x");
        assert_eq!(c.admin_stats_path, "");
        assert_eq!(c.full_refresh_interval_ms, 200);
        assert!(!c.partial_refresh);
        assert_eq!(c.admin_timeout_ms, 500);
        assert_eq!(c.max_admin_body_bytes, 2048);
        assert_eq!(c.selection.metadata_namespace, "ns");
        assert_eq!(c.override_header, "x-pick");
        assert_eq!(c.refresh_interval_ms, 100);
        assert_eq!(c.on_no_serving, OnNoServing::Passthrough);
        assert_eq!(c.clusters, Some(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(c.selection.local_zone.as_deref(), Some("z1"));
        assert_eq!(c.selection.local_zone_min_share, 0.5);
        assert_eq!(c.retry_alternates, 0);
        assert_eq!(c.before_first_snapshot, BeforeFirstSnapshot::Reject);
        assert_eq!(c.max_snapshot_age_ms, 60_000);
    }

    #[test]
    fn gaps_issue_16_found_are_refused() {
        for (text, key) in [
            (
                r#"{"refresh_interval_ms":200,"refresh_interval_ms":300}"#,
                "refresh_interval_ms",
            ),
            (r#"{"admin_health_path":""}"#, "admin_health_path"),
            (r#"{"admin_health_path":"/clusters"}"#, "admin_health_path"),
            (r#"{"override_header":"host"}"#, "override_header"),
            (r#"{"override_header":"content-length"}"#, "override_header"),
            (
                r#"{"override_header":"x-envoy-original-path"}"#,
                "override_header",
            ),
            (r#"{"clusters":[]}"#, "clusters"),
            (
                r#"{"before_first_snapshot":"wait"}"#,
                "before_first_snapshot",
            ),
        ] {
            assert_eq!(key_of(text), key, "{text}");
        }
        assert_eq!(
            parse("{}").unwrap().before_first_snapshot,
            BeforeFirstSnapshot::Passthrough
        );
        for (value, mode) in [
            ("hold", BeforeFirstSnapshot::Hold),
            ("reject", BeforeFirstSnapshot::Reject),
            ("passthrough", BeforeFirstSnapshot::Passthrough),
        ] {
            let text = format!(r#"{{"before_first_snapshot":"{value}"}}"#);
            assert_eq!(parse(&text).unwrap().before_first_snapshot, mode);
        }
    }

    #[test]
    fn max_snapshot_age_defaults_to_15_s_and_covers_a_leader_hand_over() {
        assert_eq!(parse("{}").unwrap().max_snapshot_age_ms, 15_000);
        assert_eq!(PluginConfig::default().max_snapshot_age_ms, 15_000);
        // A slow poll raises the default: four intervals and one admin call.
        let slow = parse(r#"{"refresh_interval_ms":5000}"#).unwrap();
        assert_eq!(slow.max_snapshot_age_ms, 25_000);
        let set = parse(r#"{"max_snapshot_age_ms":9000}"#).unwrap();
        assert_eq!(set.max_snapshot_age_ms, 9000);
        // Shorter than a leader hand-over plus a poll: refused, naming the key.
        assert_eq!(
            key_of(r#"{"max_snapshot_age_ms":8999}"#),
            "max_snapshot_age_ms"
        );
        assert_eq!(
            key_of(r#"{"max_snapshot_age_ms":"15000"}"#),
            "max_snapshot_age_ms"
        );
        let short = parse(
            r#"{"refresh_interval_ms":100,"admin_timeout_ms":200,"max_snapshot_age_ms":1000}"#,
        );
        assert_eq!(short.unwrap().max_snapshot_age_ms, 1000);
    }

    #[test]
    fn a_configuration_that_does_not_parse_still_names_the_header_to_strip() {
        let default = "x-gateway-destination-endpoint";
        for (raw, header) in [
            (&br#"{"clusters": 5}"#[..], default),
            (br#"{"clusters": 5, "override_header": "x-pick"}"#, "x-pick"),
            // Envoy matches header names in any case: the lower-case form.
            (
                br#"{"override_header": "X-Pick", "refresh_interval_ms": 1}"#,
                "x-pick",
            ),
            (br#"{"override_header": "host"}"#, default),
            (br#"{"override_header": 7}"#, default),
            (b"not json", default),
            (b"[1]", default),
        ] {
            assert_eq!(
                salvage_override_header(raw),
                header,
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    fn key_of(s: &str) -> String {
        parse(s).unwrap_err().key
    }

    #[test]
    fn bad_values_name_their_key() {
        assert_eq!(
            key_of(r#"{"refresh_interval_ms":99}"#),
            "refresh_interval_ms"
        );
        assert_eq!(
            key_of(r#"{"refresh_interval_ms":"1000"}"#),
            "refresh_interval_ms"
        );
        assert_eq!(
            key_of(r#"{"refresh_interval_ms":-5}"#),
            "refresh_interval_ms"
        );
        assert_eq!(key_of(r#"{"on_no_serving":"drop"}"#), "on_no_serving");
        assert_eq!(key_of(r#"{"partial_refresh":"yes"}"#), "partial_refresh");
        assert_eq!(
            key_of(r#"{"override_header":"X-Upper"}"#),
            "override_header"
        );
        assert_eq!(
            key_of(r#"{"override_header":"bad header"}"#),
            "override_header"
        );
        assert_eq!(
            key_of(r#"{"override_header":":authority"}"#),
            "override_header"
        );
        assert_eq!(key_of(r#"{"admin_path":"config_dump"}"#), "admin_path");
        assert_eq!(key_of(r#"{"admin_cluster":""}"#), "admin_cluster");
        assert_eq!(key_of(r#"{"clusters":"a"}"#), "clusters");
        assert_eq!(key_of(r#"{"clusters":[""]}"#), "clusters");
        assert_eq!(
            key_of(r#"{"local_zone_min_share":0}"#),
            "local_zone_min_share"
        );
        assert_eq!(
            key_of(r#"{"local_zone_min_share":1.5}"#),
            "local_zone_min_share"
        );
        assert_eq!(
            key_of(r#"{"metadata_namespace":null}"#),
            "metadata_namespace"
        );
        assert_eq!(key_of(r#"{"retry_alternates":9}"#), "retry_alternates");
        assert_eq!(
            key_of(r#"{"admin_stats_path":"stats"}"#),
            "admin_stats_path"
        );
        assert_eq!(
            key_of(r#"{"full_refresh_interval_ms":99}"#),
            "full_refresh_interval_ms"
        );
    }

    #[test]
    fn full_refresh_interval_is_not_shorter_than_the_poll() {
        let e = parse(r#"{"refresh_interval_ms":2000,"full_refresh_interval_ms":1000}"#);
        assert_eq!(e.unwrap_err().key, "full_refresh_interval_ms");
        let equal = parse(r#"{"refresh_interval_ms":2000,"full_refresh_interval_ms":2000}"#);
        assert_eq!(equal.unwrap().full_refresh_interval_ms, 2000);
        // Not given: the default, raised to a longer poll interval.
        assert_eq!(parse("{}").unwrap().full_refresh_interval_ms, 10_000);
        let slow = parse(r#"{"refresh_interval_ms":30000}"#).unwrap();
        assert_eq!(slow.full_refresh_interval_ms, 30_000);
    }

    #[test]
    fn default_stats_path_is_the_encoded_filter() {
        let encoded: String = STATS_FILTER
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    char::from(b).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        assert_eq!(DEFAULT_STATS_PATH, format!("/stats?filter={encoded}"));
    }

    #[test]
    fn every_key_of_the_registry_is_taken() {
        use serving_picker_core::config_keys::{Form, ALL};
        for key in ALL.iter().filter(|k| k.forms.take(Form::Wasm)) {
            let text = format!(r#"{{"{}": {}}}"#, key.name, key.example);
            assert!(parse(&text).is_ok(), "{text}: {:?}", parse(&text));
        }
    }

    #[test]
    fn a_key_given_twice_is_refused_by_name() {
        for text in [
            r#"{"clusters":["a"],"admin_cluster":"x","clusters":["b"]}"#,
            r#"{"local_zone":"a","local_zone":"a"}"#,
            r#"{"drain_window_ms":15000,"drain_window_ms":15000}"#,
        ] {
            let e = parse(text).unwrap_err();
            let key = text[2..].split('"').next().unwrap_or_default();
            assert_eq!(
                (e.key.as_str(), e.reason.as_str()),
                (key, "given more than once")
            );
            assert!(e.to_string().contains(&format!("`{key}`")), "{e}");
        }
    }

    #[test]
    fn unknown_key_is_named() {
        let e = parse(r#"{"refresh_interval":1000}"#).unwrap_err();
        assert_eq!(e.key, "refresh_interval");
        assert!(e.to_string().contains("`refresh_interval`"), "{e}");
        assert!(e.to_string().contains("unknown key"), "{e}");
    }

    #[test]
    fn not_an_object_or_not_json() {
        assert!(parse("[]").unwrap_err().reason.contains("JSON object"));
        assert!(parse("{").unwrap_err().reason.contains("not valid JSON"));
        assert!(parse("\u{0}").is_err());
    }

    #[test]
    fn allow_list_and_admin_cluster() {
        let all = PluginConfig::default();
        assert!(all.manages("backend"));
        assert!(!all.manages("envoy_admin"));
        let some = parse(r#"{"clusters":["a"]}"#).unwrap();
        assert!(some.manages("a"));
        assert!(!some.manages("b"));
    }

    #[test]
    fn local_zone_defaults_to_envoys_node_zone() {
        let envoy = || Some(b"zone-b".to_vec());
        // The configuration wins over Envoy's zone.
        let mut c = parse(r#"{"local_zone":"zone-a"}"#).unwrap();
        assert_eq!(c.default_local_zone(envoy()), "local_zone");
        assert_eq!(c.selection.local_zone.as_deref(), Some("zone-a"));
        // Without it, Envoy's.
        let mut c = parse("{}").unwrap();
        assert_eq!(c.default_local_zone(envoy()), "Envoy's node.locality.zone");
        assert_eq!(c.selection.local_zone.as_deref(), Some("zone-b"));
        // Envoy without a zone (empty, absent or not text): no zone preference.
        for unset in [Some(Vec::new()), None, Some(vec![0xff])] {
            let mut c = parse("{}").unwrap();
            assert_eq!(c.default_local_zone(unset), "nowhere: no zone preference");
            assert_eq!(c.selection.local_zone, None);
            assert!(c.selection.zone_preference().is_none());
        }
    }
}

/// A short, stable fingerprint of the raw configuration (FNV-1a), so that
/// filters with different configurations keep separate shared state.
pub fn fingerprint(raw: &[u8]) -> u64 {
    raw.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod fingerprint_tests {
    #[test]
    fn differs_by_config() {
        assert_eq!(super::fingerprint(b""), 0xcbf2_9ce4_8422_2325);
        assert_ne!(super::fingerprint(b"{}"), super::fingerprint(b"{ }"));
    }
}
