//! One Service port's endpoints, copies merged exactly as `Index::view`
//! merges them (see `index` for which copy wins), but kept up to date slice
//! by slice: a change to one slice of a 10,000-endpoint Service compares
//! that slice's endpoints with their last version and reports the merged
//! endpoints that changed (the publisher encodes only those).

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

use crate::model::endpoint::Endpoint;
use crate::model::index::IpFamily;
use crate::model::slice::{AddressType, Slice};

/// The merged endpoints of one Service port.
#[derive(Debug)]
pub struct PortView {
    port_name: String,
    /// Only slice ports of this number (the template's unnamed-port form).
    port_number: Option<u16>,
    family: IpFamily,
    /// The Service's slices that have the port, in a family this view can
    /// serve, by name (the merge order).
    slices: BTreeMap<Arc<str>, SliceCopies>,
    /// How many of those are IPv4 (`IpFamily::Auto` serves IPv4 if any).
    ipv4_slices: usize,
    /// The family served now.
    served: AddressType,
    /// The served slices holding each address.
    holders: HashMap<SocketAddr, Holders>,
}

/// One merged endpoint that changed (`None`: absent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointChange {
    /// The endpoint's address and port.
    pub addr: SocketAddr,
    /// What it was.
    pub old: Option<Endpoint>,
    /// What it is now.
    pub new: Option<Endpoint>,
}

/// The slices holding one address, in name order; nearly always one.
#[derive(Debug)]
enum Holders {
    One(Arc<str>),
    Many(Vec<Arc<str>>),
}

impl Holders {
    fn names(&self) -> &[Arc<str>] {
        match self {
            Holders::One(n) => std::slice::from_ref(n),
            Holders::Many(v) => v,
        }
    }
}

/// One slice's endpoints at the port, sorted by address, a slice's own
/// duplicates already merged (the first one's zone and hints, the most
/// cautious conditions).
#[derive(Debug)]
struct SliceCopies {
    address_type: AddressType,
    endpoints: Vec<Endpoint>,
}

impl SliceCopies {
    fn of(slice: &Slice, port: u16) -> SliceCopies {
        let mut endpoints: Vec<Endpoint> = slice
            .endpoints
            .iter()
            .map(|ep| Endpoint::new(ep, port))
            .collect();
        // Stable: copies of one address stay in slice order.
        endpoints.sort_by_key(|e| e.addr);
        endpoints.dedup_by(|later, first| {
            let same = later.addr == first.addr;
            if same {
                first.absorb(later);
            }
            same
        });
        SliceCopies {
            address_type: slice.address_type,
            endpoints,
        }
    }

    fn get(&self, addr: &SocketAddr) -> Option<&Endpoint> {
        self.endpoints
            .binary_search_by_key(addr, |e| e.addr)
            .ok()
            .and_then(|i| self.endpoints.get(i))
    }

    fn addrs(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.endpoints.iter().map(|e| e.addr)
    }
}

/// A slice's endpoints if it is of family `t`.
fn served_copies(c: Option<&SliceCopies>, t: AddressType) -> Option<&[Endpoint]> {
    c.filter(|c| c.address_type == t)
        .map(|c| c.endpoints.as_slice())
}

/// The addresses two versions of a slice disagree on (both sorted).
fn differing(old: &[Endpoint], new: &[Endpoint], out: &mut Vec<SocketAddr>) {
    let (mut o, mut n) = (old.iter().peekable(), new.iter().peekable());
    loop {
        match (o.peek(), n.peek()) {
            (Some(a), Some(b)) if a.addr == b.addr => {
                if a != b {
                    out.push(a.addr);
                }
                o.next();
                n.next();
            }
            (Some(a), Some(b)) if a.addr < b.addr => {
                out.push(a.addr);
                o.next();
            }
            (_, Some(b)) => {
                out.push(b.addr);
                n.next();
            }
            (Some(a), None) => {
                out.push(a.addr);
                o.next();
            }
            (None, None) => return,
        }
    }
}

impl PortView {
    /// An empty view of the port named `port_name` ("" unnamed), serving `family`.
    pub fn new(port_name: &str, family: IpFamily) -> PortView {
        PortView::with_number(port_name, None, family)
    }

    /// A view of the slice ports named `port_name` that also have the number
    /// `port_number`, when given (an unnamed port named by its number).
    pub fn with_number(port_name: &str, port_number: Option<u16>, family: IpFamily) -> PortView {
        PortView {
            port_name: port_name.to_string(),
            port_number,
            family,
            slices: BTreeMap::new(),
            ipv4_slices: 0,
            served: family.served(false),
            holders: HashMap::new(),
        }
    }

    /// Slice `name` of the Service is now `slice` (`None`: deleted, or no
    /// longer the Service's). Adds every merged endpoint that changed to
    /// `changes` (in no particular order).
    pub fn put(&mut self, name: &str, slice: Option<&Slice>, changes: &mut Vec<EndpointChange>) {
        let new = slice.and_then(|s| {
            let port = s
                .port(&self.port_name)
                .filter(|p| self.port_number.is_none_or(|n| n == *p))?;
            self.could_serve(s.address_type)
                .then(|| SliceCopies::of(s, port))
        });
        let old = self.slices.get(name);
        let is_v4 =
            |c: Option<&SliceCopies>| c.is_some_and(|c| c.address_type == AddressType::IPv4);
        let ipv4_slices =
            self.ipv4_slices + usize::from(is_v4(new.as_ref())) - usize::from(is_v4(old));
        let now_served = self.family.served(ipv4_slices > 0);
        // The addresses that may change, and their endpoints before.
        let mut addrs = Vec::new();
        if now_served != self.served {
            addrs.extend(self.holders.keys().copied());
            for c in self
                .slices
                .values()
                .filter(|c| c.address_type == now_served)
            {
                addrs.extend(c.addrs());
            }
            addrs.extend(
                served_copies(new.as_ref(), now_served)
                    .into_iter()
                    .flatten()
                    .map(|e| e.addr),
            );
        } else {
            differing(
                served_copies(old, self.served).unwrap_or(&[]),
                served_copies(new.as_ref(), self.served).unwrap_or(&[]),
                &mut addrs,
            );
        }
        addrs.sort_unstable();
        addrs.dedup();
        let before: Vec<Option<Endpoint>> = addrs.iter().map(|a| self.endpoint(a)).collect();

        let (name, old) = match self.slices.remove_entry(name) {
            Some((name, old)) => (name, Some(old)),
            None => (Arc::from(name), None),
        };
        self.ipv4_slices = ipv4_slices;
        if now_served != self.served {
            if let Some(new) = new {
                self.slices.insert(name, new);
            }
            self.serve(now_served);
        } else {
            // Only addresses the slice gained or lost change holders.
            let was = served_copies(old.as_ref(), self.served);
            let is = served_copies(new.as_ref(), self.served);
            let holds = |c: Option<&[Endpoint]>, a: &SocketAddr| {
                c.is_some_and(|c| c.binary_search_by_key(a, |e| e.addr).is_ok())
            };
            for a in &addrs {
                match (holds(was, a), holds(is, a)) {
                    (true, false) => self.unhold(*a, &name),
                    (false, true) => self.hold(*a, &name),
                    _ => {}
                }
            }
            if let Some(new) = new {
                self.slices.insert(name, new);
            }
        }

        changes.reserve(addrs.len());
        for (addr, old) in addrs.into_iter().zip(before) {
            let new = self.endpoint(&addr);
            if new != old {
                changes.push(EndpointChange { addr, old, new });
            }
        }
    }

    /// The merged endpoint at `addr`, if any served slice holds it.
    pub fn endpoint(&self, addr: &SocketAddr) -> Option<Endpoint> {
        let mut merged: Option<Endpoint> = None;
        for name in self.holders.get(addr)?.names() {
            let Some(e) = self.slices.get(name).and_then(|s| s.get(addr)) else {
                continue;
            };
            match &mut merged {
                Some(m) => m.absorb(e),
                None => merged = Some(e.clone()),
            }
        }
        merged
    }

    /// How many endpoints (addresses) the view has.
    pub fn len(&self) -> usize {
        self.holders.len()
    }

    /// No endpoint.
    pub fn is_empty(&self) -> bool {
        self.holders.is_empty()
    }

    /// Every merged endpoint, sorted by address.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        let mut addrs: Vec<&SocketAddr> = self.holders.keys().collect();
        addrs.sort_unstable();
        addrs.into_iter().filter_map(|a| self.endpoint(a)).collect()
    }

    fn could_serve(&self, t: AddressType) -> bool {
        match self.family {
            IpFamily::Auto => t != AddressType::Other,
            IpFamily::Ipv4 => t == AddressType::IPv4,
            IpFamily::Ipv6 => t == AddressType::IPv6,
        }
    }

    fn hold(&mut self, addr: SocketAddr, name: &Arc<str>) {
        match self.holders.entry(addr) {
            Entry::Vacant(v) => {
                v.insert(Holders::One(name.clone()));
            }
            Entry::Occupied(mut o) => {
                let h = o.get_mut();
                let mut names = h.names().to_vec();
                if let Err(i) = names.binary_search(name) {
                    names.insert(i, name.clone());
                }
                *h = Holders::Many(names);
            }
        }
    }

    fn unhold(&mut self, addr: SocketAddr, name: &Arc<str>) {
        let Some(h) = self.holders.get_mut(&addr) else {
            return;
        };
        let mut names: Vec<Arc<str>> = h.names().iter().filter(|n| *n != name).cloned().collect();
        match names.len() {
            0 => {
                self.holders.remove(&addr);
            }
            1 => *h = Holders::One(names.remove(0)),
            _ => *h = Holders::Many(names),
        }
    }

    /// Switches the served family (`Auto`, when the last IPv4 slice goes or
    /// the first one comes).
    fn serve(&mut self, family: AddressType) {
        self.served = family;
        self.holders.clear();
        let names: Vec<(Arc<str>, Vec<SocketAddr>)> = self
            .slices
            .iter()
            .filter(|(_, s)| s.address_type == family)
            .map(|(n, s)| (n.clone(), s.addrs().collect()))
            .collect();
        for (name, addrs) in names {
            for a in addrs {
                self.hold(a, &name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::model::fixtures::{slice_key, svc};
    use crate::model::index::Index;
    use crate::model::slice::{SliceEndpoint, SlicePort};
    use std::net::IpAddr;

    /// A small deterministic generator (xorshift).
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
        fn flag(&mut self) -> Option<bool> {
            [None, Some(true), Some(false)][self.below(3) as usize]
        }
    }

    /// A random slice: few addresses (so copies overlap, within a slice
    /// too), both families, two port names at varying numbers.
    fn random_slice(r: &mut Rng, name: &str) -> Slice {
        let address_type =
            [AddressType::IPv4, AddressType::IPv6, AddressType::Other][r.below(3) as usize];
        let ports = (0..r.below(3))
            .map(|_| SlicePort {
                name: ["http", ""][r.below(2) as usize].into(),
                port: 80 + r.below(2) as u16,
            })
            .collect();
        let endpoints = (0..r.below(6))
            .map(|_| {
                let n = r.below(5) as u8;
                let address: IpAddr = if address_type == AddressType::IPv6 {
                    format!("fd00::{n}").parse().unwrap()
                } else {
                    IpAddr::from([10, 0, 0, n])
                };
                let zone =
                    |r: &mut Rng| (r.below(3) > 0).then(|| format!("z{}", r.below(3)).into());
                SliceEndpoint {
                    address,
                    ready: r.flag(),
                    serving: r.flag(),
                    terminating: r.flag(),
                    zone: zone(r),
                    node_name: zone(r),
                    hints_zones: zone(r),
                    hints_nodes: None,
                }
            })
            .collect();
        Slice {
            key: slice_key(name),
            service: svc(["web", "api"][r.below(4).min(1) as usize]),
            address_type,
            ports,
            endpoints,
        }
    }

    #[test]
    fn kept_slice_by_slice_it_equals_the_index_view() {
        let families = [IpFamily::Auto, IpFamily::Ipv4, IpFamily::Ipv6];
        let mut r = Rng(0x9E37_79B9_7F4A_7C15);
        let mut ix = Index::new();
        let mut views: Vec<(IpFamily, &str, PortView)> = Vec::new();
        for f in families {
            for port in ["http", ""] {
                views.push((f, port, PortView::new(port, f)));
            }
        }
        let names = ["w-a", "w-b", "w-c", "w-d", "w-e"];
        let mut flips = 0;
        for step in 0..3000 {
            let name = names[r.below(names.len() as u64) as usize];
            let key = slice_key(name);
            if r.below(5) == 0 {
                ix.delete(&key);
            } else {
                ix.apply(random_slice(&mut r, name));
            }
            let web = svc("web");
            for (family, port, view) in &mut views {
                let mut known: BTreeMap<SocketAddr, Endpoint> =
                    view.endpoints().into_iter().map(|e| (e.addr, e)).collect();
                let was = view.served;
                let mut changes = Vec::new();
                let now = ix.slice(&key).filter(|s| s.service == web);
                view.put(name, now, &mut changes);
                flips += usize::from(view.served != was);
                let got = view.endpoints();
                let want: Vec<Endpoint> = ix.view(&web, port, *family).into_values().collect();
                assert_eq!(got, want, "step {step}, {family:?} {port:?}");
                assert_eq!(view.len(), want.len());
                // The changes, applied in order, lead from before to after.
                for c in changes {
                    assert_ne!(c.old, c.new);
                    assert_eq!(known.get(&c.addr), c.old.as_ref(), "step {step}");
                    match c.new {
                        Some(e) => known.insert(c.addr, e),
                        None => known.remove(&c.addr),
                    };
                }
                assert_eq!(known.into_values().collect::<Vec<_>>(), want, "step {step}");
            }
        }
        assert!(flips > 10, "Auto switched families {flips} times");
    }
}
