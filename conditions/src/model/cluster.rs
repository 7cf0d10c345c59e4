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
    pub service: ServiceKey,
    /// The Service port's name; "" for an unnamed port (`SERVICE` or `SERVICE:`).
    pub port_name: String,
}

impl FromStr for ClusterSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<ClusterSpec, String> {
        let usage = || format!("--cluster {s:?}: expected NAME=NAMESPACE/SERVICE:PORT_NAME");
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
            return Err(format!(
                "--cluster {s:?}: namespace, service and port name must be lower-case DNS names"
            ));
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

/// Checks a set of specs: cluster names unique.
pub fn check_unique(specs: &[ClusterSpec]) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for s in specs {
        if !seen.insert(s.name.as_str()) {
            return Err(format!("--cluster {:?} is given twice", s.name));
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
}
