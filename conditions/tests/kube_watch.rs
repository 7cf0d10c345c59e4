//! The Kubernetes source against a small API server of our own that speaks
//! the list/watch protocol over HTTP/1.1 (no kube-apiserver can run here):
//! initial list, watch events from the list's resourceVersion, bookmarks,
//! 410 Gone then a re-list, a dropped watch connection, a slow list, failing
//! lists. kube-rs's real client and watcher talk to it through
//! `kube::Config::new(url)`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use serving_picker_conditions::eds::metrics::PublishMetrics;
use serving_picker_conditions::eds::publish::{self, Publisher, Snapshot};
use serving_picker_conditions::run::Telemetry;
use serving_picker_conditions::source::kube::{run, ExpBackoff};
use serving_picker_conditions::source::{Change, Update};
use serving_picker_conditions::telemetry::metrics::Metrics;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Notify};

const NS: &str = "e2e";

#[derive(Default)]
struct State {
    rv: u64,
    objects: BTreeMap<String, Value>,
    /// (resourceVersion it belongs to, watch event line).
    log: Vec<(u64, String)>,
    /// Watches asking for an older version get 410 Gone.
    compacted: u64,
    /// Bumped to end every open watch.
    epoch: u64,
    /// Send a 410 ERROR event to the watches being ended.
    gone: bool,
    list_delay: Duration,
    fail_lists: usize,
    lists: usize,
    /// resourceVersion of each watch request, in order.
    watches: Vec<String>,
    selectors: Vec<String>,
}

#[derive(Clone, Default)]
struct FakeApi {
    state: Arc<Mutex<State>>,
    notify: Arc<Notify>,
}

fn slice(name: &str, ip: &str, ready: bool) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NS,
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": ready, "serving": ready, "terminating": false}}]
    })
}

impl FakeApi {
    fn with_rv(mut obj: Value, rv: u64) -> Value {
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        obj
    }

    /// Adds or changes an object (ADDED / MODIFIED to the watches).
    fn apply(&self, obj: Value) {
        let mut s = self.state.lock().unwrap();
        s.rv += 1;
        let rv = s.rv;
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        let kind = if s.objects.contains_key(&name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        let obj = Self::with_rv(obj, rv);
        s.objects.insert(name, obj.clone());
        s.log
            .push((rv, json!({"type": kind, "object": obj}).to_string()));
        drop(s);
        self.notify.notify_waiters();
    }

    fn delete(&self, name: &str, quietly: bool) {
        let mut s = self.state.lock().unwrap();
        s.rv += 1;
        let rv = s.rv;
        if let Some(obj) = s.objects.remove(name) {
            if !quietly {
                let obj = Self::with_rv(obj, rv);
                s.log
                    .push((rv, json!({"type": "DELETED", "object": obj}).to_string()));
            }
        }
        drop(s);
        self.notify.notify_waiters();
    }

    fn bookmark(&self) {
        let mut s = self.state.lock().unwrap();
        s.rv += 1;
        let rv = s.rv;
        let bm = json!({"type": "BOOKMARK", "object": {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"resourceVersion": rv.to_string()}}});
        s.log.push((rv, bm.to_string()));
        drop(s);
        self.notify.notify_waiters();
    }

    /// Ends every watch: with a 410 Gone (history compacted) or just cut.
    fn end_watches(&self, gone: bool) {
        let mut s = self.state.lock().unwrap();
        s.epoch += 1;
        s.gone = gone;
        if gone {
            s.compacted = s.rv + 1;
            s.rv += 1;
        }
        drop(s);
        self.notify.notify_waiters();
    }

    fn lists(&self) -> usize {
        self.state.lock().unwrap().lists
    }

    fn watches(&self) -> Vec<String> {
        self.state.lock().unwrap().watches.clone()
    }

    async fn start(self) -> String {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = l.accept().await else {
                    return;
                };
                let api = self.clone();
                tokio::spawn(async move { api.serve(stream).await });
            }
        });
        url
    }

    async fn serve(&self, stream: TcpStream) {
        let mut reader = BufReader::new(stream);
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
        let mut stream = reader.into_inner();
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let q: BTreeMap<String, String> = query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), percent_decode(v)))
            .collect();
        let expected = format!("/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices");
        if path != expected {
            let _ = write_plain(&mut stream, 404, "{}").await;
            return;
        }
        if let Some(sel) = q.get("labelSelector") {
            self.state.lock().unwrap().selectors.push(sel.clone());
        }
        if q.get("watch").map(String::as_str) == Some("true")
            || q.get("watch").map(String::as_str) == Some("1")
        {
            let rv: u64 = q
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            self.watch(
                stream,
                rv,
                q.get("resourceVersion").cloned().unwrap_or_default(),
            )
            .await;
        } else {
            let (delay, fail) = {
                let mut s = self.state.lock().unwrap();
                s.lists += 1;
                let fail = s.fail_lists > 0;
                if fail {
                    s.fail_lists -= 1;
                }
                (s.list_delay, fail)
            };
            tokio::time::sleep(delay).await;
            if fail {
                let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                    "message": "etcd unavailable", "reason": "InternalError", "code": 500});
                let _ = write_plain(&mut stream, 500, &status.to_string()).await;
                return;
            }
            let body = {
                let s = self.state.lock().unwrap();
                json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
                       "metadata": {"resourceVersion": s.rv.to_string()},
                       "items": s.objects.values().cloned().collect::<Vec<_>>()})
            };
            let _ = write_plain(&mut stream, 200, &body.to_string()).await;
        }
    }

    async fn watch(&self, mut stream: TcpStream, from: u64, raw_rv: String) {
        let (epoch, too_old) = {
            let mut s = self.state.lock().unwrap();
            s.watches.push(raw_rv);
            (s.epoch, from < s.compacted)
        };
        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
        if stream.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        if too_old {
            let _ = chunk(&mut stream, &gone_event()).await;
            let _ = stream.write_all(b"0\r\n\r\n").await;
            return;
        }
        let mut cursor = from;
        loop {
            let notified = self.notify.notified();
            let (pending, ended, gone) = {
                let s = self.state.lock().unwrap();
                let pending: Vec<(u64, String)> = s
                    .log
                    .iter()
                    .filter(|(rv, _)| *rv > cursor)
                    .cloned()
                    .collect();
                (pending, s.epoch != epoch, s.gone)
            };
            if ended {
                if gone {
                    let _ = chunk(&mut stream, &gone_event()).await;
                    let _ = stream.write_all(b"0\r\n\r\n").await;
                }
                // Cut: the connection just drops.
                return;
            }
            for (rv, line) in pending {
                if chunk(&mut stream, &line).await.is_err() {
                    return;
                }
                cursor = rv;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
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

async fn write_plain(stream: &mut TcpStream, status: u16, body: &str) -> std::io::Result<()> {
    let reason = if status == 200 { "OK" } else { "Error" };
    let msg = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(msg.as_bytes()).await?;
    stream.shutdown().await
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

fn fast_backoff() -> ExpBackoff {
    ExpBackoff::new(Duration::from_millis(50), Duration::from_millis(400))
}

async fn start_source(api: &FakeApi) -> (mpsc::Receiver<Update>, Arc<Metrics>) {
    let url = api.clone().start().await;
    let config = kube::Config::new(url.parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let (tx, rx) = mpsc::channel(64);
    let Telemetry {
        metrics, source, ..
    } = Telemetry::new();
    let clusters = vec!["backend=e2e/web:http".parse().unwrap()];
    tokio::spawn(async move { run(client, &clusters, tx, source, fast_backoff()).await });
    (rx, Arc::new(metrics))
}

async fn next(rx: &mut mpsc::Receiver<Update>) -> Change {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("no update within 10 s")
        .expect("source ended")
        .change
}

fn names(c: &Change) -> Vec<String> {
    match c {
        Change::Replace(all) => all.iter().map(|s| s.key.name.clone()).collect(),
        Change::Apply(s) => vec![s.key.name.clone()],
        Change::Delete(k) => vec![k.name.clone()],
    }
}

#[tokio::test]
async fn initial_list_then_watch_events_from_its_resource_version() {
    let api = FakeApi::default();
    api.apply(slice("web-1", "10.0.0.1", true));
    api.apply(slice("web-2", "10.0.0.2", false));
    let (mut rx, metrics) = start_source(&api).await;
    let first = next(&mut rx).await;
    assert!(matches!(first, Change::Replace(_)), "{first:?}");
    assert_eq!(names(&first), vec!["web-1", "web-2"]);
    api.apply(slice("web-2", "10.0.0.2", true));
    let c = next(&mut rx).await;
    match &c {
        Change::Apply(s) => assert_eq!(s.endpoints[0].ready, Some(true)),
        other => panic!("{other:?}"),
    }
    api.delete("web-1", false);
    assert!(matches!(next(&mut rx).await, Change::Delete(k) if k.name == "web-1"));
    assert_eq!(api.lists(), 1);
    // The watch started from the list's version, with the Services' selector.
    assert_eq!(api.watches()[0], "2");
    let sel = api.state.lock().unwrap().selectors[0].clone();
    assert_eq!(sel, "kubernetes.io/service-name in (web)");
    let text = metrics.render();
    assert!(
        text.contains("watch_events_total{kind=\"apply\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("watch_events_total{kind=\"init_done\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn a_dropped_watch_resumes_from_the_last_version_without_a_relist() {
    let api = FakeApi::default();
    api.apply(slice("web-1", "10.0.0.1", true));
    let (mut rx, _m) = start_source(&api).await;
    next(&mut rx).await;
    api.apply(slice("web-1", "10.0.0.1", false));
    next(&mut rx).await;
    // A bookmark moves the resume point past versions of other objects.
    api.bookmark();
    tokio::time::sleep(Duration::from_millis(300)).await;
    api.end_watches(false);
    // A change while the watch is down is still delivered (from the log).
    api.apply(slice("web-3", "10.0.0.3", true));
    let c = next(&mut rx).await;
    assert_eq!(names(&c), vec!["web-3"]);
    assert!(matches!(c, Change::Apply(_)));
    assert_eq!(api.lists(), 1, "no re-list after a dropped connection");
    let w = api.watches();
    assert_eq!(w.len(), 2, "{w:?}");
    assert_eq!(w[1], "3", "resumed from the bookmark's version: {w:?}");
}

#[tokio::test]
async fn gone_410_relists_and_replaces_the_index_whole() {
    let api = FakeApi::default();
    api.apply(slice("web-1", "10.0.0.1", true));
    api.apply(slice("web-2", "10.0.0.2", true));
    let (mut rx, metrics) = start_source(&api).await;
    assert_eq!(names(&next(&mut rx).await), vec!["web-1", "web-2"]);
    // History compacted: web-2's deletion is never seen as an event.
    api.delete("web-2", true);
    api.apply(slice("web-4", "10.0.0.4", true));
    api.end_watches(true);
    // Whatever came before, the re-list ends in a full list without web-2.
    let mut last = next(&mut rx).await;
    while !matches!(last, Change::Replace(_)) {
        last = next(&mut rx).await;
    }
    assert_eq!(names(&last), vec!["web-1", "web-4"]);
    assert_eq!(api.lists(), 2);
    assert!(metrics
        .render()
        .contains("source_errors_total{kind=\"watch\"}"));
}

#[tokio::test]
async fn failing_lists_back_off_then_recover() {
    let api = FakeApi::default();
    api.apply(slice("web-1", "10.0.0.1", true));
    api.state.lock().unwrap().fail_lists = 3;
    let (mut rx, metrics) = start_source(&api).await;
    let c = next(&mut rx).await;
    assert_eq!(names(&c), vec!["web-1"]);
    assert_eq!(api.lists(), 4);
    assert!(
        metrics
            .render()
            .contains("source_errors_total{kind=\"watch\"} 3"),
        "{}",
        metrics.render()
    );
}

/// A gauge of the companion's registry (0 when not rendered).
fn gauge(metrics: &Metrics, name: &str) -> f64 {
    let text = metrics.render();
    let want = format!("serving_picker_conditions_{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&want))
        .map_or(0.0, |v| v.parse().unwrap())
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// What ServingPickerSourceFailing and ServingPickerEgHookNotCalled read:
/// the errors from 0, the last success (a full list, a watch event) and the
/// last change (a watch event; the first list is none) as Unix times.
#[tokio::test]
async fn the_last_success_and_the_last_change_are_timestamps() {
    let api = FakeApi::default();
    api.apply(slice("web-1", "10.0.0.1", true));
    api.state.lock().unwrap().list_delay = Duration::from_millis(500);
    let (mut rx, metrics) = start_source(&api).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        metrics
            .render()
            .contains("source_errors_total{kind=\"watch\"} 0"),
        "errors from 0: {}",
        metrics.render()
    );
    assert_eq!(
        gauge(&metrics, "source_last_success_timestamp_seconds"),
        0.0
    );
    let before = unix_now();
    assert!(matches!(next(&mut rx).await, Change::Replace(_)));
    let listed = gauge(&metrics, "source_last_success_timestamp_seconds");
    assert!(listed >= before - 1.0 && listed <= unix_now(), "{listed}");
    assert_eq!(
        gauge(&metrics, "source_last_change_timestamp_seconds"),
        0.0,
        "a list is not a change"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    api.apply(slice("web-1", "10.0.0.1", false));
    assert!(matches!(next(&mut rx).await, Change::Apply(_)));
    let changed = gauge(&metrics, "source_last_change_timestamp_seconds");
    assert!(
        changed > listed && changed <= unix_now(),
        "{changed} {listed}"
    );
    assert!(gauge(&metrics, "source_last_success_timestamp_seconds") >= changed);
}

/// A slow API: nothing is ready (no snapshot to serve, /readyz 503) until
/// the first list is complete.
#[tokio::test]
async fn a_slow_list_is_not_served_before_it_is_complete() {
    let api = FakeApi::default();
    api.apply(slice("web-1", "10.0.0.1", true));
    api.state.lock().unwrap().list_delay = Duration::from_millis(1500);
    let (rx, metrics) = start_source(&api).await;
    let publisher = Publisher::new(
        vec!["backend=e2e/web:http".parse().unwrap()],
        Default::default(),
        Default::default(),
    );
    let (snap_tx, mut snap_rx) = watch::channel(Arc::new(Snapshot::empty()));
    tokio::spawn(publish::run(
        publisher,
        rx,
        snap_tx,
        metrics.clone(),
        PublishMetrics::register(&mut Default::default()),
    ));
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!snap_rx.borrow().ready);
    assert!(!metrics.is_ready());
    tokio::time::timeout(Duration::from_secs(10), snap_rx.changed())
        .await
        .unwrap()
        .unwrap();
    let s = snap_rx.borrow().clone();
    assert!(s.ready);
    assert_eq!(s.resource("backend").unwrap().endpoints, 1);
    assert!(metrics.is_ready());
}

/// Starts the source against `url` with `backoff`; its metrics.
fn start_source_at(url: &str, backoff: ExpBackoff) -> Arc<Metrics> {
    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    let (tx, mut rx) = mpsc::channel(64);
    // Nothing ever arrives; the receiver only has to stay open.
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let Telemetry {
        metrics, source, ..
    } = Telemetry::new();
    let clusters = vec!["backend=e2e/web:http".parse().unwrap()];
    tokio::spawn(async move { run(client, &clusters, tx, source, backoff).await });
    Arc::new(metrics)
}

fn watch_errors(metrics: &Metrics) -> u64 {
    let text = metrics.render();
    text.lines()
        .find_map(|l| {
            l.strip_prefix("serving_picker_conditions_source_errors_total{kind=\"watch\"} ")
        })
        .map_or(0, |v| v.parse().unwrap())
}

/// An API server that takes every connection and closes it at once: each
/// list attempt is one accepted connection, timed here. The gaps between
/// attempts double (the back-off is not reset by the watcher's `Init` that
/// starts every retry).
#[tokio::test]
async fn an_api_server_that_drops_every_connection_is_retried_with_doubling_gaps() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let seen = attempts.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            seen.lock().unwrap().push(std::time::Instant::now());
            drop(stream);
        }
    });
    let metrics = start_source_at(
        &url,
        ExpBackoff::new(Duration::from_millis(100), Duration::from_millis(1600)),
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let at = attempts.lock().unwrap().clone();
    // 0, 0.1, 0.3, 0.7, 1.5 s (then 3.1): 5 attempts in 2.5 s; a back-off
    // stuck at its minimum makes about 25.
    assert!(
        (4..=6).contains(&at.len()),
        "{} attempts in 2.5 s: {at:?}",
        at.len()
    );
    let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
    for (i, gap) in gaps.iter().enumerate() {
        let want = Duration::from_millis(100 << i);
        assert!(
            *gap >= want.mul_f64(0.9),
            "gap {i} is {gap:?}, want at least {want:?}: {gaps:?}"
        );
    }
    assert_eq!(watch_errors(&metrics), at.len() as u64);
}

/// An API server that refuses connections, with the shipped back-off (0.8 s
/// doubling to 30 s): 0, 0.8, 2.4 s and then 5.6 s, so 3 attempts in the
/// first 5 s (6 or 7 at a fixed 0.8 s), counted as source errors.
#[tokio::test]
async fn a_refusing_api_server_is_retried_with_the_shipped_back_off() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let metrics = start_source_at(&format!("http://127.0.0.1:{port}"), ExpBackoff::default());
    tokio::time::sleep(Duration::from_millis(5000)).await;
    let n = watch_errors(&metrics);
    assert_eq!(n, 3, "{n} list attempts in 5 s");
}
