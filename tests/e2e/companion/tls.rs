//! The companion's gRPC listener over TLS and mutual TLS, the real binary:
//!
//! - refusals at the handshake: no client certificate, one from another
//!   CA, a SAN not allowed, plaintext to the TLS port; each counted by
//!   reason, logged once per peer address per interval (not per attempt);
//! - start-up errors that name the flag and the file (missing, not a file,
//!   expired, key of another certificate, CA file without a certificate);
//! - a reload with a bad file keeps the last good one (logged, counted),
//!   a good one is served to new connections;
//! - a plaintext listener off loopback: warned and shown in a metric;
//! - rotation under load with a real Envoy 1.40 (the shipped
//!   envoy-companion.yaml transport socket, SDS from files): the
//!   companion's certificate renewed, then a CA rotation on both sides, as
//!   Secret updates (`..data` swaps): no request fails, Envoy keeps its
//!   stream and follows changes, new connections get the new certificate,
//!   the old CA is refused once dropped, and after a companion restart
//!   Envoy reconnects with its new certificate and regains the state.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::companion::{companion_bin, eds_from_companion, Companion, SliceDir, XdsApi};
use support::envoy::fresh_dir;
use support::load::{Load, LoadConfig};
use support::mtls::{dial, dial_plaintext, Dial, Mtls};
use support::pki::{self, refs, Ca, COMPANION_DNS, ENVOY_SPIFFE};
use support::ports::free_port;
use support::*;

const CLUSTER: &str = "backend";
const SERVICE: &str = "web";
const PATH: &str = "/backend/tls";
const REFUSED_LOG: &str = "TLS handshake refused";

fn start_companion(m: &Mtls, slices: &SliceDir) -> Companion {
    let args = m.companion_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Companion::start(slices.path(), &[(CLUSTER, SERVICE)], &args)
}

fn refusals(c: &Companion, reason: &str) -> f64 {
    c.metric(&format!(
        "serving_picker_conditions_tls_refusals_total{{reason=\"{reason}\"}}"
    ))
    .unwrap_or(0.0)
}

#[test]
fn refused_clients_are_counted_by_reason_and_logged_once_per_peer() {
    let m = Mtls::new("refusals");
    let slices = SliceDir::create(&fresh_dir("tls-refusals-slices"));
    slices.set_endpoints(SERVICE, &[]);
    let c = start_companion(&m, &slices);
    let addr = c.listen_addr();
    let ca = &m.ca.pem;

    // The client the companion lets in: the CA's, with Envoy's SPIFFE ID.
    let ok = dial(addr, ca, COMPANION_DNS, Some(&m.envoy_cert), None);
    assert_eq!(ok.server_cert(), m.companion_cert.der.as_slice());
    assert!(
        matches!(&ok, Dial::Accepted { alpn: Some(p), .. } if p == b"h2"),
        "{ok:?}"
    );

    let other_ca = Ca::new("another CA");
    let foreign = other_ca.client(&[ENVOY_SPIFFE]);
    let wrong_san =
        m.ca.client(&["spiffe://cluster.local/ns/demo/sa/someone-else"]);
    let rounds = 5;
    for _ in 0..rounds {
        let d = dial(addr, ca, COMPANION_DNS, None, None);
        assert!(d.is_refused(), "no client certificate: {d:?}");
        let d = dial(addr, ca, COMPANION_DNS, Some(&foreign), None);
        assert!(d.is_refused(), "another CA: {d:?}");
        let d = dial(addr, ca, COMPANION_DNS, Some(&wrong_san), None);
        assert!(d.is_refused(), "SAN not allowed: {d:?}");
        let back = dial_plaintext(addr, None);
        // Whatever comes back is no HTTP/2 SETTINGS frame (type 4).
        assert!(
            back.len() < 9 || back[3] != 4,
            "plaintext answered: {back:?}"
        );
    }
    for reason in ["no_client_cert", "unknown_ca", "san_not_allowed", "not_tls"] {
        assert_eq!(refusals(&c, reason), rounds as f64, "{reason}");
    }
    assert_eq!(
        c.metric("serving_picker_conditions_tls_handshakes_total"),
        Some(1.0)
    );
    // 20 refusals from 127.0.0.1: one line. Another address: its own line.
    let lines = c.log_lines(REFUSED_LOG);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("127.0.0.1"), "{}", lines[0]);
    let second = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    for _ in 0..3 {
        assert!(dial(addr, ca, COMPANION_DNS, None, Some(second)).is_refused());
    }
    let lines = c.log_lines(REFUSED_LOG);
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(lines[1].contains("127.0.0.2"), "{}", lines[1]);
    assert_eq!(refusals(&c, "no_client_cert"), (rounds + 3) as f64);
    // No key material in the log.
    assert!(!c.log_text().contains("PRIVATE KEY"));
}

/// Runs the companion with `args` (eds mode over an empty slice
/// directory) and expects it to stop at once: its stderr.
fn fails_to_start(args: &[String]) -> String {
    let slices = fresh_dir("tls-start-slices");
    let out = Command::new(companion_bin())
        .args(["eds", "--cluster", "backend=e2e/web:http", "--slices-dir"])
        .arg(&slices)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--metrics-listen", &format!("127.0.0.1:{}", free_port())])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(!stderr.contains("PRIVATE KEY"), "{stderr}");
    stderr
}

#[test]
fn start_up_errors_name_the_flag_and_the_file() {
    let dir = fresh_dir("tls-start");
    let ca = Ca::new("start CA");
    let good = ca.server(&[COMPANION_DNS]);
    let other = ca.server(&[COMPANION_DNS]);
    let expired = ca.leaf(
        &[COMPANION_DNS],
        pki::ExtendedKeyUsagePurpose::ServerAuth,
        -30,
        -1,
    );
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let cert = write("tls.crt", &good.cert_pem);
    let key = write("tls.key", &good.key_pem);
    let other_key = write("other.key", &other.key_pem);
    let expired_cert = write("expired.crt", &expired.cert_pem);
    let expired_key = write("expired.key", &expired.key_pem);
    let ca_file = write("ca.crt", &ca.pem);
    let empty = write("empty.pem", "");
    let missing = dir.join("missing.crt").display().to_string();
    let a = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    let cases: Vec<(Vec<String>, &str, &str, &str)> = vec![
        (
            a(&["--tls-cert", &missing, "--tls-key", &key]),
            "--tls-cert",
            &missing,
            "cannot read",
        ),
        (
            a(&["--tls-cert", &cert, "--tls-key", &dir.display().to_string()]),
            "--tls-key",
            "",
            "cannot read",
        ),
        (
            a(&["--tls-cert", &expired_cert, "--tls-key", &expired_key]),
            "--tls-cert",
            &expired_cert,
            "expired",
        ),
        (
            a(&["--tls-cert", &cert, "--tls-key", &other_key]),
            "--tls-key",
            &other_key,
            "does not match",
        ),
        (
            a(&["--tls-cert", &empty, "--tls-key", &key]),
            "--tls-cert",
            &empty,
            "no certificate",
        ),
        (
            a(&[
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
                "--client-ca",
                &empty,
            ]),
            "--client-ca",
            &empty,
            "no certificate",
        ),
    ];
    for (args, flag, file, why) in cases {
        let stderr = fails_to_start(&args);
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
        assert!(stderr.contains(file), "{args:?}: {stderr}");
        assert!(stderr.contains(why), "{args:?}: {stderr}");
    }
    // The good files start (the companion is still running after 1 s).
    let mut child = Command::new(companion_bin())
        .args(["eds", "--cluster", "backend=e2e/web:http", "--slices-dir"])
        .arg(&dir)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--metrics-listen", &format!("127.0.0.1:{}", free_port())])
        .args([
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--client-ca",
            &ca_file,
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    assert!(child.try_wait().unwrap().is_none(), "good files refused");
    let _ = child.kill();
    let _ = child.wait();
    // Flags that need others: clap says which.
    let out = Command::new(companion_bin())
        .args([
            "eds",
            "--listen",
            "127.0.0.1:1",
            "--cluster",
            "b=e2e/web:http",
        ])
        .args(["--client-ca", &ca_file])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-cert"));
}

#[test]
fn a_bad_file_on_reload_keeps_the_last_good_one_and_a_good_one_is_served_to_new_connections() {
    let mut m = Mtls::new("reload");
    let slices = SliceDir::create(&fresh_dir("tls-reload-slices"));
    slices.set_endpoints(SERVICE, &[]);
    let c = start_companion(&m, &slices);
    let addr = c.listen_addr();
    let served = || dial(addr, &m.ca.pem, COMPANION_DNS, Some(&m.envoy_cert), None);
    assert_eq!(served().server_cert(), m.companion_cert.der.as_slice());

    // A Secret update with a key that is not the certificate's.
    let renewed = m.ca.server(&[COMPANION_DNS]);
    let stray = m.ca.server(&[COMPANION_DNS]);
    m.companion.update(&[
        ("tls.crt", &renewed.cert_pem),
        ("tls.key", &stray.key_pem),
        ("ca.crt", &m.ca.pem),
    ]);
    wait_until("the bad reload counted", Duration::from_secs(15), || {
        c.metric("serving_picker_conditions_tls_reloads_total{result=\"error\"}") == Some(1.0)
    });
    assert_eq!(c.log_lines("do not load").len(), 1, "{}", c.log_text());
    assert_eq!(served().server_cert(), m.companion_cert.der.as_slice());

    // The right key: new connections get the renewed certificate.
    m.companion.update(&[
        ("tls.crt", &renewed.cert_pem),
        ("tls.key", &renewed.key_pem),
        ("ca.crt", &m.ca.pem),
    ]);
    wait_until(
        "the renewed certificate served",
        Duration::from_secs(15),
        || served().server_cert() == renewed.der.as_slice(),
    );
    assert_eq!(
        c.metric("serving_picker_conditions_tls_reloads_total{result=\"ok\"}"),
        Some(1.0)
    );
    // Still one error: the bad content is reported once, not at every poll.
    assert_eq!(
        c.metric("serving_picker_conditions_tls_reloads_total{result=\"error\"}"),
        Some(1.0)
    );
}

#[test]
fn a_plaintext_listener_off_loopback_is_warned_and_shown() {
    let slices = fresh_dir("tls-plain-slices");
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let log = slices.join("companion.log");
    let mut child = Command::new(companion_bin())
        .args(["eds", "--cluster", "backend=e2e/web:http", "--slices-dir"])
        .arg(&slices)
        .args(["--listen", &format!("0.0.0.0:{}", free_port())])
        .args(["--metrics-listen", &metrics.to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    let metric = || {
        let r = support::http::request(metrics, "GET", "/metrics", &[], Duration::from_secs(2));
        r.body
            .lines()
            .find_map(|l| l.strip_prefix("serving_picker_conditions_grpc_plaintext_exposed "))
            .map(str::to_string)
    };
    let start = Instant::now();
    while metric().is_none() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(metric().as_deref(), Some("1"));
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("plaintext on a non-loopback address"),
        "{text}"
    );

    // On loopback (the other tests' companions): 0, no warning.
    let m = Mtls::new("plain-loopback");
    let slices = SliceDir::create(&fresh_dir("tls-plain-loopback"));
    slices.set_endpoints(SERVICE, &[]);
    let c = Companion::start(slices.path(), &[(CLUSTER, SERVICE)], &[]);
    assert_eq!(
        c.metric("serving_picker_conditions_grpc_plaintext_exposed"),
        Some(0.0)
    );
    assert!(c.log_lines("plaintext on a non-loopback").is_empty());
    let t = start_companion(&m, &slices);
    assert_eq!(
        t.metric("serving_picker_conditions_grpc_plaintext_exposed"),
        Some(0.0)
    );
}

#[test]
fn rotation_under_load_loses_nothing_and_new_connections_get_the_new_certificate() {
    let a = Backend::start("A");
    let b = Backend::start("B");
    let mut m = Mtls::new("rotation");
    let slices = SliceDir::create(&fresh_dir("tls-rotation-slices"));
    slices.set_endpoints(SERVICE, &[Endpoint::serving(a.addr())]);
    let mut c = start_companion(&m, &slices);
    let envoy = EnvoyBuilder::new()
        .tag("companion-tls-rotation")
        .eds_cluster(CLUSTER, &[])
        .form(Form::Native)
        .bootstrap_hook(eds_from_companion(c.listen_addr(), XdsApi::Ads))
        .bootstrap_hook(m.envoy_hook())
        .start();
    expect_routing(&envoy, PATH, &[], "A over mTLS", served_by(&a));
    let addr = c.listen_addr();
    let load = Load::start(
        envoy.listen_addr(),
        LoadConfig {
            threads: 4,
            rate_per_thread: 100.0,
            path: PATH.into(),
            timeout: Duration::from_secs(5),
        },
        "A, first certificates",
    );
    std::thread::sleep(Duration::from_millis(500));

    // 1. Renewal (same CA), as cert-manager does before expiry.
    load.phase("companion certificate renewed");
    let renewed = m.ca.server(&[COMPANION_DNS, "localhost", "127.0.0.1"]);
    m.companion
        .update(&refs(&pki::companion_files(&renewed, &m.ca.pem)));
    wait_until(
        "new connections get the renewed certificate",
        Duration::from_secs(15),
        || {
            dial(addr, &m.ca.pem, COMPANION_DNS, Some(&m.envoy_cert), None).server_cert()
                == renewed.der.as_slice()
        },
    );
    // Envoy's stream (opened before) still carries changes.
    slices.set_endpoints(
        SERVICE,
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    settle(&envoy, PATH, &[], "B after the renewal", served_by(&b));

    // 2. A CA rotation: both sides trust old and new, then move to the new
    // CA's certificates, then drop the old CA.
    load.phase("CA rotation");
    let ca2 = Ca::new("rotated CA");
    let both = format!("{}{}", m.ca.pem, ca2.pem);
    m.companion
        .update(&refs(&pki::companion_files(&renewed, &both)));
    m.envoy
        .update(&refs(&pki::companion_files(&m.envoy_cert, &both)));
    let companion2 = ca2.server(&[COMPANION_DNS, "localhost", "127.0.0.1"]);
    let envoy2 = ca2.client(&[ENVOY_SPIFFE]);
    std::thread::sleep(Duration::from_millis(600));
    m.envoy.update(&refs(&pki::companion_files(&envoy2, &both)));
    m.companion
        .update(&refs(&pki::companion_files(&companion2, &both)));
    wait_until(
        "new connections get the new CA's certificate",
        Duration::from_secs(15),
        || {
            dial(addr, &both, COMPANION_DNS, Some(&envoy2), None).server_cert()
                == companion2.der.as_slice()
        },
    );
    std::thread::sleep(Duration::from_millis(600));
    m.envoy
        .update(&refs(&pki::companion_files(&envoy2, &ca2.pem)));
    m.companion
        .update(&refs(&pki::companion_files(&companion2, &ca2.pem)));
    wait_until(
        "the old CA's clients refused",
        Duration::from_secs(15),
        || dial(addr, &both, COMPANION_DNS, Some(&m.envoy_cert), None).is_refused(),
    );
    slices.set_endpoints(
        SERVICE,
        &[
            Endpoint::serving(a.addr()),
            Endpoint::terminating_not_serving(b.addr()),
        ],
    );
    settle(&envoy, PATH, &[], "A after the CA rotation", served_by(&a));

    // 3. Envoy's next connection: a companion restart makes one. Envoy
    // shows its new certificate, checks the companion's against the new CA,
    // and regains the state.
    load.phase("companion restarted after the rotation");
    let handshakes = c
        .metric("serving_picker_conditions_tls_handshakes_total")
        .unwrap_or(0.0);
    c.restart();
    wait_until(
        "Envoy reconnects over the new certificates",
        Duration::from_secs(30),
        || c.metric("serving_picker_conditions_xds_streams") == Some(1.0),
    );
    assert!(handshakes >= 1.0);
    slices.set_endpoints(
        SERVICE,
        &[
            Endpoint::serving_terminating(a.addr()),
            Endpoint::serving(b.addr()),
        ],
    );
    settle(&envoy, PATH, &[], "B after the reconnection", served_by(&b));
    std::thread::sleep(Duration::from_millis(300));
    let report = load.finish();
    report.assert_no_failures(
        "certificate rotation under load",
        "requests failed during the rotation",
    );
    // The restarted process refused nobody's identity: Envoy's reconnection went through.
    let refused = c.identity_refusals();
    assert!(
        refused.is_empty(),
        "refusals after the restart: {refused:?}"
    );
    assert!(report.requests() > 500, "{} requests", report.requests());
}

/// The SDS files the Envoys get in Kubernetes (deploy/conditions/envoy-sds.yaml)
/// are the ones these tests run Envoy with, for the Secret's mount path.
#[test]
fn the_shipped_sds_config_map_is_the_tested_one() {
    let path = support::repo_root().join("deploy/conditions/envoy-sds.yaml");
    let map: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let tested = pki::envoy_sds(
        std::path::Path::new("/etc/serving-picker/tls"),
        COMPANION_DNS,
    );
    for (name, text) in tested {
        assert_eq!(map["data"][name].as_str(), Some(text.as_str()), "{name}");
    }
}
