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
//! - With the tiered output (the default; not with `--flat-output`):
//!   localities keep EG's grouping, weights and metadata, and each managed
//!   one is split by tier: serving and not
//!   terminating at `2p`, serving and terminating at `2p + 1` (`p`: EG's
//!   priority, 1 for `fallback` Backends), not serving left out; endpoints
//!   left as EG sent them go by EG's health (UNKNOWN/HEALTHY/DEGRADED at
//!   `2p`, DRAINING at `2p + 1`). Unmanaged localities stay at `2p`. The
//!   priorities used are then renumbered 0, 1, ... in order, and
//!   `policy.overprovisioning_factor` is raised (`assignment`) so that
//!   nothing spills while a higher priority has a healthy host.

//!
//! **On the wire.** The assignment is edited in its encoded form (`field_edit`):
//! the fields the hook does not change are copied byte for byte (EG's
//! locality metadata, unmanaged localities, unknown fields), each annotated
//! endpoint gets its health status and its conditions metadata, encoded
//! when the Service's slices changed (`prepared`). Only what the hook reads
//! is decoded: each locality's metadata and each managed endpoint. The
//! result decodes to what editing the decoded assignment would give (a
//! repeated embedded message merges, a map entry replaces the key's
//! earlier one, the last scalar wins), so the edit is done once, in place:
//! an endpoint's fields other than health and metadata, and its metadata
//! entries other than the conditions namespace, stay as EG wrote them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use envoy_types::pb::envoy::config::core::v3::{address, socket_address, HealthStatus, Metadata};
use envoy_types::pb::envoy::config::endpoint::v3::{lb_endpoint, LbEndpoint};
use prost::encoding::WireType;
use prost::Message;

use super::field_edit::{
    fields, len_field_size, put_len_head, put_varint, varint_field_size, Field, Malformed,
};
use super::naming::metadata_backend;
use super::prepared::{Annotation, PreparedIndex, ServiceEndpoints};
use serving_picker_core::contract::SliceConditions;

use crate::eds::assignment::{health_status, Output, OVERPROVISIONING_FACTOR};
use crate::model::slice::ServiceKey;

/// An endpoint the index and EG do not agree on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Doubt {
    /// EG has it, the index does not.
    Unknown {
        /// The Service whose locality lists it.
        service: ServiceKey,
        /// Its address and port as EG wrote them.
        addr: SocketAddr,
    },
    /// EG's health says otherwise than the index's conditions.
    Disagrees {
        /// The Service whose locality lists it.
        service: ServiceKey,
        /// Its address and port as EG wrote them.
        addr: SocketAddr,
        /// EG sent it `DRAINING`.
        eg_draining: bool,
        /// Its conditions in the index.
        ours: SliceConditions,
    },
}

impl Doubt {
    /// The Service the endpoint belongs to (what a re-read reads).
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
    /// Not serving endpoints left out (tiered output).
    pub dropped: usize,
    /// Localities of a managed assignment that name no managed Service.
    pub not_services: usize,
    /// Distinct backends (Service and port) of its managed localities.
    pub backends: usize,
}

/// The hook's result for one assignment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Modified {
    /// What the hook did.
    pub answer: Answer,
    /// The encoded assignment to send; `None` when nothing is managed (EG's
    /// bytes go back untouched).
    pub assignment: Option<Vec<u8>>,
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

/// The assignment's cluster name (for logs; "" when it has none).
pub fn cluster_name(cla: &[u8]) -> String {
    fields(cla)
        .map_while(Result::ok)
        .filter(|f| f.number == CLA_CLUSTER_NAME)
        .last()
        .map(|f| String::from_utf8_lossy(f.payload).into_owned())
        .unwrap_or_default()
}

/// The tier of an endpoint left as EG sent it (tiered output).
fn eg_tier(lb: &LbEndpoint) -> u32 {
    match HealthStatus::try_from(lb.health_status) {
        Ok(HealthStatus::Unknown | HealthStatus::Healthy | HealthStatus::Degraded) => 0,
        _ => 1,
    }
}

// Field numbers (envoy.config.endpoint.v3, envoy.config.core.v3).
const CLA_CLUSTER_NAME: u32 = 1;
const CLA_ENDPOINTS: u32 = 2;
const CLA_POLICY: u32 = 4;
const POLICY_OVERPROVISIONING_FACTOR: u32 = 3;
const LOCALITY_LB_ENDPOINTS: u32 = 2;
const LOCALITY_PRIORITY: u32 = 5;
const LOCALITY_METADATA: u32 = 9;
const LB_HEALTH_STATUS: u32 = 2;
const LB_METADATA: u32 = 3;
const METADATA_FILTER_METADATA: u32 = 1;
const MAP_KEY: u32 = 1;
const MAP_VALUE: u32 = 2;
const UINT32_VALUE: u32 = 1;

fn payload_of<'a>(f: &Field<'a>) -> Result<&'a [u8], Malformed> {
    if f.wire_type == WireType::LengthDelimited {
        Ok(f.payload)
    } else {
        Err(Malformed)
    }
}

/// One LocalityLbEndpoints of EG's assignment, walked.
struct Locality<'a> {
    /// The whole field (copied when nothing in it changes).
    raw: &'a [u8],
    /// Its fields but lb_endpoints and priority, in wire order.
    other: Vec<&'a [u8]>,
    priority: u32,
    lb_endpoints: Vec<&'a [u8]>,
    metadata: Option<Metadata>,
}

fn walk_locality<'a>(raw: &'a [u8], msg: &'a [u8]) -> Result<Locality<'a>, Malformed> {
    let mut l = Locality {
        raw,
        other: Vec::new(),
        priority: 0,
        lb_endpoints: Vec::new(),
        metadata: None,
    };
    for f in fields(msg) {
        let f = f?;
        match f.number {
            LOCALITY_LB_ENDPOINTS => l.lb_endpoints.push(payload_of(&f)?),
            LOCALITY_PRIORITY if f.wire_type == WireType::Varint => l.priority = f.varint as u32,
            LOCALITY_PRIORITY => return Err(Malformed),
            LOCALITY_METADATA => {
                // A repeated embedded message merges, as prost decodes it.
                l.metadata
                    .get_or_insert_with(Metadata::default)
                    .merge(payload_of(&f)?)
                    .map_err(|_| Malformed)?;
                l.other.push(f.raw);
            }
            _ => l.other.push(f.raw),
        }
    }
    Ok(l)
}

/// Where encoded bytes go: a buffer, or a byte count (lengths come first).
trait Sink {
    fn raw(&mut self, bytes: &[u8]);
    fn len_head(&mut self, number: u32, len: usize);
    fn varint(&mut self, number: u32, value: u64);
}

impl Sink for Vec<u8> {
    fn raw(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
    fn len_head(&mut self, number: u32, len: usize) {
        put_len_head(self, number, len);
    }
    fn varint(&mut self, number: u32, value: u64) {
        put_varint(self, number, value);
    }
}

/// Counts what would be written.
#[derive(Default)]
struct Size(usize);

impl Sink for Size {
    fn raw(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
    fn len_head(&mut self, number: u32, len: usize) {
        self.0 += len_field_size(number, len) - len;
    }
    fn varint(&mut self, number: u32, value: u64) {
        self.0 += varint_field_size(number, value);
    }
}

/// An endpoint of the answer.
enum Lb<'a> {
    /// As EG sent it.
    Kept(&'a [u8]),
    /// With the index's health and conditions metadata; `len`: its size.
    Annotated {
        src: &'a [u8],
        annotation: &'a Annotation,
        len: usize,
    },
}

impl Lb<'_> {
    fn len(&self) -> usize {
        match self {
            Lb::Kept(src) => src.len(),
            Lb::Annotated { len, .. } => *len,
        }
    }
}

/// The metadata entries of `lb` kept beside the conditions: every field of
/// every metadata occurrence but a `filter_metadata` entry keyed `ns`.
fn other_metadata(lb: &[u8], ns: &[u8], sink: &mut impl Sink) {
    for f in fields(lb).flatten() {
        if f.number != LB_METADATA {
            continue;
        }
        for m in fields(f.payload).flatten() {
            if !(m.number == METADATA_FILTER_METADATA && map_key(m.payload) == ns) {
                sink.raw(m.raw);
            }
        }
    }
}

/// A map entry's key (the last one wins; absent: empty).
fn map_key(entry: &[u8]) -> &[u8] {
    fields(entry)
        .flatten()
        .filter(|e| e.number == MAP_KEY)
        .last()
        .map_or(&[][..], |e| e.payload)
}

/// Writes an annotated lb_endpoint's fields: EG's, but health and
/// metadata; the health; the metadata with the conditions entry.
fn annotated(lb: &[u8], annotation: &Annotation, ns: &[u8], sink: &mut impl Sink) {
    for f in fields(lb).flatten() {
        if f.number != LB_HEALTH_STATUS && f.number != LB_METADATA {
            sink.raw(f.raw);
        }
    }
    let health = health_status(annotation.conditions.eds_health());
    sink.varint(LB_HEALTH_STATUS, health as u64);
    let mut kept = Size::default();
    other_metadata(lb, ns, &mut kept);
    let struct_bytes = &annotation.metadata;
    let entry = len_field_size(MAP_KEY, ns.len()) + len_field_size(MAP_VALUE, struct_bytes.len());
    sink.len_head(
        LB_METADATA,
        kept.0 + len_field_size(METADATA_FILTER_METADATA, entry),
    );
    other_metadata(lb, ns, sink);
    sink.len_head(METADATA_FILTER_METADATA, entry);
    sink.len_head(MAP_KEY, ns.len());
    sink.raw(ns);
    sink.len_head(MAP_VALUE, struct_bytes.len());
    sink.raw(struct_bytes);
}

/// A locality of the answer.
enum LocalityOut<'a> {
    /// EG's, untouched.
    Same(&'a Locality<'a>),
    /// EG's fields with this priority and these endpoints.
    Rewritten {
        from: &'a Locality<'a>,
        priority: u32,
        lb_endpoints: Vec<Lb<'a>>,
    },
}

fn write_locality(out: &mut Vec<u8>, l: &LocalityOut<'_>, ns: &[u8]) {
    let (from, priority, lbs) = match l {
        LocalityOut::Same(from) => {
            out.extend_from_slice(from.raw);
            return;
        }
        LocalityOut::Rewritten {
            from,
            priority,
            lb_endpoints,
        } => (from, *priority, lb_endpoints),
    };
    let priority_len = if priority == 0 {
        0
    } else {
        varint_field_size(LOCALITY_PRIORITY, u64::from(priority))
    };
    let len = from.other.iter().map(|f| f.len()).sum::<usize>()
        + priority_len
        + lbs
            .iter()
            .map(|lb| len_field_size(LOCALITY_LB_ENDPOINTS, lb.len()))
            .sum::<usize>();
    put_len_head(out, CLA_ENDPOINTS, len);
    for f in &from.other {
        out.extend_from_slice(f);
    }
    if priority != 0 {
        put_varint(out, LOCALITY_PRIORITY, u64::from(priority));
    }
    for lb in lbs {
        put_len_head(out, LOCALITY_LB_ENDPOINTS, lb.len());
        match lb {
            Lb::Kept(src) => out.extend_from_slice(src),
            Lb::Annotated {
                src, annotation, ..
            } => annotated(src, annotation, ns, out),
        }
    }
}

/// The policy with the overprovisioning factor raised: every field of
/// every policy occurrence but that factor, then the factor.
fn write_policy(out: &mut Vec<u8>, policies: &[&[u8]]) -> Result<(), Malformed> {
    let mut kept = Vec::new();
    for p in policies {
        for f in fields(p) {
            let f = f?;
            if f.number != POLICY_OVERPROVISIONING_FACTOR {
                kept.push(f.raw);
            }
        }
    }
    let factor = varint_field_size(UINT32_VALUE, u64::from(OVERPROVISIONING_FACTOR));
    let len = kept.iter().map(|f| f.len()).sum::<usize>()
        + len_field_size(POLICY_OVERPROVISIONING_FACTOR, factor);
    put_len_head(out, CLA_POLICY, len);
    for f in kept {
        out.extend_from_slice(f);
    }
    put_len_head(out, POLICY_OVERPROVISIONING_FACTOR, factor);
    put_varint(out, UINT32_VALUE, u64::from(OVERPROVISIONING_FACTOR));
    Ok(())
}

/// Modifies EG's encoded assignment (module doc). `trusted`: Services whose
/// slices were just re-read, whose disagreements the index settles.
/// `Err`: the assignment (or a managed endpoint) does not decode.
pub fn modify(
    cla: &[u8],
    index: &PreparedIndex,
    trusted: &BTreeSet<ServiceKey>,
    out: &Output,
) -> Result<Modified, Malformed> {
    let mut answer = Answer::default();
    let top: Vec<Field<'_>> = fields(cla).collect::<Result<_, _>>()?;
    let localities: Vec<Locality<'_>> = top
        .iter()
        .filter(|f| f.number == CLA_ENDPOINTS)
        .map(|f| walk_locality(f.raw, payload_of(f)?))
        .collect::<Result<_, _>>()?;
    // Which localities are managed, by which Service.
    let mut backends = BTreeSet::new();
    let owners: Vec<Option<(ServiceKey, &ServiceEndpoints)>> = localities
        .iter()
        .map(|l| {
            let b = metadata_backend(l.metadata.as_ref()).ok()?;
            let eps = index.service(&b.service)?;
            backends.insert((b.service.clone(), b.section_name));
            Some((b.service, eps))
        })
        .collect();
    if owners.iter().all(Option::is_none) {
        return Ok(Modified {
            answer,
            assignment: None,
        });
    }
    answer.managed = true;
    answer.not_services = owners.iter().filter(|o| o.is_none()).count();
    answer.backends = backends.len();
    let ns = out.metadata_namespace.as_bytes();
    let mut split: Vec<(u32, LocalityOut<'_>)> = Vec::with_capacity(localities.len() * 2);
    for (loc, owner) in localities.iter().zip(owners) {
        let base = loc.priority.saturating_mul(2);
        match owner {
            None => split.push((base, LocalityOut::Same(loc))),
            Some((service, eps)) => {
                let [first, second] = tiers_of(loc, &service, eps, trusted, out, ns, &mut answer)?;
                answer.services.insert(service);
                let rewritten = |priority, lb_endpoints| LocalityOut::Rewritten {
                    from: loc,
                    priority,
                    lb_endpoints,
                };
                if second.is_empty() {
                    split.push((base, rewritten(loc.priority, first)));
                } else {
                    if !first.is_empty() {
                        split.push((base, rewritten(loc.priority, first)));
                    }
                    split.push((base + 1, rewritten(loc.priority, second)));
                }
            }
        }
    }
    let assignment = write_assignment(cla.len() + answer.annotated * 160, &top, split, out)?;
    Ok(Modified {
        answer,
        assignment: Some(assignment),
    })
}

/// The decision for a managed locality's endpoints: each one's tier and
/// what is written for it (the index's conditions, or EG's endpoint kept
/// when the index does not know it or disagrees without a re-read), as
/// tier 0 and tier 1 (with the tiered output; else all in tier 0).
/// Counts and doubts go to `answer`.
fn tiers_of<'a>(
    loc: &Locality<'a>,
    service: &ServiceKey,
    eps: &'a ServiceEndpoints,
    trusted: &BTreeSet<ServiceKey>,
    out: &Output,
    ns: &[u8],
    answer: &mut Answer,
) -> Result<[Vec<Lb<'a>>; 2], Malformed> {
    let mut tiers: [Vec<Lb<'a>>; 2] = [Vec::new(), Vec::new()];
    for &src in &loc.lb_endpoints {
        let lb = LbEndpoint::decode(src).map_err(|_| Malformed)?;
        let Some(addr) = lb_addr(&lb) else {
            tiers[eg_tier(&lb) as usize].push(Lb::Kept(src));
            continue;
        };
        let (tier, written) = match eps.get(&addr) {
            None => {
                answer.doubts.push(Doubt::Unknown {
                    service: service.clone(),
                    addr,
                });
                (Some(eg_tier(&lb)), Lb::Kept(src))
            }
            Some(annotation) => {
                let c = annotation.conditions;
                let eg_draining = lb.health_status == HealthStatus::Draining as i32;
                let agrees = c.eg_would_drain() == eg_draining;
                if agrees || trusted.contains(service) {
                    answer.overruled += usize::from(!agrees);
                    answer.annotated += 1;
                    let mut size = Size::default();
                    annotated(src, annotation, ns, &mut size);
                    let lb = Lb::Annotated {
                        src,
                        annotation,
                        len: size.0,
                    };
                    (c.tier().priority(), lb)
                } else {
                    answer.doubts.push(Doubt::Disagrees {
                        service: service.clone(),
                        addr,
                        eg_draining,
                        ours: c,
                    });
                    (Some(eg_tier(&lb)), Lb::Kept(src))
                }
            }
        };
        match (out.tiered(), tier) {
            (false, _) => tiers[0].push(written),
            (true, Some(t)) => tiers[t.min(1) as usize].push(written),
            (true, None) => answer.dropped += 1,
        }
    }
    Ok(tiers)
}

/// Writes the assignment: EG's other fields as they came, the localities
/// in `split` (with the tiered output renumbered 0, 1, ... and the
/// policy's overprovisioning factor set), `capacity` bytes reserved.
fn write_assignment(
    capacity: usize,
    top: &[Field<'_>],
    mut split: Vec<(u32, LocalityOut<'_>)>,
    out: &Output,
) -> Result<Vec<u8>, Malformed> {
    let ns = out.metadata_namespace.as_bytes();
    let mut buf = Vec::with_capacity(capacity);
    for f in top {
        if f.number != CLA_ENDPOINTS && !(out.tiered() && f.number == CLA_POLICY) {
            buf.extend_from_slice(f.raw);
        }
    }
    if !out.tiered() {
        for (_, l) in &split {
            write_locality(&mut buf, l, ns);
        }
        return Ok(buf);
    }
    // Renumber the priorities used to 0, 1, ... (Envoy wants no gaps).
    let used: BTreeMap<u32, u32> = split
        .iter()
        .map(|(p, _)| *p)
        .collect::<BTreeSet<u32>>()
        .into_iter()
        .zip(0..)
        .collect();
    split.sort_by_key(|(p, _)| *p);
    for (p, l) in split {
        let priority = used.get(&p).copied().unwrap_or(0);
        let l = match l {
            LocalityOut::Same(from) if from.priority != priority => LocalityOut::Rewritten {
                from,
                priority,
                lb_endpoints: from.lb_endpoints.iter().map(|s| Lb::Kept(s)).collect(),
            },
            same @ LocalityOut::Same(_) => same,
            LocalityOut::Rewritten {
                from, lb_endpoints, ..
            } => LocalityOut::Rewritten {
                from,
                priority,
                lb_endpoints,
            },
        };
        write_locality(&mut buf, &l, ns);
    }
    let policies: Vec<&[u8]> = top
        .iter()
        .filter(|f| f.number == CLA_POLICY)
        .map(payload_of)
        .collect::<Result<_, _>>()?;
    write_policy(&mut buf, &policies)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::envoy_gateway::testing::{
        eg_draining, resource_metadata, rule_assignments, BackendRef, EgEndpoint, ResourceRef,
    };
    use crate::model::slice::Slice;
    use crate::source::Change;
    use envoy_types::pb::envoy::config::core::v3::Metadata;
    use envoy_types::pb::envoy::config::endpoint::v3::{
        cluster_load_assignment::Policy, ClusterLoadAssignment,
    };
    use envoy_types::pb::google::protobuf::UInt32Value;
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

    fn index(slices: Vec<Slice>) -> PreparedIndex {
        let mut ix = PreparedIndex::new();
        ix.edit([Change::Replace(slices)]);
        ix
    }

    /// `modify` on a decoded assignment: encoded, modified, decoded back.
    fn modify_typed(
        cla: &mut ClusterLoadAssignment,
        ix: &PreparedIndex,
        trusted: &BTreeSet<ServiceKey>,
        out: &Output,
    ) -> Answer {
        let m = modify(&cla.encode_to_vec(), ix, trusted, out).unwrap();
        if let Some(bytes) = m.assignment {
            *cla = ClusterLoadAssignment::decode(bytes.as_slice()).unwrap();
        }
        m.answer
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

    fn run(
        ix: &PreparedIndex,
        refs: &[BackendRef],
        priorities: bool,
    ) -> (ClusterLoadAssignment, Answer) {
        let mut cla = rule_assignments("shop", "app", 0, refs, false).remove(0);
        let out = Output::with_tiers(priorities);
        let a = modify_typed(&mut cla, ix, &BTreeSet::new(), &out);
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
        let a = modify_typed(&mut cla, &ix, &BTreeSet::new(), &Output::default());
        assert!(!a.managed);
        assert_eq!(cla, before);
        // No EG metadata at all (not a route backend): untouched.
        let mut bare = before.clone();
        bare.endpoints[0].metadata = None;
        let copy = bare.clone();
        assert!(!modify_typed(&mut bare, &ix, &BTreeSet::new(), &Output::default()).managed);
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
                    ours: SliceConditions {
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
        let a = modify_typed(&mut cla, &ix, &trusted, &Output::default());
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
        let a = modify_typed(&mut cla, &ix, &BTreeSet::new(), &Output::default());
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
        let out = Output::default();
        modify_typed(&mut cla, &ix, &BTreeSet::new(), &out);
        let p: Vec<(u32, usize)> = cla
            .endpoints
            .iter()
            .map(|l| (l.priority, l.lb_endpoints.len()))
            .collect();
        // ready web at 0, terminating web at 1, the fallback Backend at 2.
        assert_eq!(p, vec![(0, 1), (1, 1), (2, 2)]);
    }

    #[test]
    fn an_annotated_endpoint_keeps_egs_other_fields_and_metadata() {
        use envoy_types::pb::google::protobuf::Any;
        let eps = [("10.0.0.1", SERVING_TERMINATING)];
        let ix = index(vec![slice("web-1", "web", 8080, &eps)]);
        let cla = rule_assignments("shop", "app", 0, &[eg_ref("web", 8080, &eps)], false).remove(0);
        let mut lb = cla.endpoints[0].lb_endpoints[0].clone();
        lb.load_balancing_weight = Some(UInt32Value { value: 5 });
        let strings = |k: &str, v: &str| Struct {
            fields: [(
                k.to_string(),
                Value {
                    kind: Some(Kind::StringValue(v.into())),
                },
            )]
            .into_iter()
            .collect(),
        };
        lb.metadata = Some(Metadata {
            filter_metadata: [
                (
                    "envoy.transport_socket_match".to_string(),
                    strings("name", "c/tls/0"),
                ),
                // A stale conditions entry: replaced, not merged.
                ("k8s.endpointslice".to_string(), strings("stale", "yes")),
            ]
            .into_iter()
            .collect(),
            typed_filter_metadata: [(
                "x".to_string(),
                Any {
                    type_url: "t".into(),
                    value: vec![1],
                },
            )]
            .into_iter()
            .collect(),
        });
        let mut src = lb.encode_to_vec();
        // A field this version of the protos does not know (111, varint 1).
        let unknown = [0xf8, 0x06, 0x01];
        src.extend_from_slice(&unknown);
        let annotation = ix
            .service(&svc("web"))
            .unwrap()
            .get(&"10.0.0.1:8080".parse().unwrap())
            .unwrap();
        let out = Output::default();
        let ns = out.metadata_namespace.as_bytes();
        let mut written = Vec::new();
        annotated(&src, annotation, ns, &mut written);
        let mut size = Size::default();
        annotated(&src, annotation, ns, &mut size);
        assert_eq!(size.0, written.len());
        assert!(written.windows(3).any(|w| w == unknown));
        // What setting the conditions on the decoded endpoint gives.
        let mut expected = lb;
        let ep = ix.endpoints(&svc("web"), "http", crate::model::index::IpFamily::Ipv4);
        crate::eds::assignment::set_conditions(&mut expected, &ep[0], &out);
        assert_eq!(LbEndpoint::decode(written.as_slice()).unwrap(), expected);
    }

    #[test]
    fn unmanaged_localities_are_copied_and_malformed_input_refused() {
        let web = [("10.0.0.1", READY)];
        let ix = index(vec![slice("web-1", "web", 8080, &web)]);
        let refs = [eg_ref("web", 8080, &web), eg_ref("api", 8080, &web)];
        let cla = rule_assignments("shop", "app", 0, &refs, false).remove(0);
        let bytes = cla.encode_to_vec();
        let out = Output::default();
        let m = modify(&bytes, &ix, &BTreeSet::new(), &out).unwrap();
        let answer = m.assignment.unwrap();
        let api = cla.endpoints[1].encode_to_vec();
        assert!(answer.windows(api.len()).any(|w| w == api));
        assert_eq!(m.answer.not_services, 1);
        assert_eq!(cluster_name(&answer), cla.cluster_name);
        assert_eq!(
            modify(&bytes[..bytes.len() - 3], &ix, &BTreeSet::new(), &out),
            Err(Malformed)
        );
    }

    #[test]
    fn the_priority_output_keeps_egs_policy_but_the_factor() {
        let eps = [("10.0.0.1", READY)];
        let ix = index(vec![slice("web-1", "web", 8080, &eps)]);
        let mut cla =
            rule_assignments("shop", "app", 0, &[eg_ref("web", 8080, &eps)], false).remove(0);
        cla.policy = Some(Policy {
            overprovisioning_factor: Some(UInt32Value { value: 140 }),
            weighted_priority_health: true,
            ..Default::default()
        });
        let out = Output::default();
        modify_typed(&mut cla, &ix, &BTreeSet::new(), &out);
        let policy = cla.policy.unwrap();
        assert_eq!(
            policy.overprovisioning_factor.unwrap().value,
            OVERPROVISIONING_FACTOR
        );
        assert!(policy.weighted_priority_health);
    }
}
