//! Narrowed refreshes: when the change gate's stats pin a change to a few
//! clusters, the leader asks the config dump for those clusters only
//! (`name_regex`) and merges them into its last full view; every VM then
//! rebuilds only that cluster's route. Checked here in real Envoy: each
//! cluster's change (one of them fed under an EDS service name) reaches
//! routing through a narrowed refresh, the other clusters keep theirs, an admin API that ignores `name_regex` gets a full refresh
//! instead, and `partial_refresh: false` turns it off.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{json, Value};
use std::time::Duration;
use support::admin_stub::{AdminStub, Mode};
use support::*;

const NARROWED: &str = "serving_picker.snapshot.refresh_narrowed";

/// Three clusters of two backends each, the first serving, the second not.
/// `beta` is fed as EDS service `beta-svc`, so the config dump names it so.
struct Mesh {
    envoy: Envoy,
    backends: Vec<(&'static str, Backend, Backend)>,
}

impl Mesh {
    fn start(tag: &str, extra: Value) -> Mesh {
        Self::start_with(EnvoyBuilder::new().tag(tag), extra, |_| {})
    }

    /// `ready` runs once Envoy is up, before the first routing check.
    fn start_with(builder: EnvoyBuilder, extra: Value, ready: impl Fn(&Envoy)) -> Mesh {
        let backends: Vec<_> = ["alpha", "beta", "gamma"]
            .into_iter()
            .map(|c| {
                (
                    c,
                    Backend::start(&format!("{c}-1")),
                    Backend::start(&format!("{c}-2")),
                )
            })
            .collect();
        let endpoints = |(_, one, two): &(&str, Backend, Backend)| {
            vec![
                Endpoint::serving(one.addr()),
                Endpoint::not_serving(two.addr()),
            ]
        };
        let mut config = json!({"full_refresh_interval_ms": 60_000});
        if let (Some(c), Some(e)) = (config.as_object_mut(), extra.as_object()) {
            c.extend(e.clone());
        }
        let envoy = builder
            .with_filter(Some(&plugin_config(config)))
            .eds_cluster("alpha", &endpoints(&backends[0]))
            .eds_service_cluster("beta", "beta-svc", &endpoints(&backends[1]))
            .eds_cluster("gamma", &endpoints(&backends[2]))
            .start();
        ready(&envoy);
        let mesh = Mesh { envoy, backends };
        for i in 0..3 {
            mesh.expect(i, 1, "at start");
        }
        mesh
    }

    /// Requests to cluster `i` all go to its backend `which` (1 or 2).
    fn expect(&self, i: usize, which: usize, when: &str) {
        let (name, one, two) = &self.backends[i];
        let backend = if which == 1 { one } else { two };
        let path = format!("/{name}/x");
        let what = format!("{name} {when}: {}", backend_name(backend));
        expect_routing(&self.envoy, &path, &[], &what, picked(backend));
    }

    /// Cluster `i`: its first backend stops serving, its second serves.
    fn swap(&self, i: usize) {
        let (name, one, two) = &self.backends[i];
        self.envoy.set_endpoints(
            name,
            &[
                Endpoint::not_serving(one.addr()),
                Endpoint::serving(two.addr()),
            ],
        );
    }

    fn narrowed(&self) -> u64 {
        self.envoy.stat(NARROWED).unwrap_or(0)
    }
}

fn backend_name(b: &Backend) -> String {
    b.name().to_string()
}

/// Each cluster's change reaches routing through a refresh narrowed to that
/// cluster (EDS service name included), and the others keep their picks.
#[test]
fn a_change_in_one_cluster_is_fetched_alone_and_the_rest_stays() {
    let mesh = Mesh::start("narrowed-on", json!({}));
    let mut swapped = [false; 3];
    // beta (fed as EDS service beta-svc) first, then alpha, then gamma.
    for i in [1, 0, 2] {
        let before = mesh.narrowed();
        mesh.swap(i);
        swapped[i] = true;
        mesh.expect(i, 2, "after its EDS change");
        wait_until(
            &format!("a narrowed refresh after changing {}", mesh.backends[i].0),
            Duration::from_secs(5),
            || mesh.narrowed() > before,
        );
        for other in (0..3).filter(|&o| o != i) {
            let which = if swapped[other] { 2 } else { 1 };
            mesh.expect(other, which, "after another cluster's change");
        }
    }
    // Every VM rebuilt only the changed cluster's route.
    let rebuilt = mesh
        .envoy
        .log_lines("routing table: 1 clusters rebuilt, 2 kept");
    assert!(
        rebuilt.len() >= 3,
        "routing tables rebuilt one cluster per change:\n{}",
        mesh.envoy.log_lines("routing table:").join("\n")
    );
    let lines = mesh.envoy.log_lines("narrowed to 1 changed clusters");
    assert!(
        lines.len() >= 3,
        "a narrowed refresh per change in the debug log:\n{}",
        mesh.envoy.log_lines("serving_picker: refresh").join("\n")
    );
    assert!(mesh.envoy.log_lines("admin refresh failed").is_empty());
}

/// `partial_refresh: false`: every change is a full refresh, and routing
/// follows all the same.
#[test]
fn partial_refresh_off_fetches_everything() {
    let mesh = Mesh::start("narrowed-off", json!({"partial_refresh": false}));
    mesh.swap(1);
    mesh.expect(1, 2, "after its EDS change");
    mesh.expect(0, 1, "after another cluster's change");
    assert_eq!(mesh.narrowed(), 0, "no narrowed refresh when turned off");
}

/// An admin API that answers a narrowed question with every cluster: the
/// answer is refused and a full refresh follows at once, so the change still
/// reaches routing, and no narrowed refresh is counted.
#[test]
fn an_answer_that_ignores_the_narrowing_falls_back_to_a_full_refresh() {
    let stub = AdminStub::start();
    let builder = EnvoyBuilder::new()
        .tag("narrowed-ignored")
        .admin_cluster_port(stub.port());
    let mesh = Mesh::start_with(builder, json!({}), |envoy| {
        stub.set_upstream(envoy.admin_addr())
    });
    stub.set_mode(Mode::IgnoresNameRegex);
    mesh.swap(1);
    mesh.expect(1, 2, "after its EDS change");
    mesh.expect(0, 1, "after another cluster's change");
    assert!(stub.misbehaved() >= 1, "a narrowed question was asked");
    assert_eq!(mesh.narrowed(), 0, "the refused answer is not counted");
    std::thread::sleep(Duration::from_millis(400)); // the log flush
    let refused = mesh.envoy.log_lines("narrowed refresh refused");
    assert!(
        refused.iter().any(|l| l.contains("brought cluster")),
        "{}",
        refused.join("\n")
    );
    assert!(mesh.envoy.log_lines("admin refresh failed").is_empty());
}

/// A change only `/clusters` shows: one cluster's hosts swap EDS statuses
/// UNHEALTHY and DRAINING (the config dump reads both UNHEALTHY, so the
/// narrowed dump is the same as before). The narrowed refresh reads live
/// health and the DRAINING host gets the traffic each time.
#[test]
fn a_health_only_change_in_one_cluster_is_read_from_live_health() {
    let mesh = Mesh::start("narrowed-live", json!({}));
    let (name, one, two) = &mesh.backends[1];
    let statuses = |drains_one: bool| {
        let (a, b) = if drains_one {
            ("DRAINING", "UNHEALTHY")
        } else {
            ("UNHEALTHY", "DRAINING")
        };
        [
            Endpoint::health(one.addr(), a),
            Endpoint::health(two.addr(), b),
        ]
    };
    for (round, drains_one) in [false, true, false].into_iter().enumerate() {
        let before = mesh.narrowed();
        mesh.envoy.set_endpoints(name, &statuses(drains_one));
        mesh.expect(1, if drains_one { 1 } else { 2 }, &format!("swap {round}"));
        wait_until(
            &format!("a narrowed refresh after swap {round}"),
            Duration::from_secs(5),
            || mesh.narrowed() > before,
        );
        mesh.expect(0, 1, "after another cluster's change");
    }
}
