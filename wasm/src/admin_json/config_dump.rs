//! `/config_dump?include_eds` (whole, masked to the endpoint configs, or
//! `resource=`-filtered): every cluster's hosts with their address, weight,
//! priority, zone, coarse health and the metadata namespace's reading.

use super::de::{once, Each, Field, KeyIs, OptionOf, Str};
use super::fields::{health_of, host_address, Address, HealthName, NotOverridable};
use super::metadata::{MetaReading, NamespaceSeed, OddValue};
use super::{AdminJsonError, ClusterHosts, HostRecord};
use serde::de::{
    DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor,
};
use serde::Deserialize;
use serving_picker_core::health::Health;
use std::fmt;

/// Everything a config dump says about endpoints, plus what had to be skipped.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct EndpointsDump {
    /// Each cluster with endpoints, its hosts as read.
    pub clusters: Vec<ClusterHosts>,
    /// Log lines for ignored values and skipped hosts (never fatal).
    pub notes: Vec<String>,
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
    Skipped(NotOverridable),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin_json::fixtures::{cluster, DYNAMIC, FULL, MASKED, NS, STATIC};
    use serving_picker_core::contract::{Conditions, EdsHealth, MetaFlags};

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
}
