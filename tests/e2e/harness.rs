//! Self-tests of the e2e harness: backends, HTTP client, EDS file watching,
//! the override_host plumbing the filter relies on (on a control Envoy
//! without the filter) and bootstrap validation.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use support::envoy::{envoy_bin, validate_bootstrap};
use support::*;

#[test]
fn backend_keep_alive_and_records_headers() {
    let a = Backend::start("A");
    let mut s = TcpStream::connect(a.addr()).expect("connect backend");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    // Two requests on one connection; the first carries the override header twice.
    let req1 = "GET /one HTTP/1.1\r\nHost: x\r\nx-gateway-destination-endpoint: 1.2.3.4:5\r\nX-Gateway-Destination-Endpoint: 6.7.8.9:10\r\n\r\n";
    s.write_all(req1.as_bytes()).expect("write");
    let r1 = read_one_response(&mut s);
    assert!(r1.starts_with("HTTP/1.1 200"), "{r1}");
    assert!(r1.contains("x-backend: A"), "{r1}");
    assert!(
        r1.contains("x-backend-saw-override: 1.2.3.4:5,6.7.8.9:10"),
        "{r1}"
    );
    assert!(r1.ends_with("\r\n\r\nA"), "{r1}");
    s.write_all(b"GET /two HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write 2");
    let r2 = read_one_response(&mut s);
    assert!(r2.contains("x-backend-saw-override: -"), "{r2}");
    assert_eq!(a.count(), 2);
    assert_eq!(a.override_values(), vec!["1.2.3.4:5", "6.7.8.9:10"]);
    let reqs = a.requests();
    assert_eq!(reqs[0].path, "/one");
    assert_eq!(reqs[1].path, "/two");
}

/// Reads one Content-Length response off a kept-alive connection.
fn read_one_response(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let len: usize = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_string())
                })
                .and_then(|v| v.parse().ok())
                .expect("content-length");
            if got.len() >= end + 4 + len {
                return text;
            }
        }
        let n = s.read(&mut buf).expect("read response");
        assert!(n > 0, "connection closed mid-response: {text:?}");
        got.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn http_client_sends_repeated_headers() {
    let a = Backend::start("A");
    let r = http::get(
        a.addr(),
        "/x",
        &[(OVERRIDE_HEADER, "a:1"), (OVERRIDE_HEADER, "b:2")],
    );
    assert_eq!(r.status, 200, "{}", r.summary());
    assert_eq!(r.body, "A");
    assert_eq!(r.header(BACKEND_HEADER), Some("A"));
    assert_eq!(a.override_values(), vec!["a:1", "b:2"]);
}

#[test]
fn backend_begin_termination_serves_then_closes() {
    let a = Backend::start("A");
    // A kept-alive connection opened before termination.
    let mut s = TcpStream::connect(a.addr()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    a.begin_termination(Duration::from_millis(400));
    let r = http::get(a.addr(), "/during", &[]);
    assert_eq!(
        r.status,
        200,
        "still serving during preStop: {}",
        r.summary()
    );
    wait_until(
        "backend stopped after preStop",
        Duration::from_secs(3),
        || a.is_stopped(),
    );
    wait_until("listener closed", Duration::from_secs(3), || {
        TcpStream::connect(a.addr()).is_err()
    });
    // The old connection was closed too: reading gives EOF or an error.
    let mut buf = [0u8; 16];
    let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    match s.read(&mut buf) {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!(
            "connection still answered after termination: {:?}",
            &buf[..n]
        ),
    }
}

#[test]
fn backend_stop_refuses_connections() {
    let a = Backend::start("A");
    assert_eq!(http::get(a.addr(), "/", &[]).status, 200);
    a.stop();
    assert!(
        TcpStream::connect(a.addr()).is_err(),
        "listener still open after stop()"
    );
}

#[test]
fn control_envoy_eds_file_updates_are_applied() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let envoy = EnvoyBuilder::new()
        .tag("control-eds")
        .with_filter(None)
        .eds_cluster("backend", &[Endpoint::serving(a.addr())])
        .start();
    expect_routing(
        &envoy,
        "/backend/x",
        &[],
        "A (control Envoy, only A)",
        served_by(&a),
    );
    // "/" goes to the first cluster.
    expect_routing(&envoy, "/", &[], "A via the / route", served_by(&a));
    envoy.set_endpoints("backend", &[Endpoint::serving(b.addr())]);
    expect_routing(
        &envoy,
        "/backend/x",
        &[],
        "B after the EDS update",
        served_by(&b),
    );
    assert!(envoy.eds("backend").version() >= 2);
}

#[test]
fn control_envoy_honours_override_header_including_draining_hosts() {
    // What the filter relies on: the cluster's override_host policy sends a
    // request to the host named in x-gateway-destination-endpoint, DRAINING
    // hosts included (override_host_status).
    let a = Backend::start("A");
    let b = Backend::start("B");
    let c = Backend::start("C");
    let envoy = EnvoyBuilder::new()
        .tag("control-override")
        .with_filter(None)
        .eds_cluster(
            "backend",
            &[
                Endpoint::serving(a.addr()),
                Endpoint::serving(b.addr()),
                Endpoint::health(c.addr(), "DRAINING"),
            ],
        )
        .start();
    let b_addr = b.addr().to_string();
    let c_addr = c.addr().to_string();
    expect_routing(
        &envoy,
        "/backend/x",
        &[(OVERRIDE_HEADER, &b_addr)],
        "B by override",
        served_by(&b),
    );
    expect_routing(
        &envoy,
        "/backend/x",
        &[(OVERRIDE_HEADER, &c_addr)],
        "DRAINING C by override",
        served_by(&c),
    );
    // Without the header: round robin over A and B (C is draining).
    let rs = batch(&envoy, "/backend/x", &[], BATCH);
    let counts = per_backend(&rs);
    assert!(
        counts.get("A").copied().unwrap_or(0) >= 10 && counts.get("B").copied().unwrap_or(0) >= 10,
        "round robin over A and B expected: {:?}",
        tally(&rs)
    );
    // Both workers took connections.
    let workers = envoy.worker_connections();
    assert_eq!(workers.len(), 2, "expected two workers: {workers:?}");
}

#[test]
fn control_envoy_static_cluster_and_retry_policy() {
    let a = Backend::start("A");
    let envoy = EnvoyBuilder::new()
        .tag("control-static")
        .with_filter(None)
        .static_cluster("fixed", &[Endpoint::serving(a.addr()).weight(2)])
        .retry_policy(serde_json::json!({"retry_on": "connect-failure,reset", "num_retries": 2}))
        .start();
    expect_routing(
        &envoy,
        "/fixed/x",
        &[],
        "A on the STATIC cluster",
        served_by(&a),
    );
    let admin = envoy.admin_get("/clusters");
    assert_eq!(admin.status, 200);
    assert!(admin.body.contains(&a.addr().to_string()), "{}", admin.body);
    assert!(envoy.stat("cluster.fixed.upstream_rq_total").unwrap_or(0) > 0);
}

#[test]
fn bootstrap_with_filter_validates() {
    // Fails (never skips) when the module or Envoy is missing.
    let a = Backend::start("A");
    let envoy = EnvoyBuilder::new()
        .tag("validate")
        .with_filter(Some(&plugin_config(
            serde_json::json!({"on_no_serving": "passthrough"}),
        )))
        .eds_cluster("backend", &[Endpoint::serving(a.addr())])
        .static_cluster("fixed", &[Endpoint::no_metadata(a.addr())])
        .start();
    let out = validate_bootstrap(&envoy_bin(), &envoy.bootstrap_path());
    assert!(
        out.starts_with("exit Some(0)"),
        "envoy --mode validate failed:\n{out}"
    );
}
