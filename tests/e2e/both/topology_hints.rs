//! Topology hints like kube-proxy (issue 15): kube-proxy's own
//! TestCategorizeEndpoints cases for a cluster-wide service
//! (`pkg/proxy/topology_test.go`, upstream and Antrea's node-hint cases),
//! each in a real Envoy of both forms: the endpoints, their conditions and
//! hints in EDS metadata, the local zone and node in the configuration, and
//! the set of backends that receive traffic must be exactly kube-proxy's
//! clusterEndpoints.
//!
//! Not ported: Antrea's "PreferSameNode falls back to same-zone when feature
//! gate disabled" (serving-picker has no switch to ignore node hints), the
//! "empty zone label" case (an empty `local_zone` is refused; no zone is the
//! "empty node labels" case), and the Local traffic-policy cases (no
//! topology is applied to local endpoints, and Envoy has no such policy).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;
use support::*;

const CLUSTER: &str = "backend";
const PATH: &str = "/backend/x";

#[derive(Clone, Copy)]
enum C {
    /// Ready: serving, not terminating.
    R,
    /// Not ready, not serving, not terminating.
    U,
    /// Serving and terminating.
    St,
}

struct Case {
    name: &'static str,
    zone: Option<&'static str>,
    node: Option<&'static str>,
    /// (conditions, zone hints, node hints)
    eps: &'static [(C, &'static str, &'static str)],
    /// Indexes into `eps` of the endpoints that must get traffic.
    want: &'static [usize],
    /// The pick counter that must move (`none`, `node`, `zone`).
    mode: &'static str,
}

const FOUR: &[(C, &str, &str)] = &[
    (C::R, "zone-a", "node-1"),
    (C::R, "zone-b", "node-2"),
    (C::R, "zone-c", "node-3"),
    (C::R, "zone-a", "node-4"),
];

fn run(form: Form, case: &Case) {
    let backends: Vec<Backend> = (0..case.eps.len())
        .map(|i| Backend::start(&format!("E{i}")))
        .collect();
    let endpoints: Vec<Endpoint> = case
        .eps
        .iter()
        .zip(&backends)
        .map(|((c, zones, nodes), b)| {
            let e = match c {
                C::R => Endpoint::serving(b.addr()),
                C::U => Endpoint::not_serving(b.addr()),
                C::St => Endpoint::serving_terminating(b.addr()),
            };
            e.hints(zones, nodes)
        })
        .collect();
    let mut config = serde_json::Map::new();
    if let Some(z) = case.zone {
        config.insert("local_zone".into(), json!(z));
    }
    if let Some(n) = case.node {
        config.insert("local_node".into(), json!(n));
    }
    let config = plugin_config(serde_json::Value::Object(config));
    let envoy = EnvoyBuilder::new()
        .form(form)
        .tag(&format!("hints-{}-{}", case.name, form.name()))
        .with_filter(Some(&config))
        .eds_cluster(CLUSTER, &endpoints)
        .start();
    if case.want.is_empty() {
        settle(
            &envoy,
            PATH,
            &[],
            "503 no-serving-endpoint",
            no_serving_503(CLUSTER),
        );
        return;
    }
    let want: Vec<&Backend> = case.want.iter().map(|i| &backends[*i]).collect();
    settle(&envoy, PATH, &[], case.name, picked_any(&want));
    for b in &backends {
        b.reset();
    }
    let n = 20 * want.len();
    assert_batch(&envoy, PATH, &[], n, case.name, picked_any(&want));
    for (i, b) in backends.iter().enumerate() {
        let wanted = case.want.contains(&i);
        assert_eq!(
            b.count() > 0,
            wanted,
            "{}: endpoint {i} got {} requests",
            case.name,
            b.count()
        );
    }
    let counter = format!("serving_picker.pick.topology.{}", case.mode);
    wait_until(&counter, SETTLE_TIMEOUT, || {
        envoy.stat(&counter).unwrap_or(0) >= n as u64
    });
}

/// `name { Case fields }` rows: a `fn name(form)` running that case, and its
/// tests `name::wasm` and `name::native` (`both_forms!`).
macro_rules! hint_cases {
    ($($(#[$attr:meta])* $fn:ident { $($field:ident: $value:expr),* $(,)? })*) => {
        $(
            $(#[$attr])*
            fn $fn(form: Form) {
                run(form, &Case { $($field: $value),* });
            }
        )*
        both_forms!($($fn),*);
    };
}

hint_cases! {
    zone_hints_used {
        name: "all-hinted-zone-a", zone: Some("zone-a"), node: None, mode: "zone",
        eps: &[(C::R, "zone-a", ""), (C::R, "zone-b", ""), (C::R, "zone-c", ""), (C::R, "zone-a", "")],
        want: &[0, 3],
    }
    empty_node_labels {
        name: "no-zone", zone: None, node: None, mode: "none",
        eps: &[(C::R, "zone-a", "")],
        want: &[0],
    }
    node_in_different_zone_no_filtering {
        name: "other-zone", zone: Some("zone-b"), node: None, mode: "none",
        eps: &[(C::R, "zone-a", ""), (C::R, "zone-c", "")],
        want: &[0, 1],
    }
    unready_endpoint {
        name: "unready", zone: Some("zone-a"), node: None, mode: "zone",
        eps: &[(C::R, "zone-a", ""), (C::R, "zone-b", ""), (C::R, "zone-c", ""), (C::U, "zone-a", "")],
        want: &[0],
    }
    only_unready_endpoints_in_same_zone {
        name: "only-unready-local", zone: Some("zone-a"), node: None, mode: "none",
        eps: &[(C::U, "zone-a", ""), (C::R, "zone-b", ""), (C::R, "zone-c", ""), (C::U, "zone-a", "")],
        want: &[1, 2],
    }
    missing_hints_no_filtering {
        name: "missing-hints", zone: Some("zone-a"), node: None, mode: "none",
        eps: &[(C::R, "zone-a", ""), (C::R, "zone-b", ""), (C::R, "", ""), (C::R, "zone-a", "")],
        want: &[0, 1, 2, 3],
    }
    multiple_hints_per_endpoint {
        name: "multiple-hints", zone: Some("zone-c"), node: None, mode: "zone",
        eps: &[
            (C::R, "zone-a,zone-b,zone-c", ""),
            (C::R, "zone-b,zone-c", ""),
            (C::R, "zone-b,zone-d", ""),
            (C::R, "zone-c", ""),
        ],
        want: &[0, 1, 3],
    }
    endpoints_not_ready {
        name: "none-ready", zone: None, node: None, mode: "none",
        eps: &[(C::U, "", ""), (C::U, "", "")],
        want: &[],
    }
    some_endpoints_ready {
        name: "some-ready", zone: None, node: None, mode: "none",
        eps: &[(C::U, "", ""), (C::R, "", "")],
        want: &[1],
    }
    all_endpoints_terminating {
        name: "all-terminating", zone: None, node: None, mode: "none",
        eps: &[(C::St, "", ""), (C::St, "", "")],
        want: &[0, 1],
    }
    /// Beyond kube-proxy's table: hints on terminating endpoints are ignored
    /// by the fallback.
    terminating_fallback_ignores_hints {
        name: "terminating-hinted", zone: Some("zone-a"), node: Some("node-1"), mode: "none",
        eps: &[(C::St, "zone-b", "node-2"), (C::St, "zone-a", "node-1"), (C::U, "zone-a", "node-1")],
        want: &[0, 1],
    }
    prefer_same_node_available {
        name: "same-node", zone: Some("zone-a"), node: Some("node-1"), mode: "node",
        eps: FOUR,
        want: &[0],
    }
    prefer_same_node_ignored_if_some_unhinted {
        name: "same-node-unhinted", zone: Some("zone-a"), node: Some("node-1"), mode: "none",
        eps: &[
            (C::R, "zone-a", "node-1"),
            (C::R, "", ""),
            (C::R, "zone-c", "node-3"),
            (C::R, "zone-a", "node-4"),
        ],
        want: &[0, 1, 2, 3],
    }
    prefer_same_node_falls_back_to_zone {
        name: "same-node-to-zone", zone: Some("zone-a"), node: Some("node-0"), mode: "zone",
        eps: FOUR,
        want: &[0, 3],
    }
}
