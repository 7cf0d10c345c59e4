//! The slice-file parser (`--slices-dir`) fed fuzzed text and fuzzed EndpointSlices. Invariants,
//! each named:
//! - `no_panic`: any text, read as JSON or YAML, gives slices or an error line, never a panic;
//! - `round_trip`: EndpointSlices written as one object, as a `List`, as an `EndpointSliceList`
//!   or as several YAML documents read back as the same objects;
//! - `conditions_kept`: every endpoint's ready, serving and terminating (nil included) reach the
//!   model unchanged, and its address unless it is not of the slice's family.
//!
//! Short runs in `make test` (PROPTEST_CASES), long ones in `make fuzz`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;
use serde_json::{json, Value};
use serving_picker_conditions::model::slice::Slice;
use serving_picker_conditions::source::files::parse;

fn conditions() -> impl Strategy<Value = Option<EndpointConditions>> {
    let flag = || proptest::option::of(any::<bool>());
    proptest::option::of(
        (flag(), flag(), flag()).prop_map(|(ready, serving, terminating)| EndpointConditions {
            ready,
            serving,
            terminating,
        }),
    )
}

fn endpoint(v6: bool) -> impl Strategy<Value = Endpoint> {
    (
        1u8..=255,
        any::<bool>(),
        conditions(),
        proptest::option::of("[a-z0-9-]{1,12}"),
    )
        .prop_map(move |(host, wrong_family, conditions, zone)| {
            let address = if v6 != wrong_family {
                format!("fd00::{host:x}")
            } else {
                format!("10.1.2.{host}")
            };
            Endpoint {
                addresses: vec![address],
                conditions,
                zone,
                ..Default::default()
            }
        })
}

fn endpoint_slice() -> impl Strategy<Value = EndpointSlice> {
    (
        "[a-z][a-z0-9-]{0,20}",
        "[a-z][a-z0-9-]{0,10}",
        any::<bool>(),
        1i32..65536,
    )
        .prop_flat_map(|(name, service, v6, port)| {
            proptest::collection::vec(endpoint(v6), 0..6).prop_map(move |endpoints| EndpointSlice {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some("shop".into()),
                    labels: Some(BTreeMap::from([(
                        "kubernetes.io/service-name".to_string(),
                        service.clone(),
                    )])),
                    ..Default::default()
                },
                address_type: if v6 { "IPv6" } else { "IPv4" }.into(),
                endpoints,
                ports: Some(vec![EndpointPort {
                    name: Some("http".into()),
                    port: Some(port),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
            })
        })
}

fn typed(s: &EndpointSlice) -> Value {
    let mut v = serde_json::to_value(s).unwrap();
    v["apiVersion"] = json!("discovery.k8s.io/v1");
    v["kind"] = json!("EndpointSlice");
    v
}

proptest! {
    #[test]
    fn any_text_gives_slices_or_an_error(text in ".{0,400}", json_mode in any::<bool>()) {
        // no_panic: either answer is fine.
        let _ = parse(&text, json_mode);
    }

    #[test]
    fn slice_shaped_text_gives_slices_or_an_error(
        slices in proptest::collection::vec(endpoint_slice(), 1..4),
        cut in any::<prop::sample::Index>(),
        json_mode in any::<bool>(),
    ) {
        // no_panic on text that is almost right: a list cut anywhere.
        let text = serde_json::to_string(&json!({"kind": "List", "items": slices.iter().map(typed).collect::<Vec<_>>()})).unwrap();
        let mut at = cut.index(text.len() + 1);
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        let _ = parse(&text[..at], json_mode);
    }

    #[test]
    fn written_slices_read_back(slices in proptest::collection::vec(endpoint_slice(), 1..4)) {
        let objects: Vec<Value> = slices.iter().map(typed).collect();
        let bare: Vec<Value> = slices.iter().map(|s| serde_json::to_value(s).unwrap()).collect();
        let forms = [
            (serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": objects})).unwrap(), true),
            (serde_json::to_string(&json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList", "items": bare})).unwrap(), true),
            (serde_json::to_string(&json!({"kind": "List", "items": objects})).unwrap(), false),
            (objects.iter().map(|o| serde_json::to_string(o).unwrap()).collect::<Vec<_>>().join("\n---\n"), false),
        ];
        for (text, json_mode) in forms {
            let got = parse(&text, json_mode);
            prop_assert!(got.is_ok(), "round_trip: {:?}", got.err());
            let got = got.unwrap();
            prop_assert_eq!(&got, &slices, "round_trip");
            for (obj, src) in got.iter().zip(&slices) {
                let (model, _) = Slice::from_k8s(obj).unwrap();
                let v6 = src.address_type == "IPv6";
                let kept: Vec<&Endpoint> = src
                    .endpoints
                    .iter()
                    .filter(|e| e.addresses[0].contains(':') == v6)
                    .collect();
                prop_assert_eq!(model.endpoints.len(), kept.len(), "conditions_kept");
                for (m, e) in model.endpoints.iter().zip(kept) {
                    let c = e.conditions.clone().unwrap_or_default();
                    prop_assert_eq!(m.address.to_string(), e.addresses[0].clone(), "conditions_kept");
                    prop_assert_eq!((m.ready, m.serving, m.terminating), (c.ready, c.serving, c.terminating), "conditions_kept");
                }
            }
        }
    }
}
