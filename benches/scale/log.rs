//! The filter's debug log as the benchmark reads it: refresh lines (with
//! the epoch in milliseconds, `LOG_FORMAT`), publishes, full refreshes and
//! their reasons, leader changes, warnings. Read from the file only, so that
//! a measured window holds no admin call.

use crate::fail;
use regex::Regex;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct Refresh {
    pub ms: i64,
    pub vm_us: i64,
    pub e2e_ms: i64,
    pub admin_bytes: i64,
    pub narrowed: bool,
    pub published: bool,
}

#[derive(Clone, Debug, Default)]
pub struct LogScan {
    pub refreshes: Vec<Refresh>,
    pub leaders: Vec<String>,
    pub warnings: Vec<String>,
    /// The start of each full refresh and the change gate's reason.
    pub fulls: Vec<(i64, String)>,
}

impl LogScan {
    pub fn published(&self) -> Vec<&Refresh> {
        self.refreshes.iter().filter(|r| r.published).collect()
    }
}

pub struct Patterns {
    pub refresh: Regex,
    pub leader: Regex,
    pub full: Regex,
}

impl Patterns {
    pub fn new() -> Patterns {
        let re = |p: &str| Regex::new(p).unwrap_or_else(|e| fail(e));
        Patterns {
            refresh: re(
                r"^\[(\d+)\]\[(\d+)\].*serving_picker: refresh: (\d+) clusters, (\d+) admin bytes, (\d+) us in the VM, (\d+) ms end to end(?:, narrowed to (\d+) changed clusters)?",
            ),
            leader: re(r"^\[\d+\]\[(\d+)\].*serving_picker: context (\w+) is now the admin poller"),
            full: re(r"^\[(\d+)\].*serving_picker: (?:full )?refresh \((\w+)\)"),
        }
    }

    /// Refresh lines, leader changes and warnings from byte `offset` on.
    pub fn scan(&self, log: &Path, offset: u64) -> LogScan {
        let mut s = LogScan::default();
        let mut pub_ms: Option<i64> = None;
        for line in read_from(log, offset).lines() {
            let num = |c: Option<regex::Match>| c.and_then(|m| m.as_str().parse::<i64>().ok());
            if let Some(m) = self.refresh.captures(line) {
                let ms = num(m.get(1)).unwrap_or(0);
                // The publish line comes just before the refresh line: the same callback.
                let published = pub_ms.is_some_and(|p| (0..=100).contains(&(ms - p)));
                s.refreshes.push(Refresh {
                    ms,
                    admin_bytes: num(m.get(4)).unwrap_or(0),
                    vm_us: num(m.get(5)).unwrap_or(0),
                    e2e_ms: num(m.get(6)).unwrap_or(0),
                    narrowed: m.get(7).is_some(),
                    published,
                });
                pub_ms = None;
                continue;
            }
            if line.starts_with('[') && line.contains("serving_picker: published snapshot") {
                let ms = line[1..]
                    .split(']')
                    .next()
                    .and_then(|v| v.parse::<i64>().ok())
                    .unwrap_or(0);
                match s.refreshes.last_mut() {
                    Some(last) if !last.published && (0..=100).contains(&(ms - last.ms)) => {
                        last.published = true
                    }
                    _ => pub_ms = Some(ms),
                }
                continue;
            }
            if let Some(m) = self.full.captures(line) {
                s.fulls.push((num(m.get(1)).unwrap_or(0), m[2].to_string()));
                continue;
            }
            if let Some(m) = self.leader.captures(line) {
                s.leaders.push(m[1].to_string());
            }
            let bad = ["][warning]", "][error]", "][critical]"]
                .iter()
                .any(|l| line.contains(l));
            if bad && line.contains("serving_picker") {
                s.warnings.push(line.chars().take(400).collect());
            }
        }
        s
    }

    /// Waits for a refresh line (or, `periodic`, the start of a periodic full
    /// refresh) logged at or after `since` ms, from byte `offset` on: no admin
    /// call, so no work for Envoy's main thread.
    pub fn wait(
        &self,
        log: &Path,
        offset: u64,
        since: i64,
        timeout_s: u64,
        periodic: bool,
    ) -> Option<i64> {
        let deadline = Instant::now() + Duration::from_secs(timeout_s);
        let mut pos = offset;
        let mut partial = String::new();
        loop {
            let chunk = read_from(log, pos);
            pos += chunk.len() as u64;
            partial.push_str(&chunk);
            while let Some(nl) = partial.find('\n') {
                let line: String = partial.drain(..=nl).collect();
                let found = if periodic {
                    self.full
                        .captures(&line)
                        .filter(|m| &m[2] == "Periodic")
                        .and_then(|m| m[1].parse::<i64>().ok())
                } else {
                    self.refresh
                        .captures(&line)
                        .and_then(|m| m[1].parse::<i64>().ok())
                };
                if let Some(ms) = found.filter(|ms| *ms >= since) {
                    return Some(ms);
                }
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

pub fn read_from(path: &Path, offset: u64) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        if f.seek(SeekFrom::Start(offset)).is_ok() {
            let mut bytes = Vec::new();
            let _ = f.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
    }
    text
}

pub fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}
