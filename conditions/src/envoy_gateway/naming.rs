//! Which Service a locality of an Envoy Gateway ClusterLoadAssignment
//! comes from, the way EG writes it.
//!
//! EG (>= 1.4 through main, `internal/xds/translator/cluster.go` and
//! `metadata.go`) builds one `LocalityLbEndpoints` per backendRef of a route
//! rule (per backendRef and zone on the zone-aware path) and stamps each
//! with the backend it came from:
//!
//! ```yaml
//! locality: {region: httproute/<ns>/<route>/rule/<i>/backend/<j>}   # no region when zonal
//! metadata:
//!   filter_metadata:
//!     envoy-gateway:
//!       resources: [{kind: Service, name: web, namespace: shop, sectionName: "8080"}]
//! ```
//!
//! `sectionName` is the backendRef's port, the **Service port number** (not
//! its name). EG then takes the EndpointSlice port of that Service port's
//! *name* and writes the slice port number (the target port) into each
//! endpoint's address. So the companion needs neither the port name nor the
//! Service object: it matches each endpoint by `address:port` among the
//! Service's slice ports of that number (see `hook`).
//!
//! Identity comes from this metadata only, never from cluster or region
//! names: those are EG's to change (`mergeBackends` shares content-hashed
//! clusters between routes, `XDSNameSchemeV2` renames). A locality without
//! the metadata, of another kind (`Backend`, `ServiceImport`), or naming
//! several different Services, is not ours: it is left as EG sent it. The
//! region is never read.

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};

use crate::model::slice::ServiceKey;

/// EG's filter_metadata namespace.
pub const EG_METADATA_NAMESPACE: &str = "envoy-gateway";
/// The list of resources in it.
pub const EG_RESOURCES_KEY: &str = "resources";

/// The backend a locality was built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalityBackend {
    /// The Service the locality's metadata names.
    pub service: ServiceKey,
    /// The backendRef's port (the Service port number), when EG wrote it.
    pub section_name: Option<String>,
}

/// Why a locality is not mapped to a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotAService {
    /// No `envoy-gateway` metadata with resources (EG < 1.4, or not a route backend).
    NoMetadata,
    /// A resource of another kind (`Backend`, `ServiceImport`, ...).
    Kind(String),
    /// Resources naming more than one Service.
    Ambiguous,
}

fn string_field<'a>(s: &'a Struct, key: &str) -> Option<&'a str> {
    match s.fields.get(key)?.kind.as_ref()? {
        Kind::StringValue(v) => Some(v.as_str()),
        _ => None,
    }
}

fn resources(metadata: Option<&Metadata>) -> Option<&[Value]> {
    let eg = metadata?.filter_metadata.get(EG_METADATA_NAMESPACE)?;
    match eg.fields.get(EG_RESOURCES_KEY)?.kind.as_ref()? {
        Kind::ListValue(list) => Some(&list.values),
        _ => None,
    }
}

/// The Service a locality's metadata names.
pub fn metadata_backend(metadata: Option<&Metadata>) -> Result<LocalityBackend, NotAService> {
    let list = resources(metadata).ok_or(NotAService::NoMetadata)?;
    let mut found: Option<LocalityBackend> = None;
    for v in list {
        let Some(Kind::StructValue(r)) = v.kind.as_ref() else {
            continue;
        };
        let kind = string_field(r, "kind").unwrap_or("");
        // `kind` comes from the object's TypeMeta: "" when it was not set.
        if !(kind.is_empty() || kind == "Service") {
            return Err(NotAService::Kind(kind.to_string()));
        }
        let (Some(name), Some(namespace)) = (string_field(r, "name"), string_field(r, "namespace"))
        else {
            continue;
        };
        if name.is_empty() || namespace.is_empty() {
            continue;
        }
        let b = LocalityBackend {
            service: ServiceKey {
                namespace: namespace.to_string(),
                name: name.to_string(),
            },
            section_name: string_field(r, "sectionName").map(str::to_string),
        };
        match &found {
            Some(f) if f.service != b.service => return Err(NotAService::Ambiguous),
            Some(_) => {}
            None => found = Some(b),
        }
    }
    found.ok_or(NotAService::NoMetadata)
}

/// A route backend's place, parsed from an EG locality region or cluster
/// name (`<kind>/<ns>/<route>/rule/<i>[/backend/<j>]`): EG's naming, as the
/// tests know it; the hook never reads it (identity is the metadata's).
#[cfg(test)]
#[derive(Clone, Debug, PartialEq, Eq)]
struct RouteBackend {
    route_kind: String,
    namespace: String,
    route: String,
    rule: usize,
    backend: Option<usize>,
}

/// Parses EG's route destination naming (`irRouteDestinationName`,
/// `irDestinationSettingName`).
#[cfg(test)]
fn parse_route_name(name: &str) -> Option<RouteBackend> {
    let parts: Vec<&str> = name.split('/').collect();
    let (kind, ns, route, rule_kw, rule) = match parts.as_slice() {
        [k, n, r, kw, i] | [k, n, r, kw, i, _, _] => (*k, *n, *r, *kw, *i),
        _ => return None,
    };
    if rule_kw != "rule" || !kind.ends_with("route") {
        return None;
    }
    let backend = match parts.as_slice() {
        [_, _, _, _, _, "backend", j] => Some(j.parse().ok()?),
        [_, _, _, _, _] => None,
        _ => return None,
    };
    Some(RouteBackend {
        route_kind: kind.to_string(),
        namespace: ns.to_string(),
        route: route.to_string(),
        rule: rule.parse().ok()?,
        backend,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::envoy_gateway::testing::{resource_metadata, ResourceRef};
    use envoy_types::pb::envoy::config::endpoint::v3::LocalityLbEndpoints;

    /// The Service a locality's endpoints belong to (the hook reads the
    /// metadata of the localities it walks itself).
    fn locality_backend(l: &LocalityLbEndpoints) -> Result<LocalityBackend, NotAService> {
        metadata_backend(l.metadata.as_ref())
    }

    fn locality(refs: &[ResourceRef]) -> LocalityLbEndpoints {
        LocalityLbEndpoints {
            metadata: Some(resource_metadata(refs)),
            ..Default::default()
        }
    }

    fn svc_ref(ns: &str, name: &str, port: Option<&str>) -> ResourceRef {
        ResourceRef {
            kind: "Service".into(),
            namespace: ns.into(),
            name: name.into(),
            section_name: port.map(str::to_string),
        }
    }

    #[test]
    fn a_service_backend_maps_by_its_metadata() {
        let b = locality_backend(&locality(&[svc_ref("shop", "web", Some("8080"))])).unwrap();
        assert_eq!(b.service.to_string(), "shop/web");
        assert_eq!(b.section_name.as_deref(), Some("8080"));
        // kind not set in TypeMeta: still a Service.
        let mut r = svc_ref("shop", "web", None);
        r.kind = String::new();
        assert_eq!(
            locality_backend(&locality(&[r])).unwrap().service.name,
            "web"
        );
    }

    #[test]
    fn other_kinds_missing_or_ambiguous_metadata_are_not_services() {
        let mut backend = svc_ref("shop", "ext", None);
        backend.kind = "Backend".into();
        assert_eq!(
            locality_backend(&locality(&[backend])),
            Err(NotAService::Kind("Backend".into()))
        );
        assert_eq!(
            locality_backend(&LocalityLbEndpoints::default()),
            Err(NotAService::NoMetadata)
        );
        assert_eq!(
            locality_backend(&locality(&[
                svc_ref("shop", "web", Some("80")),
                svc_ref("shop", "api", Some("80"))
            ])),
            Err(NotAService::Ambiguous)
        );
        // The same Service twice (merged backends of one Service): fine.
        assert!(locality_backend(&locality(&[
            svc_ref("shop", "web", Some("80")),
            svc_ref("shop", "web", Some("80"))
        ]))
        .is_ok());
    }

    #[test]
    fn route_names_parse_for_logs() {
        let r = parse_route_name("httproute/shop/app/rule/2/backend/1").unwrap();
        assert_eq!(
            (r.namespace.as_str(), r.route.as_str(), r.rule, r.backend),
            ("shop", "app", 2, Some(1))
        );
        let r = parse_route_name("grpcroute/shop/app/rule/0").unwrap();
        assert_eq!((r.route_kind.as_str(), r.backend), ("grpcroute", None));
        for bad in [
            "",
            "backend",
            "httproute/shop/app/rule/x",
            "httproute/shop/app/rules/0",
            "httproute/shop/app/rule/0/backend",
            "tcp/shop/app/rule/0",
        ] {
            assert_eq!(parse_route_name(bad), None, "{bad}");
        }
    }
}
