//! The native form's stream drain in a real Envoy with the real libserving_picker.so: the HTTP
//! filter `serving_picker_drain` beside the load-balancing policy, with the harness's pods and
//! clients (`support::streams`). Pods A and B; a gRPC client holds 100 server-streaming calls
//! (reconnecting on UNAVAILABLE), and websockets, HTTP/2 and HTTP/1.1 downloads (reconnecting
//! always) are held beside it, all on A while it is ready. A turns serving+terminating with B
//! ready (row 5), and exits after its grace period: every stream ends within the drain window
//! (gRPC with UNAVAILABLE, the others reset), counted by protocol, and is on B before A exits.
//! Rows 3 and 4 (A the only serving choice), a host only not ready, and a cluster without
//! `drain_window_ms` end no stream.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::thread;
use std::time::{Duration, Instant};

use support::drain_setups::{self, drain_envoy, set_both};
use support::streams::{Kind, Moved, Reconnect, StreamBackend, StreamClient};
use support::*;

/// The drain window of these tests.
const WINDOW: Duration = Duration::from_millis(3_000);
/// The pod's grace period: it exits this long after turning terminating.
const GRACE: Duration = Duration::from_millis(6_000);
/// How long past the window a stream may take to end: the EDS file's rename reaching the
/// policy, the timer thread, the worker.
const SLACK: Duration = Duration::from_millis(1_500);

fn window_policy() -> String {
    drain_setups::window_policy(WINDOW)
}

fn counter(envoy: &Envoy, name: &str) -> u64 {
    envoy.stat_or_zero(&format!("dynamicmodulescustom.serving_picker.drain.{name}"))
}

fn clients(envoy: &Envoy, grpc: usize, others: usize) -> Vec<StreamClient> {
    let mut out = vec![StreamClient::start(
        Kind::Grpc,
        envoy.listen_addr(),
        grpc,
        Reconnect::OnUnavailable,
        "test",
    )];
    if others > 0 {
        for kind in [Kind::Websocket, Kind::Http2Download, Kind::Http1Download] {
            out.push(StreamClient::start(
                kind,
                envoy.listen_addr(),
                others,
                Reconnect::Always,
                "test",
            ));
        }
    }
    out
}

/// Row 5: the 100 gRPC streams end with UNAVAILABLE inside the window, at spread points, and
/// are all on B before A exits; the websockets and downloads are reset and move too.
#[test]
fn row_5_ends_every_stream_within_the_window_and_all_are_on_b_before_the_pod_exits() {
    let mut a = StreamBackend::start("A");
    let b = StreamBackend::start("B");
    let envoy = drain_envoy(
        "native-drain-row5",
        &window_policy(),
        &[Endpoint::serving(a.addr()), Endpoint::not_serving(b.addr())],
    );
    let held = clients(&envoy, 100, 5);
    for c in &held {
        let n = if c.kind() == Kind::Grpc { 100 } else { 5 };
        assert!(
            c.wait_open_on("A", n, Duration::from_secs(10)),
            "{:?}: {} open on A",
            c.kind(),
            c.open_on("A")
        );
    }
    assert_eq!(
        counter(&envoy, "open_streams"),
        115,
        "every stream tracked, shown by the gauge"
    );
    let since = Instant::now();
    set_both(
        &envoy,
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    thread::sleep(GRACE);
    a.exit();
    let exited = Instant::now();
    thread::sleep(Duration::from_millis(500));
    for c in held {
        let kind = c.kind();
        let n = if kind == Kind::Grpc { 100 } else { 5 };
        let m = Moved::count(&c.stop(), "A", since, Some(exited));
        println!("native, {kind:?}: {}", m.summary());
        assert_eq!(m.on_pod, n, "{kind:?}: {m:?}");
        assert_eq!(m.open_at_exit, 0, "{kind:?}: {m:?}");
        assert_eq!(m.moved, n, "{kind:?}: {m:?}");
        let (first, last) = m.ends_spread.unwrap();
        assert!(
            first >= WINDOW / 10 && last <= WINDOW + SLACK,
            "{kind:?}: ends {first:?}..{last:?} after A turned terminating, window {WINDOW:?}"
        );
        assert!(
            m.all_moved_after.unwrap() < GRACE,
            "{kind:?}: not all on B before A exited: {m:?}"
        );
        if kind == Kind::Grpc {
            assert_eq!(m.not_retryable, 0, "{m:?}");
            assert_eq!(
                m.ended.get("grpc 14 UNAVAILABLE"),
                Some(&100),
                "{:?}",
                m.ended
            );
            assert!(last - first >= WINDOW / 3, "ends not spread: {m:?}");
        }
        let expected = match kind {
            Kind::Grpc => "ended.grpc.trailers_unavailable",
            Kind::Http2Download => "ended.http2.reset",
            Kind::Http1Download => "ended.http1.reset",
            Kind::Websocket => "ended.websocket.reset",
        };
        assert_eq!(counter(&envoy, expected), n as u64, "{expected}");
    }
    wait_until("no stream tracked", Duration::from_secs(3), || {
        counter(&envoy, "open_streams") == 0
    });
}

/// Rows 3 and 4: A serving+terminating is the only serving choice (alone, then with B not
/// yet serving): kube-proxy's fallback holds for streams too, none ends. A host that is only
/// not ready (not terminating) is not drained either. Then B turns ready: they end.
#[test]
fn rows_3_and_4_and_a_host_only_not_ready_end_no_stream() {
    let a = StreamBackend::start("A");
    let b = StreamBackend::start("B");
    let envoy = drain_envoy(
        "native-drain-rows34",
        &window_policy(),
        &[Endpoint::serving(a.addr())],
    );
    let grpc = clients(&envoy, 20, 0).pop().unwrap();
    assert!(grpc.wait_open_on("A", 20, Duration::from_secs(10)));
    let hold = WINDOW + SLACK;
    for (row, endpoints) in [
        ("row 3", vec![Endpoint::serving_terminating(a.addr())]),
        (
            "row 4",
            vec![
                Endpoint::serving_terminating(a.addr()),
                Endpoint::not_serving(b.addr()),
            ],
        ),
    ] {
        set_both(&envoy, &endpoints);
        thread::sleep(hold);
        assert_eq!(grpc.open_on("A"), 20, "{row}: a stream ended");
    }
    // A failing its readiness probe (not ready, not terminating) with B ready: new requests
    // leave A; its open streams stay.
    set_both(
        &envoy,
        &[Endpoint::not_serving(a.addr()), Endpoint::serving(b.addr())],
    );
    thread::sleep(hold);
    assert_eq!(grpc.open_on("A"), 20, "A only not ready: a stream ended");
    assert_eq!(counter(&envoy, "ended.grpc.trailers_unavailable"), 0);
    // Row 5 at last: the same streams end, and move to B.
    set_both(
        &envoy,
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    assert!(grpc.wait_open_on("B", 20, hold), "{:?}", grpc.open_on("B"));
    assert_eq!(counter(&envoy, "ended.grpc.trailers_unavailable"), 20);
    drop(grpc.stop());
}

/// Opt-in: a cluster whose policy has no `drain_window_ms` never has a stream ended, the
/// filter on the listener or not.
#[test]
fn a_cluster_without_drain_window_ms_ends_no_stream() {
    let a = StreamBackend::start("A");
    let b = StreamBackend::start("B");
    let envoy = drain_envoy(
        "native-drain-optin",
        "{}",
        &[Endpoint::serving(a.addr()), Endpoint::not_serving(b.addr())],
    );
    let grpc = clients(&envoy, 10, 0).pop().unwrap();
    assert!(grpc.wait_open_on("A", 10, Duration::from_secs(10)));
    set_both(
        &envoy,
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    thread::sleep(WINDOW + SLACK);
    assert_eq!(grpc.open_on("A"), 10, "a stream ended");
    assert_eq!(counter(&envoy, "ended.grpc.trailers_unavailable"), 0);
    drop(grpc.stop());
}

/// envoy-native.yaml with its drain filter's block replaced, through `envoy --mode validate`:
/// (accepted, output).
fn validate_shipped_with_filter(name: &str, config: &str) -> (bool, String) {
    let yaml = std::fs::read_to_string(support::repo_root().join("envoy-native.yaml")).unwrap();
    let shipped = "filter_name: serving_picker_drain\n              filter_config:\n                \"@type\": type.googleapis.com/google.protobuf.StringValue\n                value: '{}'";
    assert!(
        yaml.contains(shipped),
        "envoy-native.yaml's drain filter changed: update this test"
    );
    let changed = yaml.replace(
        shipped,
        &format!("filter_name: {name}\n              filter_config:\n                \"@type\": type.googleapis.com/google.protobuf.StringValue\n                value: '{config}'"),
    );
    let dir = support::envoy::fresh_dir("native-drain-refused");
    let path = dir.join("drain.yaml");
    std::fs::write(&path, changed).unwrap();
    let out = std::process::Command::new(support::envoy::envoy_bin())
        .args(["--mode", "validate", "-c"])
        .arg(&path)
        .args(["--disable-hot-restart", "-l", "info"])
        .env(
            "ENVOY_DYNAMIC_MODULES_SEARCH_PATH",
            support::envoy::native_module().parent().unwrap(),
        )
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// The shipped envoy-native.yaml loads the filter; a key in its configuration (named in the
/// error) or another filter name is refused and Envoy rejects the listener.
#[test]
fn the_filter_loads_as_shipped_and_refuses_keys_and_other_names() {
    let (ok, out) = validate_shipped_with_filter("serving_picker_drain", "{}");
    assert!(ok, "{out}");
    assert!(out.contains("serving_picker_drain configured"), "{out}");
    for (name, config, says) in [
        (
            "serving_picker_drain",
            r#"{"drain_window_ms": 15000}"#,
            "filter_config refused: plugin configuration key `drain_window_ms`",
        ),
        ("other", "{}", r#"filter_name "other" refused"#),
    ] {
        let (ok, out) = validate_shipped_with_filter(name, config);
        assert!(!ok, "{name} {config}: Envoy accepted it\n{out}");
        let ours: Vec<&str> = out
            .lines()
            .filter(|l| l.contains("[error]") && l.contains(says))
            .collect();
        assert_eq!(
            ours.len(),
            1,
            "{name} {config}: no error line with {says:?}\n{out}"
        );
    }
}
