//! An Envoy (or any server) started as given: its own bootstrap file, fixed
//! ports, a command prefix such as `taskset -c 0`. What the benchmarks run;
//! the tests start theirs with `EnvoyBuilder`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::http;

/// SIGTERM (a clean exit flushes the logs), then SIGKILL after `grace`.
/// The exit status when it came in time.
pub fn terminate(child: &mut Child, grace: Duration) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let start = Instant::now();
    while start.elapsed() < grace {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// A running process whose output goes to `<dir>/<name>.out`; stopped
/// (SIGTERM, then SIGKILL) when dropped.
pub struct Process {
    child: Option<Child>,
    name: String,
    out: PathBuf,
    log: Option<PathBuf>,
}

impl Process {
    /// `prefix` (a CPU pinning, or nothing) then `program` and `args`, with
    /// `env` set; `log` is where the program writes its own log, if anywhere.
    pub fn start(
        prefix: &[String],
        program: &Path,
        args: &[String],
        env: &[(&str, &Path)],
        dir: &Path,
        name: &str,
        log: Option<PathBuf>,
    ) -> Result<Process, String> {
        let out = dir.join(format!("{name}.out"));
        let file =
            std::fs::File::create(&out).map_err(|e| format!("create {}: {e}", out.display()))?;
        let err = file
            .try_clone()
            .map_err(|e| format!("{}: {e}", out.display()))?;
        let mut cmd = match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(program);
                c
            }
            None => Command::new(program),
        };
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("start {}: {e}", program.display()))?;
        Ok(Process {
            child: Some(child),
            name: name.to_string(),
            out,
            log,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The last `n` lines of its log and of its output.
    pub fn tail(&self, n: usize) -> String {
        let mut text = String::new();
        for p in self.log.iter().chain(std::iter::once(&self.out)) {
            let all = std::fs::read_to_string(p).unwrap_or_default();
            let lines: Vec<&str> = all.lines().collect();
            text.push_str(&format!("==> {} <==\n", p.display()));
            text.push_str(&lines[lines.len().saturating_sub(n)..].join("\n"));
            text.push('\n');
        }
        text
    }

    /// Waits until the admin API at `admin` says LIVE on /ready.
    pub fn wait_ready(&mut self, admin: SocketAddr, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if !self.is_running() {
                return Err(format!(
                    "{} exited during start-up\n{}",
                    self.name,
                    self.tail(30)
                ));
            }
            let r = http::request(admin, "GET", "/ready", &[], Duration::from_secs(1));
            if r.status == 200 && r.body.starts_with("LIVE") {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!(
            "{} not ready after {timeout:?}\n{}",
            self.name,
            self.tail(30)
        ))
    }

    /// Stops it (SIGTERM, SIGKILL after 10 s).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            terminate(&mut child, Duration::from_secs(10));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}
