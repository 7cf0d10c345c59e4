//! EndpointSlices by Service, and each Service port's endpoints by
//! address:port.
//!
//! **Which copy wins.** One address:port can appear in several slices of a
//! Service: the EndpointSlice controller moves endpoints between slices (it
//! writes the two slices one after the other, so a watcher sees both copies
//! for a moment, the older one possibly stale), and other controllers may
//! overlap. kube-proxy keeps whichever copy it meets first (map order, so
//! neither defined nor stable). Here the copies are merged field by field
//! into the most cautious view: ready and serving only if every copy says
//! so, terminating if any copy does (a pod never stops terminating). A stale
//! copy can therefore hold back a pod that just became ready (until the move
//! completes, one watch event later) but can never send traffic to a pod
//! that one of its slices says is not serving. Zone, node and hints come
//! from the first copy in slice-name order. Copies that agree merge to
//! themselves.
//!
//! **Address families.** IPv4 and IPv6 slices of a dual-stack Service hold
//! different addresses of the same pods, so they never collide; serving both
//! would list each pod twice. Each Service port is served in one family:
//! `IpFamily::Auto` takes IPv4 when the Service has an IPv4 slice for that
//! port, else IPv6. FQDN slices are never served.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;

use crate::model::endpoint::Endpoint;
use crate::model::slice::{AddressType, ServiceKey, Slice, SliceKey};

/// Which address family a Service port is served in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IpFamily {
    /// IPv4 when the Service has IPv4 slices for the port, else IPv6.
    #[default]
    Auto,
    /// IPv4 slices only.
    Ipv4,
    /// IPv6 slices only.
    Ipv6,
}

impl IpFamily {
    /// The address type served, given whether the Service port has an IPv4
    /// slice (what `Auto` decides on).
    pub fn served(self, has_ipv4: bool) -> AddressType {
        match self {
            IpFamily::Ipv4 => AddressType::IPv4,
            IpFamily::Ipv6 => AddressType::IPv6,
            IpFamily::Auto if has_ipv4 => AddressType::IPv4,
            IpFamily::Auto => AddressType::IPv6,
        }
    }
}

/// The slices the companion knows.
#[derive(Debug, Default)]
pub struct Index {
    slices: HashMap<SliceKey, Slice>,
    /// Slice names per Service (sorted: the merge order).
    by_service: HashMap<ServiceKey, BTreeSet<String>>,
    endpoints: usize,
}

impl Index {
    /// No slice.
    pub fn new() -> Index {
        Index::default()
    }

    /// Adds or replaces a slice; returns the Services whose slices changed
    /// (none when the slice is identical to the one known).
    pub fn apply(&mut self, slice: Slice) -> Vec<ServiceKey> {
        if self.slices.get(&slice.key) == Some(&slice) {
            return Vec::new();
        }
        let mut changed = Vec::new();
        if let Some(old) = self.remove(&slice.key) {
            if old.service != slice.service {
                changed.push(old.service);
            }
        }
        changed.push(slice.service.clone());
        self.endpoints += slice.endpoints.len();
        self.by_service
            .entry(slice.service.clone())
            .or_default()
            .insert(slice.key.name.clone());
        self.slices.insert(slice.key.clone(), slice);
        changed
    }

    /// Removes a slice; returns its Service if it was known.
    pub fn delete(&mut self, key: &SliceKey) -> Option<ServiceKey> {
        self.remove(key).map(|s| s.service)
    }

    /// Replaces every slice with `slices` (a full list); returns the
    /// Services whose slices changed.
    pub fn replace(&mut self, slices: Vec<Slice>) -> BTreeSet<ServiceKey> {
        self.replace_slices(slices)
            .into_iter()
            .map(|(_, service)| service)
            .collect()
    }

    /// `replace`, returning each slice that changed with the Service it
    /// left or joined (a slice that moved comes twice).
    pub fn replace_slices(&mut self, slices: Vec<Slice>) -> Vec<(SliceKey, ServiceKey)> {
        let mut changed = Vec::new();
        let keep: BTreeSet<SliceKey> = slices.iter().map(|s| s.key.clone()).collect();
        let gone: Vec<SliceKey> = self
            .slices
            .keys()
            .filter(|k| !keep.contains(*k))
            .cloned()
            .collect();
        for k in gone {
            if let Some(service) = self.delete(&k) {
                changed.push((k, service));
            }
        }
        for s in slices {
            let key = s.key.clone();
            changed.extend(
                self.apply(s)
                    .into_iter()
                    .map(|service| (key.clone(), service)),
            );
        }
        changed
    }

    fn remove(&mut self, key: &SliceKey) -> Option<Slice> {
        let old = self.slices.remove(key)?;
        self.endpoints -= old.endpoints.len();
        if let Some(names) = self.by_service.get_mut(&old.service) {
            names.remove(&key.name);
            if names.is_empty() {
                self.by_service.remove(&old.service);
            }
        }
        Some(old)
    }

    /// How many slices.
    pub fn slice_count(&self) -> usize {
        self.slices.len()
    }

    /// Endpoints over all slices (copies counted each time).
    pub fn endpoint_count(&self) -> usize {
        self.endpoints
    }

    /// The slice `key`, if known.
    pub fn slice(&self, key: &SliceKey) -> Option<&Slice> {
        self.slices.get(key)
    }

    /// The Services with slices in the index.
    pub fn services(&self) -> impl Iterator<Item = &ServiceKey> {
        self.by_service.keys()
    }

    /// A Service's slices in name order.
    pub fn slices_of<'a>(&'a self, service: &'a ServiceKey) -> impl Iterator<Item = &'a Slice> {
        self.by_service
            .get(service)
            .into_iter()
            .flatten()
            .filter_map(move |name| {
                self.slices.get(&SliceKey {
                    namespace: service.namespace.clone(),
                    name: name.clone(),
                })
            })
    }

    /// The endpoints of a Service port by address:port, copies merged
    /// (module doc). Empty when the Service has no slices.
    pub fn view(
        &self,
        service: &ServiceKey,
        port_name: &str,
        family: IpFamily,
    ) -> BTreeMap<SocketAddr, Endpoint> {
        let with_port: Vec<(&Slice, u16)> = self
            .slices_of(service)
            .filter_map(|s| s.port(port_name).map(|p| (s, p)))
            .collect();
        let wanted = family.served(
            with_port
                .iter()
                .any(|(s, _)| s.address_type == AddressType::IPv4),
        );
        let mut out: BTreeMap<SocketAddr, Endpoint> = BTreeMap::new();
        for (slice, port) in with_port {
            if slice.address_type != wanted {
                continue;
            }
            for ep in &slice.endpoints {
                let e = Endpoint::new(ep, port);
                match out.get_mut(&e.addr) {
                    Some(first) => first.absorb(&e),
                    None => {
                        out.insert(e.addr, e);
                    }
                }
            }
        }
        out
    }

    /// The endpoints of a Service port, sorted by address:port.
    pub fn endpoints(
        &self,
        service: &ServiceKey,
        port_name: &str,
        family: IpFamily,
    ) -> Vec<Endpoint> {
        self.view(service, port_name, family)
            .into_values()
            .collect()
    }

    /// One endpoint of a Service port by address:port.
    pub fn lookup(
        &self,
        service: &ServiceKey,
        port_name: &str,
        family: IpFamily,
        addr: SocketAddr,
    ) -> Option<Endpoint> {
        self.view(service, port_name, family).remove(&addr)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::model::fixtures::{conds, endpoint, slice_key, svc};
    use crate::model::slice::SliceEndpoint;

    fn ep(ip: &str, ready: bool, serving: bool, terminating: bool) -> SliceEndpoint {
        SliceEndpoint {
            ready: Some(ready),
            serving: Some(serving),
            terminating: Some(terminating),
            zone: Some(format!("zone-of-{ip}").into()),
            ..endpoint(ip)
        }
    }

    /// Port `http` = `port`.
    fn slice(name: &str, service: &str, port: u16, eps: Vec<SliceEndpoint>) -> Slice {
        crate::model::fixtures::slice(name, service, &[("http", port)], eps)
    }

    #[test]
    fn apply_delete_replace_report_changed_services() {
        let mut ix = Index::new();
        let a = slice("web-1", "web", 80, vec![ep("10.0.0.1", true, true, false)]);
        assert_eq!(ix.apply(a.clone()), vec![svc("web")]);
        assert_eq!(
            ix.apply(a.clone()),
            Vec::<ServiceKey>::new(),
            "identical: no change"
        );
        // The slice's label moves it to another Service: both change.
        let mut moved = a.clone();
        moved.service = svc("api");
        assert_eq!(ix.apply(moved), vec![svc("web"), svc("api")]);
        assert_eq!(ix.slices_of(&svc("web")).count(), 0);
        assert_eq!(ix.delete(&a.key), Some(svc("api")));
        assert_eq!(ix.delete(&a.key), None);
        assert_eq!((ix.slice_count(), ix.endpoint_count()), (0, 0));

        let b = slice("web-2", "web", 80, vec![ep("10.0.0.2", true, true, false)]);
        let c = slice("db-1", "db", 5432, vec![ep("10.0.1.1", true, true, false)]);
        let changed = ix.replace(vec![a.clone(), b.clone(), c.clone()]);
        assert_eq!(changed, [svc("web"), svc("db")].into_iter().collect());
        // Same list again: nothing changed. Without b: only web.
        assert!(ix.replace(vec![a.clone(), b.clone(), c.clone()]).is_empty());
        assert_eq!(ix.replace(vec![a, c]), [svc("web")].into_iter().collect());
        assert_eq!((ix.slice_count(), ix.endpoint_count()), (2, 2));
    }

    #[test]
    fn a_service_without_slices_has_no_endpoints() {
        let ix = Index::new();
        assert!(ix.endpoints(&svc("web"), "http", IpFamily::Auto).is_empty());
    }

    #[test]
    fn endpoints_take_the_slice_port_of_the_named_port() {
        let mut ix = Index::new();
        // A named targetPort resolving differently per pod: two slices, two ports.
        ix.apply(slice(
            "web-a",
            "web",
            8080,
            vec![ep("10.0.0.1", true, true, false)],
        ));
        ix.apply(slice(
            "web-b",
            "web",
            9090,
            vec![ep("10.0.0.2", true, true, false)],
        ));
        let eps = ix.endpoints(&svc("web"), "http", IpFamily::Auto);
        let addrs: Vec<String> = eps.iter().map(|e| e.addr.to_string()).collect();
        assert_eq!(addrs, vec!["10.0.0.1:8080", "10.0.0.2:9090"]);
        assert!(ix
            .endpoints(&svc("web"), "metrics", IpFamily::Auto)
            .is_empty());
    }

    #[test]
    fn overlapping_copies_merge_to_the_most_cautious_view() {
        let mut ix = Index::new();
        // A move from web-old to web-new: the stale copy still says ready.
        ix.apply(slice(
            "web-old",
            "web",
            80,
            vec![ep("10.0.0.1", true, true, false)],
        ));
        ix.apply(slice(
            "web-new",
            "web",
            80,
            vec![ep("10.0.0.1", false, false, false)],
        ));
        let e = ix
            .lookup(
                &svc("web"),
                "http",
                IpFamily::Auto,
                "10.0.0.1:80".parse().unwrap(),
            )
            .unwrap();
        assert_eq!(e.conditions, conds(false, false, false), "not serving wins");
        assert_eq!(ix.endpoints(&svc("web"), "http", IpFamily::Auto).len(), 1);

        // Terminating in either copy wins; serving only if both serve.
        ix.apply(slice(
            "web-old",
            "web",
            80,
            vec![ep("10.0.0.1", false, true, true)],
        ));
        ix.apply(slice(
            "web-new",
            "web",
            80,
            vec![ep("10.0.0.1", true, true, false)],
        ));
        let e = &ix.endpoints(&svc("web"), "http", IpFamily::Auto)[0];
        assert_eq!(e.conditions, conds(false, true, true));

        // The order does not matter; agreeing copies merge to themselves.
        let mut ix2 = Index::new();
        ix2.apply(slice(
            "web-new",
            "web",
            80,
            vec![ep("10.0.0.1", true, true, false)],
        ));
        ix2.apply(slice(
            "web-old",
            "web",
            80,
            vec![ep("10.0.0.1", false, true, true)],
        ));
        assert_eq!(
            ix2.endpoints(&svc("web"), "http", IpFamily::Auto),
            ix.endpoints(&svc("web"), "http", IpFamily::Auto)
        );
        // Zone etc. from the first slice by name (web-new < web-old).
        ix2.apply(slice(
            "web-old",
            "web",
            80,
            vec![ep("10.0.0.1", true, true, false)],
        ));
        let e = &ix2.endpoints(&svc("web"), "http", IpFamily::Auto)[0];
        assert_eq!(e.conditions, conds(true, true, false));

        // The move completes: the old copy goes, the new one alone decides.
        ix.delete(&slice_key("web-old"));
        let e = &ix.endpoints(&svc("web"), "http", IpFamily::Auto)[0];
        assert_eq!(e.conditions, conds(true, true, false));
    }

    #[test]
    fn dual_stack_serves_one_family() {
        let mut ix = Index::new();
        ix.apply(slice(
            "web-v6",
            "web",
            80,
            vec![ep("fd00::1", true, true, false)],
        ));
        // IPv6 only: served in IPv6.
        assert_eq!(
            ix.endpoints(&svc("web"), "http", IpFamily::Auto)[0]
                .addr
                .to_string(),
            "[fd00::1]:80"
        );
        ix.apply(slice(
            "web-v4",
            "web",
            80,
            vec![ep("10.0.0.1", true, true, false)],
        ));
        let auto = ix.endpoints(&svc("web"), "http", IpFamily::Auto);
        assert_eq!(auto.len(), 1, "each pod once");
        assert_eq!(auto[0].addr.to_string(), "10.0.0.1:80");
        let v6 = ix.endpoints(&svc("web"), "http", IpFamily::Ipv6);
        assert_eq!(v6[0].addr.to_string(), "[fd00::1]:80");
        // FQDN slices are never served.
        let mut fqdn = slice("web-fqdn", "db", 80, vec![]);
        fqdn.address_type = AddressType::Other;
        ix.apply(fqdn);
        assert!(ix.endpoints(&svc("db"), "http", IpFamily::Auto).is_empty());
    }
}
