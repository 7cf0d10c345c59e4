//! Builders the unit tests share: Services, slices and endpoints in
//! namespace `ns`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::model::slice::{AddressType, ServiceKey, Slice, SliceEndpoint, SliceKey, SlicePort};
use serving_picker_core::contract::SliceConditions;

/// Service `ns/name`.
pub fn svc(name: &str) -> ServiceKey {
    ServiceKey {
        namespace: "ns".into(),
        name: name.into(),
    }
}

/// Slice `ns/name`.
pub fn slice_key(name: &str) -> SliceKey {
    SliceKey {
        namespace: "ns".into(),
        name: name.into(),
    }
}

/// An endpoint at `ip` with every condition, zone, node and hint unset.
pub fn endpoint(ip: &str) -> SliceEndpoint {
    SliceEndpoint {
        address: ip.parse().unwrap(),
        ready: None,
        serving: None,
        terminating: None,
        zone: None,
        node_name: None,
        hints_zones: None,
        hints_nodes: None,
    }
}

/// Slice `ns/name` of Service `ns/service` with these ports (name, number)
/// and endpoints; IPv6 when the first endpoint is, else IPv4.
pub fn slice(name: &str, service: &str, ports: &[(&str, u16)], eps: Vec<SliceEndpoint>) -> Slice {
    let v6 = eps.first().is_some_and(|e| e.address.is_ipv6());
    Slice {
        key: slice_key(name),
        service: svc(service),
        address_type: if v6 {
            AddressType::IPv6
        } else {
            AddressType::IPv4
        },
        ports: ports
            .iter()
            .map(|(n, p)| SlicePort {
                name: (*n).into(),
                port: *p,
            })
            .collect(),
        endpoints: eps,
    }
}

pub fn conds(ready: bool, serving: bool, terminating: bool) -> SliceConditions {
    SliceConditions {
        ready,
        serving,
        terminating,
    }
}
