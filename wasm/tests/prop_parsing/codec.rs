//! The published snapshot's codec: round trips, long names, arbitrary and
//! mutated bytes.

use crate::mutations::*;
use proptest::prelude::*;
use proptest::sample::select;
use serving_picker_core::contract::Tier;
use serving_picker_core::plan::{ClusterPlan, PlannedHost};
use serving_picker_wasm::codec;

pub(crate) fn tier() -> impl Strategy<Value = Tier> {
    select(vec![
        Tier::Ready,
        Tier::TerminatingFallback,
        Tier::NoServing,
    ])
}

fn any_plans() -> impl Strategy<Value = Vec<ClusterPlan>> {
    let host =
        ("\\PC{0,24}", any::<u32>()).prop_map(|(address, weight)| PlannedHost { address, weight });
    let plan = ("\\PC{0,20}", tier(), prop::collection::vec(host, 0..12)).prop_map(
        |(cluster, tier, hosts)| ClusterPlan {
            cluster,
            tier,
            topology: Default::default(),
            hosts,
        },
    );
    prop::collection::vec(plan, 0..8)
}

proptest! {
    #[test]
    fn codec_round_trip(plans in any_plans()) {
        let bytes = codec::encode(&plans);
        prop_assert_eq!(codec::decode(&bytes).unwrap(), plans);
        // Every strict prefix is an error, never a panic.
        for cut in [0, bytes.len() / 3, bytes.len() / 2, bytes.len().saturating_sub(1)] {
            if cut < bytes.len() {
                prop_assert!(codec::decode(&bytes[..cut]).is_err());
            }
        }
    }

    /// Names past the 16-bit length are cut at a char boundary, not corrupted.
    #[test]
    fn codec_cuts_long_names(extra in 0usize..12, tail in "[aé😀]{1,8}") {
        let name = "a".repeat(65_530 + extra) + &tail;
        let plans = vec![ClusterPlan {
            cluster: name.clone(),
            tier: Tier::Ready,
            topology: Default::default(),
            hosts: vec![PlannedHost { address: name.clone(), weight: 7 }],
        }];
        let back = codec::decode(&codec::encode(&plans)).unwrap();
        let cut = &back[0].cluster;
        prop_assert!(cut.len() <= usize::from(u16::MAX));
        prop_assert!(name.starts_with(cut.as_str()));
        if name.len() <= usize::from(u16::MAX) {
            prop_assert_eq!(cut, &name);
        } else {
            prop_assert!(usize::from(u16::MAX) - cut.len() < 4, "{}", cut.len());
        }
        prop_assert_eq!(&back[0].hosts[0].address, cut);
        prop_assert_eq!(back[0].hosts[0].weight, 7);
    }

    /// Arbitrary bytes (also behind a valid magic) never panic, and whatever
    /// decodes re-encodes to the same bytes (the encoding is canonical).
    #[test]
    fn codec_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256), magic in any::<bool>()) {
        let bytes = if magic { [b"SPK1".as_slice(), &bytes].concat() } else { bytes };
        if let Ok(plans) = codec::decode(&bytes) {
            prop_assert_eq!(codec::encode(&plans), bytes);
        }
    }

    #[test]
    fn codec_mutated_snapshots(plans in any_plans(), muts in prop::collection::vec(mutation(), 1..4)) {
        let bytes = mutate(&codec::encode(&plans), &muts);
        if let Ok(plans) = codec::decode(&bytes) {
            prop_assert_eq!(codec::encode(&plans), bytes);
        }
    }
}
