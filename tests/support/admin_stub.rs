//! A stand-in for Envoy's admin API between the filter and the real one:
//! point the `envoy_admin` cluster at it (`EnvoyBuilder::admin_cluster_port`),
//! then `set_upstream(envoy.admin_addr())`. While `Healthy` it relays every
//! request to the real admin port; on command it misbehaves.
//!
//! HTTP/1.1 with keep-alive (Envoy pools its connections to the admin cluster).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::http;

#[derive(Clone, Debug, PartialEq)]
pub enum Mode {
    /// Relay to the real admin API.
    Healthy,
    /// Wait this long, then relay (the filter's admin_timeout_ms is shorter).
    Slow(Duration),
    /// Answer this status with a short text body.
    Status(u16),
    /// 200 with the first half of the real answer (taken once per path when
    /// the mode is set, so every answer is the same cut).
    TruncatedJson,
    /// 200 with an HTML page.
    NotJson,
    /// 200 with a valid JSON document (`{"configs":[]}`, an empty snapshot)
    /// padded with spaces to this many bytes.
    Huge(usize),
    /// Announce a Content-Length, send half the body, close the connection.
    CutMidBody,
    /// Send the headers and half the real body at once, the rest after this
    /// long (a large dump streaming slower than admin_timeout_ms).
    SlowBody(Duration),
    /// Relay, but without the query's `name_regex` (an admin API that
    /// ignores it answers a narrowed question with every cluster).
    IgnoresNameRegex,
    /// Relay, but wait this long first for a whole config dump (not a
    /// narrowed one, not stats or `/clusters`): a big Envoy's full refresh.
    SlowFullDump(Duration),
}

impl Mode {
    pub fn name(&self) -> String {
        match self {
            Mode::Healthy => "healthy".into(),
            Mode::Slow(d) => format!("slow ({} ms)", d.as_millis()),
            Mode::Status(s) => format!("HTTP {s}"),
            Mode::TruncatedJson => "truncated JSON".into(),
            Mode::NotJson => "not JSON".into(),
            Mode::Huge(n) => format!("huge body ({n} bytes)"),
            Mode::CutMidBody => "connection cut mid-body".into(),
            Mode::SlowBody(d) => format!("slow body ({} ms)", d.as_millis()),
            Mode::IgnoresNameRegex => "ignoring name_regex".into(),
            Mode::SlowFullDump(d) => format!("slow full dump ({} ms)", d.as_millis()),
        }
    }
}

struct Inner {
    mode: Mutex<Mode>,
    upstream: Mutex<Option<SocketAddr>>,
    stopping: AtomicBool,
    requests: AtomicU64,
    misbehaved: AtomicU64,
    /// Truncated answers per path, fixed when TruncatedJson is set.
    cuts: Mutex<HashMap<String, Vec<u8>>>,
    conns: Mutex<Vec<TcpStream>>,
}

pub struct AdminStub {
    addr: SocketAddr,
    inner: Arc<Inner>,
}

impl AdminStub {
    /// Starts on a fresh loopback port, `Healthy`, with no upstream yet
    /// (answers 503 until `set_upstream`).
    pub fn start() -> AdminStub {
        let listener =
            TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("admin stub: bind: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("admin stub: local_addr: {e}"));
        let _ = listener.set_nonblocking(true);
        let inner = Arc::new(Inner {
            mode: Mutex::new(Mode::Healthy),
            upstream: Mutex::new(None),
            stopping: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            misbehaved: AtomicU64::new(0),
            cuts: Mutex::new(HashMap::new()),
            conns: Mutex::new(Vec::new()),
        });
        let acc = inner.clone();
        std::thread::Builder::new()
            .name("admin-stub".into())
            .spawn(move || accept_loop(listener, acc))
            .unwrap_or_else(|e| panic!("admin stub: spawn: {e}"));
        AdminStub { addr, inner }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn set_upstream(&self, admin: SocketAddr) {
        *self
            .inner
            .upstream
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(admin);
    }

    pub fn set_mode(&self, mode: Mode) {
        self.inner
            .cuts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        *self.inner.mode.lock().unwrap_or_else(|e| e.into_inner()) = mode;
    }

    pub fn mode(&self) -> Mode {
        self.inner
            .mode
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Requests received so far.
    pub fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::SeqCst)
    }

    /// Requests answered in a mode other than Healthy.
    pub fn misbehaved(&self) -> u64 {
        self.inner.misbehaved.load(Ordering::SeqCst)
    }
}

impl Drop for AdminStub {
    fn drop(&mut self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        for c in std::mem::take(&mut *self.inner.conns.lock().unwrap_or_else(|e| e.into_inner())) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(listener: TcpListener, inner: Arc<Inner>) {
    while !inner.stopping.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_nodelay(true);
                if let Ok(c) = stream.try_clone() {
                    inner
                        .conns
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(c);
                }
                let inner = inner.clone();
                let _ = std::thread::Builder::new()
                    .name("admin-stub-conn".into())
                    .spawn(move || serve(stream, &inner));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

fn respond(w: &mut TcpStream, status: u16, content_type: &str, body: &[u8]) -> bool {
    let head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    w.write_all(head.as_bytes()).is_ok() && w.write_all(body).is_ok() && w.flush().is_ok()
}

/// The real admin answer for `path`: (status, body).
fn relay(inner: &Inner, path: &str) -> (u16, Vec<u8>) {
    let upstream = *inner.upstream.lock().unwrap_or_else(|e| e.into_inner());
    match upstream {
        None => (503, b"admin stub: no upstream yet".to_vec()),
        Some(addr) => {
            let r = http::request(addr, "GET", path, &[], Duration::from_secs(5));
            if r.status == 0 {
                (502, format!("admin stub: {}", r.body).into_bytes())
            } else {
                (r.status, r.body.into_bytes())
            }
        }
    }
}

fn serve(stream: TcpStream, inner: &Inner) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.trim().is_empty() {
            continue;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
        loop {
            let mut h = String::new();
            match reader.read_line(&mut h) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if h.trim().is_empty() {
                break;
            }
        }
        inner.requests.fetch_add(1, Ordering::SeqCst);
        let mode = inner.mode.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let narrowed = path.contains("&name_regex=");
        if mode != Mode::Healthy && (mode != Mode::IgnoresNameRegex || narrowed) {
            inner.misbehaved.fetch_add(1, Ordering::SeqCst);
        }
        let ok = match mode {
            Mode::Healthy => {
                let (status, body) = relay(inner, &path);
                respond(&mut writer, status, "application/json", &body)
            }
            Mode::IgnoresNameRegex => {
                let whole = path.split("&name_regex=").next().unwrap_or(&path);
                let (status, body) = relay(inner, whole);
                respond(&mut writer, status, "application/json", &body)
            }
            Mode::SlowFullDump(d) => {
                if path.starts_with("/config_dump") && !narrowed {
                    std::thread::sleep(d);
                }
                let (status, body) = relay(inner, &path);
                respond(&mut writer, status, "application/json", &body)
            }
            Mode::Slow(d) => {
                std::thread::sleep(d);
                let (status, body) = relay(inner, &path);
                respond(&mut writer, status, "application/json", &body)
            }
            Mode::Status(s) => respond(
                &mut writer,
                s,
                "text/plain",
                b"admin stub: internal error\n",
            ),
            Mode::TruncatedJson => {
                let cut = {
                    let mut cuts = inner.cuts.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(c) = cuts.get(&path) {
                        c.clone()
                    } else {
                        let (_, mut body) = relay(inner, &path);
                        body.truncate(body.len() / 2);
                        cuts.insert(path.clone(), body.clone());
                        body
                    }
                };
                respond(&mut writer, 200, "application/json", &cut)
            }
            Mode::NotJson => respond(
                &mut writer,
                200,
                "text/html",
                b"<html><body><h1>502 Bad Gateway</h1></body></html>\n",
            ),
            Mode::Huge(n) => {
                let mut body = br#"{"configs":[]}"#.to_vec();
                body.resize(n.max(body.len()), b' ');
                respond(&mut writer, 200, "application/json", &body)
            }
            Mode::SlowBody(d) => {
                let (_, body) = relay(inner, &path);
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                let half = body.len() / 2;
                let _ = writer.write_all(head.as_bytes());
                let _ = writer.write_all(&body[..half]);
                let _ = writer.flush();
                std::thread::sleep(d);
                writer.write_all(&body[half..]).is_ok() && writer.flush().is_ok()
            }
            Mode::CutMidBody => {
                let (_, body) = relay(inner, &path);
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                let _ = writer.write_all(head.as_bytes());
                let _ = writer.write_all(&body[..body.len() / 2]);
                let _ = writer.flush();
                let _ = writer.shutdown(Shutdown::Both);
                return;
            }
        };
        if !ok {
            return;
        }
    }
}
