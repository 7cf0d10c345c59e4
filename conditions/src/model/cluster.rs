//! `--cluster NAME=NAMESPACE/SERVICE:PORT_NAME`: which Envoy cluster (EDS
//! resource name) serves which Service port.

use std::fmt;
use std::str::FromStr;

use crate::model::slice::ServiceKey;

/// One Envoy cluster fed from one Service port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSpec {
    /// The EDS resource name: the cluster's name, or its
    /// `eds_cluster_config.service_name` when it has one.
    pub name: String,
    /// The Service whose slices it is built from.
    pub service: ServiceKey,
    /// The Service port's name; "" for an unnamed port (`SERVICE` or `SERVICE:`).
    pub port_name: String,
}

/// Why a `--cluster` value or set of values is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClusterSpecError {
    /// Not of the form `NAME=NAMESPACE/SERVICE:PORT_NAME`.
    #[error("--cluster {0:?}: expected NAME=NAMESPACE/SERVICE:PORT_NAME")]
    Form(String),
    /// A namespace, Service or port name that is not a DNS name.
    #[error("--cluster {0:?}: namespace, service and port name must be lower-case DNS names")]
    NotDns(String),
    /// The same cluster name twice.
    #[error("--cluster {0:?} is given twice")]
    Twice(String),
}

impl FromStr for ClusterSpec {
    type Err = ClusterSpecError;

    fn from_str(s: &str) -> Result<ClusterSpec, ClusterSpecError> {
        let usage = || ClusterSpecError::Form(s.to_string());
        let (name, rest) = s.split_once('=').ok_or_else(usage)?;
        let (namespace, rest) = rest.split_once('/').ok_or_else(usage)?;
        let (service, port_name) = rest.split_once(':').unwrap_or((rest, ""));
        if name.is_empty() || namespace.is_empty() || service.is_empty() {
            return Err(usage());
        }
        let dns_label = |v: &str| {
            v.len() <= 253
                && v.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        };
        if !dns_label(namespace) || !dns_label(service) || !dns_label(port_name) {
            return Err(ClusterSpecError::NotDns(s.to_string()));
        }
        Ok(ClusterSpec {
            name: name.to_string(),
            service: ServiceKey {
                namespace: namespace.to_string(),
                name: service.to_string(),
            },
            port_name: port_name.to_string(),
        })
    }
}

impl fmt::Display for ClusterSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}:{}", self.name, self.service, self.port_name)
    }
}

/// The EDS resource name of a Service port under `--manage`:
/// `<namespace>/<service>:<port>`, where `<port>` is the port's name, or
/// its number (the endpoints' port as the EndpointSlice gives it) when the
/// port has no name. Kubernetes port names always hold a letter, so a
/// number never reads as a name.
pub fn template_name(service: &ServiceKey, port_name: &str, port_number: u16) -> String {
    if port_name.is_empty() {
        format!("{}/{}:{port_number}", service.namespace, service.name)
    } else {
        format!("{}/{}:{port_name}", service.namespace, service.name)
    }
}

/// A Service port named as [`template_name`] writes it: the Service, the
/// port name ("" for a number) and the number (for an unnamed port).
/// `None` when the name cannot be one (so never served under `--manage`).
pub fn parse_template(name: &str) -> Option<(ServiceKey, String, Option<u16>)> {
    let (namespace, rest) = name.split_once('/')?;
    let (service, port) = rest.split_once(':')?;
    let label = |v: &str| {
        !v.is_empty()
            && v.len() <= 253
            && v.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    };
    if !label(namespace) || !label(service) || port.is_empty() {
        return None;
    }
    let key = ServiceKey {
        namespace: namespace.to_string(),
        name: service.to_string(),
    };
    if port.chars().all(|c| c.is_ascii_digit()) {
        let n: u16 = port.parse().ok().filter(|n| *n > 0)?;
        return Some((key, String::new(), Some(n)));
    }
    let port_name_ok = port.len() <= 63
        && port
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    port_name_ok.then(|| (key, port.to_string(), None))
}

/// Checks a set of specs: cluster names unique.
pub fn check_unique(specs: &[ClusterSpec]) -> Result<(), ClusterSpecError> {
    let mut seen = std::collections::BTreeSet::new();
    for s in specs {
        if !seen.insert(s.name.as_str()) {
            return Err(ClusterSpecError::Twice(s.name.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn parses_the_forms() {
        let c: ClusterSpec = "backend=shop/web:http".parse().unwrap();
        assert_eq!(c.name, "backend");
        assert_eq!(c.service.to_string(), "shop/web");
        assert_eq!(c.port_name, "http");
        let c: ClusterSpec = "b=shop/web".parse().unwrap();
        assert_eq!(c.port_name, "");
        let c: ClusterSpec = "outbound|80||web.shop=shop/web:".parse().unwrap();
        assert_eq!(c.name, "outbound|80||web.shop");
        assert_eq!(c.port_name, "");
        for bad in [
            "",
            "backend",
            "backend=web:http",
            "=ns/web:http",
            "b=ns/:http",
            "b=NS/web:http",
        ] {
            assert!(bad.parse::<ClusterSpec>().is_err(), "{bad:?} accepted");
        }
        let twice = vec![c.clone(), c];
        assert!(check_unique(&twice).is_err());
    }

    #[test]
    fn template_names_round_trip() {
        let web = ServiceKey {
            namespace: "shop".into(),
            name: "web".into(),
        };
        assert_eq!(template_name(&web, "http", 8080), "shop/web:http");
        assert_eq!(template_name(&web, "", 8080), "shop/web:8080");
        assert_eq!(
            parse_template("shop/web:http"),
            Some((web.clone(), "http".into(), None))
        );
        assert_eq!(
            parse_template("shop/web:8080"),
            Some((web, String::new(), Some(8080)))
        );
        for bad in [
            "web",
            "shop/web",
            "shop/web:",
            "Shop/web:http",
            "shop/:http",
            "shop/web:0",
            "shop/web:70000",
            "shop/web:HTTP",
            "backend",
        ] {
            assert_eq!(parse_template(bad), None, "{bad}");
        }
    }
}
