//! The scale scenario of `make bench-cluster`, small, asserting behaviour
//! (never time): the companion binary in mode `eds` with `--manage` against
//! the API server double (paged lists, a watch with bookmarks, a 410),
//! serving every labelled Service port by its template name to state of
//! the world and delta subscribers in two shapes (few subscribers of every
//! Service, many of a few), through churn and a rolling update:
//! - every Service port is served without a flag each;
//! - a change sends the changed Service's assignment only (resources
//!   pushed per change bounded by its subscribers);
//! - a name not served is not answered (state of the world) or answered
//!   removed (delta), counted, and sent once its Service appears;
//! - programming latency is measured (histogram, status page);
//! - after a 410 the companion lists again, and pushes only what differs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serving_picker_xds_load::apiserver::Load;
use serving_picker_xds_load::cluster::{resource_name, Cluster, Shape};
use serving_picker_xds_load::scale::{wait_until, Api, Companion, Fleet};

const SERVICES: usize = 300;
const LIMIT: Duration = Duration::from_secs(60);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Every fleet holds a version at least `v`.
fn all_at(fleets: &[&Fleet], v: u64) -> bool {
    fleets
        .iter()
        .all(|f| f.received.iter().all(|r| r.version() >= v))
}

fn pushed(c: &Companion) -> f64 {
    c.metric("serving_picker_conditions_xds_pushed_resources_total")
}

#[test]
fn a_cluster_of_labelled_services_served_by_name_through_churn_and_a_410() {
    let dir = std::env::temp_dir().join(format!("spc-cluster-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let rt = runtime();
    let cluster = Cluster::new(Shape {
        services: SERVICES,
        endpoints: SERVICES * 15 + 1000,
        of_10000: 0,
        of_1000: 1,
    });
    let slices = (0..SERVICES).map(|i| cluster.slice_count(i)).sum::<usize>();
    let api = rt.block_on(Api::start(cluster));
    let bin = Path::new(env!("CARGO_BIN_EXE_serving-picker-conditions"));
    let c = Companion::start(bin, &api, &dir, &[], "info");
    wait_until("the companion to be ready", LIMIT, || c.ready());
    // Listed in pages of 500, once; one watch open.
    assert_eq!(Load::get(&api.api.load.lists), 1);
    assert_eq!(
        Load::get(&api.api.load.list_pages),
        slices.div_ceil(500) as u64
    );
    wait_until("the watch", LIMIT, || {
        Load::get(&api.api.load.open_watches) == 1
    });

    // Shape A: few subscribers of every Service, both protocols; shape B:
    // many subscribers of ten Services each.
    let all: Vec<String> = (0..SERVICES).map(resource_name).collect();
    let sotw_all = Fleet::start(&rt, c.grpc, "all-sotw", 3, &all, false);
    let delta_all = Fleet::start(&rt, c.grpc, "all-delta", 3, &all, true);
    let mut few = Vec::new();
    for i in 0..20 {
        let names: Vec<String> = (0..10)
            .map(|k| resource_name((i * 10 + k) % SERVICES))
            .collect();
        few.push(Fleet::start(
            &rt,
            c.grpc,
            &format!("few-{i}"),
            1,
            &names,
            i % 2 == 1,
        ));
    }
    let fleets: Vec<&Fleet> = [&sotw_all, &delta_all]
        .into_iter()
        .chain(few.iter())
        .collect();
    wait_until("every subscriber's first response", LIMIT, || {
        all_at(&fleets, 1)
    });
    wait_until(
        "every Service port sent to the full subscribers",
        LIMIT,
        || {
            sotw_all.resources() == 3 * SERVICES as u64
                && delta_all.resources() == 3 * SERVICES as u64
        },
    );
    // (The gauge is set once a second.)
    wait_until("the subscriptions gauge", LIMIT, || {
        c.metric("serving_picker_conditions_xds_subscriptions") == 6.0 * SERVICES as f64 + 200.0
    });

    // Churn: one transition at a time among the small Services; each sends
    // that Service's assignment only, to its subscribers only.
    let changes = 60;
    let before = pushed(&c);
    let mut bound = 0.0;
    for _ in 0..changes {
        let p = pushed(&c);
        api.transition(1..SERVICES);
        // Its subscribers: the six full ones, and at most one few-fleet one.
        bound += 7.0;
        wait_until("the change to be pushed", LIMIT, || pushed(&c) > p);
    }
    std::thread::sleep(Duration::from_millis(500));
    let per_change = pushed(&c) - before;
    assert!(
        per_change <= bound,
        "{per_change} assignments pushed for {changes} single-Service changes (bound {bound})"
    );
    assert!(per_change >= changes as f64, "{per_change} pushed");

    // Programming latency: measured at each ACK, on the page.
    wait_until("programming latency observed", LIMIT, || {
        c.metric("serving_picker_conditions_programming_duration_seconds_count") >= changes as f64
    });
    let page: serde_json::Value =
        serde_json::from_str(c.get("/debug/services").split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert!(
        page["programming_latency"]["changes_acked"]
            .as_u64()
            .unwrap()
            >= changes as u64
    );
    assert!(page["bounds"]["ports_left_out"].as_u64().unwrap() == 0);

    // The rolling update of the 1,000-endpoint Service: its subscribers get
    // it, nobody else gets anything.
    let mut steps = api.cluster.lock().unwrap().roll(0);
    steps.truncate(400);
    let before = pushed(&c);
    for s in steps {
        api.write(s);
    }
    wait_until("the roll to be pushed", LIMIT, || pushed(&c) > before);
    std::thread::sleep(Duration::from_millis(1000));
    // Service 0 has 6 full subscribers and one few-fleet subscriber; each
    // response to one of them carries it alone.
    let roll_pushed = pushed(&c) - before;
    let responses = c.metric("serving_picker_conditions_xds_pushes_total");
    assert!(roll_pushed <= 400.0 * 7.0, "{roll_pushed}");
    assert!(responses > 0.0);

    // A name not served: not answered (state of the world), answered
    // removed (delta); counted; sent once its Service appears.
    let late = vec![format!(
        "{}/svc-late:http",
        serving_picker_xds_load::cluster::NAMESPACE
    )];
    let sotw_late = Fleet::start(&rt, c.grpc, "late-sotw", 1, &late, false);
    let delta_late = Fleet::start(&rt, c.grpc, "late-delta", 1, &late, true);
    wait_until("the delta answer (removed)", LIMIT, || {
        delta_late.received[0].responses.load(Ordering::SeqCst) == 1
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(sotw_late.received[0].responses.load(Ordering::SeqCst), 0);
    assert_eq!(delta_late.resources(), 0);
    assert!(c.metric("serving_picker_conditions_xds_unknown_resource_names_total") >= 2.0);
    let mut late_slice = api.cluster.lock().unwrap().slice(5, 0, None);
    late_slice["metadata"]["name"] = "svc-late-000".into();
    late_slice["metadata"]["labels"]["kubernetes.io/service-name"] = "svc-late".into();
    api.api.apply(late_slice);
    wait_until("the late Service to reach both", LIMIT, || {
        sotw_late.resources() == 1 && delta_late.resources() == 1
    });

    // A 410: the companion lists again; only what changed meanwhile is
    // pushed.
    let lists = Load::get(&api.api.load.lists);
    api.api.expire();
    let quiet_before = pushed(&c);
    for _ in 0..5 {
        api.transition(1..SERVICES);
    }
    wait_until("the re-list", LIMIT, || {
        Load::get(&api.api.load.lists) > lists
    });
    wait_until("the changes after the 410 to be pushed", LIMIT, || {
        pushed(&c) > quiet_before
    });
    std::thread::sleep(Duration::from_millis(1000));
    let resync = pushed(&c) - quiet_before;
    assert!(
        resync <= 5.0 * 7.0,
        "{resync} assignments pushed after a 410 for 5 changed Services"
    );
    assert!(
        fleets.iter().all(|f| f.ended().is_empty()),
        "no stream ended"
    );
    assert_eq!(c.metric("serving_picker_conditions_xds_nacks_total"), 0.0);
    eprintln!(
        "companion RSS {:.1} MB, CPU {:.2} s; log tail:\n{}",
        c.rss_mb(),
        c.cpu_seconds(),
        c.log_tail(5)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
