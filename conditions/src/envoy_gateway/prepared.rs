//! The index as the hook reads it: the slices, plus each managed Service's
//! endpoints by `address:port` with their conditions metadata already
//! encoded. Made when a Service's slices change, so that a hook call only
//! looks endpoints up and copies bytes (a 1,000-endpoint Service is called
//! for again and again while its slices stay the same).
//!
//! All changes go through [`PreparedIndex::edit`], which keeps the two in
//! step; reading the slices goes through `Deref` to the [`Index`].

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::ops::Deref;

use super::field_edit::{len_field_size, put_len_head, put_varint, varint_field_size};
use serving_picker_core::contract::{MetadataValue, SliceConditions};

use crate::model::endpoint::Endpoint;
use crate::model::index::{Index, IpFamily};
use crate::model::slice::{AddressType, ServiceKey};
use crate::source::Change;

/// What the hook writes for one endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Annotation {
    /// The endpoint's conditions, copies merged.
    pub conditions: SliceConditions,
    /// The conditions metadata (`assignment::conditions_struct`), encoded.
    pub metadata: Box<[u8]>,
}

/// A managed Service's endpoints, over all its slice port numbers and
/// address families. Each `address:port` is looked up among the slice
/// ports of that number in the address's family, copies merged (the
/// index's rule; EG writes the slice port number into each address).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceEndpoints {
    by_addr: HashMap<SocketAddr, Annotation>,
}

impl ServiceEndpoints {
    /// What the hook writes for `addr`, if the Service has it.
    pub fn get(&self, addr: &SocketAddr) -> Option<&Annotation> {
        self.by_addr.get(addr)
    }

    /// How many addresses.
    pub fn len(&self) -> usize {
        self.by_addr.len()
    }

    /// No address.
    pub fn is_empty(&self) -> bool {
        self.by_addr.is_empty()
    }

    fn of(index: &Index, service: &ServiceKey) -> ServiceEndpoints {
        let mut ports: BTreeSet<(u16, AddressType)> = BTreeSet::new();
        for s in index.slices_of(service) {
            for p in &s.ports {
                ports.insert((p.port, s.address_type));
            }
        }
        let mut by_addr = HashMap::new();
        for (port, address_type) in ports {
            let family = match address_type {
                AddressType::IPv4 => IpFamily::Ipv4,
                AddressType::IPv6 => IpFamily::Ipv6,
                AddressType::Other => continue,
            };
            for (addr, ep) in at_port(index, service, port, family) {
                by_addr.insert(
                    addr,
                    Annotation {
                        conditions: ep.conditions,
                        metadata: encode_conditions(&ep),
                    },
                );
            }
        }
        ServiceEndpoints { by_addr }
    }
}

/// `assignment::conditions_struct(ep)` encoded, written directly (no map
/// of strings built): the prepared index is made while the index is
/// locked for writing, which holds hook calls back.
fn encode_conditions(ep: &Endpoint) -> Box<[u8]> {
    const STRUCT_FIELDS: u32 = 1;
    const ENTRY_KEY: u32 = 1;
    const ENTRY_VALUE: u32 = 2;
    const VALUE_STRING: u32 = 3;
    const VALUE_BOOL: u32 = 4;
    let value_len = |v: &MetadataValue| match v {
        MetadataValue::Bool(_) => varint_field_size(VALUE_BOOL, 1),
        MetadataValue::Str(s) => len_field_size(VALUE_STRING, s.len()),
    };
    let entry_len = |k: &str, v: &MetadataValue| {
        len_field_size(ENTRY_KEY, k.len()) + len_field_size(ENTRY_VALUE, value_len(v))
    };
    let fields = ep.metadata_fields();
    let len = fields
        .iter()
        .map(|(k, v)| len_field_size(STRUCT_FIELDS, entry_len(k, v)))
        .sum();
    let mut buf = Vec::with_capacity(len);
    for (k, v) in &fields {
        put_len_head(&mut buf, STRUCT_FIELDS, entry_len(k, v));
        put_len_head(&mut buf, ENTRY_KEY, k.len());
        buf.extend_from_slice(k.as_bytes());
        put_len_head(&mut buf, ENTRY_VALUE, value_len(v));
        match v {
            // A oneof member is written even when false.
            MetadataValue::Bool(b) => put_varint(&mut buf, VALUE_BOOL, u64::from(*b)),
            MetadataValue::Str(s) => {
                put_len_head(&mut buf, VALUE_STRING, s.len());
                buf.extend_from_slice(s.as_bytes());
            }
        }
    }
    buf.into_boxed_slice()
}

/// A Service's endpoints at slice port number `port` in one family, over
/// every port name with that number, copies merged.
fn at_port(
    index: &Index,
    service: &ServiceKey,
    port: u16,
    family: IpFamily,
) -> HashMap<SocketAddr, Endpoint> {
    let names: BTreeSet<&str> = index
        .slices_of(service)
        .flat_map(|s| s.ports.iter())
        .filter(|p| p.port == port)
        .map(|p| p.name.as_str())
        .collect();
    let mut out: HashMap<SocketAddr, Endpoint> = HashMap::new();
    for name in names {
        for (addr, ep) in index.view(service, name, family) {
            if addr.port() != port {
                continue;
            }
            match out.get_mut(&addr) {
                Some(first) => first.absorb(&ep),
                None => {
                    out.insert(addr, ep);
                }
            }
        }
    }
    out
}

/// The slices and the managed Services' prepared endpoints (module doc).
#[derive(Debug, Default)]
pub struct PreparedIndex {
    index: Index,
    services: HashMap<ServiceKey, ServiceEndpoints>,
}

impl Deref for PreparedIndex {
    type Target = Index;

    fn deref(&self) -> &Index {
        &self.index
    }
}

impl PreparedIndex {
    /// No Service.
    pub fn new() -> PreparedIndex {
        PreparedIndex::default()
    }

    /// Applies `changes` in order, then prepares each Service they changed
    /// once; returns those Services.
    pub fn edit(&mut self, changes: impl IntoIterator<Item = Change>) -> BTreeSet<ServiceKey> {
        let mut changed = BTreeSet::new();
        for c in changes {
            match c {
                Change::Apply(s) => changed.extend(self.index.apply(s)),
                Change::Delete(k) => changed.extend(self.index.delete(&k)),
                Change::Replace(all) => changed.extend(self.index.replace(all)),
            }
        }
        for service in &changed {
            if self.index.slices_of(service).next().is_some() {
                let eps = ServiceEndpoints::of(&self.index, service);
                self.services.insert(service.clone(), eps);
            } else {
                self.services.remove(service);
            }
        }
        changed
    }

    /// A managed Service's endpoints (`None`: the index has no slices of it).
    pub fn service(&self, service: &ServiceKey) -> Option<&ServiceEndpoints> {
        self.services.get(service)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::model::fixtures::{endpoint, slice, slice_key, svc};
    use crate::model::slice::SliceEndpoint;
    use envoy_types::pb::google::protobuf::{value::Kind, Struct};
    use prost::Message;

    fn ep(ip: &str, ready: bool, terminating: bool) -> SliceEndpoint {
        SliceEndpoint {
            ready: Some(ready),
            serving: Some(true),
            terminating: Some(terminating),
            zone: Some("zone-a".into()),
            ..endpoint(ip)
        }
    }

    #[test]
    fn prepared_follows_every_change_of_a_service() {
        let mut ix = PreparedIndex::new();
        // Two slices with one copy each of 10.0.0.1 (merged: terminating),
        // a second port number, and an IPv6 slice.
        ix.edit([Change::Replace(vec![
            slice(
                "web-a",
                "web",
                &[("http", 8080), ("admin", 9090)],
                vec![ep("10.0.0.1", true, false)],
            ),
            slice(
                "web-b",
                "web",
                &[("http", 8080)],
                vec![ep("10.0.0.1", false, true)],
            ),
            slice(
                "web-c",
                "web",
                &[("http", 8080)],
                vec![ep("fd00::1", true, false)],
            ),
        ])]);
        let web = ix.service(&svc("web")).unwrap();
        assert_eq!(web.len(), 3);
        let a = web.get(&"10.0.0.1:8080".parse().unwrap()).unwrap();
        assert_eq!(
            a.conditions,
            SliceConditions {
                ready: false,
                serving: true,
                terminating: true
            }
        );
        let md = Struct::decode(&*a.metadata).unwrap();
        assert_eq!(
            md.fields["terminating"].kind,
            Some(Kind::BoolValue(true)),
            "merged copies"
        );
        let expected = crate::eds::assignment::conditions_struct(
            &ix.endpoints(&svc("web"), "http", IpFamily::Ipv4)[0],
        );
        assert_eq!(md, expected);
        // Every kind of value, hints included.
        let mut full = ix.endpoints(&svc("web"), "http", IpFamily::Ipv4).remove(0);
        full.node_name = Some("node-1".into());
        full.hints_zones = Some("zone-a,zone-b".into());
        full.hints_nodes = Some("".into());
        assert_eq!(
            Struct::decode(&*encode_conditions(&full)).unwrap(),
            crate::eds::assignment::conditions_struct(&full)
        );
        assert!(web.get(&"10.0.0.1:9090".parse().unwrap()).is_some());
        assert!(web.get(&"[fd00::1]:8080".parse().unwrap()).is_some());

        // A slice changes: only its Service is prepared again.
        let changed = ix.edit([Change::Apply(slice(
            "web-b",
            "web",
            &[("http", 8080)],
            vec![ep("10.0.0.2", true, false)],
        ))]);
        assert_eq!(changed, [svc("web")].into_iter().collect());
        let web = ix.service(&svc("web")).unwrap();
        assert!(
            !web.get(&"10.0.0.1:8080".parse().unwrap())
                .unwrap()
                .conditions
                .terminating
        );
        assert!(web.get(&"10.0.0.2:8080".parse().unwrap()).is_some());

        // All its slices gone: no longer managed.
        ix.edit(["web-a", "web-b", "web-c"].map(|n| Change::Delete(slice_key(n))));
        assert!(ix.service(&svc("web")).is_none());
        assert_eq!(ix.slice_count(), 0);
    }
}
