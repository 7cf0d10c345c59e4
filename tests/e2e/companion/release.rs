//! What a release promises about itself, checked on the sources (no build of images needed;
//! `make test-release` checks the images themselves):
//!
//! - one version: Cargo.toml's `[workspace.package]` version is every crate's, the shipped
//!   companion's `--version` (with the commit), and the tag of every serving-picker image the manifests
//!   (deploy/, examples/) and Containerfiles (packaging/) name;
//! - examples/ creates only serving-picker's own objects: each is named serving-picker*, or is
//!   a demo object (labelled app.kubernetes.io/part-of: serving-picker-demo, in the
//!   serving-picker-demo namespace), or sits in a patches/ directory and says it is a patch
//!   (`kubectl patch`, not `apply`): nothing a user applies overwrites a Service, a
//!   VirtualService or anything else of theirs.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn repo() -> &'static Path {
    support::repo_root()
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn shown(path: &Path) -> String {
    path.strip_prefix(repo())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn every_crate_takes_the_workspace_version() {
    let root = read(&repo().join("Cargo.toml"));
    let members: Vec<&str> = ["wasm", "native", "conditions", "tests"].to_vec();
    for member in &members {
        let toml = read(&repo().join(member).join("Cargo.toml"));
        assert!(
            toml.lines().any(|l| l.trim() == "version.workspace = true"),
            "{member}/Cargo.toml does not take the workspace version"
        );
    }
    assert!(root.contains(&format!("[workspace.package]\nversion = \"{VERSION}\"")));
    // Cargo.lock agrees (scripts/set-version.sh updates it).
    let lock = read(&repo().join("Cargo.lock"));
    for name in [
        "serving-picker-core",
        "serving-picker-wasm",
        "serving-picker-native",
        "serving-picker-conditions",
    ] {
        let entry = format!("name = \"{name}\"\nversion = \"{VERSION}\"");
        assert!(
            lock.contains(&entry),
            "Cargo.lock: {name} is not at {VERSION}"
        );
    }
}

/// `registry.example.com/serving-picker*:<tag>` references: (file, line, image, tag).
fn image_references() -> Vec<(String, usize, String, String)> {
    let mut files = Vec::new();
    for dir in ["deploy", "examples", "packaging"] {
        files_under(&repo().join(dir), &mut files);
    }
    let prefix = "registry.example.com/serving-picker";
    let mut refs = Vec::new();
    for file in files {
        for (n, line) in read(&file).lines().enumerate() {
            let mut rest = line;
            while let Some(at) = rest.find(prefix) {
                let reference: String = rest[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || "./:-_".contains(*c))
                    .collect();
                rest = &rest[at + reference.len()..];
                let Some((image, tag)) = reference.rsplit_once(':') else {
                    panic!("{}:{}: {reference} has no tag", shown(&file), n + 1);
                };
                refs.push((shown(&file), n + 1, image.to_string(), tag.to_string()));
            }
        }
    }
    refs
}

#[test]
fn every_image_reference_is_tagged_with_the_version() {
    let refs = image_references();
    let wrong: Vec<String> = refs
        .iter()
        .filter(|(_, _, image, tag)| {
            let per_minor = tag
                .strip_prefix(VERSION)
                .and_then(|rest| rest.strip_prefix("-envoy"))
                .is_some_and(|minor| {
                    minor.split('.').count() == 2
                        && minor.split('.').all(|p| p.parse::<u32>().is_ok())
                });
            let native = image.ends_with("serving-picker-native");
            // The native images are per Envoy minor; the others are not.
            if native {
                !per_minor
            } else {
                tag != VERSION
            }
        })
        .map(|(file, line, image, tag)| format!("{file}:{line}: {image}:{tag}"))
        .collect();
    println!(
        "{} image references, all at {VERSION}: {:?}",
        refs.len(),
        refs.iter()
            .map(|(f, l, i, t)| format!("{f}:{l} {i}:{t}"))
            .collect::<Vec<_>>()
    );
    assert!(
        wrong.is_empty(),
        "image references not at version {VERSION}: {wrong:?}"
    );
    for image in ["conditions", "wasm", "native"] {
        assert!(
            refs.iter()
                .any(|(_, _, i, _)| i.ends_with(&format!("serving-picker-{image}"))),
            "no reference to serving-picker-{image} found: {refs:?}"
        );
    }
}

/// `--version` prints the name, the version and the commit the binary was
/// built from (`serving-picker-conditions 0.1.0 (commit …)`), the identity
/// the wasm filter and the native module log when they load.
#[test]
fn the_shipped_companion_reports_the_version() {
    let bin = support::companion::companion_bin();
    let out = Command::new(&bin).arg("--version").output().unwrap();
    assert!(out.status.success(), "{} --version: {out:?}", bin.display());
    let identity = support::expected_build_identity();
    assert!(identity.starts_with(&format!("{VERSION} (commit ")));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("serving-picker-conditions {identity}"),
        "{}",
        bin.display()
    );
}

#[test]
fn examples_create_only_serving_pickers_own_objects() {
    let mut files = Vec::new();
    files_under(&repo().join("examples"), &mut files);
    files.sort();
    let mut objects = 0;
    let mut offenders = Vec::new();
    for file in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "yaml" || e == "yml"))
    {
        let text = read(file);
        let name = shown(file);
        if file.parent().is_some_and(|d| d.ends_with("patches")) {
            assert!(
                text.contains("kubectl patch") && text.contains("Not for `kubectl apply`"),
                "{name}: a patch file must say how it is applied (kubectl patch) and that it is not applied"
            );
            continue;
        }
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{name}: not YAML: {e}"));
        // Helm values for another project's chart (no apiVersion and kind) create nothing.
        for doc in docs
            .into_iter()
            .filter(|d| !d.is_null() && d.get("kind").is_some())
        {
            objects += 1;
            let kind = doc["kind"].as_str().unwrap_or_default();
            let object = doc["metadata"]["name"].as_str().unwrap_or_default();
            let namespace = doc["metadata"]["namespace"].as_str().unwrap_or_default();
            let demo =
                doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "serving-picker-demo";
            let ok = if demo {
                namespace == "serving-picker-demo"
                    || (kind == "Namespace" && object == "serving-picker-demo")
            } else {
                object.starts_with("serving-picker")
            };
            if !ok {
                offenders.push(format!("{name}: {kind} {namespace}/{object}"));
            }
        }
    }
    assert!(objects >= 8, "only {objects} objects found under examples/");
    assert!(
        offenders.is_empty(),
        "objects in examples/ that could overwrite a user's own (name them serving-picker*, \
         or make them demo objects in serving-picker-demo, or patches): {offenders:?}"
    );
}
