//! Long-lived streams leave a terminating pod before it exits (`drain_window_ms`): real Envoy,
//! two pods (`support::streams::StreamBackend`), clients holding streams through Envoy.
//!
//! Row 5 (A serving+terminating, B ready): every stream on A ends within the window, spread
//! over it, and the clients are on B before A exits. Rows 3 and 4 (A the only serving choice)
//! and a host only not ready: no stream ends early. Without `drain_window_ms`: none ends.
//!
//! What the client sees is what proxy-wasm lets a filter do to a response that has started: a
//! stream reset (`proxy_close_stream`, Envoy's `encoder_callbacks_->resetStream()`), which an
//! HTTP/2 client receives as RST_STREAM INTERNAL_ERROR (gRPC: INTERNAL) and an HTTP/1.1 client as the
//! connection closing (docs/wasm.md, "Long-lived streams").
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use support::streams::{
    envoy_hook, Kind, Moved, Reconnect, StreamBackend, StreamClient, StreamRecord,
};
use support::{wait_until, Endpoint, Envoy, EnvoyBuilder};

/// The window the tests set (the shipped examples: 15 s).
const WINDOW: Duration = Duration::from_millis(3000);
/// A's grace period: it exits this long after it turns terminating.
const GRACE: Duration = Duration::from_millis(6000);
const H2: &str = "grpc";
const H1: &str = "ws";

fn envoy(tag: &str, drain: bool, a: &StreamBackend, b: &StreamBackend) -> Envoy {
    let config = if drain {
        format!(
            r#"{{"refresh_interval_ms": 100, "drain_window_ms": {}}}"#,
            WINDOW.as_millis()
        )
    } else {
        r#"{"refresh_interval_ms": 100}"#.to_string()
    };
    // A alone at first: every stream opens on A, even one Envoy's own balancer places before
    // its worker has the snapshot (a not serving B beside it would take some). B comes with
    // the row.
    let _ = b;
    let eps = [Endpoint::serving(a.addr())];
    let envoy = EnvoyBuilder::new()
        .tag(tag)
        .with_filter(Some(&config))
        .eds_cluster(H2, &eps)
        .eds_cluster(H1, &eps)
        .bootstrap_hook(envoy_hook(H2, H1))
        .start();
    wait_until("the first snapshot", Duration::from_secs(10), || {
        envoy.stat_or_zero("serving_picker.snapshot.published") >= 1
    });
    // The pod answers through Envoy (its 404 for any other path) on both clusters.
    wait_until("A answers through Envoy", Duration::from_secs(10), || {
        envoy.get("/other", &[]).status == 404 && envoy.get("/ws/other", &[]).status == 404
    });
    envoy
}

fn set_both(envoy: &Envoy, eps: &[Endpoint]) {
    envoy.set_endpoints(H2, eps);
    envoy.set_endpoints(H1, eps);
}

fn open(envoy: &Envoy, kind: Kind, n: usize, reconnect: Reconnect) -> StreamClient {
    let client = StreamClient::start(kind, envoy.listen_addr(), n, reconnect, "drain.test");
    assert!(
        client.wait_open_on("A", n, Duration::from_secs(60)),
        "{kind:?}: {} of {n} streams open on A: {:?}",
        client.open_on("A"),
        client
            .records()
            .iter()
            .flat_map(|r| r.attempts.iter().filter_map(|a| a.end.clone()))
            .take(5)
            .collect::<Vec<_>>()
    );
    client
}

/// A turns serving+terminating with B ready; A exits after its grace period.
/// The records, with when A turned terminating and when it exited.
fn row_5(
    envoy: &Envoy,
    a: &mut StreamBackend,
    b: std::net::SocketAddr,
    client: StreamClient,
) -> (Vec<StreamRecord>, Instant, Instant) {
    let since = Instant::now();
    set_both(
        envoy,
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b),
        ],
    );
    std::thread::sleep(GRACE);
    // A exits now: a stream it ends from here on was open on it at its exit.
    let exited = Instant::now();
    a.exit();
    std::thread::sleep(Duration::from_millis(1000));
    (client.stop(), since, exited)
}

fn ended_stat(envoy: &Envoy, protocol: &str) -> u64 {
    println!("drain stats: {:?}", envoy.stats_matching("drain"));
    println!("reset stats: {:?}", envoy.stats_matching("reset"));
    envoy.stat_or_zero(&format!("serving_picker.drain.ended.{protocol}.reset"))
}

/// 100 gRPC streams: every one ends within the window (spread over it), none is open on A
/// when it exits, and a client that reopens on any end is on B before A's grace period ends.
#[test]
fn grpc_streams_leave_a_terminating_pod_within_the_window() {
    let (mut a, b) = (StreamBackend::start("A"), StreamBackend::start("B"));
    let envoy = envoy("drain-grpc", true, &a, &b);
    let client = open(&envoy, Kind::Grpc, 100, Reconnect::Always);
    let (records, since, exited) = row_5(&envoy, &mut a, b.addr(), client);
    let m = Moved::count(&records, "A", since, Some(exited));
    println!("wasm, grpc, row 5: {}", m.summary());
    println!("ends: {:?}", m.ended);
    assert_eq!(m.on_pod, 100, "{m:?}");
    assert_eq!(
        m.open_at_exit, 0,
        "a stream stayed on A until it exited: {m:?}"
    );
    assert_eq!(m.moved, 100, "{m:?}");
    let all_moved = m.all_moved_after.unwrap();
    assert!(all_moved < GRACE, "{m:?}");
    let (first, last) = m.ends_spread.unwrap();
    // Never in the window's first tenth; spread over the rest, with a tick and a snapshot of
    // lag on top.
    assert!(first >= WINDOW / 10, "{m:?}");
    assert!(last <= WINDOW + Duration::from_millis(1500), "{m:?}");
    assert!(last - first >= WINDOW / 2, "ends bunched: {m:?}");
    // What proxy-wasm's reset gives an HTTP/2 client on Envoy 1.40: RST_STREAM INTERNAL_ERROR
    // (gRPC: INTERNAL), every stream alike.
    assert_eq!(m.ended.get("reset INTERNAL_ERROR"), Some(&100), "{m:?}");
    assert_eq!(ended_stat(&envoy, "grpc"), 100);
}

/// Row 5 for a websocket and an HTTP/2 and an HTTP/1.1 download: each ends within the window.
#[test]
fn websockets_and_downloads_leave_a_terminating_pod_within_the_window() {
    let (mut a, b) = (StreamBackend::start("A"), StreamBackend::start("B"));
    let envoy = envoy("drain-others", true, &a, &b);
    let kinds = [Kind::Websocket, Kind::Http2Download, Kind::Http1Download];
    let clients: Vec<StreamClient> = kinds
        .iter()
        .map(|&k| open(&envoy, k, 20, Reconnect::Always))
        .collect();
    let since = Instant::now();
    set_both(
        &envoy,
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    std::thread::sleep(GRACE);
    // A exits now: a stream it ends from here on was open on it at its exit.
    let exited = Instant::now();
    a.exit();
    std::thread::sleep(Duration::from_millis(1000));
    for client in clients {
        let kind = client.kind();
        let records = client.stop();
        let m = Moved::count(&records, "A", since, Some(exited));
        println!("wasm, {kind:?}, row 5: {}", m.summary());
        assert_eq!(m.on_pod, 20, "{kind:?}: {m:?}");
        assert_eq!(m.open_at_exit, 0, "{kind:?}: {m:?}");
        assert_eq!(m.moved, 20, "{kind:?}: {m:?}");
        assert!(m.all_moved_after.unwrap() < GRACE, "{kind:?}: {m:?}");
        assert_eq!(ended_stat(&envoy, kind.protocol()), 20, "{kind:?}");
    }
}

/// A only serving+terminating, then A serving+terminating with B not serving, then A only not
/// ready with B ready: no stream ends early in any (rows 3 and 4; a host only not ready).
#[test]
fn no_stream_ends_while_the_terminating_pod_is_the_only_choice_or_only_not_ready() {
    let (a, b) = (StreamBackend::start("A"), StreamBackend::start("B"));
    let envoy = envoy("drain-rows-3-4", true, &a, &b);
    let client = open(&envoy, Kind::Grpc, 20, Reconnect::Always);
    let rows = [
        ("row 3", vec![Endpoint::serving_terminating(a.addr())]),
        (
            "row 4",
            vec![
                Endpoint::serving_terminating(a.addr()),
                Endpoint::not_serving(b.addr()),
            ],
        ),
        (
            "only not ready",
            vec![Endpoint::not_serving(a.addr()), Endpoint::serving(b.addr())],
        ),
    ];
    for (row, eps) in rows {
        set_both(&envoy, &eps);
        std::thread::sleep(WINDOW + Duration::from_millis(1000));
        assert_eq!(client.open_on("A"), 20, "{row}: a stream ended early");
        assert_eq!(ended_stat(&envoy, "grpc"), 0, "{row}");
    }
    let records = client.stop();
    assert!(records.iter().all(|r| r.attempts.len() == 1));
}

/// Without `drain_window_ms` (plain Envoy's behaviour): row 5 leaves every stream on A until
/// it exits, and the filter counts nothing.
#[test]
fn without_a_window_streams_stay_until_the_pod_exits() {
    let (mut a, b) = (StreamBackend::start("A"), StreamBackend::start("B"));
    let envoy = envoy("drain-off", false, &a, &b);
    let client = open(&envoy, Kind::Grpc, 20, Reconnect::Always);
    let (records, since, exited) = row_5(&envoy, &mut a, b.addr(), client);
    let m = Moved::count(&records, "A", since, Some(exited));
    println!("wasm without drain_window_ms, grpc, row 5: {}", m.summary());
    assert_eq!(m.on_pod, 20, "{m:?}");
    assert_eq!(m.open_at_exit, 20, "{m:?}");
    assert!(envoy.stats_matching("serving_picker.drain.").is_empty());
}
