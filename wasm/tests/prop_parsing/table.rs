//! The routing table built from plans: every decision is a host of the plan,
//! equal weights take turns.

use crate::admin::{check_table, table_of};
use crate::codec::tier;
use proptest::prelude::*;
use serving_picker_core::contract::Tier;
use serving_picker_core::plan::{ClusterPlan, PlannedHost};
use serving_picker_wasm::table::Decision;
use std::collections::HashMap;

/// Plans with distinct `IP:PORT` hosts, as build_plans makes them (any
/// weights, tiers and names, names possibly repeated).
fn table_plans() -> impl Strategy<Value = Vec<ClusterPlan>> {
    let plan = (
        prop_oneof![3 => "[a-z]{1,3}", 1 => "\\PC{0,10}"],
        tier(),
        prop::collection::vec(
            prop_oneof![4 => Just(1u32), 2 => 0u32..10, 1 => any::<u32>()],
            0..40,
        ),
        1u16..=u16::MAX,
    )
        .prop_map(|(cluster, tier, weights, port)| ClusterPlan {
            cluster,
            tier,
            topology: Default::default(),
            hosts: weights
                .into_iter()
                .enumerate()
                .map(|(i, weight)| PlannedHost {
                    address: format!("10.0.{}.{}:{port}", i / 256, i % 256),
                    weight,
                })
                .collect(),
        });
    prop::collection::vec(plan, 0..6)
}

proptest! {
    #[test]
    fn decide_returns_a_host_of_the_plan(
        plans in table_plans(),
        before in table_plans(),
        warm in 0usize..50,
        alternates in 0usize..=8,
    ) {
        check_table(&plans, alternates, None);
        // An update of a previous table (any state, some clusters equal,
        // some changed, some gone) names the same hosts.
        let previous = table_of(&before, alternates, None);
        for p in &before {
            for _ in 0..warm {
                let _ = previous.decide(&p.cluster);
            }
        }
        check_table(&plans, alternates, Some(previous));
    }

    /// Equal weights: exact round robin, every host equally often.
    #[test]
    fn equal_weights_are_round_robin(n in 1usize..50, weight in any::<u32>(), rounds in 1usize..4) {
        let plan = ClusterPlan {
            cluster: "c".into(),
            tier: Tier::Ready,
            topology: Default::default(),
            hosts: (0..n)
                .map(|i| PlannedHost { address: format!("10.0.0.{i}:80"), weight })
                .collect(),
        };
        let table = table_of(&[plan], 0, None);
        let mut counts: HashMap<String, usize> = HashMap::new();
        for _ in 0..n * rounds {
            match table.decide("c") {
                Decision::Pick { host, .. } => *counts.entry(host.to_string()).or_default() += 1,
                other => prop_assert!(false, "{:?}", other),
            }
        }
        prop_assert_eq!(counts.len(), n);
        prop_assert!(counts.values().all(|c| *c == rounds));
    }
}
