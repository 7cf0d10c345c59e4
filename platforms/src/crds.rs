//! The CRDs of each platform release, as copied at its tag.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// One platform release: its CRDs by (group, kind).
pub struct Release {
    /// The platform (`envoy-gateway`, `istio`, ...): the folder under `crds/`.
    pub platform: String,
    /// The release tag the CRDs were copied at.
    pub tag: String,
    /// Each CustomResourceDefinition, as copied, by (group, kind).
    pub crds: BTreeMap<(String, String), Value>,
}

/// The platform whose CRDs define `group`.
pub fn platform_of(group: &str) -> Option<&'static str> {
    match group {
        "gateway.envoyproxy.io" | "gateway.networking.k8s.io" => Some("envoy-gateway"),
        "networking.istio.io" | "extensions.istio.io" => Some("istio"),
        "cert-manager.io" => Some("cert-manager"),
        "trust.cert-manager.io" => Some("trust-manager"),
        "monitoring.coreos.com" => Some("prometheus-operator"),
        _ => None,
    }
}

/// `platforms/crds/`.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crds")
}

/// Every release under `root`, sorted by platform and tag.
pub fn releases(root: &Path) -> Result<Vec<Release>, String> {
    let mut out = Vec::new();
    for platform in sorted_dirs(root)? {
        for tag in sorted_dirs(&platform)? {
            let mut crds = BTreeMap::new();
            let files = std::fs::read_dir(&tag).map_err(|e| format!("{}: {e}", tag.display()))?;
            for file in files.flatten() {
                let path = file.path();
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                let crd: Value = serde_saphyr::from_str(&text)
                    .map_err(|e| format!("{}: not YAML: {e}", path.display()))?;
                let group = crd["spec"]["group"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let kind = crd["spec"]["names"]["kind"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                crds.insert((group, kind), crd);
            }
            out.push(Release {
                platform: file_name(&platform),
                tag: file_name(&tag),
                crds,
            });
        }
    }
    Ok(out)
}

impl Release {
    /// The schema of `kind` at `version` of `group`, and whether the kind is
    /// namespaced; `Err` says what is missing (no CRD, version not served).
    pub fn schema(&self, group: &str, version: &str, kind: &str) -> Result<(&Value, bool), String> {
        let crd = self
            .crds
            .get(&(group.to_string(), kind.to_string()))
            .ok_or_else(|| format!("no {kind} CRD of {group} in {} {}", self.platform, self.tag))?;
        let namespaced = crd["spec"]["scope"] == "Namespaced";
        let versions = crd["spec"]["versions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let v = crd["spec"]["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == version && v["served"] != false)
            .ok_or_else(|| {
                let served: Vec<&str> = versions
                    .iter()
                    .filter(|v| v["served"] != false)
                    .filter_map(|v| v["name"].as_str())
                    .collect();
                format!(
                    "{group}/{version} {kind} is not served by {} {} (served: {})",
                    self.platform,
                    self.tag,
                    served.join(", ")
                )
            })?;
        Ok((&v["schema"]["openAPIV3Schema"], namespaced))
    }
}

fn sorted_dirs(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    Ok(dirs)
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
