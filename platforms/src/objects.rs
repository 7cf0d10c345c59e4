//! Every object serving-picker ships: each folder under `deploy/` with a
//! kustomization built by `kubectl kustomize` (offline), every YAML file
//! under `deploy/` and `examples/`, and the same manifests as a release
//! renders them (`scripts/render-manifests.py`: images pinned by digest).
//! Documents without `apiVersion` and `kind` (Helm values, JSON patches) are
//! not objects.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// An object and where it comes from.
pub struct Shipped {
    /// Where it comes from (a file under `deploy/` or `examples/`, a built kustomization, a
    /// rendered release), named in messages.
    pub source: String,
    /// The object as parsed.
    pub object: Value,
}

impl Shipped {
    /// `group`, `version`, `kind`.
    pub fn gvk(&self) -> (String, String, String) {
        let api = self.object["apiVersion"].as_str().unwrap_or_default();
        let (group, version) = api.rsplit_once('/').unwrap_or(("", api));
        let kind = self.object["kind"].as_str().unwrap_or_default();
        (group.to_string(), version.to_string(), kind.to_string())
    }

    /// `Kind namespace/name`, for messages.
    pub fn name(&self) -> String {
        let (_, _, kind) = self.gvk();
        let meta = &self.object["metadata"];
        format!(
            "{kind} {}/{}",
            meta["namespace"].as_str().unwrap_or("-"),
            meta["name"].as_str().unwrap_or("?")
        )
    }
}

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The YAML files under `dir`, recursively, sorted.
pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The objects in a YAML text (`source` names it in messages).
pub fn parse(source: &str, text: &str) -> Result<Vec<Shipped>, String> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(text).map_err(|e| format!("{source}: not YAML: {e}"))?;
    Ok(docs
        .into_iter()
        .filter(|d| d.get("apiVersion").is_some() && d.get("kind").is_some())
        .filter(|d| d["kind"] != "Kustomization")
        .map(|object| Shipped {
            source: source.to_string(),
            object,
        })
        .collect())
}

/// Every file's objects under `deploy/` and `examples/` of `root`, and each
/// kustomization's build.
pub fn shipped(root: &Path) -> Result<Vec<Shipped>, String> {
    let mut out = Vec::new();
    for top in ["deploy", "examples"] {
        for file in yaml_files(&root.join(top)) {
            let name = file
                .strip_prefix(root)
                .unwrap_or(&file)
                .display()
                .to_string();
            let text = std::fs::read_to_string(&file).map_err(|e| format!("{name}: {e}"))?;
            out.extend(parse(&name, &text)?);
            if file.file_name().is_some_and(|n| n == "kustomization.yaml") {
                let dir = file.parent().unwrap_or(root);
                let built = kustomize(dir)?;
                out.extend(parse(
                    &format!(
                        "kubectl kustomize {}",
                        dir.strip_prefix(root).unwrap_or(dir).display()
                    ),
                    &built,
                )?);
            }
        }
    }
    Ok(out)
}

/// `kubectl kustomize DIR` (offline).
pub fn kustomize(dir: &Path) -> Result<String, String> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .map_err(|e| {
            format!(
                "kubectl kustomize {}: {e} (is kubectl installed?)",
                dir.display()
            )
        })?;
    if !out.status.success() {
        return Err(format!(
            "kubectl kustomize {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The manifests as `make release` renders them into `out`: every
/// serving-picker image reference pinned to a made-up digest.
pub fn render_release(root: &Path, out: &Path) -> Result<(), String> {
    let re = regex::Regex::new(
        r"registry\.example\.com/(serving-picker(?:-[a-z0-9]+)*):([A-Za-z0-9._-]+)",
    )
    .map_err(|e| e.to_string())?;
    let mut images = std::collections::BTreeSet::new();
    for top in ["deploy", "examples"] {
        for file in yaml_files(&root.join(top)) {
            let text = std::fs::read_to_string(&file).map_err(|e| e.to_string())?;
            for c in re.captures_iter(&text) {
                images.insert((c[1].to_string(), c[2].to_string()));
            }
        }
    }
    let list: String = images
        .iter()
        .map(|(name, tag)| format!("{name} {tag} sha256:{}\n", "0".repeat(64)))
        .collect();
    let version = images
        .iter()
        .next()
        .map(|(_, t)| t.split('-').next().unwrap_or(t).to_string())
        .unwrap_or_default();
    std::fs::create_dir_all(out).map_err(|e| e.to_string())?;
    let images_txt = out.join("images.txt");
    std::fs::write(&images_txt, list).map_err(|e| e.to_string())?;
    let status = Command::new("python3")
        .arg(root.join("scripts/render-manifests.py"))
        .arg(&images_txt)
        .arg("registry.example.com")
        .arg(&version)
        .arg(out.join("manifests"))
        .args(["deploy", "examples"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("render-manifests.py: {e}"))?;
    if !status.status.success() {
        return Err(format!(
            "render-manifests.py: {}{}",
            String::from_utf8_lossy(&status.stdout),
            String::from_utf8_lossy(&status.stderr)
        ));
    }
    Ok(())
}
