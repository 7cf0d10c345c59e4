//! The index under fuzzed sequences of slice events (apply, delete, full list), against a model
//! that keeps the slices in a plain map. Slices share names, Services, addresses and ports, so
//! copies of one endpoint in several slices, slices moving between Services and families mixing
//! all happen. Invariants, each named:
//! - `counts`: the index holds the model's slices and endpoints;
//! - `cautious_merge`: an endpoint's merged conditions are ready and serving only if every copy
//!   says so, terminating if any copy does (never serving where a copy says not serving);
//! - `every_endpoint`: a Service port lists exactly the addresses of its slices in the family
//!   served;
//! - `changes_reported`: a Service whose endpoints changed is among the Services an event
//!   reports.
//!
//! Short runs in `make test` (PROPTEST_CASES), long ones in `make fuzz`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use proptest::prelude::*;
use serving_picker_core::contract::SliceConditions;

use crate::model::endpoint::{conditions_of, Endpoint};
use crate::model::fixtures::{slice, slice_key, svc};
use crate::model::index::{Index, IpFamily};
use crate::model::slice::{AddressType, ServiceKey, Slice, SliceEndpoint, SliceKey};

const SLICE_NAMES: [&str; 4] = ["s1", "s2", "s3", "s4"];
const SERVICES: [&str; 2] = ["web", "api"];
const PORTS: [u16; 2] = [80, 8080];

#[derive(Clone, Debug)]
enum Event {
    Apply(Slice),
    Delete(SliceKey),
    Replace(Vec<Slice>),
}

fn endpoint(v6: bool) -> impl Strategy<Value = SliceEndpoint> {
    let flag = || proptest::option::of(any::<bool>());
    (0u8..4, flag(), flag(), flag()).prop_map(move |(host, ready, serving, terminating)| {
        let address: IpAddr = if v6 {
            format!("fd00::{host}").parse().unwrap()
        } else {
            format!("10.0.0.{host}").parse().unwrap()
        };
        SliceEndpoint {
            ready,
            serving,
            terminating,
            ..crate::model::fixtures::endpoint(&address.to_string())
        }
    })
}

fn any_slice() -> impl Strategy<Value = Slice> {
    (
        0..SLICE_NAMES.len(),
        0..SERVICES.len(),
        0..PORTS.len(),
        any::<bool>(),
    )
        .prop_flat_map(|(name, service, port, v6)| {
            proptest::collection::vec(endpoint(v6), 0..5).prop_map(move |eps| {
                let mut s = slice(
                    SLICE_NAMES[name],
                    SERVICES[service],
                    &[("http", PORTS[port])],
                    eps,
                );
                s.address_type = if v6 {
                    AddressType::IPv6
                } else {
                    AddressType::IPv4
                };
                s
            })
        })
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => any_slice().prop_map(Event::Apply),
        2 => (0..SLICE_NAMES.len()).prop_map(|n| Event::Delete(slice_key(SLICE_NAMES[n]))),
        1 => proptest::collection::vec(any_slice(), 0..4).prop_map(|slices| {
            // A full list names each slice once (the last copy wins, as a map would keep it).
            let by_key: BTreeMap<String, Slice> =
                slices.into_iter().map(|s| (s.key.name.clone(), s)).collect();
            Event::Replace(by_key.into_values().collect())
        }),
    ]
}

/// The model's view of a Service port: every copy of each address in the family served.
fn model_view(
    model: &BTreeMap<SliceKey, Slice>,
    service: &ServiceKey,
) -> BTreeMap<SocketAddr, Vec<SliceConditions>> {
    let of_service: Vec<&Slice> = model.values().filter(|s| &s.service == service).collect();
    let wanted = IpFamily::Auto.served(
        of_service
            .iter()
            .any(|s| s.address_type == AddressType::IPv4 && s.port("http").is_some()),
    );
    let mut out: BTreeMap<SocketAddr, Vec<SliceConditions>> = BTreeMap::new();
    for s in of_service {
        let Some(port) = s.port("http") else { continue };
        if s.address_type != wanted {
            continue;
        }
        for ep in &s.endpoints {
            out.entry(SocketAddr::new(ep.address, port))
                .or_default()
                .push(conditions_of(ep));
        }
    }
    out
}

fn views(index: &Index) -> BTreeMap<ServiceKey, Vec<Endpoint>> {
    SERVICES
        .iter()
        .map(|s| (svc(s), index.endpoints(&svc(s), "http", IpFamily::Auto)))
        .collect()
}

proptest! {
    #[test]
    fn the_index_follows_a_plain_model(events in proptest::collection::vec(event(), 1..24)) {
        let mut index = Index::new();
        let mut model: BTreeMap<SliceKey, Slice> = BTreeMap::new();
        for event in events {
            let before = views(&index);
            let reported: BTreeSet<ServiceKey> = match event {
                Event::Apply(s) => {
                    model.insert(s.key.clone(), s.clone());
                    index.apply(s).into_iter().collect()
                }
                Event::Delete(k) => {
                    model.remove(&k);
                    index.delete(&k).into_iter().collect()
                }
                Event::Replace(list) => {
                    model = list.iter().map(|s| (s.key.clone(), s.clone())).collect();
                    index.replace(list)
                }
            };
            let after = views(&index);

            prop_assert_eq!(index.slice_count(), model.len(), "counts");
            prop_assert_eq!(
                index.endpoint_count(),
                model.values().map(|s| s.endpoints.len()).sum::<usize>(),
                "counts"
            );
            for service in SERVICES.map(svc) {
                let expected = model_view(&model, &service);
                let got = &after[&service];
                let addrs: Vec<SocketAddr> = got.iter().map(|e| e.addr).collect();
                let want: Vec<SocketAddr> = expected.keys().copied().collect();
                prop_assert_eq!(addrs, want, "every_endpoint");
                for e in got {
                    let copies = &expected[&e.addr];
                    let c = e.conditions;
                    prop_assert_eq!(c.ready, copies.iter().all(|k| k.ready), "cautious_merge");
                    prop_assert_eq!(c.serving, copies.iter().all(|k| k.serving), "cautious_merge");
                    prop_assert_eq!(
                        c.terminating,
                        copies.iter().any(|k| k.terminating),
                        "cautious_merge"
                    );
                }
                if before[&service] != after[&service] {
                    prop_assert!(reported.contains(&service), "changes_reported: {}", service);
                }
            }
        }
    }
}
