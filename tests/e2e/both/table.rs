//! The rolling-update table, row by row, each from a fresh Envoy with the
//! real serving_picker.wasm; then the same rows walked in sequence on one
//! Envoy through EDS updates.
//!
//! | endpoints                                   | traffic goes to       |
//! | A serving                                   | A                     |
//! | A not serving (terminating or not)          | nobody: a clear 503   |
//! | A serving+terminating                       | A (only choice)       |
//! | A serving+terminating, B not yet serving    | A                     |
//! | A serving+terminating, B serving            | B for new requests    |
//! | A terminating not serving, B serving        | B                     |
//!
//! "goes to X" is asserted as: 200 from X, and X received
//! `x-gateway-destination-endpoint: <X's address>` (so the filter picked it,
//! not Envoy's round robin); in the native form (the module is the cluster's
//! load balancer), 200 from X with no override header at all.
//!
//! Every scenario runs against both forms: `<name>::wasm` and `<name>::native`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use support::*;

const CLUSTER: &str = "backend";
const PATH: &str = "/backend/x";

fn envoy_with(form: Form, tag: &str, endpoints: &[Endpoint]) -> Envoy {
    EnvoyBuilder::new()
        .form(form)
        .tag(&format!("{tag}-{}", form.name()))
        .eds_cluster(CLUSTER, endpoints)
        .start()
}

/// Settles, then asserts a batch where nothing reaches `a`.
fn expect_503_and_nothing_reaches(envoy: &Envoy, backends: &[&Backend]) {
    settle(
        envoy,
        PATH,
        &[],
        "503 no-serving-endpoint",
        no_serving_503(CLUSTER),
    );
    for b in backends {
        b.reset();
    }
    assert_batch(
        envoy,
        PATH,
        &[],
        BATCH,
        "503 no-serving-endpoint",
        no_serving_503(CLUSTER),
    );
    for b in backends {
        assert_eq!(
            b.count(),
            0,
            "{} got requests although nothing is serving",
            b.name()
        );
    }
}

fn row1_a_serving_goes_to_a(form: Form) {
    let a = Backend::start("A");
    let envoy = envoy_with(form, "row1", &[Endpoint::serving(a.addr())]);
    expect_routing(&envoy, PATH, &[], "A picked", picked(&a));
}

fn row2_a_not_serving_not_terminating_gets_clear_503(form: Form) {
    let a = Backend::start("A");
    let envoy = envoy_with(form, "row2a", &[Endpoint::not_serving(a.addr())]);
    expect_503_and_nothing_reaches(&envoy, &[&a]);
}

fn row2_a_not_serving_terminating_gets_clear_503(form: Form) {
    let a = Backend::start("A");
    let envoy = envoy_with(
        form,
        "row2b",
        &[Endpoint::terminating_not_serving(a.addr())],
    );
    expect_503_and_nothing_reaches(&envoy, &[&a]);
}

fn row3_a_serving_terminating_goes_to_a(form: Form) {
    let a = Backend::start("A");
    let envoy = envoy_with(form, "row3", &[Endpoint::serving_terminating(a.addr())]);
    expect_routing(
        &envoy,
        PATH,
        &[],
        "A picked (terminating fallback)",
        picked(&a),
    );
}

fn row4_a_serving_terminating_b_not_yet_serving_goes_to_a(form: Form) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let envoy = envoy_with(
        form,
        "row4",
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::not_serving(b.addr()),
        ],
    );
    expect_routing(&envoy, PATH, &[], "A picked, B not yet serving", picked(&a));
}

fn row5_a_serving_terminating_b_serving_goes_to_b(form: Form) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let envoy = envoy_with(
        form,
        "row5",
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    expect_routing(&envoy, PATH, &[], "B picked over terminating A", picked(&b));
}

fn row6_a_terminating_not_serving_b_serving_goes_to_b(form: Form) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let envoy = envoy_with(
        form,
        "row6",
        &[
            Endpoint::terminating_not_serving(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    expect_routing(&envoy, PATH, &[], "B picked, A gone", picked(&b));
}

fn rolling_update_walk_through_every_row(form: Form) {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let envoy = envoy_with(form, "walk", &[Endpoint::serving(a.addr())]);
    let step = |what: &str, eps: &[Endpoint]| {
        envoy.set_endpoints(CLUSTER, eps);
        eprintln!("walk step (EDS v{}): {what}", envoy.eds(CLUSTER).version());
    };

    // Row 1.
    expect_routing(&envoy, PATH, &[], "row 1: A serving -> A", picked(&a));
    // New pod B appears, not ready yet.
    step(
        "A serving, B not yet serving",
        &[Endpoint::serving(a.addr()), Endpoint::not_serving(b.addr())],
    );
    expect_routing(
        &envoy,
        PATH,
        &[],
        "A serving, B not yet serving -> A",
        picked(&a),
    );
    // Row 4: A starts terminating before B is ready.
    step(
        "A serving+terminating, B not yet serving",
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::not_serving(b.addr()),
        ],
    );
    expect_routing(
        &envoy,
        PATH,
        &[],
        "row 4: A s+t, B not serving -> A",
        picked(&a),
    );
    // Row 5: B becomes ready.
    step(
        "A serving+terminating, B serving",
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    expect_routing(
        &envoy,
        PATH,
        &[],
        "row 5: A s+t, B serving -> B",
        picked(&b),
    );
    // Row 6: A stops serving.
    step(
        "A terminating not serving, B serving",
        &[
            Endpoint::terminating_not_serving(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    expect_routing(
        &envoy,
        PATH,
        &[],
        "row 6: A term not serving, B serving -> B",
        picked(&b),
    );
    // A removed.
    step("B serving", &[Endpoint::serving(b.addr())]);
    expect_routing(&envoy, PATH, &[], "B alone -> B", picked(&b));
    // Row 2: B fails readiness: nobody serves.
    step("B not serving", &[Endpoint::not_serving(b.addr())]);
    expect_503_and_nothing_reaches(&envoy, &[&a, &b]);
    // Row 2 (terminating variant).
    step(
        "B terminating not serving",
        &[Endpoint::terminating_not_serving(b.addr())],
    );
    expect_503_and_nothing_reaches(&envoy, &[&a, &b]);
    // Row 3: B serving+terminating is the only choice.
    step(
        "B serving+terminating",
        &[Endpoint::serving_terminating(b.addr())],
    );
    expect_routing(&envoy, PATH, &[], "row 3: B s+t only -> B", picked(&b));

    // The walk went through both worker threads (each has its own wasm VM).
    let workers = envoy.worker_connections();
    assert!(
        workers.len() == 2 && workers.iter().all(|&n| n > 0),
        "expected connections on both workers, got {workers:?}"
    );
}

both_forms!(
    row1_a_serving_goes_to_a,
    row2_a_not_serving_not_terminating_gets_clear_503,
    row2_a_not_serving_terminating_gets_clear_503,
    row3_a_serving_terminating_goes_to_a,
    row4_a_serving_terminating_b_not_yet_serving_goes_to_a,
    row5_a_serving_terminating_b_serving_goes_to_b,
    row6_a_terminating_not_serving_b_serving_goes_to_b,
    rolling_update_walk_through_every_row,
);
