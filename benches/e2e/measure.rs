//! One measured run: wrk against a front Envoy, its figures (req/s,
//! latency, the front's CPU per request, what else used the machine) and
//! Envoy's own request counts over the window.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serving_picker_benches::Pinning;
use support::cpu;
use support::process::Process;

use crate::{fail, Knobs, FRONT_ADMIN, FRONT_PORT};

/// What a wrk run printed.
pub struct Wrk {
    pub rps: String,
    pub p50_us: f64,
    pub p99_us: f64,
    pub requests: u64,
    pub non2xx: u64,
    pub socket_errors: u64,
}

/// A wrk time ("85.00us", "1.23ms") in microseconds; NaN when unreadable
/// rather than a wrong number.
pub fn to_us(v: &str) -> f64 {
    let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let Ok(n) = digits.parse::<f64>() else {
        return f64::NAN;
    };
    let f = match &v[digits.len()..] {
        "us" => 1.0,
        "ms" => 1e3,
        "s" => 1e6,
        "m" => 6e7,
        "h" => 3.6e9,
        _ => return f64::NAN,
    };
    // As printed with one decimal.
    (n * f * 10.0).round() / 10.0
}

pub fn parse_wrk(out: &str) -> Option<Wrk> {
    let mut w = Wrk {
        rps: String::new(),
        p50_us: f64::NAN,
        p99_us: f64::NAN,
        requests: 0,
        non2xx: 0,
        socket_errors: 0,
    };
    let mut seen_requests = false;
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["Requests/sec:", v, ..] => w.rps = v.to_string(),
            ["50%", v, ..] => w.p50_us = to_us(v),
            ["99%", v, ..] => w.p99_us = to_us(v),
            [n, "requests", "in", ..] => {
                w.requests = n.parse().ok()?;
                seen_requests = true;
            }
            _ if line.contains("Non-2xx or 3xx responses:") => {
                w.non2xx = f.last().and_then(|v| v.parse().ok()).unwrap_or(0)
            }
            _ if line.contains("Socket errors:") => {
                w.socket_errors = f
                    .iter()
                    .skip(3)
                    .step_by(2)
                    .filter_map(|x| x.trim_end_matches(',').parse::<u64>().ok())
                    .sum()
            }
            _ => {}
        }
    }
    (seen_requests && !w.rps.is_empty()).then_some(w)
}

/// Runs wrk (pinned) with `args` against `url`, its output into `out`.
pub fn run_wrk(pin: &[String], args: &[String], url: &str, out: &Path) -> std::process::Child {
    let file = std::fs::File::create(out)
        .unwrap_or_else(|e| fail(format!("create {}: {e}", out.display())));
    let err = file.try_clone().unwrap_or_else(|e| fail(e));
    let mut cmd = match pin.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg("wrk");
            c
        }
        None => Command::new("wrk"),
    };
    cmd.args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::from(file))
        .stderr(Stdio::from(err))
        .spawn()
        .unwrap_or_else(|e| fail(format!("run wrk: {e}")))
}

pub fn read_wrk(out: &Path) -> Wrk {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    parse_wrk(&text).unwrap_or_else(|| {
        fail(format!(
            "could not parse wrk output {}\n{text}",
            out.display()
        ))
    })
}

pub fn admin_get(port: u16, path: &str) -> String {
    let r = support::http::request(
        SocketAddr::from(([127, 0, 0, 1], port)),
        "GET",
        path,
        &[],
        Duration::from_secs(2),
    );
    if r.status == 200 {
        r.body
    } else {
        String::new()
    }
}

/// One stat's value (None when absent).
pub fn stat_value(port: u16, name: &str) -> Option<i64> {
    let body = admin_get(port, &format!("/stats?filter=%5E{name}%24"));
    body.lines().find_map(|l| {
        l.split_once(": ")
            .filter(|(k, _)| *k == name)
            .and_then(|(_, v)| v.trim().parse().ok())
    })
}

/// One measured run, as a line of raw.tsv / raw-latency.tsv.
#[derive(Clone, Debug)]
pub struct Run {
    pub config: String,
    pub round: usize,
    pub rps: String,
    pub p50: f64,
    pub p99: f64,
    pub cpu_us_req: f64,
    pub requests: u64,
    pub non2xx: u64,
    pub socket_errors: u64,
    pub envoy_rq: i64,
    pub envoy_ok: i64,
    pub front_pct: f64,
    pub backend_pct: f64,
    pub wrk_pct: f64,
    pub other_pct: f64,
    pub noisy: bool,
}

impl Run {
    pub fn rps(&self) -> f64 {
        self.rps.parse().unwrap_or(f64::NAN)
    }

    /// A column of the raw files, by its awk number (3 req/s, 4 p50, 5 p99, 6 cpu).
    pub fn column(&self, col: usize) -> f64 {
        match col {
            3 => self.rps(),
            4 => self.p50,
            5 => self.p99,
            _ => self.cpu_us_req,
        }
    }

    pub fn tsv(&self) -> String {
        format!(
            "{}\t{}\t{}\t{:.1}\t{:.1}\t{:.2}\t{}\t{}\t{}\t{}\t{}\t{:.0}%\t{:.0}%\t{:.0}%\t{:.0}%\t{}\n",
            self.config,
            self.round,
            self.rps,
            self.p50,
            self.p99,
            self.cpu_us_req,
            self.requests,
            self.non2xx,
            self.socket_errors,
            self.envoy_rq,
            self.envoy_ok,
            self.front_pct,
            self.backend_pct,
            self.wrk_pct,
            self.other_pct,
            u8::from(self.noisy)
        )
    }

    /// Errors that make a run's figures meaningless.
    pub fn errors(&self) -> i64 {
        (self.non2xx + self.socket_errors) as i64 + (self.envoy_rq - self.envoy_ok)
    }
}

pub const ROW_HEAD: [&str; 12] = [
    "config",
    "round",
    "load",
    "req/s",
    "p50 us",
    "p99 us",
    "cpu us/req",
    "front",
    "backend",
    "wrk",
    "other",
    "non2xx",
];

pub fn row(cells: &[String]) -> String {
    format!(
        "{:<16} {:>5} {:>4} {:>10} {:>9} {:>9} {:>11} {:>6} {:>8} {:>5} {:>6} {:>7}",
        cells[0],
        cells[1],
        cells[2],
        cells[3],
        cells[4],
        cells[5],
        cells[6],
        cells[7],
        cells[8],
        cells[9],
        cells[10],
        cells[11]
    )
}

/// The bench's state: knobs, pinning, clock, the backend.
pub struct Bench {
    pub k: Knobs,
    pub pin: Pinning,
    pub hz: f64,
    pub backend_pid: u32,
}

impl Bench {
    /// One measured wrk run against the running front Envoy `front`.
    #[allow(clippy::too_many_arguments)]
    pub fn measure(
        &self,
        c: &str,
        round: usize,
        load: &str,
        front: &mut Process,
        out: &Path,
        wrk_args: &[String],
    ) -> Run {
        let rq0 = stat_value(FRONT_ADMIN, "http.ingress.downstream_rq_completed").unwrap_or(0);
        let ok0 = stat_value(FRONT_ADMIN, "http.ingress.downstream_rq_2xx").unwrap_or(0);
        let t0 = cpu::process_ticks(front.pid());
        let b0 = cpu::process_ticks(self.backend_pid);
        let k0 = cpu::children_ticks();
        let m0 = cpu::machine_busy_ticks();
        let w0 = Instant::now();
        let url = format!("http://127.0.0.1:{FRONT_PORT}/");
        let _ = run_wrk(&self.pin.others, wrk_args, &url, out).wait();
        if !front.is_running() {
            fail(format!(
                "{c}: front Envoy died during the {load} run\n{}",
                front.tail(30)
            ));
        }
        let t1 = cpu::process_ticks(front.pid());
        let b1 = cpu::process_ticks(self.backend_pid);
        let k1 = cpu::children_ticks();
        let m1 = cpu::machine_busy_ticks();
        let secs = w0.elapsed().as_secs_f64();
        let rq1 = stat_value(FRONT_ADMIN, "http.ingress.downstream_rq_completed").unwrap_or(0);
        let ok1 = stat_value(FRONT_ADMIN, "http.ingress.downstream_rq_2xx").unwrap_or(0);
        let w = read_wrk(out);
        let pct = |ticks: u64| 100.0 * ticks as f64 / self.hz / secs;
        let front_t = t1.saturating_sub(t0);
        let backend_t = b1.saturating_sub(b0);
        let wrk_t = k1.saturating_sub(k0);
        let other_t = m1
            .saturating_sub(m0)
            .saturating_sub(front_t + backend_t + wrk_t);
        let other_pct = pct(other_t);
        let run = Run {
            config: c.to_string(),
            round,
            rps: w.rps.clone(),
            p50: w.p50_us,
            p99: w.p99_us,
            cpu_us_req: if w.requests > 0 {
                front_t as f64 * 1e6 / self.hz / w.requests as f64
            } else {
                0.0
            },
            requests: w.requests,
            non2xx: w.non2xx,
            socket_errors: w.socket_errors,
            envoy_rq: rq1 - rq0,
            envoy_ok: ok1 - ok0,
            front_pct: pct(front_t),
            backend_pct: pct(backend_t),
            wrk_pct: pct(wrk_t),
            other_pct,
            noisy: other_pct.round() > self.k.noisy_pct,
        };
        println!(
            "{}",
            row(&[
                c.to_string(),
                round.to_string(),
                load.to_string(),
                run.rps.clone(),
                format!("{:.1}", run.p50),
                format!("{:.1}", run.p99),
                format!("{:.2}", run.cpu_us_req),
                format!("{:.0}%", run.front_pct),
                format!("{:.0}%", run.backend_pct),
                format!("{:.0}%", run.wrk_pct),
                format!("{:.0}%{}", run.other_pct, if run.noisy { "*" } else { "" }),
                run.non2xx.to_string(),
            ])
        );
        run
    }

    pub fn start_envoy(&self, pin: &[String], name: &str, config: &Path) -> Process {
        let log = self.k.work.join(format!("{name}.log"));
        let args: Vec<String> = vec![
            "-c".into(),
            config.to_string_lossy().into(),
            "--concurrency".into(),
            "1".into(),
            "--disable-hot-restart".into(),
            "-l".into(),
            "warn".into(),
            "--log-path".into(),
            log.to_string_lossy().into(),
        ];
        let native_dir = self.k.work.join("native");
        Process::start(
            pin,
            &self.k.envoy,
            &args,
            &[("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", &native_dir)],
            &self.k.work,
            name,
            Some(log),
        )
        .unwrap_or_else(|e| fail(e))
    }

    pub fn wrk_args(&self, c: &str, connections: bool, duration: &str) -> Vec<String> {
        let mut a: Vec<String> = if connections {
            vec![
                format!("-t{}", self.k.threads),
                format!("-c{}", self.k.connections),
                "--latency".into(),
            ]
        } else {
            vec!["-t1".into(), "-c1".into(), "--latency".into()]
        };
        if c == "override-client" {
            a.push("-s".into());
            a.push(
                self.k
                    .work
                    .join("override-client.lua")
                    .to_string_lossy()
                    .into(),
            );
        }
        a.push(format!("-d{duration}"));
        a
    }
}
