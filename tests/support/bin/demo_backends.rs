//! The demo's backends (`make run`): one harness `Backend` per `name=port`
//! argument on 127.0.0.1, each answering with its name and a newline (and the headers the
//! end-to-end tests read: `x-backend`, `x-backend-saw-override`), until
//! killed. Usage: `demo-backends pod-a=18081 pod-b=18082 ...`.

use std::net::SocketAddr;
use std::process::ExitCode;

use support::Backend;

fn main() -> ExitCode {
    let specs: Vec<String> = std::env::args().skip(1).collect();
    let mut parsed = Vec::new();
    for spec in &specs {
        let port = spec
            .split_once('=')
            .and_then(|(n, p)| Some((n, p.parse::<u16>().ok()?)));
        match port {
            Some((name, port)) if !name.is_empty() => parsed.push((name, port)),
            _ => {
                eprintln!("demo-backends: {spec:?} is not name=port (usage: demo-backends pod-a=18081 ...)");
                return ExitCode::from(2);
            }
        }
    }
    if parsed.is_empty() {
        eprintln!("demo-backends: no backend given (usage: demo-backends pod-a=18081 ...)");
        return ExitCode::from(2);
    }
    // Kept for the process's life: dropping a Backend stops it.
    let backends: Vec<Backend> = parsed
        .iter()
        .map(|(name, port)| {
            let addr = SocketAddr::from(([127, 0, 0, 1], *port));
            Backend::start_answering(name, addr, &format!("{name}\n"))
        })
        .collect();
    println!("demo backends: {}", specs.join(" "));
    // A harness backend records every request for the tests to read; the
    // demo reads none, so the records are dropped now and then.
    loop {
        std::thread::sleep(std::time::Duration::from_secs(10));
        backends.iter().for_each(Backend::reset);
    }
}
