//! Reading a companion from outside, as its tests and benchmarks do: its
//! metrics port, and its process's figures in /proc.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where [`free_port`] takes its ports: below Linux's ephemeral range
/// (32768-60999), where every outgoing connection of every test running
/// beside this one takes its local port and could take a port between the
/// check here and the child's bind; and below the harness's ports for Envoy
/// (30000-39999, tests/support/ports.rs).
const PORTS: std::ops::RangeInclusive<u16> = 20000..=29999;

/// The next port [`free_port`] tries in this process.
static NEXT: Mutex<Option<u16>> = Mutex::new(None);

/// A loopback port free at this moment (0 when none can be had), for a
/// process this one starts to bind: taken in turn from a start that is
/// random per process, so that tests running side by side rarely try the
/// same one.
pub fn free_port() -> u16 {
    let (low, high) = (*PORTS.start(), *PORTS.end());
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    let mut port = next.unwrap_or_else(|| {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::from(d.subsec_nanos()) ^ d.as_secs())
            .unwrap_or(0)
            ^ u64::from(std::process::id()).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        low + (seed.wrapping_mul(6_364_136_223_846_793_005) >> 33) as u16 % (high - low + 1)
    });
    for _ in PORTS {
        let candidate = port;
        port = if port >= high { low } else { port + 1 };
        if TcpListener::bind(("127.0.0.1", candidate)).is_ok() {
            *next = Some(port);
            return candidate;
        }
    }
    0
}

/// `GET path` (HTTP/1.1, Connection: close): the whole answer, status
/// line first; empty when it cannot connect.
pub fn http_get(addr: SocketAddr, path: &str) -> String {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// A metric's value in a Prometheus text exposition: summed over its label
/// sets, unless `name` carries labels (`name{a="b"}`, matched exactly).
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(k, _)| *k == name || (!name.contains('{') && k.split('{').next() == Some(name)))
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}

/// A `/proc/<pid>/status` figure given in kB (`VmRSS`, `VmHWM`...), in MB;
/// 0 when the process or the field is gone.
pub fn status_mb(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.split(':').next() == Some(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// A process's (user, system) CPU time in seconds, from `/proc/<pid>/stat`
/// (`pid` may be `self`); zeros when it is gone.
pub fn cpu_split(pid: &str) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, a)| a).unwrap_or("");
    let fields: Vec<f64> = after
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // After the command: state is field 3, utime 14 and stime 15 (1-based).
    let tick = 100.0;
    (
        fields.get(11).copied().unwrap_or(0.0) / tick,
        fields.get(12).copied().unwrap_or(0.0) / tick,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_summed_over_label_sets_unless_named_with_labels() {
        let text = "# HELP x_total x\nx_total{a=\"1\"} 2\nx_total{a=\"2\"} 3\nx_totals 100\ny 7\n";
        assert_eq!(metric(text, "x_total"), 5.0);
        assert_eq!(metric(text, "x_total{a=\"2\"}"), 3.0);
        assert_eq!(metric(text, "y"), 7.0);
        assert_eq!(metric(text, "z"), 0.0);
    }

    #[test]
    fn this_process_has_memory_and_cpu_figures() {
        assert!(status_mb(std::process::id(), "VmRSS") > 0.0);
        assert_eq!(status_mb(std::process::id(), "NoSuchField"), 0.0);
        let (user, system) = cpu_split("self");
        assert!(user >= 0.0 && system >= 0.0);
    }

    #[test]
    fn ports_come_in_turn_from_below_the_ephemeral_range() {
        let (a, b) = (free_port(), free_port());
        assert!(PORTS.contains(&a) && PORTS.contains(&b), "{a} {b}");
        assert_ne!(a, b);
    }
}
