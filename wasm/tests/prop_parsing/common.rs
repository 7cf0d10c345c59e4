//! The real Envoy output the properties start from, and arbitrary JSON.

use proptest::prelude::*;
use serde_json::Value;

pub(crate) const NS: &str = "k8s.endpointslice";

/// Real Envoy 1.40 output (tests/fixtures/README.md).
pub(crate) const DUMPS: [&[u8]; 5] = [
    include_bytes!("../fixtures/config_dump_endpoints_masked.json"),
    include_bytes!("../fixtures/config_dump_endpoints_pending_removal.json"),
    include_bytes!("../fixtures/config_dump_static_endpoints.json"),
    include_bytes!("../fixtures/config_dump_dynamic_endpoints.json"),
    include_bytes!("../fixtures/config_dump_include_eds.json"),
];
pub(crate) const CLUSTERS: [&[u8]; 2] = [
    include_bytes!("../fixtures/clusters.json"),
    include_bytes!("../fixtures/clusters_pending_removal.json"),
];

pub(crate) fn fixture(i: usize) -> &'static [u8] {
    if i < DUMPS.len() {
        DUMPS[i]
    } else {
        CLUSTERS[(i - DUMPS.len()) % CLUSTERS.len()]
    }
}

pub(crate) const FIXTURES: usize = DUMPS.len() + CLUSTERS.len();

pub(crate) fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        "\\PC{0,12}".prop_map(Value::String),
    ]
}

pub(crate) fn any_json() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("\\PC{0,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}
