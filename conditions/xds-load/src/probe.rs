//! Reading a companion from outside, as its tests and benchmarks do: its
//! metrics port, and its process's figures in /proc.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// A loopback port free at this moment (0 when none can be had).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
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
}
