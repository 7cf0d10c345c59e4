//! A tiny HTTP/1.1 client: one request per connection (`Connection: close`),
//! headers sent exactly as given (the same name may appear several times).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Response {
    /// 0 when the request failed at the transport level (see `body`).
    pub status: u16,
    /// Header names lower-cased, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// Every value of header `name` (case-insensitive) among `headers`, whose
/// names are lower-case, in order.
pub fn values_of<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    let name = name.to_ascii_lowercase();
    headers
        .iter()
        .filter(|(k, _)| *k == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

impl Response {
    /// First value of a header (name is case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        values_of(&self.headers, name).into_iter().next()
    }

    /// Every value of a header.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        values_of(&self.headers, name)
    }

    /// One line for failure messages.
    pub fn summary(&self) -> String {
        let hs: Vec<String> = self
            .headers
            .iter()
            .filter(|(k, _)| {
                !matches!(
                    k.as_str(),
                    "date"
                        | "server"
                        | "content-type"
                        | "connection"
                        | "x-envoy-upstream-service-time"
                )
            })
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        let body: String = self.body.chars().take(200).collect();
        format!("status {} [{}] body {:?}", self.status, hs.join("; "), body)
    }

    fn transport_error(msg: String) -> Response {
        Response {
            status: 0,
            headers: Vec::new(),
            body: msg,
        }
    }
}

/// GET `path` from `addr`. Transport failures come back as status 0.
pub fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response {
    request(addr, "GET", path, headers, Duration::from_secs(10))
}

pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Response {
    let mut stream = match TcpStream::connect_timeout(&addr, timeout) {
        Ok(s) => s,
        Err(e) => return Response::transport_error(format!("connect {addr}: {e}")),
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    let _ = stream.set_nodelay(true);
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n");
    for (k, v) in headers {
        req.push_str(k);
        req.push_str(": ");
        req.push_str(v);
        req.push_str("\r\n");
    }
    req.push_str("Connection: close\r\n");
    if method == "POST" || method == "PUT" {
        req.push_str("Content-Length: 0\r\n");
    }
    req.push_str("\r\n");
    if let Err(e) = stream.write_all(req.as_bytes()) {
        return Response::transport_error(format!("write to {addr}: {e}"));
    }
    // Read until the response is complete by its own framing (Content-Length
    // or chunked), not until EOF: Envoy may hold a connection open after a
    // local reply even when the client asked to close.
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        if let Some(done) = complete_len(&raw, method == "HEAD") {
            raw.truncate(done);
            break;
        }
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) => {
                if raw.is_empty() {
                    return Response::transport_error(format!("read from {addr}: {e}"));
                }
                break;
            }
        }
    }
    match parse_response(&raw, method == "HEAD") {
        Ok(r) => r,
        Err(e) => Response::transport_error(format!(
            "bad response from {addr}: {e}: {:?}",
            String::from_utf8_lossy(&raw[..raw.len().min(300)])
        )),
    }
}

/// Length of the first complete response in `raw`, if it is complete and
/// framed by Content-Length or chunked encoding (None: read more, or to EOF).
fn complete_len(raw: &[u8], head_only: bool) -> Option<usize> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let status: u16 = head.split_whitespace().nth(1)?.parse().ok()?;
    if head_only || status == 204 || status == 304 || (100..200).contains(&status) {
        return Some(end);
    }
    let field = |name: &str| {
        head.split("\r\n")
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim() == name)
            .map(|(_, v)| v.trim().to_string())
    };
    if field("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        let body = &raw[end..];
        // Complete once the terminal zero-size chunk and its blank line arrived.
        let mut at = 0;
        loop {
            let eol = body[at..].windows(2).position(|w| w == b"\r\n")?;
            let size_s = String::from_utf8_lossy(&body[at..at + eol]).to_string();
            let size =
                usize::from_str_radix(size_s.split(';').next().unwrap_or("").trim(), 16).ok()?;
            at += eol + 2;
            if size == 0 {
                // trailers until an empty line
                loop {
                    let eol = body[at..].windows(2).position(|w| w == b"\r\n")?;
                    at += eol + 2;
                    if eol == 0 {
                        return Some(end + at);
                    }
                }
            }
            if body.len() < at + size + 2 {
                return None;
            }
            at += size + 2;
        }
    }
    let len: usize = field("content-length")?.parse().ok()?;
    if raw.len() >= end + len {
        Some(end + len)
    } else {
        None
    }
}

fn parse_response(raw: &[u8], head_only: bool) -> Result<Response, String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| "no end of headers".to_string())?;
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or("empty response")?;
    let mut parts = status_line.splitn(3, ' ');
    let _version = parts.next();
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut headers = Vec::new();
    for line in lines {
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let rest = &raw[end + 4..];
    let find = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let body_bytes: Vec<u8> = if head_only {
        Vec::new()
    } else if find("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    {
        dechunk(rest)?
    } else if let Some(len) = find("content-length").and_then(|v| v.parse::<usize>().ok()) {
        if rest.len() < len {
            return Err(format!("body cut short: {} of {len} bytes", rest.len()));
        }
        rest[..len].to_vec()
    } else {
        rest.to_vec()
    };
    Ok(Response {
        status,
        headers,
        body: String::from_utf8_lossy(&body_bytes).into_owned(),
    })
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("chunk size line cut short")?;
        let size_str = String::from_utf8_lossy(&data[..eol]);
        let size_str = size_str.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_str, 16)
            .map_err(|e| format!("chunk size {size_str:?}: {e}"))?;
        data = &data[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if data.len() < size + 2 {
            return Err("chunk cut short".into());
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}
