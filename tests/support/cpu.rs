//! CPU time from /proc: a process's, each of its threads' (by name, with the
//! scheduler's nanoseconds beside the clock ticks), the whole machine's busy
//! time, and what this process's reaped children used (a load generator).

use std::collections::BTreeMap;
use std::process::Command;
use std::time::SystemTime;

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux when unknown).
pub fn clock_ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100)
}

/// The fields of a /proc `stat` line after the command name: (name, fields).
fn stat_fields(text: &str) -> Option<(String, Vec<&str>)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let name = text.get(open + 1..close)?.to_string();
    let rest = text.get(close + 2..)?;
    Some((name, rest.split_whitespace().collect()))
}

/// utime + stime of a process or thread, from its `stat` file.
fn ticks_of(stat_path: &str) -> Option<(String, u64)> {
    let text = std::fs::read_to_string(stat_path).ok()?;
    let (name, f) = stat_fields(&text)?;
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((name, utime + stime))
}

/// CPU ticks (user + system) a process has used so far; 0 once it is gone.
pub fn process_ticks(pid: u32) -> u64 {
    ticks_of(&format!("/proc/{pid}/stat")).map_or(0, |(_, t)| t)
}

/// CPU ticks this process's reaped children have used (`cutime + cstime`):
/// a load generator run to completion is counted here.
pub fn children_ticks() -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    let Some((_, f)) = stat_fields(&text) else {
        return 0;
    };
    let field = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    field(13) + field(14)
}

/// Busy ticks of the whole machine (all cores, steal included).
pub fn machine_busy_ticks() -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/stat") else {
        return 0;
    };
    let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else {
        return 0;
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system (idle) (iowait) irq softirq steal
    [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| v.get(i)).sum()
}

/// One thread's CPU so far.
#[derive(Clone, Debug)]
pub struct ThreadCpu {
    pub name: String,
    pub ticks: u64,
    /// On-CPU nanoseconds from schedstat, when the kernel keeps them.
    pub ns: Option<u64>,
}

/// Every thread of a process at one instant, and the machine's busy ticks.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Seconds since the epoch.
    pub at: f64,
    pub threads: BTreeMap<String, ThreadCpu>,
    pub machine_busy: u64,
}

impl Sample {
    pub fn take(pid: u32) -> Sample {
        let mut threads = BTreeMap::new();
        let base = format!("/proc/{pid}/task");
        if let Ok(entries) = std::fs::read_dir(&base) {
            for e in entries.flatten() {
                let tid = e.file_name().to_string_lossy().to_string();
                let Some((name, ticks)) = ticks_of(&format!("{base}/{tid}/stat")) else {
                    continue;
                };
                let ns = std::fs::read_to_string(format!("{base}/{tid}/schedstat"))
                    .ok()
                    .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()));
                threads.insert(tid, ThreadCpu { name, ticks, ns });
            }
        }
        let at = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        Sample {
            at,
            threads,
            machine_busy: machine_busy_ticks(),
        }
    }
}

/// CPU used between two samples of one process.
#[derive(Clone, Debug, Default)]
pub struct Window {
    /// Its edges, seconds since the epoch.
    pub from: f64,
    pub to: f64,
    pub secs: f64,
    /// Ticks of the threads named `main` (Envoy's main thread is "envoy").
    pub main_ticks: f64,
    /// Their schedstat nanoseconds, when every sample had them.
    pub main_ns: Option<f64>,
    /// (ticks, ns) per thread name.
    pub by_name: BTreeMap<String, (f64, f64)>,
    pub machine_ticks: f64,
}

impl Window {
    pub fn between(a: &Sample, b: &Sample, main: &str) -> Window {
        let mut w = Window {
            from: a.at,
            to: b.at,
            secs: b.at - a.at,
            machine_ticks: b.machine_busy.saturating_sub(a.machine_busy) as f64,
            ..Window::default()
        };
        let mut ns_known = true;
        for (tid, t) in &b.threads {
            let (old_ticks, old_ns) = a.threads.get(tid).map_or((0, Some(0)), |o| (o.ticks, o.ns));
            let dt = t.ticks.saturating_sub(old_ticks) as f64;
            let dn = match (t.ns, old_ns) {
                (Some(n), Some(o)) => Some(n.saturating_sub(o) as f64),
                _ => None,
            };
            let entry = w.by_name.entry(t.name.clone()).or_insert((0.0, 0.0));
            entry.0 += dt;
            entry.1 += dn.unwrap_or(0.0);
            if t.name == main {
                w.main_ticks += dt;
                match dn {
                    Some(n) => *w.main_ns.get_or_insert(0.0) += n,
                    None => ns_known = false,
                }
            }
        }
        if !ns_known {
            w.main_ns = None;
        }
        w
    }

    /// Ticks of every thread whose name starts with `prefix`.
    pub fn ticks_named(&self, prefix: &str) -> f64 {
        self.by_name
            .iter()
            .filter(|(n, _)| n.starts_with(prefix))
            .map(|(_, (t, _))| t)
            .sum()
    }
}
