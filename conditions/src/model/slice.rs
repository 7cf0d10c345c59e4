//! One EndpointSlice as the companion keeps it: only what the index and the
//! endpoint mapping read, taken from a `discovery.k8s.io/v1` object (from the
//! Kubernetes API or a file).

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::discovery::v1 as discovery;

/// The label that ties a slice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A slice's identity: namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SliceKey {
    /// `metadata.namespace` (`default` when a file gives none).
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

impl fmt::Display for SliceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A Service: namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    /// The Service's namespace (the slice's).
    pub namespace: String,
    /// The Service's name (the slice's `kubernetes.io/service-name` label).
    pub name: String,
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A slice's `addressType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AddressType {
    /// `IPv4`: addresses are IPv4.
    IPv4,
    /// `IPv6`: addresses are IPv6.
    IPv6,
    /// FQDN (deprecated) or anything else: never served.
    Other,
}

/// One `ports[]` entry (TCP or unset protocol, with a port number).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlicePort {
    /// "" for an unnamed port.
    pub name: String,
    /// The port number (what the pods listen on).
    pub port: u16,
}

/// One endpoint of a slice, conditions as written (nil kept as `None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceEndpoint {
    /// The first address (the API defines no semantics for the others, and
    /// kube-proxy reads only the first).
    pub address: IpAddr,
    /// `conditions.ready`; `None` when nil.
    pub ready: Option<bool>,
    /// `conditions.serving`; `None` when nil.
    pub serving: Option<bool>,
    /// `conditions.terminating`; `None` when nil.
    pub terminating: Option<bool>,
    /// `zone`, when set.
    pub zone: Option<Arc<str>>,
    /// `nodeName`, when set.
    pub node_name: Option<Arc<str>>,
    /// `hints.forZones[].name`, comma-separated; `None` without hints.
    pub hints_zones: Option<Arc<str>>,
    /// `hints.forNodes[].name`, comma-separated; `None` without hints.
    pub hints_nodes: Option<Arc<str>>,
}

/// Names joined with ",", `None` when there are none.
pub fn joined<'a>(names: impl Iterator<Item = &'a str>) -> Option<Arc<str>> {
    let v: Vec<&str> = names.filter(|n| !n.is_empty()).collect();
    (!v.is_empty()).then(|| Arc::from(v.join(",")))
}

/// One EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    /// Its namespace and name.
    pub key: SliceKey,
    /// The Service it belongs to (its `kubernetes.io/service-name` label).
    pub service: ServiceKey,
    /// `addressType`.
    pub address_type: AddressType,
    /// The ports taken (`Skipped` counts the others).
    pub ports: Vec<SlicePort>,
    /// The endpoints taken, in the slice's order.
    pub endpoints: Vec<SliceEndpoint>,
}

impl Slice {
    /// The port number this slice gives the port named `name` ("" unnamed).
    pub fn port(&self, name: &str) -> Option<u16> {
        self.ports.iter().find(|p| p.name == name).map(|p| p.port)
    }
}

/// Why an EndpointSlice object is not taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SliceError {
    /// No `metadata.name`.
    NoName,
    /// No `kubernetes.io/service-name` label: not part of any Service.
    NoServiceLabel(SliceKey),
}

impl std::error::Error for SliceError {}

impl fmt::Display for SliceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SliceError::NoName => write!(f, "EndpointSlice without metadata.name"),
            SliceError::NoServiceLabel(k) => {
                write!(f, "EndpointSlice {k} has no {SERVICE_NAME_LABEL} label")
            }
        }
    }
}

/// What was left out of a slice while reading it (logged by the caller).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Endpoints whose first address is not an IP address of the slice's type.
    pub bad_addresses: usize,
    /// Ports without a number, with a number out of range, or not TCP.
    pub ports: usize,
}

impl Slice {
    /// Reads an EndpointSlice object. A missing namespace reads as
    /// `default` (as kubectl does for files without one).
    pub fn from_k8s(obj: &discovery::EndpointSlice) -> Result<(Slice, Skipped), SliceError> {
        let name = obj.metadata.name.clone().ok_or(SliceError::NoName)?;
        let namespace = obj
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let key = SliceKey { namespace, name };
        let service = obj
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
            .filter(|s| !s.is_empty())
            .cloned()
            .ok_or_else(|| SliceError::NoServiceLabel(key.clone()))?;
        let service = ServiceKey {
            namespace: key.namespace.clone(),
            name: service,
        };
        let address_type = match obj.address_type.as_str() {
            "IPv4" => AddressType::IPv4,
            "IPv6" => AddressType::IPv6,
            _ => AddressType::Other,
        };
        let mut skipped = Skipped::default();
        let mut ports = Vec::new();
        for p in obj.ports.iter().flatten() {
            let tcp = matches!(p.protocol.as_deref(), None | Some("TCP"));
            match p
                .port
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n > 0)
            {
                Some(port) if tcp => ports.push(SlicePort {
                    name: p.name.clone().unwrap_or_default(),
                    port,
                }),
                _ => skipped.ports += 1,
            }
        }
        let mut endpoints = Vec::with_capacity(obj.endpoints.len());
        for ep in &obj.endpoints {
            let address = ep
                .addresses
                .first()
                .and_then(|a| a.parse::<IpAddr>().ok())
                .filter(|ip| match address_type {
                    AddressType::IPv4 => ip.is_ipv4(),
                    AddressType::IPv6 => ip.is_ipv6(),
                    AddressType::Other => false,
                });
            let Some(address) = address else {
                skipped.bad_addresses += usize::from(address_type != AddressType::Other);
                continue;
            };
            let conditions = ep.conditions.as_ref();
            let hints = ep.hints.as_ref();
            endpoints.push(SliceEndpoint {
                address,
                ready: conditions.and_then(|c| c.ready),
                serving: conditions.and_then(|c| c.serving),
                terminating: conditions.and_then(|c| c.terminating),
                zone: ep.zone.as_deref().filter(|z| !z.is_empty()).map(Arc::from),
                node_name: ep
                    .node_name
                    .as_deref()
                    .filter(|n| !n.is_empty())
                    .map(Arc::from),
                hints_zones: joined(
                    hints
                        .and_then(|h| h.for_zones.as_ref())
                        .into_iter()
                        .flatten()
                        .map(|z| z.name.as_str()),
                ),
                hints_nodes: joined(
                    hints
                        .and_then(|h| h.for_nodes.as_ref())
                        .into_iter()
                        .flatten()
                        .map(|n| n.name.as_str()),
                ),
            });
        }
        Ok((
            Slice {
                key,
                service,
                address_type,
                ports,
                endpoints,
            },
            skipped,
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn obj(v: serde_json::Value) -> discovery::EndpointSlice {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn reads_a_kubectl_slice() {
        let o = obj(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-abc", "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"},
                      {"name": "dns", "port": 53, "protocol": "UDP"}],
            "endpoints": [
                {"addresses": ["10.0.0.1", "10.0.0.9"], "conditions": {"ready": true},
                 "zone": "z1", "nodeName": "n1",
                 "hints": {"forZones": [{"name": "z1"}], "forNodes": [{"name": "n1"}]}},
                {"addresses": ["fe80::1"], "conditions": {}},
                {"addresses": ["10.0.0.2"]}
            ]
        }));
        let (s, skipped) = Slice::from_k8s(&o).unwrap();
        assert_eq!(s.service.to_string(), "shop/web");
        assert_eq!(s.port("http"), Some(8080));
        assert_eq!(s.port("dns"), None);
        assert_eq!(skipped.ports, 1);
        assert_eq!(skipped.bad_addresses, 1);
        assert_eq!(s.endpoints.len(), 2);
        let e = &s.endpoints[0];
        assert_eq!(e.address.to_string(), "10.0.0.1");
        assert_eq!(
            (e.ready, e.serving, e.terminating),
            (Some(true), None, None)
        );
        assert_eq!(e.hints_zones.as_deref(), Some("z1"));
        assert_eq!(e.hints_nodes.as_deref(), Some("n1"));
        assert_eq!(s.endpoints[1].hints_zones, None);
        assert_eq!(s.endpoints[1].ready, None);
    }

    #[test]
    fn a_slice_without_service_label_is_refused() {
        let o = obj(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "x"}, "addressType": "IPv4", "endpoints": []
        }));
        assert!(matches!(
            Slice::from_k8s(&o),
            Err(SliceError::NoServiceLabel(_))
        ));
    }
}
