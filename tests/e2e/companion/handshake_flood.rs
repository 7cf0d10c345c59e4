//! Sockets that never finish a TLS handshake cannot lock out a client that
//! does (the real binary, mutual TLS as shipped):
//!
//! - 1,500 idle TCP connections (no byte sent) and 200 half-sent
//!   handshakes (a ClientHello cut short) are opened, twice in a row, as a
//!   client that reconnects at once would;
//! - meanwhile a good mTLS client is served (its handshake done, HTTP/2
//!   answered);
//! - the pending sockets stay within `--max-pending-handshakes`, the oldest
//!   dropped first (counted in `limit_hits_total` and by TLS refusal
//!   reason), none of them ever holds a `--max-connections` slot;
//! - once the flood is gone, the companion's descriptors and pending gauge
//!   are back where they were.
//!
//! Figures (time to serve the good client, descriptors and RSS before,
//! during, after) are printed with `--nocapture`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serving_picker_xds_load::probe::status_mb;
use support::companion::{Companion, SliceDir};
use support::envoy::fresh_dir;
use support::mtls::{dial, Dial, Mtls};
use support::pki::COMPANION_DNS;

const IDLE: usize = 1_500;
const HALF_SENT: usize = 200;
const MAX_PENDING: usize = 256;

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn metric(c: &Companion, name: &str) -> f64 {
    c.metric(name).unwrap_or(0.0)
}

/// A TLS record that announces a 512-byte ClientHello and carries 40 bytes
/// of it: the server waits for the rest.
fn half_client_hello() -> Vec<u8> {
    let mut b = vec![0x16, 0x03, 0x01, 0x02, 0x00];
    b.extend_from_slice(&[0x01, 0x00, 0x01, 0xfc, 0x03, 0x03]);
    b.extend((0..34u8).map(|i| i.wrapping_mul(7)));
    b
}

fn open_flood(addr: SocketAddr) -> Vec<TcpStream> {
    let mut socks = Vec::with_capacity(IDLE + HALF_SENT);
    for _ in 0..IDLE {
        socks.push(TcpStream::connect(addr).unwrap());
    }
    let hello = half_client_hello();
    for _ in 0..HALF_SENT {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&hello).unwrap();
        socks.push(s);
    }
    socks
}

fn wait_until(what: &str, deadline: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < deadline,
            "{what}: not within {deadline:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sockets_that_never_finish_a_handshake_do_not_lock_out_a_good_client() {
    let m = Mtls::new("handshake-flood");
    let slices = SliceDir::create(&fresh_dir("handshake-flood-slices"));
    slices.set_endpoints("web", &[]);
    let mut args = m.companion_args();
    args.extend(["--max-pending-handshakes".into(), MAX_PENDING.to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let c = Companion::start(slices.path(), &[("backend", "web")], &args);
    let addr = c.listen_addr();
    let pid = c.pid();
    let good = || dial(addr, &m.ca.pem, COMPANION_DNS, Some(&m.envoy_cert), None);

    assert!(matches!(good(), Dial::Accepted { .. }), "before the flood");
    assert_eq!(
        metric(
            &c,
            "serving_picker_conditions_limit{limit=\"max-pending-handshakes\"}"
        ),
        MAX_PENDING as f64
    );
    let fds_before = fds(pid);
    let rss_before = status_mb(pid, "VmRSS");

    let mut served_ms = Vec::new();
    let mut fds_during = 0;
    let mut rss_during: f64 = 0.0;
    for round in 1..=2 {
        let flood = open_flood(addr);
        // Every socket accepted: the newest MAX_PENDING are pending, the
        // rest dropped oldest first.
        let displaced = (round * (IDLE + HALF_SENT - MAX_PENDING)) as f64;
        wait_until("the flood accepted", Duration::from_secs(30), || {
            metric(
                &c,
                "serving_picker_conditions_limit_hits_total{limit=\"max-pending-handshakes\"}",
            ) >= displaced
        });
        let pending = metric(&c, "serving_picker_conditions_grpc_pending_handshakes");
        assert!(
            pending <= MAX_PENDING as f64,
            "{pending} pending handshakes over the bound"
        );
        assert_eq!(
            metric(&c, "serving_picker_conditions_grpc_connections"),
            0.0,
            "a socket without a handshake holds a --max-connections slot"
        );
        fds_during = fds_during.max(fds(pid));
        rss_during = rss_during.max(status_mb(pid, "VmRSS"));
        assert!(
            fds(pid) <= fds_before + MAX_PENDING + 16,
            "descriptors not bounded by --max-pending-handshakes: {} (before {fds_before})",
            fds(pid)
        );

        // The good client, with the flood still open.
        let start = Instant::now();
        let d = good();
        served_ms.push(start.elapsed().as_secs_f64() * 1e3);
        assert!(
            matches!(d, Dial::Accepted { .. }),
            "round {round}: good client not served during the flood: {d:?}"
        );
        drop(flood);
    }
    assert!(
        metric(
            &c,
            "serving_picker_conditions_tls_refusals_total{reason=\"displaced\"}"
        ) > 0.0,
        "dropped handshakes are counted by reason"
    );

    wait_until(
        "the pending gauge back at 0",
        Duration::from_secs(15),
        || metric(&c, "serving_picker_conditions_grpc_pending_handshakes") == 0.0,
    );
    wait_until("the descriptors back", Duration::from_secs(15), || {
        fds(pid) <= fds_before + 2
    });
    let fds_after = fds(pid);
    let rss_after = status_mb(pid, "VmRSS");
    assert!(matches!(good(), Dial::Accepted { .. }), "after the flood");
    println!(
        "handshake flood ({IDLE} idle + {HALF_SENT} half-sent, twice; --max-pending-handshakes {MAX_PENDING}): \
         good client served in {:.1} / {:.1} ms during the flood; \
         companion fds {fds_before} before / {fds_during} during / {fds_after} after; \
         RSS {rss_before:.1} / {rss_during:.1} / {rss_after:.1} MB",
        served_ms[0], served_ms[1]
    );
}
