//! EndpointSlices from a directory of files, as `kubectl get endpointslices
//! -o yaml|json` prints them: one object, a List, or several YAML
//! documents per file. Only `*.yaml`, `*.yml` and `*.json` count (dot files
//! are skipped, so a file written beside and renamed into place is read
//! once, whole).
//!
//! The directory is watched (`files_watch`: inotify names the files that
//! changed; the safety net is one `stat` of the directory every two seconds
//! and a scan of the whole directory every five minutes). The first scan
//! sends every slice as a full list; then only the files events name are
//! read (a `stat` each, and the file when it moved), and their slices are
//! sent one by one (applied, with the file's trigger-time annotation, or
//! deleted): a change does not list the directory.
//! A file that does not parse is logged (once per version of it) and its
//! last good content is kept; a file that is removed takes its slices with
//! it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::model::slice::{Slice, SliceKey};
use crate::source::files_watch::{SliceWatch, Wake};
use crate::source::kube::Keep;
use crate::source::metrics::SourceMetrics;
use crate::source::{Change, Update};

/// The largest slice file read, in bytes: a `kubectl get endpointslices -o
/// yaml` List of 10,000 slices of 100 endpoints each (about 330 bytes an
/// endpoint, with its conditions, node, zone and pod reference) is about
/// 330 MB. A larger file is refused whole (its last good content kept).
pub const MAX_FILE_BYTES: u64 = 512 * 1024 * 1024;

/// The YAML parser's budget, sized from the byte cap rather than from
/// serde-saphyr's defaults (250,000 nodes, 1,000,000 events: a List of
/// about 100 slices of 100 endpoints). A node takes at least two bytes of
/// YAML (`[a,b]`: three nodes in five bytes), so these never refuse a file
/// under the byte cap that a reader would call real; they bound what a
/// hostile file can make the parser do per byte.
#[derive(Clone, Copy, Debug)]
pub struct YamlLimits {
    /// YAML nodes (scalars, sequences, mappings) in one file.
    pub max_nodes: usize,
    /// Parser events in one file.
    pub max_events: usize,
    /// YAML documents (`---`) in one file.
    pub max_documents: usize,
}

impl YamlLimits {
    /// The limits for files of at most `max_file_bytes`.
    pub const fn for_bytes(max_file_bytes: u64) -> YamlLimits {
        let bytes = max_file_bytes as usize;
        YamlLimits {
            max_nodes: bytes / 2,
            max_events: bytes,
            max_documents: bytes / 4,
        }
    }
}

/// The limits the companion reads slice files with.
pub const YAML_LIMITS: YamlLimits = YamlLimits::for_bytes(MAX_FILE_BYTES);

/// Why a slice file is refused (its last good content is kept).
#[derive(Debug, thiserror::Error)]
pub enum SliceFileError {
    /// Opening or reading failed.
    #[error("read: {0}")]
    Io(#[from] std::io::Error),
    /// More bytes than the cap.
    #[error("more than {0} bytes: over the slice-file byte cap (MAX_FILE_BYTES); split it into several files")]
    OverCap(u64),
    /// Not JSON.
    #[error("JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// Over the YAML parser's budget: which limit, and the limits.
    #[error("YAML: over the slice-file parser budget ({breach}; limits: max_nodes {}, max_events {}, max_documents {}, sized for files of at most {MAX_FILE_BYTES} bytes)", limits.max_nodes, limits.max_events, limits.max_documents)]
    YamlBudget {
        /// The limit breached, as the parser says it.
        breach: String,
        /// The limits read with.
        limits: YamlLimits,
    },
    /// Not YAML.
    #[error("YAML: {0}")]
    Yaml(#[source] serde_saphyr::Error),
    /// A `...List` without `items`.
    #[error("a {0} without items")]
    ListWithoutItems(String),
    /// An item of a list that is not an object.
    #[error("an item that is not an object")]
    NotAnObject,
    /// An EndpointSlice of another API version.
    #[error("EndpointSlice of apiVersion {0:?}: only discovery.k8s.io/v1 is read")]
    ApiVersion(String),
    /// An EndpointSlice that does not read as one.
    #[error("EndpointSlice {name}: {source}")]
    Slice {
        /// Its `metadata.name` ("?" without one).
        name: String,
        /// Why it does not read.
        source: serde_json::Error,
    },
}

/// Parses one file's text into EndpointSlice objects.
pub fn parse(text: &str, json: bool) -> Result<Vec<EndpointSlice>, SliceFileError> {
    parse_within(text, json, YAML_LIMITS)
}

/// [`parse`] with the YAML budget `limits`; a breach is refused with the
/// limit named.
pub fn parse_within(
    text: &str,
    json: bool,
    limits: YamlLimits,
) -> Result<Vec<EndpointSlice>, SliceFileError> {
    let docs: Vec<Value> = if json {
        vec![serde_json::from_str(text).map_err(SliceFileError::Json)?]
    } else {
        let options = serde_saphyr::options! {
            budget: serde_saphyr::budget! {
                max_nodes: limits.max_nodes,
                max_events: limits.max_events,
                max_documents: limits.max_documents,
                max_total_scalar_bytes: limits.max_events,
            },
        };
        serde_saphyr::from_multiple_with_options::<Value>(text, options).map_err(|e| {
            // A breach may come wrapped (with a snippet of the input): the
            // text says it either way.
            let text = e.to_string();
            if matches!(e, serde_saphyr::Error::Budget { .. }) || text.contains("budget breached") {
                let breach = text
                    .lines()
                    .find_map(|l| l.split_once("budget breached: ").map(|(_, b)| b.trim()))
                    .unwrap_or("a limit")
                    .to_string();
                SliceFileError::YamlBudget { breach, limits }
            } else {
                SliceFileError::Yaml(e)
            }
        })?
    };
    let mut out = Vec::new();
    for doc in docs {
        if doc.is_null() {
            continue;
        }
        let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("");
        if kind == "List" || kind.ends_with("List") {
            let items = doc
                .get("items")
                .and_then(Value::as_array)
                .ok_or_else(|| SliceFileError::ListWithoutItems(kind.to_string()))?;
            for item in items {
                if let Some(s) = object(item.clone(), kind == "EndpointSliceList")? {
                    out.push(s);
                }
            }
        } else if let Some(s) = object(doc, false)? {
            out.push(s);
        }
    }
    Ok(out)
}

/// One object: an EndpointSlice, `None` for another kind (skipped).
fn object(mut v: Value, typed_list: bool) -> Result<Option<EndpointSlice>, SliceFileError> {
    let Some(obj) = v.as_object_mut() else {
        return Err(SliceFileError::NotAnObject);
    };
    if typed_list {
        // Items of an EndpointSliceList (the API's own list) carry no type.
        obj.entry("apiVersion")
            .or_insert("discovery.k8s.io/v1".into());
        obj.entry("kind").or_insert("EndpointSlice".into());
    }
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind != "EndpointSlice" {
        tracing::debug!(kind, "not an EndpointSlice: skipped");
        return Ok(None);
    }
    let api = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if api != "discovery.k8s.io/v1" {
        return Err(SliceFileError::ApiVersion(api.to_string()));
    }
    let name = obj
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_string();
    serde_json::from_value(v)
        .map(Some)
        .map_err(|source| SliceFileError::Slice { name, source })
}

/// A file's identity for change detection.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Signature {
    len: u64,
    modified: Option<std::time::SystemTime>,
    inode: u64,
}

fn signature(meta: &std::fs::Metadata) -> Signature {
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(meta);
    #[cfg(not(unix))]
    let inode = 0;
    Signature {
        len: meta.len(),
        modified: meta.modified().ok(),
        inode,
    }
}

struct FileState {
    /// The version read last (good or not).
    seen: Signature,
    /// The last good content, each slice with its trigger time.
    slices: Vec<(Slice, Option<SystemTime>)>,
}

/// The directory's files and their last good content.
pub struct Directory {
    dir: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
    metrics: SourceMetrics,
    /// `--manage` in mode `eds`: only the slices kept.
    select: Option<Keep>,
    /// The files holding each slice (a slice in several files: the last
    /// file by name wins).
    holders: HashMap<SliceKey, BTreeSet<PathBuf>>,
    /// What was last sent of each slice.
    sent: HashMap<SliceKey, Slice>,
    /// The largest file read ([`MAX_FILE_BYTES`]).
    max_file_bytes: u64,
}

/// A file's text, refused (with the cap named) when it holds more than
/// `max` bytes, whatever its size said a moment before.
fn read_capped(path: &Path, max: u64) -> Result<String, SliceFileError> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    let mut text = String::new();
    file.take(max.saturating_add(1)).read_to_string(&mut text)?;
    if text.len() as u64 > max {
        return Err(SliceFileError::OverCap(max));
    }
    Ok(text)
}

/// Whether a path is a slice file: `*.yaml|yml|json`, not a dot file.
pub fn counts(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.starts_with('.') {
        return false;
    }
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    )
}

impl Directory {
    /// The directory `dir`, nothing read yet; its errors count in `metrics`.
    pub fn new(dir: &Path, metrics: SourceMetrics) -> Directory {
        Directory {
            dir: dir.to_path_buf(),
            files: BTreeMap::new(),
            metrics,
            select: None,
            holders: HashMap::new(),
            sent: HashMap::new(),
            max_file_bytes: MAX_FILE_BYTES,
        }
    }

    /// Reads files of at most `max` bytes (tests use a small cap).
    pub fn with_max_file_bytes(mut self, max: u64) -> Directory {
        self.max_file_bytes = max;
        self
    }

    /// Only the slices `select` keeps (as `--manage` selects through the
    /// API server).
    pub fn selecting(mut self, select: Option<Keep>) -> Directory {
        self.select = select;
        self
    }

    /// Reads what changed since the last scan; true when the set of good
    /// slices may have changed.
    pub fn scan(&mut self) -> std::io::Result<bool> {
        Ok(!self.scan_files()?.is_empty())
    }

    /// Reads what changed since the last scan: each file whose good content
    /// changed (or that is gone), with the slices it held before.
    fn scan_files(&mut self) -> std::io::Result<Vec<(PathBuf, Vec<SliceKey>)>> {
        let mut present = BTreeMap::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let Ok(entry) = entry else { continue };
            let path = entry.path();
            if !counts(&path) {
                continue;
            }
            match std::fs::metadata(&path) {
                Ok(m) if m.is_file() => {
                    present.insert(path, signature(&m));
                }
                _ => {}
            }
        }
        let gone: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|p| !present.contains_key(*p))
            .cloned()
            .collect();
        Ok(self.read_files(present, gone))
    }

    /// Reads `paths` only (the files events named; each in this directory
    /// and counting): a `stat` each, the file when it moved; one that is
    /// no longer a file is gone.
    fn scan_paths(&mut self, paths: &[PathBuf]) -> Vec<(PathBuf, Vec<SliceKey>)> {
        let mut present = BTreeMap::new();
        let mut gone = Vec::new();
        for path in paths {
            if path.parent() != Some(self.dir.as_path()) || !counts(path) {
                continue;
            }
            match std::fs::metadata(path) {
                Ok(m) if m.is_file() => {
                    present.insert(path.clone(), signature(&m));
                }
                _ => {
                    if self.files.contains_key(path) {
                        gone.push(path.clone());
                    }
                }
            }
        }
        self.read_files(present, gone)
    }

    /// Forgets the files `gone`, reads each of `present` whose signature
    /// moved: each file whose good content changed (or that is gone), with
    /// the slices it held before.
    fn read_files(
        &mut self,
        present: BTreeMap<PathBuf, Signature>,
        gone: Vec<PathBuf>,
    ) -> Vec<(PathBuf, Vec<SliceKey>)> {
        let keys = |f: &FileState| -> Vec<SliceKey> {
            f.slices.iter().map(|(s, _)| s.key.clone()).collect()
        };
        let mut changed: Vec<(PathBuf, Vec<SliceKey>)> = Vec::new();
        for path in gone {
            if let Some(f) = self.files.remove(&path) {
                changed.push((path, keys(&f)));
            }
        }
        for (path, sig) in present {
            if self.files.get(&path).is_some_and(|f| f.seen == sig) {
                continue;
            }
            let text = read_capped(&path, self.max_file_bytes);
            let json = path.extension().and_then(|e| e.to_str()) == Some("json");
            let parsed = text.and_then(|t| parse(&t, json));
            match parsed {
                Ok(objects) => {
                    let origin = path.display().to_string();
                    let slices = objects
                        .iter()
                        .filter_map(|o| {
                            let s = super::read_slice_if(o, &origin, self.select.as_ref())?;
                            Some((s, super::trigger_time(o.metadata.annotations.as_ref())))
                        })
                        .collect();
                    tracing::debug!(file = %path.display(), objects = objects.len(), "slice file read");
                    let before = self
                        .files
                        .insert(path.clone(), FileState { seen: sig, slices });
                    changed.push((path, before.map(|f| keys(&f)).unwrap_or_default()));
                }
                Err(e) => {
                    self.metrics.error("file");
                    let kept = self.files.get(&path).map(|f| f.slices.len());
                    tracing::error!(
                        file = %path.display(),
                        error = %e,
                        kept_slices = ?kept,
                        "malformed slice file: its last good content is kept"
                    );
                    let slices = self
                        .files
                        .remove(&path)
                        .map(|f| f.slices)
                        .unwrap_or_default();
                    self.files.insert(path, FileState { seen: sig, slices });
                }
            }
        }
        changed
    }

    /// Every good slice (a slice named in several files: the last file by
    /// name wins, logged).
    pub fn slices(&self) -> Vec<Slice> {
        let mut by_key: BTreeMap<SliceKey, (&Path, &Slice)> = BTreeMap::new();
        for (path, f) in &self.files {
            for (s, _) in &f.slices {
                if let Some((other, _)) = by_key.insert(s.key.clone(), (path, s)) {
                    tracing::warn!(
                        slice = %s.key,
                        file = %path.display(),
                        earlier = %other.display(),
                        "EndpointSlice defined in two files: the later file wins"
                    );
                }
            }
        }
        by_key.into_values().map(|(_, s)| s.clone()).collect()
    }

    /// Scans and reads everything as a full list (the first update, and
    /// after an error), remembering what it sent.
    pub fn full_list(&mut self) -> std::io::Result<Update> {
        self.scan_files()?;
        self.holders.clear();
        for (path, f) in &self.files {
            for (s, _) in &f.slices {
                self.holders
                    .entry(s.key.clone())
                    .or_default()
                    .insert(path.clone());
            }
        }
        let all = self.slices();
        self.sent = all.iter().map(|s| (s.key.clone(), s.clone())).collect();
        Ok(Update::now(Change::Replace(all)))
    }

    /// Scans, and says what changed as single updates: the slices of the
    /// files that changed, each applied (with its trigger time) or deleted.
    pub fn changes(&mut self) -> std::io::Result<Vec<Update>> {
        let changed = self.scan_files()?;
        Ok(self.updates(changed))
    }

    /// As [`Directory::changes`], reading only `paths` (the files events
    /// named) instead of listing the directory.
    pub fn changes_in(&mut self, paths: &[PathBuf]) -> Vec<Update> {
        let changed = self.scan_paths(paths);
        self.updates(changed)
    }

    /// The single updates for the files that changed.
    fn updates(&mut self, changed: Vec<(PathBuf, Vec<SliceKey>)>) -> Vec<Update> {
        let mut touched: BTreeSet<SliceKey> = BTreeSet::new();
        for (path, before) in changed {
            for k in before {
                if let Some(h) = self.holders.get_mut(&k) {
                    h.remove(&path);
                    if h.is_empty() {
                        self.holders.remove(&k);
                    }
                }
                touched.insert(k);
            }
            if let Some(f) = self.files.get(&path) {
                for (s, _) in &f.slices {
                    self.holders
                        .entry(s.key.clone())
                        .or_default()
                        .insert(path.clone());
                    touched.insert(s.key.clone());
                }
            }
        }
        let mut out = Vec::new();
        for key in touched {
            let winner = self.holders.get(&key).and_then(|h| h.last()).and_then(|p| {
                self.files
                    .get(p)?
                    .slices
                    .iter()
                    .rev()
                    .find(|(s, _)| s.key == key)
            });
            match winner {
                Some((s, trigger)) => {
                    if self.sent.get(&key) != Some(s) {
                        self.sent.insert(key, s.clone());
                        out.push(Update::triggered(Change::Apply(s.clone()), *trigger));
                    }
                }
                None => {
                    if self.sent.remove(&key).is_some() {
                        out.push(Update::now(Change::Delete(key)));
                    }
                }
            }
        }
        out
    }
}

/// Watches `dir` and sends a full list, then each change, until the
/// receiver goes; `select`: only the slices it selects.
pub async fn run(
    dir: PathBuf,
    updates: mpsc::Sender<Update>,
    metrics: SourceMetrics,
    select: Option<Keep>,
) -> anyhow::Result<()> {
    let mut directory = Directory::new(&dir, metrics.clone()).selecting(select);
    metrics.started("file");
    // Watched before the first list: a change during it is an event after it.
    let mut watch = SliceWatch::start(&dir, counts)
        .map_err(|e| anyhow::anyhow!("--slices-dir {}: cannot watch: {e}", dir.display()))?;
    let first = directory
        .full_list()
        .map_err(|e| anyhow::anyhow!("--slices-dir {}: {e}", dir.display()))?;
    metrics.progress(false);
    metrics.watch_event("files_reload");
    if updates.send(first).await.is_err() {
        return Ok(());
    }
    tracing::info!(dir = %dir.display(), "watching slice files");
    loop {
        let read = match watch.next().await {
            Ok(Wake::Quiet) => Ok(Vec::new()),
            Ok(Wake::Paths(paths)) => Ok(directory.changes_in(&paths)),
            Ok(Wake::Rescan(why)) => {
                metrics.file_rescan(why.label());
                let read = directory.changes();
                watch.scanned();
                read
            }
            Err(e) => Err(e),
        };
        match read {
            Ok(list) if list.is_empty() => metrics.progress(false),
            Ok(list) => {
                metrics.progress(true);
                metrics.watch_event("files_reload");
                for u in list {
                    if updates.send(u).await.is_err() {
                        return Ok(());
                    }
                }
            }
            Err(e) => {
                metrics.error("file");
                tracing::error!(dir = %dir.display(), error = %e, "cannot read the slice directory: last good state kept");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    const ONE: &str = r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 80, protocol: TCP}]
endpoints:
- addresses: [10.0.0.1]
  conditions: {ready: true, serving: true, terminating: false}
"#;

    #[test]
    fn parses_one_object_a_list_multi_docs_and_json() {
        assert_eq!(parse(ONE, false).unwrap().len(), 1);
        let list = format!(
            "apiVersion: v1\nkind: List\nitems:\n{}",
            ONE.lines()
                .filter(|l| !l.is_empty())
                .enumerate()
                .map(|(i, l)| if i == 0 {
                    format!("- {l}")
                } else {
                    format!("  {l}")
                })
                .collect::<Vec<_>>()
                .join("\n")
        );
        assert_eq!(parse(&list, false).unwrap().len(), 1, "{list}");
        let two = format!("{ONE}---\n{}", ONE.replace("web-1", "web-2"));
        assert_eq!(parse(&two, false).unwrap().len(), 2);
        let json = serde_json::json!({
            "kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
            "items": [{"metadata": {"name": "x", "labels": {"kubernetes.io/service-name": "web"}},
                       "addressType": "IPv4", "endpoints": []}]
        });
        assert_eq!(parse(&json.to_string(), true).unwrap().len(), 1);
        // Other kinds are skipped, not errors.
        let svc = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\n";
        assert_eq!(parse(svc, false).unwrap().len(), 0);
    }

    #[test]
    fn malformed_input_is_an_error() {
        assert!(parse("{not json", true).is_err());
        assert!(parse(
            "kind: EndpointSlice\napiVersion: discovery.k8s.io/v1\nmetadata: [",
            false
        )
        .is_err());
        let wrong_type = ONE.replace("addressType: IPv4", "addressType: {a: 1}");
        assert!(parse(&wrong_type, false).is_err());
        let beta = ONE.replace("discovery.k8s.io/v1", "discovery.k8s.io/v1beta1");
        assert!(parse(&beta, false)
            .unwrap_err()
            .to_string()
            .contains("v1beta1"));
    }

    /// A `kubectl get endpointslices -o yaml` List of `slices` slices of
    /// `endpoints` endpoints each, as kubectl prints it.
    fn kubectl_list(slices: usize, endpoints: usize) -> String {
        let mut out = String::from(
            "apiVersion: v1\nkind: List\nmetadata:\n  resourceVersion: \"\"\nitems:\n",
        );
        for s in 0..slices {
            out.push_str("- addressType: IPv4\n  apiVersion: discovery.k8s.io/v1\n  endpoints:\n");
            for e in 0..endpoints {
                out.push_str(&format!(
                    "  - addresses:\n    - 10.{}.{}.{}\n    conditions:\n      ready: true\n      serving: true\n      terminating: false\n    nodeName: node-{e}\n    targetRef:\n      kind: Pod\n      name: web-{s}-{e}\n      namespace: shop\n      uid: 1f0e3a52-9b7c-4d1e-8f2a-3c4d5e6f7a8b\n    zone: zone-a\n",
                    s / 250, s % 250, e % 250
                ));
            }
            out.push_str(&format!(
                "  kind: EndpointSlice\n  metadata:\n    labels:\n      kubernetes.io/service-name: web-{s}\n    name: web-{s}-abcde\n    namespace: shop\n  ports:\n  - name: http\n    port: 8080\n    protocol: TCP\n"
            ));
        }
        out
    }

    #[test]
    fn a_real_list_over_serde_saphyrs_default_budget_is_read() {
        // 1,000 slices x 20 endpoints: 26 YAML nodes an endpoint, about
        // 540,000 in all, over the 250,000 of serde-saphyr's default budget.
        let text = kubectl_list(1_000, 20);
        assert!(
            serde_saphyr::from_multiple::<Value>(&text).is_err(),
            "the default budget refuses it (else this test proves nothing)"
        );
        let slices = parse(&text, false).unwrap();
        assert_eq!(slices.len(), 1_000);
        assert_eq!(slices[999].endpoints.len(), 20);
        // Bytes per endpoint as kubectl prints them: what MAX_FILE_BYTES is sized by
        // (10,000 slices x 100 endpoints fit).
        let per_endpoint = text.len() as u64 / 20_000;
        assert!(
            10_000 * 100 * per_endpoint < MAX_FILE_BYTES,
            "{per_endpoint} bytes an endpoint"
        );
        // ... and their nodes (26 an endpoint) fit the budget sized from the cap.
        const { assert!(YAML_LIMITS.max_nodes >= 10_000 * 100 * 30) };
    }

    #[test]
    fn a_file_over_the_budget_or_the_byte_cap_is_refused_naming_the_limit() {
        let text = kubectl_list(10, 20);
        let small = YamlLimits {
            max_nodes: 1_000,
            ..YAML_LIMITS
        };
        let e = parse_within(&text, false, small).unwrap_err().to_string();
        assert!(e.contains("max_nodes 1000"), "{e}");
        assert!(e.contains("Nodes"), "{e}");
        assert!(parse_within(&text, false, YAML_LIMITS).is_ok());

        let dir = std::env::temp_dir().join(format!("spc-files-cap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("web.yaml"), ONE).unwrap();
        let cap = ONE.len() as u64 + 10;
        let mut d = Directory::new(&dir, SourceMetrics::register(&mut Default::default()))
            .with_max_file_bytes(cap);
        assert!(d.scan().unwrap());
        assert_eq!(d.slices().len(), 1);
        // Over the cap: refused, the last good content kept.
        std::fs::write(
            dir.join("web.yaml"),
            format!("{ONE}\n# {}\n", "x".repeat(20)),
        )
        .unwrap();
        assert!(!d.scan().unwrap());
        assert_eq!(d.slices().len(), 1);
        let e = read_capped(&dir.join("web.yaml"), cap)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("more than {cap} bytes")), "{e}");
        assert!(e.contains("MAX_FILE_BYTES"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn changes_in_reads_only_the_files_named() {
        let dir = std::env::temp_dir().join(format!("spc-files-named-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.yaml"), ONE).unwrap();
        std::fs::write(dir.join("b.yaml"), ONE.replace("web-1", "web-2")).unwrap();
        let mut d = Directory::new(&dir, SourceMetrics::register(&mut Default::default()));
        assert_eq!(kinds(&[d.full_list().unwrap()]), ["replace 2"]);
        std::fs::write(dir.join("a.yaml"), ONE.replace("10.0.0.1", "10.0.0.7")).unwrap();
        std::fs::write(
            dir.join("b.yaml"),
            ONE.replace("web-1", "web-2")
                .replace("10.0.0.1", "10.0.0.8"),
        )
        .unwrap();
        // Only a.yaml named: only web-1 read; b.yaml waits for its own event or a scan.
        assert_eq!(kinds(&d.changes_in(&[dir.join("a.yaml")])), ["apply web-1"]);
        assert!(
            d.changes_in(&[dir.join("a.yaml")]).is_empty(),
            "unchanged since"
        );
        // Paths outside the directory, dot files and other names are not read.
        let outside = std::env::temp_dir().join("b.yaml");
        assert!(d
            .changes_in(&[outside, dir.join(".b.yaml"), dir.join("b.txt")])
            .is_empty());
        assert_eq!(kinds(&d.changes().unwrap()), ["apply web-2"]);
        // A named file that is gone takes its slices.
        std::fs::remove_file(dir.join("a.yaml")).unwrap();
        assert_eq!(
            kinds(&d.changes_in(&[dir.join("a.yaml")])),
            ["delete web-1"]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn directory_keeps_the_last_good_content_of_a_malformed_file() {
        let dir = std::env::temp_dir().join(format!("spc-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut d = Directory::new(&dir, SourceMetrics::register(&mut Default::default()));
        assert!(!d.scan().unwrap());
        std::fs::write(dir.join("web.yaml"), ONE).unwrap();
        std::fs::write(dir.join("notes.txt"), "ignored").unwrap();
        std::fs::write(dir.join(".web.yaml.tmp.yaml"), "ignored: [").unwrap();
        assert!(d.scan().unwrap());
        assert_eq!(d.slices().len(), 1);
        assert!(!d.scan().unwrap(), "nothing changed");
        std::fs::write(dir.join("web.yaml"), "kind: EndpointSlice\nmetadata: [\n").unwrap();
        assert!(!d.scan().unwrap());
        assert_eq!(d.slices().len(), 1, "last good content kept");
        std::fs::write(dir.join("web.yaml"), ONE.replace("10.0.0.1", "10.0.0.2")).unwrap();
        assert!(d.scan().unwrap());
        assert_eq!(d.slices()[0].endpoints[0].address.to_string(), "10.0.0.2");
        std::fs::remove_file(dir.join("web.yaml")).unwrap();
        assert!(d.scan().unwrap());
        assert!(d.slices().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn kinds(updates: &[Update]) -> Vec<String> {
        updates
            .iter()
            .map(|u| match &u.change {
                Change::Apply(s) => format!("apply {}", s.key.name),
                Change::Delete(k) => format!("delete {}", k.name),
                Change::Replace(all) => format!("replace {}", all.len()),
            })
            .collect()
    }

    #[test]
    fn only_what_changed_is_sent_one_slice_at_a_time() {
        let dir = std::env::temp_dir().join(format!("spc-files-changes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let managed = ONE.replace(
            "labels: {kubernetes.io/service-name: web}",
            "labels: {kubernetes.io/service-name: web, serving-picker.io/conditions: 'true'}\n  annotations: {endpoints.kubernetes.io/last-change-trigger-time: '2026-12-05T14:00:00Z'}",
        );
        std::fs::write(dir.join("a.yaml"), &managed).unwrap();
        std::fs::write(dir.join("b.yaml"), ONE.replace("web-1", "web-2")).unwrap();
        let mut d = Directory::new(&dir, SourceMetrics::register(&mut Default::default()));
        assert_eq!(kinds(&[d.full_list().unwrap()]), ["replace 2"]);
        assert!(d.changes().unwrap().is_empty(), "nothing changed");
        // One file changes: only its slice goes, with its trigger time.
        std::fs::write(dir.join("a.yaml"), managed.replace("10.0.0.1", "10.0.0.9")).unwrap();
        let u = d.changes().unwrap();
        assert_eq!(kinds(&u), ["apply web-1"]);
        assert!(u[0].trigger.is_some());
        // The same slice in a later file wins; when that file goes, the
        // earlier copy is back.
        std::fs::write(dir.join("c.yaml"), ONE.replace("10.0.0.1", "10.0.0.3")).unwrap();
        assert_eq!(kinds(&d.changes().unwrap()), ["apply web-1"]);
        std::fs::remove_file(dir.join("c.yaml")).unwrap();
        let u = d.changes().unwrap();
        assert_eq!(kinds(&u), ["apply web-1"]);
        std::fs::remove_file(dir.join("b.yaml")).unwrap();
        assert_eq!(kinds(&d.changes().unwrap()), ["delete web-2"]);
        // With a selector, unselected slices are not there at all.
        let mut sel = Directory::new(&dir, SourceMetrics::register(&mut Default::default()))
            .selecting(Some(Keep {
                services: Default::default(),
                manage: "serving-picker.io/conditions=true".parse().unwrap(),
            }));
        std::fs::write(dir.join("b.yaml"), ONE.replace("web-1", "web-2")).unwrap();
        match sel.full_list().unwrap().change {
            Change::Replace(all) => {
                assert_eq!(all.len(), 1);
                assert_eq!(all[0].key.name, "web-1");
            }
            other => panic!("{other:?}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
