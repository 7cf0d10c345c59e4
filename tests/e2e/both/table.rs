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
//! load balancer), 200 from X with no override header at all. "a clear 503":
//! the module's `no-serving-endpoint` answer, and no backend ever reached.
//!
//! Every scenario runs against both forms: `<name>::wasm` and `<name>::native`.

use support::scenario::{ep, walk, Expect::*, Published::*, Step};
use support::*;

scenarios! {
    row1_a_serving_goes_to_a {
        tag: "row1", endpoints: &[ep("A", Serving)], expect: Picked(&["A"]), native: None,
    }
    row2_a_not_serving_not_terminating_gets_clear_503 {
        tag: "row2a", endpoints: &[ep("A", NotServing)], expect: NoServing, native: None,
    }
    row2_a_not_serving_terminating_gets_clear_503 {
        tag: "row2b", endpoints: &[ep("A", TerminatingNotServing)], expect: NoServing, native: None,
    }
    row3_a_serving_terminating_goes_to_a {
        tag: "row3", endpoints: &[ep("A", ServingTerminating)], expect: Picked(&["A"]), native: None,
    }
    row4_a_serving_terminating_b_not_yet_serving_goes_to_a {
        tag: "row4",
        endpoints: &[ep("A", ServingTerminating), ep("B", NotServing)],
        expect: Picked(&["A"]),
        native: None,
    }
    row5_a_serving_terminating_b_serving_goes_to_b {
        tag: "row5",
        endpoints: &[ep("A", ServingTerminating), ep("B", Serving)],
        expect: Picked(&["B"]),
        native: None,
    }
    row6_a_terminating_not_serving_b_serving_goes_to_b {
        tag: "row6",
        endpoints: &[ep("A", TerminatingNotServing), ep("B", Serving)],
        expect: Picked(&["B"]),
        native: None,
    }
}

/// A one-replica rolling update through every row of the table, then the
/// replacement failing and coming back.
const WALK: &[Step] = &[
    Step {
        what: "row 1: A serving -> A",
        endpoints: &[ep("A", Serving)],
        expect: Picked(&["A"]),
    },
    Step {
        what: "A serving, B not yet serving -> A",
        endpoints: &[ep("A", Serving), ep("B", NotServing)],
        expect: Picked(&["A"]),
    },
    Step {
        what: "row 4: A s+t, B not serving -> A",
        endpoints: &[ep("A", ServingTerminating), ep("B", NotServing)],
        expect: Picked(&["A"]),
    },
    Step {
        what: "row 5: A s+t, B serving -> B",
        endpoints: &[ep("A", ServingTerminating), ep("B", Serving)],
        expect: Picked(&["B"]),
    },
    Step {
        what: "row 6: A term not serving, B serving -> B",
        endpoints: &[ep("A", TerminatingNotServing), ep("B", Serving)],
        expect: Picked(&["B"]),
    },
    Step {
        what: "A removed: B alone -> B",
        endpoints: &[ep("B", Serving)],
        expect: Picked(&["B"]),
    },
    Step {
        what: "row 2: B fails readiness, nobody serves -> 503",
        endpoints: &[ep("B", NotServing)],
        expect: NoServing,
    },
    Step {
        what: "row 2: B terminating not serving -> 503",
        endpoints: &[ep("B", TerminatingNotServing)],
        expect: NoServing,
    },
    Step {
        what: "row 3: B s+t only -> B",
        endpoints: &[ep("B", ServingTerminating)],
        expect: Picked(&["B"]),
    },
];

fn rolling_update_walk_through_every_row(form: Form) {
    let (envoy, _backends) = walk(form, "walk", WALK);
    // The walk went through both worker threads (each has its own wasm VM).
    let workers = envoy.worker_connections();
    assert!(
        workers.len() == 2 && workers.iter().all(|&n| n > 0),
        "expected connections on both workers, got {workers:?}"
    );
}

both_forms!(rolling_update_walk_through_every_row);
