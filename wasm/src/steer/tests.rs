//! The request path against a fake request: what Envoy's tests reached only
//! through a running Envoy (a managed or unmanaged cluster, before the first
//! snapshot in each mode, the no-serving answer, the client's header).

use super::*;
use crate::codec;
use crate::testing::{FakeRequest, Reply};
use serving_picker_core::plan::{ClusterPlan, PlannedHost, Topology};
use std::rc::Rc;

const HEADER: &str = "x-gateway-destination-endpoint";

fn plan(cluster: &str, tier: Tier, topology: Topology, hosts: &[&str]) -> ClusterPlan {
    ClusterPlan {
        cluster: cluster.into(),
        tier,
        topology,
        hosts: hosts
            .iter()
            .map(|a| PlannedHost {
                address: (*a).into(),
                weight: 1,
            })
            .collect(),
    }
}

/// A worker with `config` and, when `plans` is given, a snapshot of them.
fn steering(config: PluginConfig, plans: Option<&[ClusterPlan]>) -> Steering {
    let s = Steering::new(Rc::new(config));
    if let Some(plans) = plans {
        let mut table = RoutingTable::new(s.config.retry_alternates);
        table.update(&codec::encode(plans)).unwrap();
        *s.table.borrow_mut() = Some(table);
    }
    s
}

fn snapshot() -> Vec<ClusterPlan> {
    vec![
        plan("ready", Tier::Ready, Topology::Zone, &["10.0.0.1:80"]),
        plan(
            "draining",
            Tier::TerminatingFallback,
            Topology::None,
            &["10.0.0.2:80"],
        ),
        plan("gone", Tier::NoServing, Topology::None, &[]),
    ]
}

fn counts(s: &Steering) -> Vec<u64> {
    s.counts.all().iter().map(|t| t.get()).collect()
}

/// The one counter that moved, by name, and by how much.
fn moved(s: &Steering) -> Vec<(&'static str, u64)> {
    let c = counts(s);
    COUNTER_NAMES
        .iter()
        .zip(c)
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| (*name, n))
        .collect()
}

#[test]
fn a_pick_sets_the_header_over_every_client_value_and_counts_tier_and_topology() {
    let s = steering(PluginConfig::default(), Some(&snapshot()));
    let mut req = FakeRequest::to("ready")
        .with_header(HEADER, "6.6.6.6:1")
        .with_header(HEADER, "7.7.7.7:1");
    assert_eq!(s.request(&mut req, true), Verdict::Continue);
    // The pick, then the retry alternates (`retry_alternates: 2`, cycled).
    assert_eq!(req.values(HEADER), ["10.0.0.1:80,10.0.0.1:80,10.0.0.1:80"]);
    assert_eq!(req.header_writes, 1, "one replace, no separate removal");
    assert!(req.replies.is_empty());
    assert_eq!(
        moved(&s),
        [("serving_picker.pick.ready", 1), (COUNTER_NAMES[4], 1)]
    );

    let mut req = FakeRequest::to("draining");
    assert_eq!(s.request(&mut req, true), Verdict::Continue);
    assert!(req.values(HEADER)[0].starts_with("10.0.0.2:80,"));
    assert_eq!(s.counts.pick_terminating_fallback.get(), 1);
    assert_eq!(s.counts.pick_topology[0].get(), 1);
}

#[test]
fn no_serving_endpoint_is_a_503_saying_so_or_a_stripped_passthrough() {
    let s = steering(PluginConfig::default(), Some(&snapshot()));
    let mut req = FakeRequest::to("gone").with_header(HEADER, "10.0.0.9:80");
    assert_eq!(s.request(&mut req, true), Verdict::Pause);
    assert_eq!(
        req.replies,
        [Reply {
            status: 503,
            details: "serving_picker_no_serving_endpoint".into(),
            headers: vec![
                ("x-serving-picker".into(), "no-serving-endpoint".into()),
                ("content-type".into(), "text/plain".into())
            ],
            body: "no-serving-endpoint: cluster \"gone\" has no serving endpoint\n".into(),
        }]
    );
    assert_eq!(
        moved(&s),
        [(serving_picker_core::counters::REJECT_NO_SERVING, 1)]
    );

    let config = PluginConfig {
        on_no_serving: OnNoServing::Passthrough,
        ..PluginConfig::default()
    };
    let s = steering(config, Some(&snapshot()));
    let mut req = FakeRequest::to("gone").with_header(HEADER, "10.0.0.9:80");
    assert_eq!(s.request(&mut req, true), Verdict::Continue);
    assert!(req.values(HEADER).is_empty(), "the client never steers");
    assert!(req.replies.is_empty());
    assert_eq!(
        moved(&s),
        [
            ("serving_picker.passthrough.no_serving", 1),
            ("serving_picker.override_header.stripped", 1)
        ]
    );
}

#[test]
fn a_503_that_cannot_be_sent_lets_the_request_through() {
    let s = steering(PluginConfig::default(), Some(&snapshot()));
    let mut req = FakeRequest::to("gone");
    req.fail_reply = true;
    assert_eq!(s.request(&mut req, true), Verdict::Continue);
    assert_eq!(s.counts.reject_no_serving.get(), 1);
}

#[test]
fn unmanaged_and_unknown_clusters_pass_through_with_the_client_header_stripped() {
    let config = PluginConfig {
        clusters: Some(vec!["ready".into(), "other".into()]),
        ..PluginConfig::default()
    };
    let s = steering(config, Some(&snapshot()));
    for cluster in ["unlisted", "envoy_admin"] {
        let mut req = FakeRequest::to(cluster).with_header(HEADER, "10.0.0.9:80");
        assert_eq!(s.request(&mut req, true), Verdict::Continue, "{cluster}");
        assert!(req.values(HEADER).is_empty(), "{cluster}");
    }
    assert_eq!(s.counts.passthrough_unmanaged.get(), 2);
    // Managed, not in the snapshot: passed through, logged once per snapshot.
    for _ in 0..2 {
        let mut req = FakeRequest::to("other").with_header(HEADER, "10.0.0.9:80");
        assert_eq!(s.request(&mut req, true), Verdict::Continue);
        assert!(req.values(HEADER).is_empty());
    }
    assert_eq!(s.counts.passthrough_unknown_cluster.get(), 2);
    assert_eq!(s.logged_unknown.borrow().len(), 1);
    assert_eq!(s.counts.override_header_stripped.get(), 4);
}

#[test]
fn a_request_without_the_header_is_not_touched() {
    // A removal clears Envoy's route cache: only when there is something to remove.
    let s = steering(PluginConfig::default(), Some(&snapshot()));
    let mut req = FakeRequest::to("unknown").with_header("x-other", "1");
    assert_eq!(s.request(&mut req, true), Verdict::Continue);
    assert_eq!(req.header_writes, 0);
    assert_eq!(s.counts.override_header_stripped.get(), 0);
}

#[test]
fn a_header_that_cannot_be_stripped_is_a_500_never_a_steer() {
    let s = steering(PluginConfig::default(), Some(&snapshot()));
    let mut req = FakeRequest::to("gone-elsewhere").with_header(HEADER, "10.0.0.9:80");
    req.fail_remove = true;
    assert_eq!(s.request(&mut req, true), Verdict::Pause);
    assert_eq!(req.replies.len(), 1);
    assert_eq!(req.replies[0].status, 500);
    assert_eq!(req.replies[0].details, "serving_picker_strip_failed");
    assert_eq!(s.counts.override_header_stripped.get(), 0);
}

#[test]
fn a_pick_that_cannot_be_set_strips_and_passes_or_refuses() {
    let s = steering(PluginConfig::default(), Some(&snapshot()));
    let mut req = FakeRequest::to("ready").with_header(HEADER, "10.0.0.9:80");
    req.fail_replace = true;
    assert_eq!(s.request(&mut req, true), Verdict::Continue);
    assert!(req.values(HEADER).is_empty());
    assert_eq!(s.counts.pick_ready.get(), 0);
    req.fail_remove = true;
    req.headers.push((HEADER.into(), "10.0.0.9:80".into()));
    assert_eq!(s.request(&mut req, true), Verdict::Pause);
    assert_eq!(req.replies[0].status, 500);
}

#[test]
fn no_cluster_name_or_a_non_utf8_one_only_strips() {
    let s = steering(PluginConfig::default(), Some(&snapshot()));
    for cluster in [None, Some(vec![0xff, 0xfe])] {
        let mut req = FakeRequest {
            cluster,
            ..FakeRequest::default()
        }
        .with_header(HEADER, "10.0.0.9:80");
        assert_eq!(s.request(&mut req, true), Verdict::Continue);
        assert!(req.values(HEADER).is_empty());
    }
    assert_eq!(moved(&s), [("serving_picker.override_header.stripped", 2)]);
}

#[test]
fn before_the_first_snapshot_hold_holds_once_then_answers_no_snapshot_yet() {
    let hold = || PluginConfig {
        before_first_snapshot: BeforeFirstSnapshot::Hold,
        ..PluginConfig::default()
    };
    let s = steering(hold(), None);
    let mut req = FakeRequest::to("ready").with_header(HEADER, "10.0.0.9:80");
    assert_eq!(s.request(&mut req, true), Verdict::Hold);
    assert_eq!(req.header_writes, 0);
    assert_eq!(moved(&s), [("serving_picker.hold.no_snapshot", 1)]);
    // Released without a snapshot (the hold expired): a 503, never a second hold.
    assert_eq!(s.request(&mut req, false), Verdict::Pause);
    assert_eq!(req.replies[0].status, 503);
    assert_eq!(req.replies[0].details, "serving_picker_no_snapshot_yet");
    assert_eq!(
        req.replies[0].body,
        "no-snapshot-yet: cluster \"ready\" knows no endpoints yet\n"
    );
    assert_eq!(s.counts.reject_no_snapshot.get(), 1);
    // Unmanaged clusters never wait.
    let config = PluginConfig {
        clusters: Some(vec!["ready".into()]),
        ..hold()
    };
    let s = steering(config, None);
    assert_eq!(
        s.request(&mut FakeRequest::to("other"), true),
        Verdict::Continue
    );
}

#[test]
fn before_the_first_snapshot_reject_and_passthrough() {
    let config = PluginConfig {
        before_first_snapshot: BeforeFirstSnapshot::Reject,
        ..PluginConfig::default()
    };
    let s = steering(config, None);
    let mut req = FakeRequest::to("ready");
    assert_eq!(s.request(&mut req, true), Verdict::Pause);
    assert_eq!(req.replies[0].headers[0].1, "no-snapshot-yet");
    assert_eq!(moved(&s), [("serving_picker.reject.no_snapshot", 1)]);

    let config = PluginConfig {
        before_first_snapshot: BeforeFirstSnapshot::Passthrough,
        ..PluginConfig::default()
    };
    let s = steering(config, None);
    let mut req = FakeRequest::to("ready").with_header(HEADER, "10.0.0.9:80");
    assert_eq!(s.request(&mut req, true), Verdict::Continue);
    assert!(req.values(HEADER).is_empty());
    assert!(req.replies.is_empty());
    assert_eq!(
        moved(&s),
        [
            ("serving_picker.override_header.stripped", 1),
            ("serving_picker.passthrough.no_snapshot", 1)
        ]
    );
    // The default.
    assert_eq!(
        PluginConfig::default().before_first_snapshot,
        BeforeFirstSnapshot::Passthrough
    );
}

#[test]
fn an_unlisted_cluster_passes_through_before_the_first_snapshot_and_after() {
    for mode in [
        BeforeFirstSnapshot::Hold,
        BeforeFirstSnapshot::Reject,
        BeforeFirstSnapshot::Passthrough,
    ] {
        let config = || PluginConfig {
            clusters: Some(vec!["ready".into()]),
            before_first_snapshot: mode,
            ..PluginConfig::default()
        };
        for s in [
            steering(config(), None),
            steering(config(), Some(&snapshot())),
        ] {
            // (The leader plans only listed clusters: `plans::build_plans`.)
            for cluster in ["elsewhere", "envoy_admin"] {
                let mut req = FakeRequest::to(cluster).with_header(HEADER, "10.0.0.9:80");
                assert_eq!(s.request(&mut req, true), Verdict::Continue, "{mode:?}");
                assert!(req.values(HEADER).is_empty(), "{mode:?}");
                assert!(req.replies.is_empty(), "{mode:?}");
            }
            assert_eq!(
                moved(&s),
                [
                    ("serving_picker.passthrough.unmanaged_cluster", 2),
                    ("serving_picker.override_header.stripped", 2)
                ],
                "{mode:?}"
            );
        }
    }
}

#[test]
fn a_configuration_that_does_not_parse_passes_every_request_through_stripped() {
    let s = Steering::config_invalid("x-pick".into());
    for cluster in ["ready", "elsewhere"] {
        let mut req = FakeRequest::to(cluster)
            .with_header("x-pick", "10.0.0.9:80")
            .with_header(HEADER, "keep");
        assert_eq!(s.request(&mut req, true), Verdict::Continue);
        assert!(req.values("x-pick").is_empty());
        assert_eq!(req.values(HEADER), ["keep"]);
        assert!(req.replies.is_empty());
    }
    assert_eq!(
        moved(&s),
        [
            ("serving_picker.override_header.stripped", 2),
            ("serving_picker.passthrough.config_invalid", 2)
        ]
    );
    // It never leaves that state (a new configuration is a new worker).
    assert!(!s.set_stale(false));
    assert_eq!(s.bypass.get(), Bypass::ConfigInvalid);
}

#[test]
fn a_stale_snapshot_passes_every_request_through_until_it_is_confirmed_again() {
    let s = steering(PluginConfig::default(), Some(&snapshot()));
    assert!(s.set_stale(true));
    assert!(!s.set_stale(true), "no change, nothing to log");
    for cluster in ["ready", "gone"] {
        let mut req = FakeRequest::to(cluster).with_header(HEADER, "10.0.0.9:80");
        assert_eq!(s.request(&mut req, true), Verdict::Continue);
        assert!(req.values(HEADER).is_empty());
        assert!(
            req.replies.is_empty(),
            "no no-serving 503 from a stale snapshot"
        );
    }
    assert_eq!(
        moved(&s),
        [
            ("serving_picker.override_header.stripped", 2),
            ("serving_picker.passthrough.stale_snapshot", 2)
        ]
    );
    assert!(s.set_stale(false));
    let mut req = FakeRequest::to("ready");
    s.request(&mut req, true);
    assert!(req.values(HEADER)[0].starts_with("10.0.0.1:80"));
}

#[test]
fn a_custom_override_header_is_the_one_set_and_stripped() {
    let config = PluginConfig {
        override_header: "x-pick".into(),
        ..PluginConfig::default()
    };
    let s = steering(config, Some(&snapshot()));
    let mut req = FakeRequest::to("ready").with_header(HEADER, "keep");
    s.request(&mut req, true);
    assert!(req.values("x-pick")[0].starts_with("10.0.0.1:80"));
    assert_eq!(req.values(HEADER), ["keep"]);
}

#[test]
fn held_requests_expire_after_the_timeout_from_the_oldest() {
    let mut held = Held::default();
    assert!(!held.expired(1_000_000, 0), "nothing held, nothing expires");
    assert!(held.hold(7, 100));
    assert!(!held.hold(8, 900), "the wait started with the first");
    assert!(!held.expired(5_099, 5_000));
    assert!(held.expired(5_100, 5_000));
    assert_eq!(held.take(), [7, 8]);
    assert!(held.is_empty());
    assert!(held.hold(9, 6_000), "a new wait starts");
    assert!(!held.expired(10_999, 5_000));
}

#[test]
fn counters_are_taken_once_and_named_in_order() {
    let s = steering(PluginConfig::default(), Some(&snapshot()));
    s.request(&mut FakeRequest::to("ready"), true);
    let all = s.counts.all();
    assert_eq!(all.len(), COUNTER_NAMES.len());
    assert_eq!(all[0].take(), 1);
    assert_eq!(all[0].take(), 0);
    let mut names = COUNTER_NAMES.to_vec();
    names.sort_unstable();
    names.dedup();
    assert_eq!(
        names.len(),
        COUNTER_NAMES.len(),
        "every counter has its own name"
    );
}

#[test]
fn an_empty_first_value_does_not_hide_the_client_header_on_any_passthrough() {
    // The header sent twice, the first value empty: every pass-through path
    // removes both values (Envoy routes on the first, a backend may read any).
    let with_empty_first = |cluster: Option<&str>| {
        FakeRequest {
            cluster: cluster.map(|c| c.as_bytes().to_vec()),
            ..FakeRequest::default()
        }
        .with_header(HEADER, "")
        .with_header(HEADER, "10.0.0.9:80")
    };
    let config = PluginConfig {
        clusters: Some(vec!["ready".into(), "gone".into(), "other".into()]),
        on_no_serving: OnNoServing::Passthrough,
        ..PluginConfig::default()
    };
    let s = steering(config, Some(&snapshot()));
    // Unmanaged, managed but unknown, no serving endpoint, no cluster name.
    for cluster in [Some("unlisted"), Some("other"), Some("gone"), None] {
        let mut req = with_empty_first(cluster);
        assert_eq!(s.request(&mut req, true), Verdict::Continue, "{cluster:?}");
        assert!(
            req.values(HEADER).is_empty(),
            "{cluster:?}: {:?}",
            req.values(HEADER)
        );
    }
    assert_eq!(s.counts.override_header_stripped.get(), 4);
    // A stale snapshot and a configuration that does not parse pass everything through.
    assert!(s.set_stale(true));
    let mut req = with_empty_first(Some("ready"));
    assert_eq!(s.request(&mut req, true), Verdict::Continue);
    assert!(req.values(HEADER).is_empty());
    let s = Steering::config_invalid(HEADER.into());
    let mut req = with_empty_first(Some("ready"));
    assert_eq!(s.request(&mut req, true), Verdict::Continue);
    assert!(req.values(HEADER).is_empty());
    assert_eq!(s.counts.override_header_stripped.get(), 1);
}

#[test]
fn presence_is_the_host_status_never_the_bytes() {
    assert!(header_answer_present(HEADER_ANSWER_OK));
    assert!(!header_answer_present(HEADER_ANSWER_NOT_FOUND));
    let mut req = FakeRequest::to("x").with_header(HEADER, "");
    assert!(req.has_header(HEADER));
    assert!(!req.has_header("x-other"));
}
