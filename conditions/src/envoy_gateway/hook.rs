//! PostEndpointsModify as a pure function: Envoy Gateway's
//! ClusterLoadAssignment + the index -> the assignment Envoy gets.
//!
//! - A locality is **managed** when EG's metadata names a Service (`naming`)
//!   that has slices in the index: the index holds only the slices of
//!   managed Services (the `--manage` selector, or the slice directory).
//!   An assignment with no managed locality is not touched at all (the
//!   service then echoes EG's bytes).
//! - Each endpoint of a managed locality is found by `address:port` among
//!   that Service's slice ports of that number (EG wrote the slice port
//!   number of the backendRef's Service port), in the address's family.
//!   Found: its conditions metadata (other metadata namespaces, such as EG's
//!   TLS transport-socket match, are kept) and health (serving HEALTHY, not
//!   serving UNHEALTHY), as the `eds` mode writes them.
//! - **Doubts**: an endpoint the index does not know, or whose conditions
//!   say something else than EG's health (EG: DRAINING iff `terminating ||
//!   !serving`). One of the two is behind. The caller may re-read the
//!   Service's slices and call again with the Service in `trusted`; then a
//!   disagreement is settled by the index (just read from the source).
//!   Otherwise a doubtful endpoint is left exactly as EG sent it (EG's
//!   health, no conditions metadata): the behaviour without the companion,
//!   never worse. An unknown endpoint is always left as EG sent it.
//! - With the priority output: localities keep EG's grouping, weights and
//!   metadata, and each managed one is split by tier: serving and not
//!   terminating at `2p`, serving and terminating at `2p + 1` (`p`: EG's
//!   priority, 1 for `fallback` Backends), not serving left out; endpoints
//!   left as EG sent them go by EG's health (UNKNOWN/HEALTHY/DEGRADED at
//!   `2p`, DRAINING at `2p + 1`). Unmanaged localities stay at `2p`. The
//!   priorities used are then renumbered 0, 1, ... in order, and
//!   `policy.overprovisioning_factor` is raised (`assignment`) so that
//!   nothing spills while a higher priority has a healthy host.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};

use envoy_types::pb::envoy::config::core::v3::{address, socket_address, HealthStatus};
use envoy_types::pb::envoy::config::endpoint::v3::{
    cluster_load_assignment::Policy, lb_endpoint, ClusterLoadAssignment, LbEndpoint,
    LocalityLbEndpoints,
};
use envoy_types::pb::google::protobuf::UInt32Value;

use super::naming::{locality_backend, NotAService};
use crate::assignment::{set_conditions, Output, OVERPROVISIONING_FACTOR};
use crate::endpoint::{Conditions, Endpoint};
use crate::index::{Index, IpFamily};
use crate::slice::ServiceKey;

/// An endpoint the index and EG do not agree on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Doubt {
    /// EG has it, the index does not.
    Unknown {
        service: ServiceKey,
        addr: SocketAddr,
    },
    /// EG's health says otherwise than the index's conditions.
    Disagrees {
        service: ServiceKey,
        addr: SocketAddr,
        eg_draining: bool,
        ours: Conditions,
    },
}

impl Doubt {
    pub fn service(&self) -> &ServiceKey {
        match self {
            Doubt::Unknown { service, .. } | Doubt::Disagrees { service, .. } => service,
        }
    }
}

/// What the hook did to one assignment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// False: nothing managed, the assignment is untouched.
    pub managed: bool,
    /// The managed Services named in the assignment.
    pub services: BTreeSet<ServiceKey>,
    /// Endpoints given the index's conditions.
    pub annotated: usize,
    /// Doubtful endpoints left as EG sent them (re-read candidates).
    pub doubts: Vec<Doubt>,
    /// Disagreements settled by the index (Service in `trusted`).
    pub overruled: usize,
    /// Not serving endpoints left out (priority output).
    pub dropped: usize,
    /// Localities of a managed assignment that name no Service.
    pub not_services: usize,
}

/// EG's drain rule applied to conditions (nil values already resolved).
pub fn eg_would_drain(c: Conditions) -> bool {
    c.terminating || !c.serving
}

/// An lb_endpoint's socket address, if it has one.
pub fn lb_addr(lb: &LbEndpoint) -> Option<SocketAddr> {
    let lb_endpoint::HostIdentifier::Endpoint(e) = lb.host_identifier.as_ref()? else {
        return None;
    };
    let address::Address::SocketAddress(sa) = e.address.as_ref()?.address.as_ref()? else {
        return None;
    };
    let Some(socket_address::PortSpecifier::PortValue(port)) = sa.port_specifier else {
        return None;
    };
    let ip: IpAddr = sa.address.parse().ok()?;
    Some(SocketAddr::new(ip, u16::try_from(port).ok()?))
}

type Lookup = HashMap<SocketAddr, Endpoint>;

/// A Service's endpoints at slice port `port`, in one family, copies merged
/// (the index's rule), over every port name with that number.
fn lookup(index: &Index, service: &ServiceKey, port: u16, v6: bool) -> Lookup {
    let names: BTreeSet<&str> = index
        .slices_of(service)
        .flat_map(|s| s.ports.iter())
        .filter(|p| p.port == port)
        .map(|p| p.name.as_str())
        .collect();
    let family = if v6 { IpFamily::Ipv6 } else { IpFamily::Ipv4 };
    let mut out: Lookup = HashMap::new();
    for name in names {
        for (addr, ep) in index.view(service, name, family) {
            if addr.port() != port {
                continue;
            }
            match out.get_mut(&addr) {
                Some(first) => first.conditions = first.conditions.cautious(ep.conditions),
                None => {
                    out.insert(addr, ep);
                }
            }
        }
    }
    out
}

/// The tier of an endpoint left as EG sent it (priority output).
fn eg_tier(lb: &LbEndpoint) -> u32 {
    match HealthStatus::try_from(lb.health_status) {
        Ok(HealthStatus::Unknown | HealthStatus::Healthy | HealthStatus::Degraded) => 0,
        _ => 1,
    }
}

/// Modifies `cla` in place (module doc). `trusted`: Services whose slices
/// were just re-read, whose disagreements the index settles.
pub fn modify(
    cla: &mut ClusterLoadAssignment,
    index: &Index,
    trusted: &BTreeSet<ServiceKey>,
    out: &Output,
) -> Answer {
    let mut answer = Answer::default();
    // Which localities are managed, by which Service.
    let owners: Vec<Option<ServiceKey>> = cla
        .endpoints
        .iter()
        .map(|l| match locality_backend(l) {
            Ok(b) if index.slices_of(&b.service).next().is_some() => Some(b.service),
            Ok(_) => None,
            Err(NotAService::NoMetadata | NotAService::Kind(_) | NotAService::Ambiguous) => None,
        })
        .collect();
    if owners.iter().all(Option::is_none) {
        return answer;
    }
    answer.managed = true;
    answer.not_services = owners.iter().filter(|o| o.is_none()).count();

    // Per Service, per (slice port, IPv6): built once per call.
    let mut lookups: HashMap<ServiceKey, HashMap<(u16, bool), Lookup>> = HashMap::new();
    let mut split: Vec<(u32, LocalityLbEndpoints)> = Vec::with_capacity(cla.endpoints.len() * 2);
    for (mut loc, owner) in std::mem::take(&mut cla.endpoints).into_iter().zip(owners) {
        let base = loc.priority.saturating_mul(2);
        let Some(service) = owner else {
            split.push((base, loc));
            continue;
        };
        answer.services.insert(service.clone());
        // One clone per locality, not per endpoint.
        let by_port = lookups.entry(service.clone()).or_default();
        let mut tiers: [Vec<LbEndpoint>; 2] = [Vec::new(), Vec::new()];
        for mut lb in std::mem::take(&mut loc.lb_endpoints) {
            let Some(addr) = lb_addr(&lb) else {
                tiers[eg_tier(&lb) as usize].push(lb);
                continue;
            };
            let map = by_port
                .entry((addr.port(), addr.is_ipv6()))
                .or_insert_with(|| lookup(index, &service, addr.port(), addr.is_ipv6()));
            let tier = match map.get(&addr) {
                None => {
                    answer.doubts.push(Doubt::Unknown {
                        service: service.clone(),
                        addr,
                    });
                    Some(eg_tier(&lb))
                }
                Some(ep) => {
                    let eg_draining = lb.health_status == HealthStatus::Draining as i32;
                    let agrees = eg_would_drain(ep.conditions) == eg_draining;
                    if agrees || trusted.contains(&service) {
                        answer.overruled += usize::from(!agrees);
                        answer.annotated += 1;
                        set_conditions(&mut lb, ep, out);
                        ep.conditions.priority()
                    } else {
                        answer.doubts.push(Doubt::Disagrees {
                            service: service.clone(),
                            addr,
                            eg_draining,
                            ours: ep.conditions,
                        });
                        Some(eg_tier(&lb))
                    }
                }
            };
            match (out.priorities, tier) {
                (false, _) => tiers[0].push(lb),
                (true, Some(t)) => tiers[t.min(1) as usize].push(lb),
                (true, None) => answer.dropped += 1,
            }
        }
        let [first, second] = tiers;
        if second.is_empty() {
            loc.lb_endpoints = first;
            split.push((base, loc));
        } else {
            let mut terminating = loc.clone();
            terminating.lb_endpoints = second;
            if !first.is_empty() {
                loc.lb_endpoints = first;
                split.push((base, loc));
            }
            split.push((base + 1, terminating));
        }
    }
    if out.priorities {
        // Renumber the priorities used to 0, 1, ... (Envoy wants no gaps).
        let used: BTreeMap<u32, u32> = split
            .iter()
            .map(|(p, _)| *p)
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .zip(0..)
            .collect();
        split.sort_by_key(|(p, _)| *p);
        cla.endpoints = split
            .into_iter()
            .map(|(p, mut l)| {
                l.priority = used.get(&p).copied().unwrap_or(0);
                l
            })
            .collect();
        let policy = cla.policy.get_or_insert_with(Policy::default);
        policy.overprovisioning_factor = Some(UInt32Value {
            value: OVERPROVISIONING_FACTOR,
        });
    } else {
        cla.endpoints = split.into_iter().map(|(_, l)| l).collect();
    }
    answer
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::envoy_gateway::eg_shape::{
        eg_draining, resource_metadata, rule_assignments, BackendRef, EgEndpoint, ResourceRef,
    };
    use crate::slice::Slice;
    use envoy_types::pb::envoy::config::core::v3::Metadata;
    use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};

    /// (ready, serving, terminating) of the seed table's states.
    const READY: (bool, bool, bool) = (true, true, false);
    const SERVING_TERMINATING: (bool, bool, bool) = (false, true, true);
    const TERMINATING_NOT_SERVING: (bool, bool, bool) = (false, false, true);
    const NOT_SERVING: (bool, bool, bool) = (false, false, false);

    fn svc(name: &str) -> ServiceKey {
        ServiceKey {
            namespace: "shop".into(),
            name: name.into(),
        }
    }

    /// A slice of `service` with port `http` = `port` and these endpoints,
    /// read from kubectl JSON as every source reads slices.
    fn slice(name: &str, service: &str, port: u16, eps: &[(&str, (bool, bool, bool))]) -> Slice {
        slice_ports(name, service, &[("http", port)], eps)
    }

    fn slice_ports(
        name: &str,
        service: &str,
        ports: &[(&str, u16)],
        eps: &[(&str, (bool, bool, bool))],
    ) -> Slice {
        let obj = serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "ports": ports.iter().map(|(n, p)| serde_json::json!({"name": n, "port": p, "protocol": "TCP"})).collect::<Vec<_>>(),
            "endpoints": eps.iter().map(|(ip, (r, s, t))| serde_json::json!({
                "addresses": [ip], "zone": "zone-a",
                "conditions": {"ready": r, "serving": s, "terminating": t}
            })).collect::<Vec<_>>(),
        });
        Slice::from_k8s(&serde_json::from_value(obj).unwrap())
            .unwrap()
            .0
    }

    /// What EG sends for these slice endpoints (its drain rule).
    fn eg_ref(service: &str, port: u16, eps: &[(&str, (bool, bool, bool))]) -> BackendRef {
        BackendRef {
            service: svc(service),
            port: 80,
            weight: None,
            endpoints: eps
                .iter()
                .map(|(ip, (r, s, t))| EgEndpoint {
                    addr: SocketAddr::new(ip.parse().unwrap(), port),
                    draining: eg_draining(Some(*r), Some(*s), Some(*t)),
                    zone: Some("zone-a".into()),
                })
                .collect(),
        }
    }

    fn index(slices: Vec<Slice>) -> Index {
        let mut ix = Index::new();
        ix.replace(slices);
        ix
    }

    fn md_bool(lb: &LbEndpoint, key: &str) -> Option<bool> {
        match lb
            .metadata
            .as_ref()?
            .filter_metadata
            .get("k8s.endpointslice")?
            .fields
            .get(key)?
            .kind
        {
            Some(Kind::BoolValue(b)) => Some(b),
            _ => None,
        }
    }

    fn health(lb: &LbEndpoint) -> HealthStatus {
        HealthStatus::try_from(lb.health_status).unwrap()
    }

    /// (addr, priority, health, serving metadata) of every endpoint.
    fn view(cla: &ClusterLoadAssignment) -> Vec<(String, u32, HealthStatus, Option<bool>)> {
        cla.endpoints
            .iter()
            .flat_map(|l| {
                l.lb_endpoints.iter().map(move |lb| {
                    (
                        lb_addr(lb).unwrap().to_string(),
                        l.priority,
                        health(lb),
                        md_bool(lb, "serving"),
                    )
                })
            })
            .collect()
    }

    fn run(ix: &Index, refs: &[BackendRef], priorities: bool) -> (ClusterLoadAssignment, Answer) {
        let mut cla = rule_assignments("shop", "app", 0, refs, false).remove(0);
        let out = Output {
            priorities,
            ..Output::default()
        };
        let a = modify(&mut cla, ix, &BTreeSet::new(), &out);
        (cla, a)
    }

    #[test]
    fn seed_rows_get_the_conditions_eg_cannot_send() {
        use HealthStatus::{Healthy, Unhealthy};
        // Row 4: A serving+terminating, B not yet serving. EG: both DRAINING.
        let eps = [("10.0.0.1", SERVING_TERMINATING), ("10.0.0.2", NOT_SERVING)];
        let ix = index(vec![slice("web-1", "web", 8080, &eps)]);
        let (cla, a) = run(&ix, &[eg_ref("web", 8080, &eps)], false);
        assert!(a.managed && a.doubts.is_empty());
        assert_eq!(a.annotated, 2);
        assert_eq!(
            view(&cla),
            vec![
                ("10.0.0.1:8080".into(), 0, Healthy, Some(true)),
                ("10.0.0.2:8080".into(), 0, Unhealthy, Some(false)),
            ]
        );
        let lb = &cla.endpoints[0].lb_endpoints[0];
        assert_eq!(md_bool(lb, "terminating"), Some(true));
        assert_eq!(md_bool(lb, "ready"), Some(false));
        // EG's locality, weight and metadata are kept.
        assert_eq!(
            cla.endpoints[0].locality.as_ref().unwrap().region,
            "httproute/shop/app/rule/0/backend/0"
        );
        assert!(cla.endpoints[0].metadata.is_some());

        // Priority output: A alone at priority 0 (its tier), B left out.
        let (cla, a) = run(&ix, &[eg_ref("web", 8080, &eps)], true);
        assert_eq!(a.dropped, 1);
        assert_eq!(
            view(&cla),
            vec![("10.0.0.1:8080".into(), 0, Healthy, Some(true))]
        );
        assert_eq!(
            cla.policy.unwrap().overprovisioning_factor.unwrap().value,
            OVERPROVISIONING_FACTOR
        );

        // Row 5: A serving+terminating, B serving: B at 0, A at 1.
        let eps = [("10.0.0.1", SERVING_TERMINATING), ("10.0.0.2", READY)];
        let ix = index(vec![slice("web-1", "web", 8080, &eps)]);
        let (cla, _) = run(&ix, &[eg_ref("web", 8080, &eps)], true);
        assert_eq!(
            view(&cla),
            vec![
                ("10.0.0.2:8080".into(), 0, Healthy, Some(true)),
                ("10.0.0.1:8080".into(), 1, Healthy, Some(true)),
            ]
        );
        // Row 6: A terminating not serving, B serving.
        let eps = [("10.0.0.1", TERMINATING_NOT_SERVING), ("10.0.0.2", READY)];
        let ix = index(vec![slice("web-1", "web", 8080, &eps)]);
        let (cla, _) = run(&ix, &[eg_ref("web", 8080, &eps)], false);
        assert_eq!(
            view(&cla),
            vec![
                ("10.0.0.1:8080".into(), 0, Unhealthy, Some(false)),
                ("10.0.0.2:8080".into(), 0, Healthy, Some(true)),
            ]
        );
    }

    #[test]
    fn unmanaged_assignments_are_untouched() {
        let eps = [("10.0.0.1", READY)];
        // The index knows "web", EG sends "api".
        let ix = index(vec![slice("web-1", "web", 8080, &eps)]);
        let mut cla =
            rule_assignments("shop", "app", 0, &[eg_ref("api", 8080, &eps)], false).remove(0);
        let before = cla.clone();
        let a = modify(&mut cla, &ix, &BTreeSet::new(), &Output::default());
        assert!(!a.managed);
        assert_eq!(cla, before);
        // No EG metadata at all (not a route backend): untouched.
        let mut bare = before.clone();
        bare.endpoints[0].metadata = None;
        let copy = bare.clone();
        assert!(!modify(&mut bare, &ix, &BTreeSet::new(), &Output::default()).managed);
        assert_eq!(bare, copy);
    }

    #[test]
    fn doubts_leave_egs_view_until_trusted() {
        // EG saw A become not ready (DRAINING); the index still says ready.
        // EG also has C, which the index has not seen yet.
        let ix = index(vec![slice("web-1", "web", 8080, &[("10.0.0.1", READY)])]);
        let eg = eg_ref(
            "web",
            8080,
            &[("10.0.0.1", NOT_SERVING), ("10.0.0.3", READY)],
        );
        let (cla, a) = run(&ix, std::slice::from_ref(&eg), false);
        assert!(a.managed);
        assert_eq!(a.annotated, 0);
        assert_eq!(
            a.doubts,
            vec![
                Doubt::Disagrees {
                    service: svc("web"),
                    addr: "10.0.0.1:8080".parse().unwrap(),
                    eg_draining: true,
                    ours: Conditions {
                        ready: true,
                        serving: true,
                        terminating: false
                    },
                },
                Doubt::Unknown {
                    service: svc("web"),
                    addr: "10.0.0.3:8080".parse().unwrap(),
                },
            ]
        );
        // Both left exactly as EG sent them.
        let sent = rule_assignments("shop", "app", 0, std::slice::from_ref(&eg), false).remove(0);
        assert_eq!(cla, sent);

        // Priority output: EG's DRAINING one at priority 1, the unknown ready one at 0.
        let (cla, _) = run(&ix, std::slice::from_ref(&eg), true);
        assert_eq!(
            view(&cla),
            vec![
                ("10.0.0.3:8080".into(), 0, HealthStatus::Unknown, None),
                ("10.0.0.1:8080".into(), 1, HealthStatus::Draining, None),
            ]
        );

        // After a re-read (trusted), the index settles the disagreement.
        let mut cla = sent.clone();
        let trusted: BTreeSet<ServiceKey> = [svc("web")].into_iter().collect();
        let a = modify(&mut cla, &ix, &trusted, &Output::default());
        assert_eq!((a.annotated, a.overruled, a.doubts.len()), (1, 1, 1));
        assert_eq!(
            health(&cla.endpoints[0].lb_endpoints[0]),
            HealthStatus::Healthy
        );
    }

    #[test]
    fn naming_one_service_weights_and_several_backend_refs() {
        let web = [("10.0.0.1", SERVING_TERMINATING), ("10.0.0.2", READY)];
        let api = [("10.0.1.1", READY)];
        let ix = index(vec![
            slice("web-1", "web", 8080, &web),
            slice("api-1", "api", 9090, &api),
        ]);
        // backendRefs: web (weight 3), other (zero weight: left out by EG),
        // api (weight 1), unmanaged (weight 2).
        let mut refs = vec![
            eg_ref("web", 8080, &web),
            eg_ref("other", 80, &[("10.0.2.1", READY)]),
            eg_ref("api", 9090, &api),
            eg_ref("unmanaged", 7070, &[("10.0.3.1", SERVING_TERMINATING)]),
        ];
        refs[0].weight = Some(3);
        refs[1].weight = Some(0);
        refs[2].weight = Some(1);
        refs[3].weight = Some(2);
        let (cla, a) = run(&ix, &refs, true);
        assert_eq!(a.services, [svc("web"), svc("api")].into_iter().collect());
        assert_eq!(a.not_services, 1);
        let locs: Vec<(String, u32, u32, usize)> = cla
            .endpoints
            .iter()
            .map(|l| {
                (
                    l.locality.as_ref().unwrap().region.clone(),
                    l.load_balancing_weight.unwrap().value,
                    l.priority,
                    l.lb_endpoints.len(),
                )
            })
            .collect();
        let r = |j: usize| format!("httproute/shop/app/rule/0/backend/{j}");
        assert_eq!(
            locs,
            vec![
                (r(0), 3, 0, 1), // web's ready pod
                (r(2), 1, 0, 1), // api
                (r(3), 2, 0, 1), // unmanaged: EG's view, at the ready level
                (r(0), 3, 1, 1), // web's terminating pod
            ]
        );
        // The unmanaged locality is exactly EG's.
        let sent = rule_assignments("shop", "app", 0, &refs, false).remove(0);
        assert_eq!(cla.endpoints[2], sent.endpoints[2]);
    }

    #[test]
    fn zonal_localities_and_tls_metadata_are_kept() {
        let eps = [("10.0.0.1", READY), ("10.0.0.2", SERVING_TERMINATING)];
        let mut s = slice("web-1", "web", 8080, &eps);
        s.endpoints[1].zone = Some("zone-b".into());
        let ix = index(vec![s]);
        let mut r = eg_ref("web", 8080, &eps);
        r.endpoints[1].zone = Some("zone-b".into());
        let mut clas = rule_assignments("shop", "app", 0, &[r], true);
        assert_eq!(clas.len(), 1);
        let mut cla = clas.remove(0);
        assert_eq!(cla.cluster_name, "httproute/shop/app/rule/0/backend/0");
        // EG's TLS transport-socket match on an endpoint survives.
        let tls = Metadata {
            filter_metadata: [(
                "envoy.transport_socket_match".to_string(),
                Struct {
                    fields: [(
                        "name".to_string(),
                        Value {
                            kind: Some(Kind::StringValue("c/tls/0".into())),
                        },
                    )]
                    .into_iter()
                    .collect(),
                },
            )]
            .into_iter()
            .collect(),
            ..Default::default()
        };
        cla.endpoints[0].lb_endpoints[0].metadata = Some(tls);
        let a = modify(&mut cla, &ix, &BTreeSet::new(), &Output::default());
        assert_eq!(a.annotated, 2);
        let zones: Vec<&str> = cla
            .endpoints
            .iter()
            .map(|l| l.locality.as_ref().unwrap().zone.as_str())
            .collect();
        assert_eq!(zones, vec!["zone-a", "zone-b"]);
        let md = cla.endpoints[0].lb_endpoints[0].metadata.as_ref().unwrap();
        assert!(md
            .filter_metadata
            .contains_key("envoy.transport_socket_match"));
        assert!(md.filter_metadata.contains_key("k8s.endpointslice"));
    }

    #[test]
    fn a_port_number_shared_by_several_port_names_and_named_target_ports() {
        // Two Service ports target 8080 (names http and alt); another slice
        // resolves the named target port to 9090 for its pod.
        let a = slice_ports(
            "web-a",
            "web",
            &[("http", 8080), ("alt", 8080)],
            &[("10.0.0.1", READY)],
        );
        let b = slice("web-b", "web", 9090, &[("10.0.0.2", SERVING_TERMINATING)]);
        let ix = index(vec![a, b]);
        let mut r = eg_ref("web", 8080, &[("10.0.0.1", READY)]);
        r.endpoints.push(EgEndpoint {
            addr: "10.0.0.2:9090".parse().unwrap(),
            draining: true,
            zone: None,
        });
        let (cla, a) = run(&ix, &[r], false);
        assert!(a.doubts.is_empty(), "{:?}", a.doubts);
        assert_eq!(a.annotated, 2);
        assert_eq!(
            view(&cla)[1],
            ("10.0.0.2:9090".into(), 0, HealthStatus::Healthy, Some(true))
        );
    }

    #[test]
    fn eg_fallback_priorities_stay_below_terminating_ones() {
        // EG priority 1 (a fallback backend, here a managed Service for the test).
        let web = [("10.0.0.1", SERVING_TERMINATING), ("10.0.0.2", READY)];
        let ix = index(vec![slice("web-1", "web", 8080, &web)]);
        let mut cla =
            rule_assignments("shop", "app", 0, &[eg_ref("web", 8080, &web)], false).remove(0);
        let mut fallback = cla.endpoints[0].clone();
        fallback.priority = 1;
        fallback.metadata = Some(resource_metadata(&[ResourceRef {
            kind: "Backend".into(),
            namespace: "shop".into(),
            name: "static".into(),
            section_name: None,
        }]));
        cla.endpoints.push(fallback);
        let out = Output {
            priorities: true,
            ..Output::default()
        };
        modify(&mut cla, &ix, &BTreeSet::new(), &out);
        let p: Vec<(u32, usize)> = cla
            .endpoints
            .iter()
            .map(|l| (l.priority, l.lb_endpoints.len()))
            .collect();
        // ready web at 0, terminating web at 1, the fallback Backend at 2.
        assert_eq!(p, vec![(0, 1), (1, 1), (2, 2)]);
    }
}
