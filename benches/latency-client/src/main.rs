//! Interleaved latency client for `make bench-e2e` (the "interleaved c1" phase).
//!
//! Several front Envoys run side by side, one per config. This client keeps one keep-alive
//! connection to each and sends one request at a time, visiting the fronts in turn (the starting
//! front rotates every lap so that none always goes first). The machine's drift, which between
//! separate runs is larger than the filter's cost, then hits every front alike: the laps are a
//! millisecond apart. Each lap gives one paired difference per front against the baseline front;
//! their median, with a 95% confidence interval from order statistics, is the added latency.
//!
//! Usage: latency_client WARMUP_LAPS LAPS NAME=HOST:PORT[|HEADER: VALUE...]... (the first is the
//! baseline; with headers, each request to that front carries the next one in turn)
//! Output: one line per front, tab-separated:
//!   name n p50_us p90_us p99_us mean_us diff_median_us diff_lo_us diff_hi_us errors

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::time::Instant;

struct Front {
    name: String,
    address: String,
    stream: TcpStream,
    /// The request bytes, one per header given (or one without), sent in turn.
    requests: Vec<Vec<u8>>,
    next: usize,
    buffer: Vec<u8>,
    errors: u64,
}

impl Front {
    fn connect(name: &str, address: &str, headers: &[&str]) -> std::io::Result<Front> {
        let stream = TcpStream::connect(address)?;
        stream.set_nodelay(true)?;
        let request = |extra: &str| {
            format!(
                "GET / HTTP/1.1\r\nHost: {address}\r\nUser-Agent: latency-client\r\n{extra}\r\n"
            )
            .into_bytes()
        };
        let requests = if headers.is_empty() {
            vec![request("")]
        } else {
            headers
                .iter()
                .map(|h| request(&format!("{h}\r\n")))
                .collect()
        };
        Ok(Front {
            name: name.to_string(),
            address: address.to_string(),
            stream,
            requests,
            next: 0,
            buffer: vec![0; 64 * 1024],
            errors: 0,
        })
    }

    /// One request and its whole response; the time in nanoseconds, or None on an error or a
    /// status other than 200 (the connection is then opened again).
    fn round_trip(&mut self) -> Option<u64> {
        let start = Instant::now();
        let ok = self.exchange().unwrap_or(false);
        let elapsed = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        if ok {
            return Some(elapsed);
        }
        self.errors += 1;
        if let Ok(again) = TcpStream::connect(&self.address) {
            let _ = again.set_nodelay(true);
            self.stream = again;
        }
        None
    }

    fn exchange(&mut self) -> std::io::Result<bool> {
        let request = &self.requests[self.next % self.requests.len()];
        self.next += 1;
        self.stream.write_all(request)?;
        let mut filled = 0;
        loop {
            let n = self.stream.read(&mut self.buffer[filled..])?;
            if n == 0 {
                return Ok(false);
            }
            filled += n;
            let Some(end) = find(&self.buffer[..filled], b"\r\n\r\n") else {
                if filled == self.buffer.len() {
                    return Ok(false);
                }
                continue;
            };
            let head = &self.buffer[..end];
            let status_ok = head.starts_with(b"HTTP/1.1 200");
            let Some(length) = content_length(head) else {
                return Ok(false);
            };
            let total = end + 4 + length;
            if total > self.buffer.len() {
                return Ok(false);
            }
            while filled < total {
                let n = self.stream.read(&mut self.buffer[filled..total])?;
                if n == 0 {
                    return Ok(false);
                }
                filled += n;
            }
            return Ok(status_ok);
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn content_length(head: &[u8]) -> Option<usize> {
    let text = std::str::from_utf8(head).ok()?;
    text.split("\r\n").find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

/// The value at quantile q (0..1) of sorted values.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let at = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

/// Median of values and its 95% confidence interval (order statistics: the ranks n/2 ± 0.98√n).
fn median_with_interval(values: &mut [f64]) -> (f64, f64, f64) {
    if values.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    values.sort_by(f64::total_cmp);
    let n = values.len() as f64;
    let half_width = 0.98 * n.sqrt();
    let lo = ((n / 2.0 - half_width).floor().max(0.0)) as usize;
    let hi = ((n / 2.0 + half_width).ceil() as usize).min(values.len() - 1);
    (quantile(values, 0.5), values[lo], values[hi])
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(warmup), Some(laps)) = (
        args.first().and_then(|a| a.parse::<usize>().ok()),
        args.get(1).and_then(|a| a.parse::<usize>().ok()),
    ) else {
        eprintln!("usage: latency_client WARMUP_LAPS LAPS NAME=HOST:PORT...");
        return ExitCode::from(2);
    };
    let mut fronts = Vec::new();
    for spec in &args[2..] {
        let Some((name, address)) = spec.split_once('=') else {
            eprintln!("latency_client: '{spec}' is not NAME=HOST:PORT");
            return ExitCode::from(2);
        };
        let mut parts = address.split('|');
        let address = parts.next().unwrap_or_default();
        let headers: Vec<&str> = parts.collect();
        match Front::connect(name, address, &headers) {
            Ok(f) => fronts.push(f),
            Err(e) => {
                eprintln!("latency_client: cannot connect to {name} at {address}: {e}");
                return ExitCode::from(1);
            }
        }
    }
    if fronts.len() < 2 {
        eprintln!("latency_client: give at least two fronts (the first is the baseline)");
        return ExitCode::from(2);
    }
    let count = fronts.len();
    // samples[f][lap]: microseconds, NaN when that request failed.
    let mut samples = vec![Vec::with_capacity(laps); count];
    for lap in 0..warmup + laps {
        let mut this_lap = vec![f64::NAN; count];
        for k in 0..count {
            let f = (lap + k) % count;
            if let Some(ns) = fronts[f].round_trip() {
                this_lap[f] = ns as f64 / 1000.0;
            }
        }
        if lap >= warmup {
            for (f, v) in this_lap.into_iter().enumerate() {
                samples[f].push(v);
            }
        }
    }
    for f in 0..count {
        let mut own: Vec<f64> = samples[f]
            .iter()
            .copied()
            .filter(|v| v.is_finite())
            .collect();
        own.sort_by(f64::total_cmp);
        let mean = own.iter().sum::<f64>() / own.len().max(1) as f64;
        let mut diffs: Vec<f64> = samples[f]
            .iter()
            .zip(&samples[0])
            .map(|(a, b)| a - b)
            .filter(|d| d.is_finite())
            .collect();
        let (d, lo, hi) = median_with_interval(&mut diffs);
        println!(
            "{}\t{}\t{:.1}\t{:.1}\t{:.1}\t{:.1}\t{:+.1}\t{:+.1}\t{:+.1}\t{}",
            fronts[f].name,
            own.len(),
            quantile(&own, 0.5),
            quantile(&own, 0.9),
            quantile(&own, 0.99),
            mean,
            d,
            lo,
            hi,
            fronts[f].errors
        );
    }
    if fronts.iter().any(|f| f.errors > 0) {
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
