//! What both end-to-end benchmarks (`bench-e2e`, `bench-scale`) share beyond
//! the harness (`support`): their knobs, CPU pinning, figures (medians,
//! spreads), and stopping with a message; and the pictures' drawing ([`picture`]).

pub mod picture;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Prints `<bench>: <message>` and exits 1.
pub fn die(bench: &str, message: impl std::fmt::Display) -> ! {
    eprintln!("{bench}: {message}");
    std::process::exit(1)
}

/// An environment knob's text, or `default`.
pub fn knob(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// A whole-number knob, or `default`; `Err` names the knob.
pub fn knob_number(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("{name} must be a whole number, not '{v}'")),
    }
}

/// A path knob, relative ones from the repository root, or `default`.
pub fn knob_path(name: &str, default: &str) -> PathBuf {
    let p = PathBuf::from(knob(name, default));
    if p.is_absolute() {
        p
    } else {
        support::repo_root().join(p)
    }
}

/// A duration as wrk takes it (`10s`, `500ms`, `2m`) in seconds.
pub fn wrk_seconds(text: &str) -> Option<f64> {
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let n: f64 = digits.parse().ok()?;
    match &text[digits.len()..] {
        "" | "s" => Some(n),
        "ms" => Some(n / 1000.0),
        "m" => Some(n * 60.0),
        "h" => Some(n * 3600.0),
        _ => None,
    }
}

/// Where the processes run: the measured one on core 0 to itself, the rest
/// (load generators, backends) on core 1, when `taskset` and two cores exist.
pub struct Pinning {
    /// The command prefix of the measured process (`taskset -c 0`), empty without pinning.
    pub measured: Vec<String>,
    /// The command prefix of the other processes (`taskset -c 1`), empty without pinning.
    pub others: Vec<String>,
    /// How the figures' header describes the pinning.
    pub said: &'static str,
}

impl Pinning {
    /// Pinning when `taskset` and two cores exist (`measured_what` then describes it), else none.
    pub fn detect(measured_what: &'static str) -> Pinning {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let taskset = std::process::Command::new("taskset")
            .arg("--version")
            .output()
            .is_ok();
        if taskset && cores >= 2 {
            let pin = |c: &str| vec!["taskset".to_string(), "-c".to_string(), c.to_string()];
            Pinning {
                measured: pin("0"),
                others: pin("1"),
                said: measured_what,
            }
        } else {
            Pinning {
                measured: Vec::new(),
                others: Vec::new(),
                said: "no pinning (taskset missing or fewer than 2 cores)",
            }
        }
    }
}

/// The median of `values` (NaN for none): the middle one, or the mean of the
/// two middle ones.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// How a figure is printed.
#[derive(Clone, Copy, Debug)]
pub enum Fmt {
    /// `%.3f`: a ratio.
    Ratio,
    /// `%+.2f`: a difference of microseconds of CPU.
    Signed2,
    /// `%+.1f`: a difference of microseconds of latency.
    Signed1,
}

impl Fmt {
    /// `v` printed this way.
    pub fn show(self, v: f64) -> String {
        match self {
            Fmt::Ratio => format!("{v:.3}"),
            Fmt::Signed2 => format!("{v:+.2}"),
            Fmt::Signed1 => format!("{v:+.1}"),
        }
    }
}

/// Figures of several rounds (None: a run that could not be read), as
/// (median, "min..max", every figure in order); "n/a" when there are none.
pub fn spread(values: &[Option<f64>], fmt: Fmt) -> (String, String, String) {
    let known: Vec<f64> = values.iter().flatten().copied().collect();
    let mut all = String::new();
    for v in values {
        match v {
            Some(x) => {
                let _ = write!(all, " {}", fmt.show(*x));
            }
            None => all.push_str(" n/a"),
        }
    }
    if known.is_empty() {
        return ("n/a".into(), "n/a".into(), all);
    }
    let lo = known.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = known.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (
        fmt.show(median(&known)),
        format!("{}..{}", fmt.show(lo), fmt.show(hi)),
        all,
    )
}

/// Copies `from` to `to` (creating its folder).
pub fn copy_into(from: &Path, to: &Path) -> Result<(), String> {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    }
    std::fs::copy(from, to)
        .map(|_| ())
        .map_err(|e| format!("copy {} -> {}: {e}", from.display(), to.display()))
}

/// Writes `value` as pretty JSON.
pub fn write_json(path: &Path, value: &serde_json::Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("write {}: {e}", path.display()))
}

/// `envoy --mode validate` of a bootstrap; the output when it fails.
pub fn validate(envoy: &Path, bootstrap: &Path) -> Result<(), String> {
    let out = std::process::Command::new(envoy)
        .args([
            "--mode",
            "validate",
            "--disable-hot-restart",
            "-l",
            "warn",
            "-c",
        ])
        .arg(bootstrap)
        .output()
        .map_err(|e| format!("run {}: {e}", envoy.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} failed validation:\n{}{}",
            bootstrap.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Whether something answers on loopback `port`.
pub fn port_in_use(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        std::time::Duration::from_millis(300),
    )
    .is_ok()
}
