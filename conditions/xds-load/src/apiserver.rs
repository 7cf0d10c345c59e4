//! A Kubernetes API server double that serves EndpointSlices the way
//! kube-apiserver does to a client-go-like watcher (no API server can run
//! here): lists in pages (`limit` / `continue`), watches from a list's
//! `resourceVersion` with bookmarks, and `410 Gone` (history compacted) on
//! demand, then a re-list. It counts what it serves: list requests and
//! pages, watches opened and open, bytes.
//!
//! Objects are kept as their JSON text, written once per change: a list of
//! 150,000 endpoints costs the double a copy of text, not a serialization,
//! so the figures measure the client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// What the double has served.
#[derive(Debug, Default)]
pub struct Load {
    pub lists: AtomicU64,
    pub list_pages: AtomicU64,
    pub watches: AtomicU64,
    pub open_watches: AtomicU64,
    pub events: AtomicU64,
    pub bytes: AtomicU64,
}

impl Load {
    pub fn get(v: &AtomicU64) -> u64 {
        v.load(Ordering::SeqCst)
    }
}

#[derive(Default)]
struct State {
    rv: u64,
    /// name -> (namespace, JSON text with its resourceVersion).
    objects: BTreeMap<(String, String), Arc<str>>,
    /// (resourceVersion, watch event line).
    log: Vec<(u64, Arc<str>)>,
    /// Watches from an older version get 410 Gone.
    compacted: u64,
    /// Bumped to end every open watch (with a 410).
    epoch: u64,
}

/// The API server double.
#[derive(Clone, Default)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    notify: Arc<Notify>,
    pub load: Arc<Load>,
}

fn key_of(obj: &Value) -> (String, String) {
    (
        obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string(),
        obj["metadata"]["name"].as_str().unwrap_or("").to_string(),
    )
}

impl FakeApi {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds or changes objects (ADDED / MODIFIED to the watches), each at a
    /// version of its own.
    pub fn apply_all(&self, objs: impl IntoIterator<Item = Value>) {
        let mut s = self.lock();
        for mut obj in objs {
            s.rv += 1;
            let rv = s.rv;
            obj["metadata"]["resourceVersion"] = json!(rv.to_string());
            let key = key_of(&obj);
            let kind = if s.objects.contains_key(&key) {
                "MODIFIED"
            } else {
                "ADDED"
            };
            let text: Arc<str> = Arc::from(obj.to_string());
            let line = format!("{{\"type\":\"{kind}\",\"object\":{text}}}");
            s.objects.insert(key, text);
            s.log.push((rv, Arc::from(line)));
        }
        drop(s);
        self.notify.notify_waiters();
    }

    pub fn apply(&self, obj: Value) {
        self.apply_all([obj]);
    }

    /// Deletes an object (DELETED to the watches).
    pub fn delete(&self, namespace: &str, name: &str) {
        let mut s = self.lock();
        s.rv += 1;
        let rv = s.rv;
        if let Some(text) = s.objects.remove(&(namespace.to_string(), name.to_string())) {
            let mut obj: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            obj["metadata"]["resourceVersion"] = json!(rv.to_string());
            let line = json!({"type": "DELETED", "object": obj}).to_string();
            s.log.push((rv, Arc::from(line)));
        }
        drop(s);
        self.notify.notify_waiters();
    }

    /// A bookmark at the current version to every watch.
    pub fn bookmark(&self) {
        let mut s = self.lock();
        s.rv += 1;
        let rv = s.rv;
        let bm = json!({"type": "BOOKMARK", "object": {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"resourceVersion": rv.to_string()}}});
        s.log.push((rv, Arc::from(bm.to_string())));
        drop(s);
        self.notify.notify_waiters();
    }

    /// Compacts the history: every open watch gets 410 Gone, and a watch
    /// from an older version too (the client lists again).
    pub fn expire(&self) {
        let mut s = self.lock();
        s.rv += 1;
        s.compacted = s.rv;
        s.epoch += 1;
        s.log.clear();
        drop(s);
        self.notify.notify_waiters();
    }

    pub fn objects(&self) -> usize {
        self.lock().objects.len()
    }

    /// Serves on a loopback port; its URL.
    pub async fn start(self) -> String {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = l.accept().await else {
                    return;
                };
                let _ = stream.set_nodelay(true);
                let api = self.clone();
                tokio::spawn(async move { api.serve(stream).await });
            }
        });
        url
    }

    async fn serve(&self, stream: TcpStream) {
        let mut reader = BufReader::new(stream);
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            let target = line.split_whitespace().nth(1).unwrap_or("/").to_string();
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).await.unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
            }
            let (path, query) = target.split_once('?').unwrap_or((&target, ""));
            let q: BTreeMap<String, String> = query
                .split('&')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), percent_decode(v)))
                .collect();
            if !path.ends_with("/endpointslices") {
                let _ = write_plain(reader.get_mut(), 404, "{}").await;
                continue;
            }
            if matches!(q.get("watch").map(String::as_str), Some("true" | "1")) {
                let rv = q
                    .get("resourceVersion")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                self.watch(reader.into_inner(), rv).await;
                return;
            }
            let body = self.list_page(&q);
            self.load
                .bytes
                .fetch_add(body.len() as u64, Ordering::SeqCst);
            if write_plain(reader.get_mut(), 200, &body).await.is_err() {
                return;
            }
        }
    }

    /// One page of a list: `limit` items after the `continue` token.
    fn list_page(&self, q: &BTreeMap<String, String>) -> String {
        let limit: usize = q
            .get("limit")
            .and_then(|v| v.parse().ok())
            .filter(|n| *n > 0)
            .unwrap_or(usize::MAX);
        let s = self.lock();
        let (after, rv) = match q.get("continue").and_then(|c| c.split_once('|')) {
            Some((rv, key)) => {
                let (ns, name) = key.split_once('/').unwrap_or(("", key));
                (
                    Some((ns.to_string(), name.to_string())),
                    rv.parse().unwrap_or(s.rv),
                )
            }
            None => {
                self.load.lists.fetch_add(1, Ordering::SeqCst);
                (None, s.rv)
            }
        };
        self.load.list_pages.fetch_add(1, Ordering::SeqCst);
        let range = match &after {
            Some(k) => s.objects.range((
                std::ops::Bound::Excluded(k.clone()),
                std::ops::Bound::Unbounded,
            )),
            None => s.objects.range(..),
        };
        let mut items = String::from("[");
        let mut last = None;
        for (n, (k, text)) in range.take(limit).enumerate() {
            if n > 0 {
                items.push(',');
            }
            items.push_str(text);
            last = Some(k.clone());
        }
        items.push(']');
        let more = match &last {
            Some(k) => s
                .objects
                .range((
                    std::ops::Bound::Excluded(k.clone()),
                    std::ops::Bound::Unbounded,
                ))
                .next()
                .is_some(),
            None => false,
        };
        let cont = match (more, last) {
            (true, Some((ns, name))) => format!("{rv}|{ns}/{name}"),
            _ => String::new(),
        };
        format!(
            "{{\"apiVersion\":\"discovery.k8s.io/v1\",\"kind\":\"EndpointSliceList\",\"metadata\":{{\"resourceVersion\":\"{rv}\",\"continue\":\"{cont}\"}},\"items\":{items}}}"
        )
    }

    async fn watch(&self, mut stream: TcpStream, from: u64) {
        self.load.watches.fetch_add(1, Ordering::SeqCst);
        self.load.open_watches.fetch_add(1, Ordering::SeqCst);
        self.watch_inner(&mut stream, from).await;
        self.load.open_watches.fetch_sub(1, Ordering::SeqCst);
    }

    async fn watch_inner(&self, stream: &mut TcpStream, from: u64) {
        let (epoch, too_old) = {
            let s = self.lock();
            (s.epoch, from < s.compacted)
        };
        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
        if stream.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        if too_old {
            let _ = chunk(stream, &gone_event()).await;
            let _ = stream.write_all(b"0\r\n\r\n").await;
            return;
        }
        let mut cursor = from;
        let mut since_bookmark = tokio::time::Instant::now();
        loop {
            let notified = self.notify.notified();
            let (pending, ended, rv) = {
                let s = self.lock();
                let start = s.log.partition_point(|(rv, _)| *rv <= cursor);
                let pending: Vec<(u64, Arc<str>)> = s.log[start..].to_vec();
                (pending, s.epoch != epoch, s.rv)
            };
            if ended {
                let _ = chunk(stream, &gone_event()).await;
                let _ = stream.write_all(b"0\r\n\r\n").await;
                return;
            }
            if !pending.is_empty() {
                let mut out = String::new();
                for (rv, line) in &pending {
                    out.push_str(line);
                    out.push('\n');
                    cursor = *rv;
                }
                self.load
                    .events
                    .fetch_add(pending.len() as u64, Ordering::SeqCst);
                if chunk_raw(stream, &out, &self.load).await.is_err() {
                    return;
                }
            } else if since_bookmark.elapsed() >= Duration::from_secs(1) && rv > cursor {
                // Bookmarks as the API server sends them: progress without
                // events, so a watch resumes from here.
                since_bookmark = tokio::time::Instant::now();
                let bm = json!({"type": "BOOKMARK", "object": {
                    "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"resourceVersion": rv.to_string()}}})
                .to_string();
                if chunk(stream, &bm).await.is_err() {
                    return;
                }
                cursor = rv;
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
        }
    }
}

fn gone_event() -> String {
    json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
           "message": "too old resource version", "reason": "Expired", "code": 410}})
    .to_string()
}

async fn chunk(stream: &mut TcpStream, line: &str) -> std::io::Result<()> {
    let data = format!("{line}\n");
    stream
        .write_all(format!("{:x}\r\n{data}\r\n", data.len()).as_bytes())
        .await?;
    stream.flush().await
}

async fn chunk_raw(stream: &mut TcpStream, data: &str, load: &Load) -> std::io::Result<()> {
    load.bytes.fetch_add(data.len() as u64, Ordering::SeqCst);
    stream
        .write_all(format!("{:x}\r\n", data.len()).as_bytes())
        .await?;
    stream.write_all(data.as_bytes()).await?;
    stream.write_all(b"\r\n").await?;
    stream.flush().await
}

async fn write_plain(stream: &mut TcpStream, status: u16, body: &str) -> std::io::Result<()> {
    let reason = if status == 200 { "OK" } else { "Error" };
    let msg = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(msg.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.flush().await
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
