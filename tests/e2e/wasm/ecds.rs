//! The filter never fails a route by itself: delivered by ECDS (a watched
//! file, as istiod or Envoy Gateway would serve it: no default
//! configuration, no initial fetch timeout), a configuration it cannot
//! parse is accepted and every request passes through to Envoy's own load
//! balancer, the client's override header still removed; a valid
//! configuration delivered later takes effect. For contrast, an ECDS
//! resource Envoy itself rejects (a module file that is not there) leaves
//! the listener without the filter's configuration: every route answers 500.
//! Each test states its expectation in its doc comment.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use support::companion::plain_round_robin;
use support::*;

const MANAGED: &str = "/backend/x";
const OTHER: &str = "/other/x";

/// The ECDS file of a filter named `serving_picker`: `<dir>/ecds/ecds.json`.
struct EcdsFile {
    dir: PathBuf,
}

impl EcdsFile {
    fn in_envoy_dir(dir: &Path) -> EcdsFile {
        EcdsFile {
            dir: dir.join("ecds"),
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.join("ecds.json")
    }

    /// Writes version `version` of the filter's configuration (a Wasm
    /// filter config), beside the watched file, then renamed into place.
    fn write(&self, version: u64, wasm: &Value) {
        std::fs::create_dir_all(&self.dir).unwrap();
        let doc = json!({
            "version_info": version.to_string(),
            "resources": [{
                "@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
                "name": "serving_picker",
                "typed_config": wasm,
            }]
        });
        let tmp = self.dir.join(format!(".ecds.json.{version}"));
        std::fs::write(&tmp, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
        std::fs::rename(&tmp, self.path()).unwrap();
    }
}

/// The filter's Wasm config as the builder writes it, with `configuration`.
fn wasm_config(template: &Value, configuration: &str) -> Value {
    let mut w = template.clone();
    w["config"]["configuration"] =
        json!({"@type": "type.googleapis.com/google.protobuf.StringValue", "value": configuration});
    w
}

/// A hook that moves the builder's wasm filter to ECDS from a watched file
/// whose first version carries `configuration` (and, with `module`, that
/// module file instead of the real one). The template is kept in
/// `<dir>/ecds/template.json` for later versions.
fn filter_from_ecds(
    configuration: &str,
    module: Option<&str>,
) -> impl Fn(&mut Value, &Path) + 'static {
    let configuration = configuration.to_string();
    let module = module.map(str::to_string);
    move |bootstrap: &mut Value, dir: &Path| {
        let hcm = &mut bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"]
            [0]["typed_config"];
        let filters = hcm["http_filters"].as_array_mut().unwrap();
        let at = filters
            .iter()
            .position(|f| f["name"] == "envoy.filters.http.wasm")
            .expect("the builder's wasm filter");
        let mut template = filters[at]["typed_config"].clone();
        if let Some(m) = &module {
            template["config"]["vm_config"]["code"]["local"]["filename"] = json!(m);
        }
        let ecds = EcdsFile::in_envoy_dir(dir);
        let _ = std::fs::remove_file(ecds.path());
        std::fs::create_dir_all(&ecds.dir).unwrap();
        std::fs::write(
            ecds.dir.join("template.json"),
            serde_json::to_string(&template).unwrap(),
        )
        .unwrap();
        ecds.write(1, &wasm_config(&template, &configuration));
        filters[at] = json!({
            "name": "serving_picker",
            "config_discovery": {
                "config_source": {
                    "resource_api_version": "V3",
                    "path_config_source": {
                        "path": ecds.path().to_string_lossy(),
                        "watched_directory": {"path": ecds.dir.to_string_lossy()}
                    }
                },
                "type_urls": ["type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"]
            }
        });
    }
}

/// Envoy with the filter from ECDS (first version: `configuration`), the
/// managed cluster `backend` (override_host: A serving, B not serving and
/// UNHEALTHY in EDS, as the companion writes it) and `other` (plain round
/// robin, C), each on its own route.
fn envoy_with_ecds(
    tag: &str,
    configuration: &str,
    module: Option<&str>,
) -> (Envoy, Backend, Backend, Backend) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let c = Backend::start("C");
    let envoy = EnvoyBuilder::new()
        .tag(tag)
        .eds_cluster(
            "backend",
            &[
                Endpoint::serving(a.addr()),
                Endpoint::not_serving(b.addr()).health_status("UNHEALTHY"),
            ],
        )
        .eds_cluster("other", &[Endpoint::serving(c.addr())])
        .bootstrap_hook(plain_round_robin("other"))
        .bootstrap_hook(filter_from_ecds(configuration, module))
        .start();
    (envoy, a, b, c)
}

/// ECDS resources Envoy rejected (`extension_config_discovery.*.config_fail`).
fn ecds_rejections(envoy: &Envoy) -> u64 {
    envoy
        .stats_matching("extension_config_discovery")
        .iter()
        .filter(|(k, _)| k.ends_with(".config_fail"))
        .map(|(_, v)| v.trim().parse::<u64>().unwrap_or(0))
        .sum()
}

/// `{"clusters": 5}` from the first ECDS version on. Expected: Envoy
/// accepts it (no ECDS rejection); the filter logs why it cannot parse it,
/// sets `serving_picker.config_invalid` to 1 and counts every request in
/// `serving_picker.passthrough.config_invalid`; both routes answer 200
/// through Envoy's own balancer, and a client's override header naming
/// not-serving B is removed (B, which override_host would reach, is never
/// reached). Then a valid configuration (version 2) takes effect: A picked,
/// `config_invalid` back to 0.
#[test]
fn a_configuration_it_cannot_parse_passes_through_on_every_route() {
    let (envoy, a, b, c) = envoy_with_ecds("ecds-broken", r#"{"clusters": 5}"#, None);
    let b_addr = b.addr().to_string();
    let hostile = [(OVERRIDE_HEADER, b_addr.as_str())];
    let managed = batch(&envoy, MANAGED, &hostile, BATCH);
    let other = batch(&envoy, OTHER, &hostile, BATCH);
    println!(
        "ECDS {{\"clusters\": 5}}: managed route {:?}, other route {:?}",
        tally(&managed),
        tally(&other)
    );
    assert_all(
        &managed,
        "managed route: Envoy's balancer, client header removed",
        |r| passed_through(r) && served_by(&a)(r),
    );
    assert_all(&other, "other route: plain Envoy", served_by(&c));
    assert_eq!(b.count(), 0, "the client's header reached not-serving B");
    assert!(
        a.override_values().is_empty(),
        "an override header reached A: {:?}",
        a.override_values()
    );
    assert_eq!(
        ecds_rejections(&envoy),
        0,
        "Envoy rejected the ECDS resource"
    );
    wait_until("the pass-through counted", Duration::from_secs(5), || {
        envoy.stat_or_zero("serving_picker.passthrough.config_invalid") >= BATCH as u64
    });
    assert!(
        envoy.stat_or_zero("serving_picker.config_invalid") >= 1,
        "config_invalid counts the contexts on the configuration"
    );
    let logged = envoy.log_lines("invalid configuration, every request passes through");
    assert!(
        logged.iter().any(|l| l.contains("`clusters`")),
        "the error line names the key: {logged:?}"
    );
    println!("logged: {}", logged[0]);

    // A valid configuration delivered later takes effect.
    let ecds = EcdsFile::in_envoy_dir(envoy.dir());
    let template: Value =
        serde_json::from_str(&std::fs::read_to_string(ecds.dir.join("template.json")).unwrap())
            .unwrap();
    ecds.write(
        2,
        &wasm_config(&template, &plugin_config(json!({"clusters": ["backend"]}))),
    );
    settle(
        &envoy,
        MANAGED,
        &hostile,
        "ECDS v2 (valid): A picked",
        picked(&a),
    );
    wait_until("config_invalid back to 0", Duration::from_secs(15), || {
        envoy.stat("serving_picker.config_invalid") == Some(0)
    });
    assert_batch(&envoy, OTHER, &hostile, BATCH, "other route", served_by(&c));
    assert_eq!(b.count(), 0);
}

/// For contrast, what the filter's own parsing no longer causes: an ECDS
/// resource Envoy rejects (its module file is not there). Expected: the
/// listener has no configuration for the filter and Envoy's missing-config
/// filter answers 500 on every route, the one to the unmanaged cluster
/// included (`NFCF`), until a valid resource comes.
#[test]
fn a_resource_envoy_rejects_fails_every_route_of_the_listener() {
    let missing = "/nonexistent/serving_picker.wasm";
    let (envoy, a, _b, c) =
        envoy_with_ecds("ecds-rejected", &plugin_config(json!({})), Some(missing));
    let managed = batch(&envoy, MANAGED, &[], 10);
    let other = batch(&envoy, OTHER, &[], 10);
    println!(
        "ECDS resource rejected: managed route {:?}, other route {:?}",
        tally(&managed),
        tally(&other)
    );
    assert_all(&managed, "500", |r| r.status == 500);
    assert_all(&other, "500 on the other route too", |r| r.status == 500);
    assert_eq!(a.count() + c.count(), 0);
    assert!(ecds_rejections(&envoy) > 0, "the rejection is counted");
}
