//! A real HTTP/1.1 backend on 127.0.0.1: thread per connection, keep-alive,
//! Content-Length responses. Answers 200 with body = its name, header
//! `x-backend: <name>` and `x-backend-saw-override: <values>` (the values of
//! the override header it received, "," joined, "-" if none). Records every
//! request's headers.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{OVERRIDE_HEADER, SAW_OVERRIDE_HEADER};

#[derive(Clone, Debug)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    /// Names lower-cased, in the order received (repeats kept).
    pub headers: Vec<(String, String)>,
}

impl RecordedRequest {
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        super::http::values_of(&self.headers, name)
    }
}

struct Inner {
    name: String,
    /// What every answer carries: the name, unless started with a body.
    body: String,
    stopping: AtomicBool,
    count: AtomicU64,
    requests: Mutex<Vec<RecordedRequest>>,
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_conn: AtomicU64,
}

impl Inner {
    /// Closes every open connection (the accept loop closes the listener).
    fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let conns = std::mem::take(&mut *self.conns.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, c) in conns {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

pub struct Backend {
    addr: SocketAddr,
    inner: Arc<Inner>,
    acceptor: Mutex<Option<JoinHandle<()>>>,
}

impl Backend {
    /// Starts a backend on a fresh loopback port.
    pub fn start(name: &str) -> Backend {
        Backend::start_at(name, SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// Starts a backend on `addr` (port 0: a fresh one; or the address of a
    /// stopped backend: a pod that comes back at the same IP:port).
    pub fn start_at(name: &str, addr: SocketAddr) -> Backend {
        Backend::start_answering(name, addr, name)
    }

    /// `start_at`, answering `body` instead of the name (the demo's
    /// backends end theirs with a newline, for a terminal).
    pub fn start_answering(name: &str, addr: SocketAddr, body: &str) -> Backend {
        let listener =
            TcpListener::bind(addr).unwrap_or_else(|e| panic!("backend {name}: bind {addr}: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("backend {name}: local_addr: {e}"));
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("backend {name}: set_nonblocking: {e}"));
        let inner = Arc::new(Inner {
            name: name.to_string(),
            body: body.to_string(),
            stopping: AtomicBool::new(false),
            count: AtomicU64::new(0),
            requests: Mutex::new(Vec::new()),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
        });
        let acc_inner = inner.clone();
        let acceptor = std::thread::Builder::new()
            .name(format!("backend-{name}"))
            .spawn(move || accept_loop(listener, acc_inner))
            .unwrap_or_else(|e| panic!("backend {name}: spawn: {e}"));
        Backend {
            addr,
            inner,
            acceptor: Mutex::new(Some(acceptor)),
        }
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests answered so far.
    pub fn count(&self) -> u64 {
        self.inner.count.load(Ordering::SeqCst)
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.inner
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Every value of `name` received, over all requests.
    pub fn header_values(&self, name: &str) -> Vec<String> {
        self.requests()
            .iter()
            .flat_map(|r| {
                r.header_all(name)
                    .into_iter()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Every value of the override header received, over all requests.
    pub fn override_values(&self) -> Vec<String> {
        self.header_values(OVERRIDE_HEADER)
    }

    /// Forgets the recorded requests and the count.
    pub fn reset(&self) {
        self.inner
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.inner.count.store(0, Ordering::SeqCst);
    }

    /// Models a pod's preStop then exit: keeps serving for `prestop`, then
    /// closes its listener and all its connections. Returns at once.
    pub fn begin_termination(&self, prestop: Duration) {
        let inner = self.inner.clone();
        let _ = std::thread::Builder::new()
            .name(format!("backend-{}-prestop", inner.name))
            .spawn(move || {
                std::thread::sleep(prestop);
                inner.stop();
            });
    }

    /// True once the backend has stopped accepting and closed its connections.
    pub fn is_stopped(&self) -> bool {
        self.inner.stopping.load(Ordering::SeqCst)
    }

    /// Closes the listener and all connections now; returns once the
    /// listening socket is closed.
    pub fn stop(&self) {
        self.inner.stop();
        let handle = self
            .acceptor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: TcpListener, inner: Arc<Inner>) {
    loop {
        if inner.stopping.load(Ordering::SeqCst) {
            break; // drops (closes) the listener
        }
        match listener.accept() {
            Ok((stream, _)) => {
                if inner.stopping.load(Ordering::SeqCst) {
                    let _ = stream.shutdown(Shutdown::Both);
                    break;
                }
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_nodelay(true);
                let id = inner.next_conn.fetch_add(1, Ordering::SeqCst);
                if let Ok(clone) = stream.try_clone() {
                    inner
                        .conns
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(id, clone);
                }
                // stop() may have run between the check above and the insert.
                if inner.stopping.load(Ordering::SeqCst) {
                    let _ = stream.shutdown(Shutdown::Both);
                    continue;
                }
                let conn_inner = inner.clone();
                let _ = std::thread::Builder::new()
                    .name(format!("backend-{}-conn", inner.name))
                    .spawn(move || {
                        serve_connection(stream, &conn_inner);
                        conn_inner
                            .conns
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&id);
                    });
            }
            Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

fn serve_connection(stream: TcpStream, inner: &Inner) {
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = BufReader::new(stream);
    loop {
        // Request line (skip stray empty lines between requests).
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if !line.trim().is_empty() {
                break;
            }
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("").to_string();
        let version = parts.next().unwrap_or("HTTP/1.1").to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            match reader.read_line(&mut h) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let h = h.trim_end_matches(['\r', '\n']);
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let get = |n: &str| {
            headers
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.to_ascii_lowercase())
        };
        let chunked = get("transfer-encoding").is_some_and(|v| v.contains("chunked"));
        if chunked {
            if !skip_chunked(&mut reader) {
                return;
            }
        } else if let Some(len) = get("content-length").and_then(|v| v.parse::<u64>().ok()) {
            let mut sink = Vec::new();
            if (&mut reader).take(len).read_to_end(&mut sink).is_err() {
                return;
            }
        }
        if inner.stopping.load(Ordering::SeqCst) {
            return;
        }
        let close = match get("connection") {
            Some(c) if c.contains("close") => true,
            Some(c) if c.contains("keep-alive") => false,
            _ => version == "HTTP/1.0",
        };
        let saw: Vec<&str> = headers
            .iter()
            .filter(|(k, _)| k == OVERRIDE_HEADER)
            .map(|(_, v)| v.as_str())
            .collect();
        let saw = if saw.is_empty() {
            "-".to_string()
        } else {
            saw.join(",")
        };
        let body = inner.body.as_bytes();
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nx-backend: {}\r\n{}: {}\r\n{}\r\n",
            body.len(),
            inner.name,
            SAW_OVERRIDE_HEADER,
            saw,
            if close { "Connection: close\r\n" } else { "" }
        );
        inner
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(RecordedRequest {
                method,
                path,
                headers: headers.clone(),
            });
        inner.count.fetch_add(1, Ordering::SeqCst);
        if writer.write_all(resp.as_bytes()).is_err() || writer.write_all(body).is_err() {
            return;
        }
        let _ = writer.flush();
        if close {
            let _ = writer.shutdown(Shutdown::Both);
            return;
        }
    }
}

fn skip_chunked<R: BufRead>(reader: &mut R) -> bool {
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return false;
        }
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or("").trim(), 16)
            .unwrap_or(0);
        if size == 0 {
            // trailers until empty line
            loop {
                let mut t = String::new();
                if reader.read_line(&mut t).unwrap_or(0) == 0 {
                    return false;
                }
                if t.trim().is_empty() {
                    return true;
                }
            }
        }
        let mut buf = vec![0u8; size + 2];
        if reader.read_exact(&mut buf).is_err() {
            return false;
        }
    }
}
