//! The admin poller: one root context of all of Envoy's VMs holds the lease,
//! and it is the main thread's, which serves no requests. A worker that
//! held it (it can win the race at start-up) hands it over once it serves
//! requests, so that refreshes never hold up a worker's requests.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;
use support::*;

/// `[time][tid][level]... context ID is now|is no longer the admin poller`:
/// (tid, context, holds).
fn poller_events(envoy: &Envoy) -> Vec<(String, String, bool)> {
    envoy
        .log_lines("the admin poller")
        .iter()
        .filter_map(|line| {
            let tid = line.split('[').nth(2)?.split(']').next()?.to_string();
            let rest = line.split("serving_picker: context ").nth(1)?;
            let context = rest.split_whitespace().next()?.to_string();
            Some((tid, context, rest.contains(" is now the admin poller")))
        })
        .collect()
}

#[test]
fn the_poller_is_the_main_threads_context() {
    let a = Backend::start("A");
    let envoy = EnvoyBuilder::new()
        .tag("leader-main")
        .eds_cluster("backend", &[Endpoint::serving(a.addr())])
        .start();
    expect_routing(&envoy, "/backend/x", &[], "A", picked(&a));
    // Both workers serve requests for a while (several ticks).
    for _ in 0..10 {
        assert_batch(&envoy, "/backend/x", &[], 10, "A", picked(&a));
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(400)); // the log flush
    let events = poller_events(&envoy);
    assert!(!events.is_empty(), "no poller line in the log");
    let mut last: BTreeMap<String, (String, bool)> = BTreeMap::new();
    for (tid, context, holds) in &events {
        let thread = envoy.thread_name(tid).unwrap_or_default();
        if *holds && thread != "envoy" {
            // A worker took it first: it must have handed it over since.
            let released = envoy
                .log_lines(&format!("context {context} is no longer the admin poller"))
                .iter()
                .any(|l| l.contains("serves requests"));
            assert!(released, "worker {thread} holds the lease:\n{events:?}");
        }
        last.insert(context.clone(), (thread, *holds));
    }
    let holders: Vec<_> = last.iter().filter(|(_, (_, holds))| *holds).collect();
    assert_eq!(holders.len(), 1, "one poller at a time: {events:?}");
    assert_eq!(holders[0].1 .0, "envoy", "the poller runs on: {events:?}");
    println!("poller events: {events:?}");
}
