//! Parsing Envoy admin output: `/config_dump?include_eds` (endpoints and
//! metadata) and `/clusters?format=json` (live health).

use rustc_hash::FxBuildHasher;
use serde::de::{
    DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor,
};
use serde::Deserialize;
use serving_picker_core::contract::EdsHealth;
use serving_picker_core::de::{once, Each, Field, KeyIs, OptionOf, Str};
use serving_picker_core::health::Health;
use serving_picker_core::metadata::{MetaReading, NamespaceSeed, OddValue};
use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::net::IpAddr;

pub use serving_picker_core::host::{ClusterHosts, HostRecord};

/// Everything a config dump says about endpoints, plus what had to be skipped.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct EndpointsDump {
    pub clusters: Vec<ClusterHosts>,
    /// Log lines for ignored values and skipped hosts (never fatal).
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminJsonError(pub String);

impl std::fmt::Display for AdminJsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Accepts an admin answer before its body is read: a 200 within the size
/// limit. No `:status` means the call failed (unreachable, reset, timeout).
pub fn check_admin_response(
    what: &str,
    status: Option<&[u8]>,
    body_size: usize,
    max_body: usize,
) -> Result<(), AdminJsonError> {
    match status {
        None => Err(AdminJsonError(format!(
            "{what}: no answer from the admin cluster (unreachable, reset or timed out)"
        ))),
        Some(b"200") if body_size > max_body => Err(AdminJsonError(format!(
            "{what}: body of {body_size} bytes exceeds max_admin_body_bytes ({max_body})"
        ))),
        Some(b"200") => Ok(()),
        Some(other) => Err(AdminJsonError(format!(
            "{what}: admin answered HTTP {}",
            String::from_utf8_lossy(other)
        ))),
    }
}

// --- config_dump: hand-written visitors ---
//
// The dump is read in one pass straight into `ClusterHosts`: only the
// configured metadata namespace is read (the others are skipped unparsed),
// and strings are borrowed from the body. They accept what the derived
// shapes they replace accepted: unknown fields skipped, a field given twice
// an error, `null` as absent where a field is optional, `cluster_name` and a
// socket address's `address` required; and, as derive does, a struct also
// as an array of its fields in order (the defaulted ones may be left off).

/// Clusters as they are converted, with their notes, in order.
struct Sink<'n> {
    namespace: &'n str,
    clusters: Vec<ClusterHosts>,
    notes: Vec<String>,
}

impl<'n> Sink<'n> {
    fn new(namespace: &'n str) -> Self {
        Sink {
            namespace,
            clusters: Vec::new(),
            notes: Vec::new(),
        }
    }

    fn append(&mut self, mut other: Sink<'_>) {
        self.clusters.append(&mut other.clusters);
        self.notes.append(&mut other.notes);
    }
}

/// A struct's field in array form that has no default.
fn required<T, E: serde::de::Error>(
    value: Option<T>,
    index: usize,
    what: &'static str,
) -> Result<T, E> {
    value.ok_or_else(|| E::invalid_length(index, &what))
}

/// `{"configs": [DumpEntry, ...]}`
struct DumpSeed<'s, 'n>(&'s mut Sink<'n>);

impl<'de> DeserializeSeed<'de> for DumpSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_struct("ConfigDump", &["configs"], self)
    }
}

impl<'de> Visitor<'de> for DumpSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a config dump object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut configs = None;
        while let Some(key) = map.next_key_seed(Field(&["configs"]))? {
            if key.is_some() {
                once(&configs, "configs")?;
                map.next_value_seed(Each(&mut DumpEntries(&mut *self.0)))?;
                configs = Some(());
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        configs.ok_or_else(|| A::Error::missing_field("configs"))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let configs = seq.next_element_seed(Each(&mut DumpEntries(&mut *self.0)))?;
        required(configs, 0, "struct ConfigDump with 1 element")
    }
}

/// Each element: either an `EndpointsConfigDump` (whole or masked) or, with
/// `resource=`, a single Static/DynamicEndpointConfig. Other config types
/// add nothing.
struct DumpEntries<'s, 'n>(&'s mut Sink<'n>);

const DUMP_ENTRY: [&str; 3] = [
    "static_endpoint_configs",
    "dynamic_endpoint_configs",
    "endpoint_config",
];

impl DumpEntries<'_, '_> {
    /// Listed static, dynamic, then the single one, whatever the key order.
    fn finish(&mut self, parts: [Option<Sink>; 3]) {
        for sink in parts.into_iter().flatten() {
            self.0.append(sink);
        }
    }
}

impl<'de> DeserializeSeed<'de> for &mut DumpEntries<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_struct("DumpEntry", &DUMP_ENTRY, self)
    }
}

impl<'de> Visitor<'de> for &mut DumpEntries<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a config dump entry")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let ns = self.0.namespace;
        let mut parts: [Option<Sink>; 3] = [None, None, None];
        while let Some(key) = map.next_key_seed(Field(&DUMP_ENTRY))? {
            let Some((part, name)) = key.and_then(|i| parts.get_mut(i).zip(DUMP_ENTRY.get(i)))
            else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            once(part, name)?;
            let mut sink = Sink::new(ns);
            if *name == "endpoint_config" {
                map.next_value_seed(OptionOf(LoadAssignmentSeed(&mut sink)))?;
            } else {
                map.next_value_seed(Each(&mut EndpointConfigs(&mut sink)))?;
            }
            *part = Some(sink);
        }
        self.finish(parts);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let ns = self.0.namespace;
        let (mut listed, mut dynamic, mut single) = (Sink::new(ns), Sink::new(ns), Sink::new(ns));
        // The two lists default to empty; the single one has no default.
        seq.next_element_seed(Each(&mut EndpointConfigs(&mut listed)))?;
        seq.next_element_seed(Each(&mut EndpointConfigs(&mut dynamic)))?;
        let last = seq.next_element_seed(OptionOf(LoadAssignmentSeed(&mut single)))?;
        required(last, 2, "struct DumpEntry with 3 elements")?;
        self.finish([Some(listed), Some(dynamic), Some(single)]);
        Ok(())
    }
}

/// `{"endpoint_config": ClusterLoadAssignment}` (Static/DynamicEndpointConfig).
struct EndpointConfigs<'s, 'n>(&'s mut Sink<'n>);

impl<'de> DeserializeSeed<'de> for &mut EndpointConfigs<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_struct("EndpointConfigEntry", &["endpoint_config"], self)
    }
}

impl<'de> Visitor<'de> for &mut EndpointConfigs<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an endpoint config")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = None;
        while let Some(key) = map.next_key_seed(Field(&["endpoint_config"]))? {
            if key.is_some() {
                once(&seen, "endpoint_config")?;
                map.next_value_seed(OptionOf(LoadAssignmentSeed(&mut *self.0)))?;
                seen = Some(());
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let config = seq.next_element_seed(OptionOf(LoadAssignmentSeed(&mut *self.0)))?;
        required(config, 0, "struct EndpointConfigEntry with 1 element").map(|_| ())
    }
}

/// A note waiting for its cluster's name (which may come after the hosts).
enum Pending {
    Skipped(String),
    Odd(usize, OddValue),
}

/// The hosts of one ClusterLoadAssignment, as they are read.
struct Hosts<'n> {
    namespace: &'n str,
    hosts: Vec<HostRecord>,
    pending: Vec<Pending>,
}

/// A ClusterLoadAssignment, converted into the sink.
struct LoadAssignmentSeed<'s, 'n>(&'s mut Sink<'n>);

impl LoadAssignmentSeed<'_, '_> {
    fn finish(self, cluster: String, hosts: Hosts) {
        let namespace = self.0.namespace;
        for note in hosts.pending {
            self.0.notes.push(match note {
                Pending::Skipped(why) => format!("cluster {cluster}: host skipped: {why}"),
                Pending::Odd(i, odd) => format!(
                    "cluster {cluster} host {}: metadata {namespace}.{} = {} is not of the expected type; read as absent",
                    hosts.hosts.get(i).map_or("", |h| h.address.as_str()),
                    odd.key,
                    odd.found
                ),
            });
        }
        self.0.clusters.push(ClusterHosts {
            name: cluster,
            hosts: hosts.hosts,
        });
    }
}

const LOAD_ASSIGNMENT: [&str; 2] = ["cluster_name", "endpoints"];

impl<'de> DeserializeSeed<'de> for LoadAssignmentSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_struct("LoadAssignment", &LOAD_ASSIGNMENT, self)
    }
}

impl<'de> Visitor<'de> for LoadAssignmentSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a cluster load assignment")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut cluster: Option<String> = None;
        let mut endpoints = None;
        let mut hosts = Hosts {
            namespace: self.0.namespace,
            hosts: Vec::new(),
            pending: Vec::new(),
        };
        while let Some(key) = map.next_key_seed(Field(&LOAD_ASSIGNMENT))? {
            match key {
                Some(0) => {
                    once(&cluster, "cluster_name")?;
                    cluster = Some(map.next_value()?);
                }
                Some(_) => {
                    once(&endpoints, "endpoints")?;
                    map.next_value_seed(Each(&mut hosts))?;
                    endpoints = Some(());
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let cluster = cluster.ok_or_else(|| A::Error::missing_field("cluster_name"))?;
        self.finish(cluster, hosts);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut hosts = Hosts {
            namespace: self.0.namespace,
            hosts: Vec::new(),
            pending: Vec::new(),
        };
        let what = "struct LoadAssignment with 2 elements";
        let cluster: String = required(seq.next_element()?, 0, what)?;
        seq.next_element_seed(Each(&mut hosts))?;
        self.finish(cluster, hosts);
        Ok(())
    }
}

#[derive(Deserialize)]
struct Locality<'a> {
    #[serde(borrow)]
    zone: Option<Str<'a>>,
}

const LOCALITY_ENDPOINTS: [&str; 3] = ["lb_endpoints", "priority", "locality"];

impl Hosts<'_> {
    /// The group's priority and zone, on the hosts it added from `first` on.
    fn finish_group(&mut self, first: usize, priority: u32, locality: Option<Locality>) {
        let zone = locality.and_then(|l| l.zone).filter(|z| !z.0.is_empty());
        for host in self.hosts.iter_mut().skip(first) {
            host.priority = priority;
            if host.zone.is_none() {
                host.zone = zone.as_ref().map(|z| z.0.to_string());
            }
        }
    }
}

/// One LocalityLbEndpoints: its hosts, then its priority and zone on them.
impl<'de> DeserializeSeed<'de> for &mut Hosts<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_struct("LocalityEndpoints", &LOCALITY_ENDPOINTS, self)
    }
}

impl<'de> Visitor<'de> for &mut Hosts<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("locality lb endpoints")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let first = self.hosts.len();
        let (mut listed, mut priority, mut locality) = (None, None, None);
        while let Some(key) = map.next_key_seed(Field(&LOCALITY_ENDPOINTS))? {
            match key {
                Some(0) => {
                    once(&listed, "lb_endpoints")?;
                    map.next_value_seed(Each(&mut LbEndpoints(&mut *self)))?;
                    listed = Some(());
                }
                Some(1) => {
                    once(&priority, "priority")?;
                    priority = Some(map.next_value::<u32>()?);
                }
                Some(_) => {
                    once(&locality, "locality")?;
                    locality = Some(map.next_value::<Option<Locality<'de>>>()?);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        self.finish_group(first, priority.unwrap_or(0), locality.flatten());
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let first = self.hosts.len();
        seq.next_element_seed(Each(&mut LbEndpoints(&mut *self)))?;
        let priority = seq.next_element::<u32>()?;
        let locality = seq.next_element::<Option<Locality<'de>>>()?;
        let locality = required(locality, 2, "struct LocalityEndpoints with 3 elements")?;
        self.finish_group(first, priority.unwrap_or(0), locality);
        Ok(())
    }
}

#[derive(Deserialize)]
struct Endpoint<'a> {
    #[serde(borrow)]
    address: Option<Address<'a>>,
}

#[derive(Deserialize)]
struct Address<'a> {
    #[serde(borrow)]
    socket_address: Option<SocketAddress<'a>>,
}

#[derive(Deserialize)]
struct SocketAddress<'a> {
    #[serde(borrow)]
    address: Str<'a>,
    port_value: Option<u32>,
}

/// An EDS health status name, read without keeping the string.
struct HealthName(EdsHealth);

impl<'de> Deserialize<'de> for HealthName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Str::deserialize(d).map(|s| HealthName(EdsHealth::from_name(Some(&s.0))))
    }
}

fn health_of(name: Option<HealthName>) -> EdsHealth {
    name.map_or(EdsHealth::from_name(None), |n| n.0)
}

/// One LbEndpoint of a locality.
struct LbEndpoints<'h, 'n>(&'h mut Hosts<'n>);

const LB_ENDPOINT: [&str; 4] = [
    "endpoint",
    "health_status",
    "metadata",
    "load_balancing_weight",
];

impl LbEndpoints<'_, '_> {
    fn finish(
        &mut self,
        endpoint: Option<Endpoint>,
        health: Option<HealthName>,
        metadata: Option<MetaReading>,
        weight: Option<u32>,
    ) {
        let hosts = &mut *self.0;
        let address = endpoint.and_then(|e| e.address);
        let address = match host_address(address.as_ref()) {
            Ok(a) => a,
            Err(why) => {
                hosts.pending.push(Pending::Skipped(why));
                return;
            }
        };
        let reading = metadata.unwrap_or_default();
        let index = hosts.hosts.len();
        hosts
            .pending
            .extend(reading.odd.into_iter().map(|odd| Pending::Odd(index, odd)));
        hosts.hosts.push(HostRecord {
            address,
            weight: weight.unwrap_or(1).max(1),
            // Set with the locality's zone once the group is read.
            priority: 0,
            flags: reading.flags,
            zone: reading.zone,
            topology: reading.topology,
            health: Health {
                eds: None,
                coarse: health_of(health),
                failing: false,
            },
        });
    }
}

impl<'de> DeserializeSeed<'de> for &mut LbEndpoints<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_struct("LbEndpoint", &LB_ENDPOINT, self)
    }
}

impl<'de> Visitor<'de> for &mut LbEndpoints<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an lb endpoint")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let namespace = self.0.namespace;
        let (mut endpoint, mut health, mut metadata, mut weight) = (None, None, None, None);
        while let Some(key) = map.next_key_seed(Field(&LB_ENDPOINT))? {
            match key {
                Some(0) => {
                    once(&endpoint, "endpoint")?;
                    endpoint = Some(map.next_value::<Option<Endpoint<'de>>>()?);
                }
                Some(1) => {
                    once(&health, "health_status")?;
                    health = Some(map.next_value::<Option<HealthName>>()?);
                }
                Some(2) => {
                    once(&metadata, "metadata")?;
                    metadata = Some(map.next_value_seed(OptionOf(MetadataSeed(namespace)))?);
                }
                Some(_) => {
                    once(&weight, "load_balancing_weight")?;
                    weight = Some(map.next_value::<Option<u32>>()?);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        self.finish(
            endpoint.flatten(),
            health.flatten(),
            metadata.flatten().flatten(),
            weight.flatten(),
        );
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let what = "struct LbEndpoint with 4 elements";
        let endpoint = required(seq.next_element::<Option<Endpoint<'de>>>()?, 0, what)?;
        let health = required(seq.next_element::<Option<HealthName>>()?, 1, what)?;
        let metadata = seq.next_element_seed(OptionOf(MetadataSeed(self.0.namespace)))?;
        let metadata = required(metadata, 2, what)?;
        let weight = required(seq.next_element::<Option<u32>>()?, 3, what)?;
        self.finish(endpoint, health, metadata.flatten(), weight);
        Ok(())
    }
}

/// `{"filter_metadata": {NAMESPACE: {...}, ...}}`: the namespace's reading
/// (`None` without it); the other namespaces are skipped unparsed.
struct MetadataSeed<'n>(&'n str);

impl<'de> DeserializeSeed<'de> for MetadataSeed<'_> {
    type Value = Option<MetaReading>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_struct("Metadata", &["filter_metadata"], self)
    }
}

impl<'de> Visitor<'de> for MetadataSeed<'_> {
    type Value = Option<MetaReading>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("endpoint metadata")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut filter = None;
        while let Some(key) = map.next_key_seed(Field(&["filter_metadata"]))? {
            if key.is_some() {
                once(&filter, "filter_metadata")?;
                filter = Some(map.next_value_seed(FilterMetadataSeed(self.0))?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(filter.flatten())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        // `filter_metadata` defaults to empty.
        Ok(seq.next_element_seed(FilterMetadataSeed(self.0))?.flatten())
    }
}

struct FilterMetadataSeed<'n>(&'n str);

impl<'de> DeserializeSeed<'de> for FilterMetadataSeed<'_> {
    type Value = Option<MetaReading>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FilterMetadataSeed<'_> {
    type Value = Option<MetaReading>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map of metadata namespaces")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        // The last one wins if the namespace comes twice, as in a map.
        let mut reading = None;
        while let Some(ours) = map.next_key_seed(KeyIs(self.0))? {
            if ours {
                reading = Some(map.next_value_seed(NamespaceSeed)?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(reading)
    }
}

/// `IP:PORT` for a socket address, or why it cannot be overridden to.
fn host_address(address: Option<&Address<'_>>) -> Result<String, String> {
    let socket = address
        .and_then(|a| a.socket_address.as_ref())
        .ok_or("not a socket address")?;
    let port = socket.port_value.ok_or("no port_value")?;
    if port == 0 || port > 65535 {
        return Err(format!("port {port} out of range"));
    }
    let text: &str = &socket.address.0;
    let mut out = String::with_capacity(text.len() + 6);
    if is_canonical_ipv4(text.as_bytes()) {
        // What almost every host has: it prints as it is written.
        out.push_str(text);
    } else {
        match text.parse::<IpAddr>() {
            Ok(IpAddr::V4(ip)) => {
                let _ = write!(out, "{ip}");
            }
            Ok(IpAddr::V6(ip)) => {
                // Canonical form (RFC 5952), as Display writes it.
                let _ = write!(out, "[{ip}]");
            }
            Err(_) => return Err(format!("{text:?} is not an IP address")),
        }
    }
    out.push(':');
    push_decimal(&mut out, port);
    Ok(out)
}

/// Four decimal octets of at most 255, without leading zeros: an IPv4
/// address exactly as `Ipv4Addr` parses and then prints it. (Anything else
/// goes through the standard parser.)
fn is_canonical_ipv4(text: &[u8]) -> bool {
    let (mut dots, mut digits, mut octet) = (0, 0, 0u32);
    for &b in text {
        match b {
            b'0'..=b'9' => {
                if digits == 1 && octet == 0 {
                    return false;
                }
                octet = octet * 10 + u32::from(b - b'0');
                digits += 1;
                if octet > 255 {
                    return false;
                }
            }
            b'.' if digits > 0 && dots < 3 => {
                dots += 1;
                digits = 0;
                octet = 0;
            }
            _ => return false,
        }
    }
    dots == 3 && digits > 0
}

/// `n` in decimal, without going through `fmt`.
fn push_decimal(out: &mut String, mut n: u32) {
    let mut digits = [0u8; 10];
    let mut len = 0;
    while len < digits.len() {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for d in digits[..len].iter().rev() {
        out.push(char::from(*d));
    }
}

/// Parses a config dump (`include_eds`, optionally masked or `resource=`-filtered).
pub fn parse_config_dump(body: &[u8], namespace: &str) -> Result<EndpointsDump, AdminJsonError> {
    let mut sink = Sink::new(namespace);
    let mut de = serde_json::Deserializer::from_slice(body);
    DumpSeed(&mut sink)
        .deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(|e| AdminJsonError(format!("config_dump is not the expected JSON: {e}")))?;
    Ok(EndpointsDump {
        clusters: sink.clusters,
        notes: sink.notes,
    })
}

// --- /clusters?format=json shapes (per-host `stats` are skipped unparsed) ---

#[derive(Deserialize)]
struct ClustersJson<'a> {
    #[serde(default, borrow)]
    cluster_statuses: Vec<ClusterStatus<'a>>,
}

#[derive(Deserialize)]
struct ClusterStatus<'a> {
    name: String,
    eds_service_name: Option<String>,
    #[serde(default, borrow)]
    host_statuses: Vec<HostStatus<'a>>,
}

#[derive(Deserialize)]
struct HostStatus<'a> {
    #[serde(borrow)]
    address: Option<Address<'a>>,
    health_status: Option<HostHealthFlags>,
}

#[derive(Deserialize, Default)]
struct HostHealthFlags {
    eds_health_status: Option<HealthName>,
    #[serde(default)]
    failed_active_health_check: bool,
    #[serde(default)]
    failed_outlier_check: bool,
    #[serde(default)]
    active_hc_timeout: bool,
    #[serde(default)]
    excluded_via_immediate_hc_fail: bool,
    #[serde(default)]
    pending_dynamic_removal: bool,
}

/// Envoy's live view of one host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveHost {
    pub eds: EdsHealth,
    pub failing: bool,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveCluster {
    /// The config dump lists an EDS cluster under its service name.
    pub eds_service_name: Option<String>,
    pub hosts: HashMap<String, LiveHost, FxBuildHasher>,
}

/// `/clusters?format=json`, per cluster name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveHealth {
    pub clusters: HashMap<String, LiveCluster, FxBuildHasher>,
}

pub fn parse_clusters(body: &[u8]) -> Result<LiveHealth, AdminJsonError> {
    let parsed: ClustersJson = serde_json::from_slice(body)
        .map_err(|e| AdminJsonError(format!("/clusters is not the expected JSON: {e}")))?;
    let mut live = LiveHealth::default();
    for cluster in parsed.cluster_statuses {
        let mut hosts =
            HashMap::with_capacity_and_hasher(cluster.host_statuses.len(), FxBuildHasher);
        for host in cluster.host_statuses {
            let Ok(address) = host_address(host.address.as_ref()) else {
                continue;
            };
            let f = host.health_status.unwrap_or_default();
            let failing = f.failed_active_health_check
                || f.failed_outlier_check
                || f.active_hc_timeout
                || f.excluded_via_immediate_hc_fail;
            let mut eds = health_of(f.eds_health_status);
            // Gone from EDS, kept by Envoy while it passes its checks: a pod
            // that left the Service drains, below the ready hosts.
            if f.pending_dynamic_removal
                && !matches!(eds, EdsHealth::Unhealthy | EdsHealth::Timeout)
            {
                eds = EdsHealth::Draining;
            }
            hosts.insert(address, LiveHost { eds, failing });
        }
        let eds_service_name = cluster.eds_service_name.filter(|s| !s.is_empty());
        live.clusters.insert(
            cluster.name,
            LiveCluster {
                eds_service_name,
                hosts,
            },
        );
    }
    Ok(live)
}

/// Dump entries by name (their indexes), and whether a live cluster claims it.
pub type NameIndex<'a> = HashMap<&'a str, (Vec<usize>, bool), FxBuildHasher>;

/// Whether the dump leaves some host's health open. Envoy's coarse verdict
/// in the dump says UNHEALTHY for EDS DRAINING/UNHEALTHY, failed active checks
/// and outlier ejection alike; only `/clusters` tells them apart. When every
/// host reads HEALTHY or DEGRADED, and `known` (the last live view) names every
/// cluster of the dump (each once), the live view would add nothing.
pub fn needs_live_health(dump: &EndpointsDump, known: Option<&LiveHealth>) -> bool {
    let Some(known) = known else {
        return true;
    };
    let settled = |h: &HostRecord| {
        matches!(
            h.health.coarse,
            EdsHealth::Healthy | EdsHealth::Degraded | EdsHealth::Unknown
        )
    };
    let claimed = |name: &str| {
        known
            .clusters
            .iter()
            .any(|(n, c)| c.eds_service_name.as_deref().unwrap_or(n) == name)
    };
    // A name listed twice is told apart by the hosts `/clusters` shows.
    let mut names = NameIndex::with_capacity_and_hasher(dump.clusters.len(), FxBuildHasher);
    dump.clusters.iter().any(|c| {
        names.insert(&c.name, Default::default()).is_some()
            || !claimed(&c.name)
            || !c.hosts.iter().all(settled)
    })
}

/// The live view the dump implies when `needs_live_health` is false: the
/// cluster names (and service names) of `known`, the hosts of the dump.
pub fn implied_live_health(dump: &EndpointsDump, known: &LiveHealth) -> LiveHealth {
    let mut live = LiveHealth::default();
    for (name, cluster) in &known.clusters {
        let listed_as = cluster.eds_service_name.as_deref().unwrap_or(name);
        let Some(entry) = dump.clusters.iter().find(|c| c.name == listed_as) else {
            continue;
        };
        let hosts = entry
            .hosts
            .iter()
            .map(|h| {
                let eds = if h.health.coarse == EdsHealth::Degraded {
                    EdsHealth::Degraded
                } else {
                    EdsHealth::Healthy
                };
                (
                    h.address.clone(),
                    LiveHost {
                        eds,
                        failing: false,
                    },
                )
            })
            .collect();
        live.clusters.insert(
            name.clone(),
            LiveCluster {
                eds_service_name: cluster.eds_service_name.clone(),
                hosts,
            },
        );
    }
    live
}

/// Joins the dump with live health: each Envoy cluster gets its hosts under
/// its own name (an EDS service name maps back to every cluster using it),
/// hosts Envoy no longer has are dropped, and live health is filled in.
/// Without a live view, or for a dump entry no live cluster claims, the dump
/// stands as it is. When the dump lists a name more than once (a cluster
/// named like another's EDS service name), each cluster claiming the name
/// takes the entry that holds most of its live hosts (ties: the one with
/// fewest hosts it lacks), never another cluster's.
pub fn join_live_health(dump: EndpointsDump, live: Option<&LiveHealth>) -> Vec<ClusterHosts> {
    let Some(live) = live else {
        return dump.clusters;
    };
    // Dump entries by name, and whether a live cluster claims the name.
    let mut by_name = NameIndex::default();
    for (i, entry) in dump.clusters.iter().enumerate() {
        by_name.entry(entry.name.as_str()).or_default().0.push(i);
    }
    // Per dump entry, the live clusters that take it (none: it stands as is,
    // unless its name is claimed by a cluster that took another entry).
    let mut owners: Vec<Vec<(&str, &LiveCluster)>> = vec![Vec::new(); dump.clusters.len()];
    for (name, cluster) in &live.clusters {
        let listed_as = cluster.eds_service_name.as_deref().unwrap_or(name);
        let Some((entries, claimed)) = by_name.get_mut(listed_as) else {
            continue;
        };
        *claimed = true;
        let score = |i: usize| {
            let hosts = dump.clusters.get(i).map_or(&[][..], |e| &e.hosts[..]);
            let found = hosts
                .iter()
                .filter(|h| cluster.hosts.contains_key(&h.address))
                .count();
            (found, usize::MAX - (hosts.len() - found), usize::MAX - i)
        };
        if let Some(best) = entries.iter().copied().max_by_key(|i| score(*i)) {
            if let Some(o) = owners.get_mut(best) {
                o.push((name.as_str(), cluster));
            }
        }
    }
    let name_claimed: Vec<bool> = dump
        .clusters
        .iter()
        .map(|e| by_name.get(e.name.as_str()).is_some_and(|n| n.1))
        .collect();
    let mut out = Vec::with_capacity(dump.clusters.len());
    for ((entry, owners), name_claimed) in dump.clusters.into_iter().zip(owners).zip(name_claimed) {
        let Some(((last_name, last), others)) = owners.split_last() else {
            if !name_claimed {
                out.push(entry);
            }
            continue;
        };
        let with = |mut host: HostRecord, cluster: &LiveCluster| {
            let seen = cluster.hosts.get(&host.address)?;
            host.health.eds = Some(seen.eds);
            host.health.failing = seen.failing;
            Some(host)
        };
        // Every owner but the last gets copies; the last takes the hosts.
        for (name, cluster) in others {
            out.push(ClusterHosts {
                name: (*name).to_string(),
                hosts: entry
                    .hosts
                    .iter()
                    .filter_map(|h| with(h.clone(), cluster))
                    .collect(),
            });
        }
        out.push(ClusterHosts {
            name: (*last_name).to_string(),
            hosts: entry
                .hosts
                .into_iter()
                .filter_map(|h| with(h, last))
                .collect(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serving_picker_core::contract::{Conditions, MetaFlags};

    const NS: &str = "k8s.endpointslice";
    // Real Envoy 1.40 output; see tests/fixtures/README.md for how it was made.
    const MASKED: &str = include_str!("../tests/fixtures/config_dump_endpoints_masked.json");
    const FULL: &str = include_str!("../tests/fixtures/config_dump_include_eds.json");
    const STATIC: &str = include_str!("../tests/fixtures/config_dump_static_endpoints.json");
    const DYNAMIC: &str = include_str!("../tests/fixtures/config_dump_dynamic_endpoints.json");
    const CLUSTERS: &str = include_str!("../tests/fixtures/clusters.json");

    fn cluster<'a>(clusters: &'a [ClusterHosts], name: &str) -> &'a ClusterHosts {
        clusters.iter().find(|c| c.name == name).unwrap()
    }

    fn view(c: &ClusterHosts) -> Vec<(String, Conditions)> {
        c.hosts
            .iter()
            .map(|h| (h.address.clone(), h.conditions()))
            .collect()
    }

    #[test]
    fn every_dump_shape_lists_the_same_clusters() {
        let names = |body: &str| {
            let mut n: Vec<String> = parse_config_dump(body.as_bytes(), NS)
                .unwrap()
                .clusters
                .into_iter()
                .map(|c| c.name)
                .collect();
            n.sort();
            n
        };
        let masked = names(MASKED);
        assert_eq!(masked.len(), 9, "{masked:?}");
        assert!(masked.contains(&"cds_backend_svc".to_string()));
        assert_eq!(names(FULL), masked);
        let mut split = names(STATIC);
        split.extend(names(DYNAMIC));
        split.sort();
        assert_eq!(split, masked);
    }

    #[test]
    fn real_dump_hosts_weights_zones_priorities() {
        let dump = parse_config_dump(MASKED.as_bytes(), NS).unwrap();
        let backend = cluster(&dump.clusters, "backend");
        let addrs: Vec<_> = backend.hosts.iter().map(|h| h.address.as_str()).collect();
        assert_eq!(
            addrs,
            ["127.0.0.1:20101", "127.0.0.1:20102", "127.0.0.1:20103"]
        );
        let weights: Vec<_> = backend.hosts.iter().map(|h| h.weight).collect();
        assert_eq!(weights, [1, 3, 1]);
        assert_eq!(
            backend.hosts[1].conditions(),
            Conditions::SERVING_TERMINATING
        );
        // 20103 is DRAINING, but the dump alone says UNHEALTHY.
        assert_eq!(backend.hosts[2].conditions(), Conditions::NOT_SERVING);
        let eds = cluster(&dump.clusters, "eds_backend");
        let prio: Vec<_> = eds.hosts.iter().map(|h| h.priority).collect();
        assert_eq!(prio, [0, 0, 0, 1, 1]);
        assert_eq!(
            eds.hosts[3].zone.as_deref(),
            Some("zone-b"),
            "locality zone fills in"
        );
        assert_eq!(
            eds.hosts[1].flags,
            MetaFlags::default(),
            "odd types read as absent"
        );
        let odd: Vec<_> = dump.notes.iter().filter(|n| n.contains("20202")).collect();
        assert_eq!(odd.len(), 2, "{:?}", dump.notes);
        assert!(
            odd.iter().any(|n| n.contains("serving = \"yes\"")),
            "{odd:?}"
        );
    }

    #[test]
    fn real_live_health_joins_by_service_name_and_sees_draining() {
        let dump = parse_config_dump(MASKED.as_bytes(), NS).unwrap();
        let live = parse_clusters(CLUSTERS.as_bytes()).unwrap();
        assert_eq!(
            live.clusters["cds_backend"].eds_service_name.as_deref(),
            Some("cds_backend_svc")
        );
        let joined = join_live_health(dump, Some(&live));
        assert!(joined.iter().all(|c| c.name != "cds_backend_svc"));
        let backend = cluster(&joined, "backend");
        assert_eq!(
            backend.hosts[2].conditions(),
            Conditions::SERVING_TERMINATING,
            "DRAINING"
        );
        let cds = view(cluster(&joined, "cds_backend"));
        assert_eq!(
            cds,
            [
                ("127.0.0.1:20201".into(), Conditions::READY),
                ("127.0.0.1:20202".into(), Conditions::SERVING_TERMINATING),
                // Metadata says serving; active health checks fail it.
                ("127.0.0.1:20399".into(), Conditions::NOT_SERVING),
            ]
        );
        let outlier = view(cluster(&joined, "outlier_backend"));
        assert_eq!(outlier[0].1, Conditions::NOT_SERVING, "ejected");
        assert_eq!(outlier[1].1, Conditions::READY);
        let eds = view(cluster(&joined, "eds_backend"));
        assert_eq!(eds[2].1, Conditions::NOT_SERVING, "EDS UNHEALTHY");
    }

    #[test]
    fn live_health_is_needed_only_where_the_dump_leaves_it_open() {
        let dump = parse_config_dump(MASKED.as_bytes(), NS).unwrap();
        let live = parse_clusters(CLUSTERS.as_bytes()).unwrap();
        // Never without a live view to know cluster names from.
        assert!(needs_live_health(&dump, None));
        // The fixture has DRAINING/failing hosts (coarse UNHEALTHY).
        assert!(needs_live_health(&dump, Some(&live)));
        let mut healthy = dump.clone();
        for c in &mut healthy.clusters {
            c.hosts.retain(|h| h.health.coarse != EdsHealth::Unhealthy);
        }
        assert!(!needs_live_health(&healthy, Some(&live)));
        // A cluster no live view has named yet (a new CDS cluster) needs it.
        let mut new_cluster = healthy.clone();
        new_cluster.clusters.push(ClusterHosts {
            name: "new_svc".into(),
            hosts: vec![],
        });
        assert!(needs_live_health(&new_cluster, Some(&live)));
    }

    #[test]
    fn implied_live_health_joins_like_the_real_one() {
        let dump = parse_config_dump(MASKED.as_bytes(), NS).unwrap();
        let live = parse_clusters(CLUSTERS.as_bytes()).unwrap();
        let mut healthy = dump.clone();
        for c in &mut healthy.clusters {
            c.hosts.retain(|h| h.health.coarse != EdsHealth::Unhealthy);
        }
        let implied = implied_live_health(&healthy, &live);
        let mut real = live.clone();
        // The real view of the same hosts: drop those the healthy dump lacks.
        for (name, c) in real.clusters.iter_mut() {
            let listed_as = c.eds_service_name.clone().unwrap_or(name.clone());
            let Some(entry) = healthy.clusters.iter().find(|d| d.name == listed_as) else {
                continue;
            };
            c.hosts
                .retain(|a, _| entry.hosts.iter().any(|h| &h.address == a));
        }
        let joined = |l: &LiveHealth| {
            let mut v: Vec<_> = join_live_health(healthy.clone(), Some(l))
                .into_iter()
                .map(|c| (c.name.clone(), view(&c)))
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        assert_eq!(joined(&implied), joined(&real));
        assert!(
            joined(&implied).iter().any(|(n, _)| n == "cds_backend"),
            "service name mapped back"
        );
    }

    /// STATIC `svc` and EDS `other` with `service_name: svc`: the dump lists
    /// `svc` twice; each cluster takes its own entry, whatever the order.
    #[test]
    fn a_cluster_named_like_another_clusters_service_name() {
        let entry = |addr: &str| {
            format!(
                r#"{{"endpoint_config":{{"cluster_name":"svc","endpoints":[{{"lb_endpoints":[
                {{"endpoint":{{"address":{{"socket_address":{{"address":"{addr}","port_value":80}}}}}}}}]}}]}}}}"#
            )
        };
        let (a, b) = (entry("10.0.0.1"), entry("10.0.0.2"));
        let live = parse_clusters(
            br#"{"cluster_statuses":[
              {"name":"svc","host_statuses":[{"address":{"socket_address":{"address":"10.0.0.1","port_value":80}}}]},
              {"name":"other","eds_service_name":"svc","host_statuses":[
                {"address":{"socket_address":{"address":"10.0.0.2","port_value":80}}}]}]}"#,
        )
        .unwrap();
        for (first, second) in [(&a, &b), (&b, &a)] {
            let body =
                format!(r#"{{"configs":[{{"static_endpoint_configs":[{first},{second}]}}]}}"#);
            let dump = parse_config_dump(body.as_bytes(), NS).unwrap();
            assert!(needs_live_health(&dump, Some(&live)), "a name listed twice");
            let mut joined: Vec<_> = join_live_health(dump, Some(&live))
                .into_iter()
                .map(|c| (c.name.clone(), view(&c)))
                .collect();
            joined.sort_by(|x, y| x.0.cmp(&y.0));
            assert_eq!(
                joined,
                [
                    (
                        "other".into(),
                        vec![("10.0.0.2:80".into(), Conditions::READY)]
                    ),
                    (
                        "svc".into(),
                        vec![("10.0.0.1:80".into(), Conditions::READY)]
                    ),
                ]
            );
        }
    }

    #[test]
    fn join_drops_hosts_envoy_no_longer_has() {
        let dump = parse_config_dump(MASKED.as_bytes(), NS).unwrap();
        let mut live = parse_clusters(CLUSTERS.as_bytes()).unwrap();
        let backend = live.clusters.get_mut("backend").unwrap();
        backend.hosts.remove("127.0.0.1:20102");
        live.clusters.remove("retry_backend");
        let joined = join_live_health(dump, Some(&live));
        assert_eq!(cluster(&joined, "backend").hosts.len(), 2);
        // Not in the live view at all: the dump stands.
        assert_eq!(cluster(&joined, "retry_backend").hosts.len(), 3);
    }

    #[test]
    fn odd_addresses_are_skipped_with_a_note() {
        let body = r#"{"configs":[{"static_endpoint_configs":[{"endpoint_config":{"cluster_name":"c","endpoints":[{"lb_endpoints":[
           {"endpoint":{"address":{"socket_address":{"address":"::1","port_value":18082}}}},
           {"endpoint":{"address":{"pipe":{"path":"/tmp/x"}}}},
           {"endpoint":{"address":{"socket_address":{"address":"db.local","port_value":5432}}}},
           {"endpoint":{"address":{"socket_address":{"address":"10.0.0.1","port_value":0}}}},
           {"endpoint":{"address":{"socket_address":{"address":"10.0.0.1"}}}},
           {}]}]}}]}]}"#;
        let dump = parse_config_dump(body.as_bytes(), NS).unwrap();
        let addrs: Vec<_> = dump.clusters[0]
            .hosts
            .iter()
            .map(|h| h.address.as_str())
            .collect();
        assert_eq!(addrs, ["[::1]:18082"]);
        assert_eq!(dump.notes.len(), 5, "{:?}", dump.notes);
        assert!(dump.notes.iter().any(|n| n.contains("db.local")));
    }

    #[test]
    fn addresses_print_as_the_standard_parser_reads_them() {
        let pieces = [
            "0", "00", "01", "1", "9", "10", "99", "100", "199", "255", "256", "999", "1000", "",
        ];
        let mut cases: Vec<String> = vec![
            "::1".into(),
            "::ffff:10.0.0.1".into(),
            "2001:DB8:0:0:0:0:0:1".into(),
            "1.2.3.4.".into(),
            ".1.2.3.4".into(),
            "1.2.3.4 ".into(),
            "+1.2.3.4".into(),
            "1..3.4".into(),
            "1.2.3".into(),
            "1.2.3.4.5".into(),
            "１.2.3.4".into(),
        ];
        for a in pieces {
            for b in ["0", "7", "255", "256", "08"] {
                cases.push(format!("{a}.{b}.{b}.{a}"));
                cases.push(format!("10.{a}.{b}.1"));
            }
        }
        for text in &cases {
            let std = match text.parse::<IpAddr>() {
                Ok(IpAddr::V4(ip)) => Some(format!("{ip}:80")),
                Ok(IpAddr::V6(ip)) => Some(format!("[{ip}]:80")),
                Err(_) => None,
            };
            let address = Address {
                socket_address: Some(SocketAddress {
                    address: Str(text.as_str().into()),
                    port_value: Some(80),
                }),
            };
            assert_eq!(host_address(Some(&address)).ok(), std, "{text:?}");
            if is_canonical_ipv4(text.as_bytes()) {
                assert!(text.parse::<std::net::Ipv4Addr>().is_ok(), "{text:?}");
            }
        }
        let mut out = String::new();
        for n in [0, 1, 9, 10, 65535, u32::MAX] {
            out.clear();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string());
        }
    }

    #[test]
    fn any_key_order_and_the_array_form_of_structs() {
        let host = r#"{"endpoint":{"address":{"socket_address":{"address":"10.0.0.1","port_value":80}}},
            "metadata":{"filter_metadata":{"k8s.endpointslice":{"serving":"yes"}}}}"#;
        // The name after the hosts, the single config before the lists.
        let body = format!(
            r#"{{"configs":[{{"endpoint_config":{{"endpoints":[{{"priority":2,"lb_endpoints":[{host}],
              "locality":{{"zone":"z"}}}}],"cluster_name":"single"}},
              "dynamic_endpoint_configs":[{{"endpoint_config":{{"cluster_name":"dynamic"}}}}],
              "static_endpoint_configs":[{{"endpoint_config":{{"cluster_name":"static"}}}}]}}]}}"#
        );
        let dump = parse_config_dump(body.as_bytes(), NS).unwrap();
        let names: Vec<_> = dump.clusters.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["static", "dynamic", "single"]);
        let h = &dump.clusters[2].hosts[0];
        assert_eq!((h.priority, h.zone.as_deref()), (2, Some("z")));
        assert_eq!(dump.notes.len(), 1);
        assert!(
            dump.notes[0].starts_with("cluster single host 10.0.0.1:80: metadata"),
            "{:?}",
            dump.notes
        );
        // Derive read a struct also as an array of its fields; so do these.
        let array = r#"{"configs":[[[],[],["c",[[[[{"address":{"socket_address":
            {"address":"10.0.0.1","port_value":80}}},"DRAINING",[{"k8s.endpointslice":
            {"ready":false}}],3]],1,["z"]]]]]]}"#;
        let dump = parse_config_dump(array.as_bytes(), NS).unwrap();
        let h = &dump.clusters[0].hosts[0];
        assert_eq!(
            (h.weight, h.priority, h.zone.as_deref(), h.flags.ready),
            (3, 1, Some("z"), Some(false))
        );
        assert_eq!(h.health.coarse, EdsHealth::Draining);
        // Fields without a default cannot be left off; nor can more be added.
        for short in [
            r#"{"configs":[[[],[]]]}"#,
            r#"{"configs":[{"endpoint_config":["c",[[[],0]]]}]}"#,
            r#"{"configs":[{"endpoint_config":["c",[[[[null,null,null]]]]]}]}"#,
            r#"{"configs":[{"static_endpoint_configs":[[null, 1]]}]}"#,
        ] {
            assert!(parse_config_dump(short.as_bytes(), NS).is_err(), "{short}");
        }
        // Fields given twice are errors, as they were.
        for twice in [
            r#"{"configs":[{"endpoint_config":{"cluster_name":"a","cluster_name":"b"}}]}"#,
            r#"{"configs":[{"endpoint_config":null,"endpoint_config":null}]}"#,
            r#"{"configs":[{"endpoint_config":{"cluster_name":"c","endpoints":[{"lb_endpoints":[
                {"metadata":null,"metadata":null}]}]}}]}"#,
        ] {
            assert!(parse_config_dump(twice.as_bytes(), NS).is_err(), "{twice}");
        }
    }

    #[test]
    fn resource_filtered_shape() {
        let dump = parse_config_dump(DYNAMIC.as_bytes(), NS).unwrap();
        assert_eq!(dump.clusters.len(), 1);
        assert_eq!(dump.clusters[0].name, "cds_backend_svc");
    }

    #[test]
    fn malformed_dumps_are_errors() {
        for body in [
            "",
            "{",
            "[]",
            "{\"configs\":{}}",
            "{\"configs\":[{\"endpoint_config\":{}}]}",
            "null",
            "<html>",
        ] {
            assert!(parse_config_dump(body.as_bytes(), NS).is_err(), "{body:?}");
        }
        // Truncated real output.
        assert!(parse_config_dump(&MASKED.as_bytes()[..MASKED.len() / 2], NS).is_err());
        // Deep nesting is refused by serde_json's recursion limit, not a crash.
        let deep = format!(
            "{{\"configs\":[{}{}]}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert!(parse_config_dump(deep.as_bytes(), NS).is_err());
    }

    #[test]
    fn admin_response_checks() {
        assert!(check_admin_response("x", Some(b"200"), 10, 10).is_ok());
        let e = check_admin_response("x", Some(b"200"), 11, 10).unwrap_err();
        assert!(e.0.contains("exceeds"), "{e}");
        let e = check_admin_response("x", Some(b"500"), 0, 10).unwrap_err();
        assert!(e.0.contains("HTTP 500"), "{e}");
        let e = check_admin_response("x", None, 0, 10).unwrap_err();
        assert!(e.0.contains("unreachable"), "{e}");
    }

    #[test]
    fn malformed_clusters_json() {
        assert!(parse_clusters(b"<html>").is_err());
        assert!(parse_clusters(&CLUSTERS.as_bytes()[..100]).is_err());
        assert!(parse_clusters(b"{\"cluster_statuses\":[{}]}").is_err());
        assert_eq!(parse_clusters(b"{}").unwrap(), LiveHealth::default());
    }
}
