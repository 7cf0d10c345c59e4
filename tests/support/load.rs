//! A steady load on loopback: N client threads, each with its own keep-alive
//! HTTP/1.1 connection to Envoy, paced to a fixed rate. Every request is
//! recorded (when it was sent, which backend answered, or why it failed) so
//! that a test can count requests, failures and backends per phase.
//!
//! A failure is anything but a complete 200: another status, a connection
//! error, a timeout, a response cut short. Nothing is retried by the client.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::BACKEND_HEADER;

#[derive(Clone, Debug)]
pub struct LoadConfig {
    pub threads: usize,
    /// Requests per second per thread; 0 = as fast as possible.
    pub rate_per_thread: f64,
    pub path: String,
    /// Read/write timeout of one request.
    pub timeout: Duration,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            threads: 8,
            rate_per_thread: 100.0,
            path: "/".into(),
            timeout: Duration::from_secs(5),
        }
    }
}

impl LoadConfig {
    /// `threads` clients on `path`, each paced to `rate_per_thread`
    /// requests/s (0: as fast as it can), 5 s per request at most.
    pub fn paced(threads: usize, rate_per_thread: f64, path: &str) -> LoadConfig {
        LoadConfig {
            threads,
            rate_per_thread,
            path: path.into(),
            ..LoadConfig::default()
        }
    }
}

/// One request.
#[derive(Clone, Debug)]
pub struct Record {
    /// When it was sent, from the start of the load.
    pub sent: Duration,
    /// How long it took.
    pub took: Duration,
    /// `Ok(backend)` for a 200 (the `x-backend` header, "?" if absent), else why not.
    pub outcome: Result<String, String>,
}

impl Record {
    pub fn failed(&self) -> bool {
        self.outcome.is_err()
    }

    pub fn backend(&self) -> Option<&str> {
        self.outcome.as_deref().ok()
    }
}

pub struct Load {
    started: Instant,
    stop: Arc<AtomicBool>,
    marks: Mutex<Vec<(String, Duration)>>,
    threads: Mutex<Vec<JoinHandle<Vec<Record>>>>,
}

impl Load {
    /// Starts the clients against `addr`; the first phase is named `first_phase`.
    pub fn start(addr: SocketAddr, config: LoadConfig, first_phase: &str) -> Load {
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for i in 0..config.threads {
            let stop = stop.clone();
            let config = config.clone();
            let h = std::thread::Builder::new()
                .name(format!("load-{i}"))
                .spawn(move || client_loop(addr, &config, started, &stop))
                .unwrap_or_else(|e| panic!("spawn load thread: {e}"));
            threads.push(h);
        }
        Load {
            started,
            stop,
            marks: Mutex::new(vec![(first_phase.to_string(), Duration::ZERO)]),
            threads: Mutex::new(threads),
        }
    }

    /// Time since the load started.
    pub fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// Starts a new phase now; returns its start time.
    pub fn phase(&self, name: &str) -> Duration {
        let t = self.now();
        self.marks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name.to_string(), t));
        t
    }

    /// Stops the clients (each finishes its request in flight) and returns
    /// every request and the phases.
    pub fn finish(self) -> LoadReport {
        let end = self.now();
        self.stop.store(true, Ordering::SeqCst);
        let handles = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        let mut records = Vec::new();
        for h in handles {
            match h.join() {
                Ok(rs) => records.extend(rs),
                Err(_) => panic!("a load thread panicked"),
            }
        }
        records.sort_by_key(|r| r.sent);
        let marks = std::mem::take(&mut *self.marks.lock().unwrap_or_else(|e| e.into_inner()));
        LoadReport {
            records,
            marks,
            end,
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Per phase: requests, failures, and who served them.
#[derive(Clone, Debug, Default)]
pub struct PhaseStats {
    pub name: String,
    pub start: Duration,
    pub end: Duration,
    pub requests: usize,
    pub failures: usize,
    pub by_backend: BTreeMap<String, usize>,
    /// Failure reasons and how often each was seen.
    pub failure_reasons: BTreeMap<String, usize>,
}

pub struct LoadReport {
    /// Sorted by `sent`.
    pub records: Vec<Record>,
    /// (phase name, start), in order.
    pub marks: Vec<(String, Duration)>,
    pub end: Duration,
}

fn stats_of<'a>(
    name: &str,
    start: Duration,
    end: Duration,
    rs: impl Iterator<Item = &'a Record>,
) -> PhaseStats {
    let mut s = PhaseStats {
        name: name.to_string(),
        start,
        end,
        ..PhaseStats::default()
    };
    for r in rs {
        s.requests += 1;
        match &r.outcome {
            Ok(b) => *s.by_backend.entry(b.clone()).or_insert(0) += 1,
            Err(why) => {
                s.failures += 1;
                *s.failure_reasons.entry(why.clone()).or_insert(0) += 1;
            }
        }
    }
    s
}

impl LoadReport {
    pub fn requests(&self) -> usize {
        self.records.len()
    }

    pub fn failures(&self) -> usize {
        self.records.iter().filter(|r| r.failed()).count()
    }

    /// Prints the phase table titled `title` and asserts that no request
    /// failed (`what` says when, the table follows).
    pub fn assert_no_failures(&self, title: &str, what: &str) {
        let table = self.phase_table(title);
        println!("{table}");
        assert_eq!(self.failures(), 0, "{what}\n{table}");
    }

    pub fn duration(&self) -> Duration {
        self.end
    }

    /// Requests per second over the whole load.
    pub fn rate(&self) -> f64 {
        self.records.len() as f64 / self.end.as_secs_f64().max(1e-9)
    }

    /// Start of the phase named `name`; panics if there is none.
    pub fn phase_start(&self, name: &str) -> Duration {
        self.marks
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| *t)
            .unwrap_or_else(|| panic!("no phase {name:?} in {:?}", self.marks))
    }

    /// Requests sent in [from, to).
    pub fn window(&self, from: Duration, to: Duration) -> impl Iterator<Item = &Record> + '_ {
        self.records
            .iter()
            .filter(move |r| r.sent >= from && r.sent < to)
    }

    /// Stats of the requests sent in [from, to).
    pub fn window_stats(&self, name: &str, from: Duration, to: Duration) -> PhaseStats {
        stats_of(name, from, to, self.window(from, to))
    }

    /// Requests sent in [from, to) that `backend` answered.
    pub fn served_by_in(&self, backend: &str, from: Duration, to: Duration) -> usize {
        self.window(from, to)
            .filter(|r| r.backend() == Some(backend))
            .count()
    }

    /// Requests sent in [from, to) and answered before `to` that `backend`
    /// answered: the ones routed inside the window for certain. A phase
    /// starts when its mark is taken and its endpoints are pushed just
    /// after, so a request sent just before the mark and still in flight
    /// may be routed by the next phase's endpoints.
    pub fn served_by_within(&self, backend: &str, from: Duration, to: Duration) -> usize {
        self.window(from, to)
            .filter(|r| r.sent + r.took < to && r.backend() == Some(backend))
            .count()
    }

    /// Stats per phase (a request belongs to the phase it was sent in).
    pub fn phases(&self) -> Vec<PhaseStats> {
        let mut out = Vec::new();
        for (i, (name, start)) in self.marks.iter().enumerate() {
            let end = self.marks.get(i + 1).map_or(self.end, |(_, t)| *t);
            out.push(self.window_stats(name, *start, end));
        }
        out
    }

    /// Stats over everything.
    pub fn total(&self, name: &str) -> PhaseStats {
        stats_of(name, Duration::ZERO, self.end, self.records.iter())
    }

    /// A per-phase table for --nocapture output.
    pub fn phase_table(&self, title: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "--- {title} ---");
        let _ = writeln!(
            out,
            "{:<52} {:>6} {:>8} {:>5}  served by / failures",
            "phase", "ms", "requests", "fail"
        );
        for p in self.phases() {
            let ms = (p.end - p.start).as_millis();
            let by: Vec<String> = p
                .by_backend
                .iter()
                .map(|(b, n)| format!("{b}={n}"))
                .collect();
            let mut why: Vec<String> = p
                .failure_reasons
                .iter()
                .map(|(w, n)| format!("{n}x {w}"))
                .collect();
            why.truncate(3);
            let _ = writeln!(
                out,
                "{:<52} {:>6} {:>8} {:>5}  {}{}",
                p.name,
                ms,
                p.requests,
                p.failures,
                by.join(" "),
                if why.is_empty() {
                    String::new()
                } else {
                    format!("  FAILURES: {}", why.join("; "))
                }
            );
        }
        let t = self.total("total");
        let _ = writeln!(
            out,
            "{:<52} {:>6} {:>8} {:>5}  {:.0} req/s",
            "total",
            self.end.as_millis(),
            t.requests,
            t.failures,
            self.rate()
        );
        out
    }
}

struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

fn connect(addr: SocketAddr, timeout: Duration) -> Result<Conn, String> {
    let s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {e}"))?;
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(timeout));
    let _ = s.set_write_timeout(Some(timeout));
    let writer = s.try_clone().map_err(|e| format!("clone: {e}"))?;
    Ok(Conn {
        reader: BufReader::new(s),
        writer,
    })
}

struct Answer {
    status: u16,
    backend: Option<String>,
    close: bool,
    summary: String,
}

fn read_answer(reader: &mut BufReader<TcpStream>) -> Result<Answer, String> {
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(0) => return Err("connection closed before the response".into()),
        Ok(_) => {}
        Err(e) => return Err(format!("read status line: {e}")),
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {line:?}"))?;
    let mut headers: Vec<(String, String)> = Vec::new();
    loop {
        let mut h = String::new();
        match reader.read_line(&mut h) {
            Ok(0) => return Err("connection closed in the headers".into()),
            Ok(_) => {}
            Err(e) => return Err(format!("read headers: {e}")),
        }
        let h = h.trim_end_matches(['\r', '\n']);
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if get("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        loop {
            let mut size_line = String::new();
            if reader
                .read_line(&mut size_line)
                .map_err(|e| e.to_string())?
                == 0
            {
                return Err("connection closed in a chunk".into());
            }
            let size = usize::from_str_radix(size_line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|e| format!("chunk size {size_line:?}: {e}"))?;
            let mut chunk = vec![0u8; size + 2];
            reader
                .read_exact(&mut chunk)
                .map_err(|e| format!("read chunk: {e}"))?;
            if size == 0 {
                break;
            }
            chunk.truncate(size);
            body.extend(chunk);
        }
    } else if let Some(len) = get("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body = vec![0u8; len];
        reader
            .read_exact(&mut body)
            .map_err(|e| format!("body cut short: {e}"))?;
    } else if status != 204 && status != 304 {
        return Err(format!("status {status} without content-length"));
    }
    let close = get("connection").is_some_and(|v| v.to_ascii_lowercase().contains("close"));
    let backend = get(BACKEND_HEADER);
    let summary = if status == 200 {
        String::new()
    } else {
        let text: String = String::from_utf8_lossy(&body).chars().take(70).collect();
        format!(
            "{status} from {} x-serving-picker={} body={:?}",
            backend.as_deref().unwrap_or("envoy"),
            get("x-serving-picker").unwrap_or_else(|| "-".into()),
            text.trim()
        )
    };
    Ok(Answer {
        status,
        backend,
        close,
        summary,
    })
}

fn client_loop(
    addr: SocketAddr,
    config: &LoadConfig,
    started: Instant,
    stop: &AtomicBool,
) -> Vec<Record> {
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: serving-picker-load\r\n\r\n",
        config.path
    );
    let interval = if config.rate_per_thread > 0.0 {
        Some(Duration::from_secs_f64(1.0 / config.rate_per_thread))
    } else {
        None
    };
    let mut records = Vec::with_capacity(8192);
    let mut conn: Option<Conn> = None;
    let mut next = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        if let Some(iv) = interval {
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            } else if now - next > Duration::from_millis(100) {
                next = now; // far behind: do not burst to catch up
            }
            next += iv;
        }
        let t0 = Instant::now();
        let sent = t0 - started;
        if conn.is_none() {
            match connect(addr, config.timeout) {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    records.push(Record {
                        sent,
                        took: t0.elapsed(),
                        outcome: Err(e),
                    });
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let result = c
            .writer
            .write_all(request.as_bytes())
            .map_err(|e| format!("write: {e}"))
            .and_then(|_| read_answer(&mut c.reader));
        let outcome = match result {
            Ok(a) => {
                if a.close {
                    conn = None;
                }
                if a.status == 200 {
                    Ok(a.backend.unwrap_or_else(|| "?".into()))
                } else {
                    Err(a.summary)
                }
            }
            Err(e) => {
                conn = None;
                Err(e)
            }
        };
        records.push(Record {
            sent,
            took: t0.elapsed(),
            outcome,
        });
    }
    records
}
