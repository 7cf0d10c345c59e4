//! `make drain-picture`: long-lived streams through a pod's termination, side by side. Prints a
//! table, asserts nothing (the tests that assert are tests/e2e/wasm/drain.rs and
//! tests/e2e/native/drain.rs).
//!
//! Two pods (`support::streams::StreamBackend`), A then B; clients hold 100 gRPC
//! server-streaming calls, 20 websockets and 20 HTTP/2 downloads through one real Envoy, all on
//! A. Row 5: A turns serving+terminating with B ready, and exits after its grace period. For
//! each setup and kind: how the streams on A ended before A exited, how many a gRPC client would
//! not retry, how many were still open on A when it exited, when the last reached B, and the
//! messages missed in between. Rows 3 and 4 (A the only serving choice, then B not serving):
//! the streams that ended early (none should).
//!
//! Also draws row 5's gRPC streams (an SVG, to the path given, default docs/img/drain.svg): per
//! setup, each stream's time on A, its gap, and its time on B, relative to A turning terminating
//! and A's exit.
//!
//! A setup is one [`Setup`] row: how its Envoy is built and how it is given each row's
//! endpoints. The native form's Envoy and the companion's tiered EDS output come from the
//! harness (`support::drain_setups`), shared with tests/e2e/native/drain.rs.
//!
//! Knobs: DRAIN_WINDOW_MS (3000), DRAIN_GRACE_MS (6000).

use std::time::{Duration, Instant};

use plotters::prelude::*;
use serving_picker_benches::picture;

use support::drain_setups::{drain_envoy, set_both, set_both_tiered, window_policy, H1, H2};
use support::streams::{
    envoy_hook, Kind, Moved, Reconnect, StreamBackend, StreamClient, StreamRecord,
};
use support::{wait_until, Endpoint, Envoy, EnvoyBuilder};

#[derive(Clone, Copy, Debug)]
enum Setup {
    /// Plain Envoy given only ready endpoints (A leaves EDS when it turns terminating, as Istio
    /// and kube-proxy-like control planes publish): round robin, no filter.
    PlainReadyOnly,
    /// Plain Envoy on the conditions companion's tiered output: ready endpoints at priority 0,
    /// serving+terminating ones at priority 1, overprovisioning factor 100000; no module.
    PlainTiered,
    /// The wasm form without `drain_window_ms`.
    WasmNoWindow,
    /// The wasm form with `drain_window_ms`.
    WasmDrain,
    /// The native form: the load-balancing policy with `drain_window_ms`, the stream-drain
    /// HTTP filter `serving_picker_drain` beside it.
    NativeDrain,
}

impl Setup {
    fn name(self) -> &'static str {
        match self {
            Setup::PlainReadyOnly => "plain Envoy, only ready endpoints",
            Setup::PlainTiered => "plain Envoy, companion's tiered output",
            Setup::WasmNoWindow => "wasm form, no drain_window_ms",
            Setup::WasmDrain => "wasm form, drain_window_ms",
            Setup::NativeDrain => "native form, drain_window_ms",
        }
    }

    /// Whether the picture has a panel of it (the wasm form without a window behaves as plain
    /// Envoy does: the table shows it).
    fn drawn(self) -> bool {
        !matches!(self, Setup::WasmNoWindow)
    }

    fn envoy(self, a: &StreamBackend, window: Duration) -> Envoy {
        let eps = [Endpoint::serving(a.addr())];
        let config = match self {
            Setup::NativeDrain => {
                let envoy = drain_envoy("drain-picture", &window_policy(window), &eps);
                wait_for_a(&envoy);
                return envoy;
            }
            Setup::PlainReadyOnly | Setup::PlainTiered => None,
            Setup::WasmNoWindow => Some(r#"{"refresh_interval_ms": 100}"#.to_string()),
            Setup::WasmDrain => Some(format!(
                r#"{{"refresh_interval_ms": 100, "drain_window_ms": {}}}"#,
                window.as_millis()
            )),
        };
        let envoy = EnvoyBuilder::new()
            .tag("drain-picture")
            .with_filter(config.as_deref())
            .eds_cluster(H2, &eps)
            .eds_cluster(H1, &eps)
            .bootstrap_hook(envoy_hook(H2, H1))
            .start();
        if matches!(self, Setup::PlainTiered) {
            // From the start as the companion writes it (A alone, ready: priority 0).
            set_both_tiered(&envoy, &eps);
        }
        if config.is_some() {
            wait_until("the first snapshot", Duration::from_secs(10), || {
                envoy.stat_or_zero("serving_picker.snapshot.published") >= 1
            });
        }
        wait_for_a(&envoy);
        envoy
    }

    /// Gives both clusters these endpoints, as this setup's control plane writes them.
    fn set(self, envoy: &Envoy, eps: &[Endpoint]) {
        match self {
            Setup::PlainTiered => set_both_tiered(envoy, eps),
            _ => set_both(envoy, eps),
        }
    }

    /// Row 5's endpoints.
    fn row_5(self, a: &StreamBackend, b: &StreamBackend) -> Vec<Endpoint> {
        match self {
            Setup::PlainReadyOnly => vec![Endpoint::serving(b.addr())],
            _ => vec![
                Endpoint::serving_terminating(a.addr()),
                Endpoint::serving(b.addr()),
            ],
        }
    }

    /// Rows 3 and 4's endpoints, in turn.
    fn rows_3_4(self, a: &StreamBackend, b: &StreamBackend) -> Vec<Vec<Endpoint>> {
        match self {
            // Given only ready endpoints, A leaves and nothing is left to publish.
            Setup::PlainReadyOnly => vec![vec![], vec![]],
            _ => vec![
                vec![Endpoint::serving_terminating(a.addr())],
                vec![
                    Endpoint::serving_terminating(a.addr()),
                    Endpoint::not_serving(b.addr()),
                ],
            ],
        }
    }
}

fn env_ms(name: &str, default: u64) -> Duration {
    Duration::from_millis(
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

fn wait_for_a(envoy: &Envoy) {
    wait_until("A answers through Envoy", Duration::from_secs(10), || {
        envoy.get("/other", &[]).status == 404 && envoy.get("/ws/other", &[]).status == 404
    });
}

const KINDS: [(Kind, usize); 3] = [
    (Kind::Grpc, 100),
    (Kind::Websocket, 20),
    (Kind::Http2Download, 20),
];

fn open_all(envoy: &Envoy) -> Vec<StreamClient> {
    KINDS
        .iter()
        .map(|&(kind, n)| {
            let c = StreamClient::start(kind, envoy.listen_addr(), n, Reconnect::Always, "drain");
            if !c.wait_open_on("A", n, Duration::from_secs(30)) {
                eprintln!("{kind:?}: only {} of {n} streams open on A", c.open_on("A"));
            }
            c
        })
        .collect()
}

/// One stream of row 5, in seconds from A turning terminating: when it left A (its end there;
/// when the clients stopped, if it never ended) and when B first fed it (None: it never did).
#[derive(Clone, Copy, Debug)]
struct Leg {
    left_a: f64,
    reached_b: Option<f64>,
}

/// Seconds from `since` to `t` (negative before it).
fn secs_from(since: Instant, t: Instant) -> f64 {
    match t.checked_duration_since(since) {
        Some(d) => d.as_secs_f64(),
        None => -since.duration_since(t).as_secs_f64(),
    }
}

/// The streams on A at `since` (as [`Moved::count`] picks them): when each left A and reached
/// B, in the order they left; `stopped`: when the clients stopped.
fn legs(records: &[StreamRecord], since: Instant, stopped: Instant) -> Vec<Leg> {
    let mut legs: Vec<Leg> = records
        .iter()
        .filter_map(|r| {
            let at = r.attempts.iter().position(|a| {
                a.pod.as_deref() == Some("A")
                    && a.first_at.is_some_and(|t| t <= since)
                    && a.ended_at.is_none_or(|t| t > since)
            })?;
            let on_a = &r.attempts[at];
            let left = on_a.ended_at.unwrap_or(stopped);
            let reached = r.attempts[at + 1..]
                .iter()
                .find(|b| b.pod.as_deref() == Some("B"))
                .and_then(|b| b.first_at);
            Some(Leg {
                left_a: secs_from(since, left),
                reached_b: reached.map(|t| secs_from(since, t)),
            })
        })
        .collect();
    legs.sort_by(|x, y| x.left_a.total_cmp(&y.left_a));
    legs
}

/// Row 5 for one setup: prints its rows; returns its gRPC streams' legs and A's exit (seconds
/// from A turning terminating).
fn row_5(setup: Setup, window: Duration, grace: Duration) -> (Vec<Leg>, f64) {
    let (mut a, b) = (StreamBackend::start("A"), StreamBackend::start("B"));
    let envoy = setup.envoy(&a, window);
    let clients = open_all(&envoy);
    let since = Instant::now();
    setup.set(&envoy, &setup.row_5(&a, &b));
    std::thread::sleep(grace);
    // A exits now: a stream it ends from here on was open on it at its exit.
    let exited = Instant::now();
    a.exit();
    // HTTP/1 connections close within Envoy's delayed_close_timeout (1 s) of their stream's end.
    std::thread::sleep(Duration::from_secs(2));
    let mut grpc = Vec::new();
    for client in clients {
        let kind = client.kind();
        let records = client.stop();
        if kind == Kind::Grpc {
            grpc = legs(&records, since, Instant::now());
        }
        let m = Moved::count(&records, "A", since, Some(exited));
        let ended: Vec<String> = m.ended.iter().map(|(k, v)| format!("{v} {k}")).collect();
        let secs =
            |d: Option<Duration>| d.map_or("-".into(), |d| format!("{:.1} s", d.as_secs_f64()));
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} ({} max) |",
            setup.name(),
            kind.protocol(),
            m.on_pod,
            if ended.is_empty() {
                "-".into()
            } else {
                ended.join(", ")
            },
            if kind == Kind::Grpc {
                m.not_retryable.to_string()
            } else {
                "-".into()
            },
            m.open_at_exit,
            secs(m.all_moved_after),
            m.ends_spread.map_or("-".into(), |(lo, hi)| format!(
                "{:.1}..{:.1} s",
                lo.as_secs_f64(),
                hi.as_secs_f64()
            )),
            m.missed_total,
            m.missed_max,
        );
    }
    (grpc, secs_from(since, exited))
}

fn rows_3_4(setup: Setup, window: Duration) {
    let (a, b) = (StreamBackend::start("A"), StreamBackend::start("B"));
    let envoy = setup.envoy(&a, window);
    let clients = open_all(&envoy);
    let open_before: Vec<usize> = clients.iter().map(|c| c.open_on("A")).collect();
    for (row, eps) in ["row 3", "row 4"].iter().zip(setup.rows_3_4(&a, &b)) {
        setup.set(&envoy, &eps);
        std::thread::sleep(window + Duration::from_secs(1));
        for (client, before) in clients.iter().zip(&open_before) {
            println!(
                "| {} | {row} | {} | {} |",
                setup.name(),
                client.kind().protocol(),
                before - client.open_on("A").min(*before),
            );
        }
    }
}

/// Seconds shown before A turns terminating and after the last moment of a panel.
const MARGIN_S: f64 = 1.0;

fn draw(out: &str, runs: &[(Setup, Vec<Leg>, f64)], window: Duration) -> Result<(), String> {
    let title = format!(
        "gRPC streams through pod A's termination (B ready; drain window {:.1} s): each stream's time on A, its gap, its time on B",
        window.as_secs_f64()
    );
    let (root, panels) = picture::panels(out, 1000, 260, &title, runs.len())?;
    let x_end = runs
        .iter()
        .flat_map(|(_, legs, exited)| {
            legs.iter()
                .filter_map(|l| l.reached_b)
                .chain(std::iter::once(*exited))
        })
        .fold(0.0, f64::max)
        + MARGIN_S;
    let x = -MARGIN_S..x_end;
    for ((setup, legs, exited), area) in runs.iter().zip(panels.iter()) {
        let open_at_exit = legs.iter().filter(|l| l.left_a >= *exited).count();
        let caption = format!(
            "{}: {} of {} streams still on A when it exited",
            setup.name(),
            open_at_exit,
            legs.len()
        );
        let mut chart = picture::chart(
            area,
            &caption,
            x.clone(),
            // Headroom above the streams for the marks' labels.
            0.0..legs.len().max(1) as f64 * 1.15,
            ("seconds from A turning terminating", "stream"),
            true,
        )?;
        let row = |i: usize| i as f64 + 0.5;
        let segment = |y: f64, from: f64, to: f64, colour: RGBColor| {
            PathElement::new(vec![(from, y), (to, y)], colour.stroke_width(1))
        };
        let gap = RGBColor(220, 60, 60);
        chart
            .draw_series(
                legs.iter()
                    .enumerate()
                    .map(|(i, l)| segment(row(i), x.start, l.left_a, BLUE)),
            )
            .map_err(picture::failed)?
            .label("on A")
            .legend(picture::legend_line(BLUE));
        chart
            .draw_series(
                legs.iter()
                    .enumerate()
                    .map(|(i, l)| segment(row(i), l.left_a, l.reached_b.unwrap_or(x.end), gap)),
            )
            .map_err(picture::failed)?
            .label("between A and B")
            .legend(picture::legend_line(gap));
        chart
            .draw_series(
                legs.iter()
                    .enumerate()
                    .filter_map(|(i, l)| l.reached_b.map(|b| segment(row(i), b, x.end, GREEN))),
            )
            .map_err(picture::failed)?
            .label("on B")
            .legend(picture::legend_line(GREEN));
        // Over the streams: the marks show through them.
        picture::marks(
            &mut chart,
            &[
                ("A terminating".to_string(), 0.0),
                ("A exits".to_string(), *exited),
            ],
            BLACK.mix(0.8),
        )?;
        picture::legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    }
    root.present().map_err(picture::failed)
}

fn main() {
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "docs/img/drain.svg".into());
    let window = env_ms("DRAIN_WINDOW_MS", 3000);
    let grace = env_ms("DRAIN_GRACE_MS", 6000);
    let setups = [
        Setup::PlainReadyOnly,
        Setup::PlainTiered,
        Setup::WasmNoWindow,
        Setup::WasmDrain,
        Setup::NativeDrain,
    ];
    println!(
        "Row 5: A serving+terminating with B ready, A exits {:.1} s later; window {:.1} s.\n",
        grace.as_secs_f64(),
        window.as_secs_f64()
    );
    println!("| setup | stream | on A | ended before A exited | gRPC would not retry | open on A at its exit | all on B after | ends from .. to | messages missed |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut drawn = Vec::new();
    for setup in setups {
        let (legs, exited) = row_5(setup, window, grace);
        if setup.drawn() {
            drawn.push((setup, legs, exited));
        }
    }
    println!("\nRows 3 and 4: streams on A that ended early (none should).\n");
    println!("| setup | row | stream | ended early |");
    println!("|---|---|---|---|");
    for setup in setups {
        rows_3_4(setup, window);
    }
    match draw(&out, &drawn, window) {
        Ok(()) => println!("\nwrote {out}"),
        Err(e) => {
            eprintln!("drain-picture: drawing {out}: {e}");
            std::process::exit(1);
        }
    }
}
