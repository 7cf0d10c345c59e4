//! A client's override header whose first value is empty, in a real Envoy:
//! on a pass-through path the filter strips every value, so no backend sees
//! the second value (Envoy's proxy-wasm answers an empty first value with a
//! null pointer, which is presence, not absence).

use std::time::Duration;

use serde_json::json;
use support::*;

#[test]
fn an_empty_first_value_and_a_second_are_both_stripped_on_a_passthrough() {
    let a = Backend::start("A");
    let c = Backend::start("C");
    let d = Backend::start("D");
    let cfg = plugin_config(json!({"clusters": ["picked"]}));
    let envoy = EnvoyBuilder::new()
        .tag("empty-first-value")
        .with_filter(Some(&cfg))
        .eds_cluster("picked", &[Endpoint::serving(a.addr())])
        .eds_cluster(
            "other",
            &[Endpoint::serving(c.addr()), Endpoint::not_serving(d.addr())],
        )
        .start();
    // The filter is active and knows the endpoints.
    expect_routing(&envoy, "/picked/x", &[], "picked -> A", picked(&a));
    c.reset();
    d.reset();
    // "other" is outside the allow-list: passed through, both values stripped.
    let d_addr = d.addr().to_string();
    let hdr = [(OVERRIDE_HEADER, ""), (OVERRIDE_HEADER, d_addr.as_str())];
    assert_batch(
        &envoy,
        "/other/x",
        &hdr,
        BATCH,
        "passed through, every value stripped",
        passed_through,
    );
    let seen: Vec<String> = c
        .override_values()
        .into_iter()
        .chain(d.override_values())
        .collect();
    assert!(
        seen.is_empty(),
        "a value of the client's override header reached a backend: {seen:?}"
    );
    assert!(
        c.count() + d.count() >= BATCH as u64,
        "the batch reached the backends: C {} D {}",
        c.count(),
        d.count()
    );
    // Each passed-through request had the header removed, and counted.
    let stripped = || {
        envoy
            .stat("serving_picker.override_header.stripped")
            .unwrap_or(0)
    };
    eventually(Duration::from_secs(3), || stripped() >= BATCH as u64);
    assert!(
        stripped() >= BATCH as u64,
        "override_header.stripped = {}, expected >= {BATCH}",
        stripped()
    );
}
