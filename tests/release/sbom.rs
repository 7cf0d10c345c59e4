//! The SBOMs test-release read back from the registry (scripts/check-release.sh pulls each
//! image's SBOM artifact by the image's digest into SBOM_DIR), checked against the artefacts
//! unpacked from the images and against Cargo.lock, through two cargo views that do not share
//! the generator's code:
//!
//! - the described component is the artefact: its package name, the release's version, the
//!   sha256 of the file unpacked from the image, the commit the images' revision label names,
//!   the cargo target it was built for;
//! - every crate is a Cargo.lock package: a registry crate with its purl and the SHA-256 that
//!   Cargo.lock records for its .crate file, or a workspace crate;
//! - the crates are exactly those `cargo tree -p <package> --target <triple> -e normal` names
//!   (what `cargo build -p` builds into the artefact, proc macros included, each counted once);
//! - `cargo metadata --filter-platform <triple>` agrees: every crate in scope `required` is one
//!   the package reaches through normal dependencies there (the build-time crates build for the
//!   host, whose platform that view filters out), and every non-optional dependency the package
//!   declares itself is named;
//! - every crate whose source path the artefact's bytes hold (panic locations:
//!   `registry/src/<index>/<name>-<version>/`) is named, in scope `required`;
//! - the dependency graph refers to named crates only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// One released artefact and what it is built from.
pub struct Artefact {
    /// The SBOM's file name in the SBOM directory (`<released file>.cdx.json`).
    pub sbom: String,
    /// The file as unpacked from its image.
    pub file: PathBuf,
    pub package: &'static str,
    pub target: &'static str,
}

/// (name, version) -> checksum (None for workspace crates) of every Cargo.lock package.
fn lock_packages(root: &Path) -> Result<BTreeMap<(String, String), Option<String>>, String> {
    let text =
        std::fs::read_to_string(root.join("Cargo.lock")).map_err(|e| format!("Cargo.lock: {e}"))?;
    let mut out = BTreeMap::new();
    for block in text.split("[[package]]").skip(1) {
        let field = |key: &str| {
            block.lines().find_map(|l| {
                l.strip_prefix(&format!("{key} = \""))
                    .and_then(|v| v.strip_suffix('"'))
                    .map(str::to_string)
            })
        };
        let (Some(name), Some(version)) = (field("name"), field("version")) else {
            return Err(format!(
                "Cargo.lock: a package without name or version:{block}"
            ));
        };
        out.insert((name, version), field("checksum"));
    }
    Ok(out)
}

fn cargo(root: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()))
        .args(args)
        .current_dir(root)
        .output()
        .map_err(|e| format!("cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The crates `cargo build -p package --target target` builds, the package aside.
fn cargo_tree(root: &Path, a: &Artefact) -> Result<BTreeSet<(String, String)>, String> {
    let out = cargo(
        root,
        &[
            "tree", "--locked", "-p", a.package, "--target", a.target, "-e", "normal", "--prefix",
            "none", "-f", "{p}",
        ],
    )?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next()?;
            let version = words.next()?.strip_prefix('v')?;
            Some((name.to_string(), version.to_string()))
        })
        .filter(|(name, _)| name != a.package)
        .collect())
}

/// From `cargo metadata --filter-platform target` (features unified across the workspace,
/// so a superset of what one package builds): the crates `package` reaches through normal
/// dependencies, and the non-optional normal dependencies it declares itself.
type Reach = (BTreeSet<(String, String)>, BTreeSet<String>);

fn metadata_reach(root: &Path, a: &Artefact) -> Result<Reach, String> {
    let out = cargo(
        root,
        &[
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--filter-platform",
            a.target,
        ],
    )?;
    let m: Value = serde_json::from_str(&out).map_err(|e| format!("cargo metadata: {e}"))?;
    let mut ids = BTreeMap::new();
    let mut non_optional = BTreeSet::new();
    let mut start = None;
    for p in m["packages"].as_array().into_iter().flatten() {
        let (Some(id), Some(name), Some(version)) =
            (p["id"].as_str(), p["name"].as_str(), p["version"].as_str())
        else {
            continue;
        };
        ids.insert(id.to_string(), (name.to_string(), version.to_string()));
        if name == a.package {
            start = Some(id.to_string());
            for d in p["dependencies"].as_array().into_iter().flatten() {
                if d["kind"].is_null() && d["optional"] == false {
                    non_optional.extend(d["name"].as_str().map(str::to_string));
                }
            }
        }
    }
    let start = start.ok_or_else(|| format!("cargo metadata names no package {}", a.package))?;
    let mut edges: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for node in m["resolve"]["nodes"].as_array().into_iter().flatten() {
        let Some(id) = node["id"].as_str() else {
            continue;
        };
        let normal = node["deps"].as_array().into_iter().flatten().filter(|d| {
            d["dep_kinds"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k["kind"].is_null()))
        });
        edges.insert(
            id.to_string(),
            normal
                .filter_map(|d| d["pkg"].as_str().map(str::to_string))
                .collect(),
        );
    }
    // Declared by the package, and resolved for this platform.
    let declared = edges
        .get(&start)
        .into_iter()
        .flatten()
        .filter_map(|id| ids.get(id))
        .map(|(name, _)| name.clone())
        .filter(|name| non_optional.contains(name))
        .collect();
    let mut seen = BTreeSet::from([start.clone()]);
    let mut todo = vec![start.clone()];
    while let Some(id) = todo.pop() {
        for next in edges.get(&id).into_iter().flatten() {
            if seen.insert(next.clone()) {
                todo.push(next.clone());
            }
        }
    }
    seen.remove(&start);
    Ok((
        seen.iter().filter_map(|id| ids.get(id).cloned()).collect(),
        declared,
    ))
}

/// `<name>-<version>` of every registry source directory the file's bytes name.
fn traces(
    file: &Path,
    lock: &BTreeMap<(String, String), Option<String>>,
) -> Result<BTreeSet<(String, String)>, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let by_dir: BTreeMap<String, (String, String)> = lock
        .keys()
        .map(|(n, v)| (format!("{n}-{v}"), (n.clone(), v.clone())))
        .collect();
    let needle = b"registry/src/";
    let mut found = BTreeSet::new();
    let mut i = 0;
    while let Some(at) = bytes[i..].windows(needle.len()).position(|w| w == needle) {
        let rest = &bytes[i + at + needle.len()..];
        // <index dir>/<name>-<version>/
        let mut parts = rest.splitn(3, |&b| b == b'/');
        let (_, dir) = (parts.next(), parts.next());
        if let Some(crate_) = dir.and_then(|d| by_dir.get(String::from_utf8_lossy(d).as_ref())) {
            found.insert(crate_.clone());
        }
        i += at + needle.len();
    }
    Ok(found)
}

fn sha256(file: &Path) -> Result<String, String> {
    let out = Command::new("sha256sum")
        .arg(file)
        .output()
        .map_err(|e| format!("sha256sum: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .map(str::to_string)
        .ok_or_else(|| format!("sha256sum {}: {out:?}", file.display()))
}

fn property<'a>(component: &'a Value, name: &str) -> Option<&'a str> {
    component["properties"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name)?["value"]
        .as_str()
}

/// Checks one SBOM; Ok(a summary) or Err(every problem found).
pub fn check(
    root: &Path,
    sbom_dir: &Path,
    a: &Artefact,
    version: &str,
    commit: &str,
) -> Result<String, String> {
    let path = sbom_dir.join(&a.sbom);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let bom: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let lock = lock_packages(root)?;
    let mut problems = Vec::new();

    let described = &bom["metadata"]["component"];
    let digest = sha256(&a.file)?;
    let hashes: Vec<&str> = described["hashes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|h| h["alg"] == "SHA-256")
        .filter_map(|h| h["content"].as_str())
        .collect();
    if hashes != [digest.as_str()] {
        problems.push(format!(
            "metadata.component SHA-256 {hashes:?}, the file from the image is {digest}"
        ));
    }
    for (what, got, want) in [
        ("name", described["name"].as_str(), a.package),
        ("version", described["version"].as_str(), version),
        (
            "commit",
            property(described, "serving-picker:commit"),
            commit,
        ),
        (
            "cargo target",
            property(described, "serving-picker:cargo-target"),
            a.target,
        ),
    ] {
        if got != Some(want) {
            problems.push(format!("metadata.component {what} {got:?}, want {want:?}"));
        }
    }

    let mut named = BTreeSet::new();
    let mut required = BTreeSet::new();
    let mut refs = BTreeSet::new();
    refs.extend(described["bom-ref"].as_str().map(str::to_string));
    for c in bom["components"].as_array().into_iter().flatten() {
        let (Some(name), Some(v)) = (c["name"].as_str(), c["version"].as_str()) else {
            problems.push(format!("a component without name or version: {c}"));
            continue;
        };
        let key = (name.to_string(), v.to_string());
        refs.extend(c["bom-ref"].as_str().map(str::to_string));
        match lock.get(&key) {
            None => problems.push(format!("{name} {v} is not in Cargo.lock")),
            Some(Some(checksum)) => {
                let purl = format!("pkg:cargo/{name}@{v}");
                if c["purl"].as_str() != Some(purl.as_str()) {
                    problems.push(format!("{name} {v}: purl {}, want {purl}", c["purl"]));
                }
                let sha = c["hashes"][0]["content"].as_str();
                if c["hashes"][0]["alg"] != "SHA-256" || sha != Some(checksum.as_str()) {
                    problems.push(format!(
                        "{name} {v}: hash {:?}, Cargo.lock's checksum {checksum}",
                        sha
                    ));
                }
            }
            Some(None) => {} // a workspace crate: no checksum, no purl
        }
        if c["scope"] == "required" {
            required.insert(key.clone());
        }
        named.insert(key);
    }

    let tree = cargo_tree(root, a)?;
    let missing: Vec<_> = tree.difference(&named).collect();
    let extra: Vec<_> = named.difference(&tree).collect();
    if !missing.is_empty() || !extra.is_empty() {
        problems.push(format!(
            "against cargo tree: missing {missing:?}, not built in {extra:?}"
        ));
    }

    // What the artefact holds, against cargo metadata's graph for its target.
    // The build-time rest is left out: metadata filters the graph by the
    // target's platform, while proc macros build for the host (pest_derive
    // pulls stacker on linux-gnu hosts, into no musl artefact).
    let (reached, declared) = metadata_reach(root, a)?;
    let unreached: Vec<_> = required.difference(&reached).collect();
    if !unreached.is_empty() {
        problems.push(format!(
            "cargo metadata: {} reaches none of {unreached:?}",
            a.package
        ));
    }
    let names: BTreeSet<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
    let undeclared: Vec<_> = declared
        .iter()
        .filter(|d| !names.contains(d.as_str()))
        .collect();
    if !undeclared.is_empty() {
        problems.push(format!(
            "dependencies {} declares, not named: {undeclared:?}",
            a.package
        ));
    }

    let traced = traces(&a.file, &lock)?;
    let untraced: Vec<_> = traced.difference(&required).collect();
    if !untraced.is_empty() {
        problems.push(format!(
            "crates whose source paths {} holds, not named as required: {untraced:?}",
            a.file.display()
        ));
    }

    for d in bom["dependencies"].as_array().into_iter().flatten() {
        let from = d["ref"].as_str().unwrap_or_default();
        let to = d["dependsOn"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str);
        for r in std::iter::once(from).chain(to) {
            if !refs.contains(r) {
                problems.push(format!("dependencies: {r} is no component"));
            }
        }
    }

    if problems.is_empty() {
        Ok(format!(
            "{} crates ({} in the artefact), {} traced in its bytes, {}",
            named.len(),
            required.len(),
            traced.len(),
            &digest[..12]
        ))
    } else {
        Err(problems.join("\n"))
    }
}
