//! The xDS stream state machine fed fuzzed sequences: a state-of-the-world and a delta stream,
//! sharing one byte budget, take requests (names served, managed, unknown, long, not UTF-8;
//! nonces current, stale or garbage; NACKs; other type URLs), snapshots (resources appearing,
//! changing, going; snapshots skipped) and takes of any size, in any order. Invariants, each
//! named:
//! - `no_panic`: nothing panics (proptest fails on a panic);
//! - `responses_decode`: every response taken decodes, and names only resources of the newest
//!   snapshot (state of the world) or those and names it removes (delta);
//! - `retained_within_limits`: each stream keeps at most the per-stream bytes, all of them at
//!   most the total, and the budget counts exactly what the streams keep;
//! - `refused_whole`: a request refused over a byte limit changes nothing the stream keeps;
//! - `bytes_given_back`: once both streams end, the budget holds nothing.
//!
//! Short runs in `make test` (PROPTEST_CASES), long ones in `make fuzz`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use proptest::prelude::*;

use crate::eds::assignment::CLA_TYPE_URL;
use crate::eds::snapshot::{name_hash, Resource, Snapshot, Table};
use crate::xds::delta::DeltaStream;
use crate::xds::protocol::Names;
use crate::xds::requests::{DeltaRequestView, RequestView};
use crate::xds::retained::RetainedBudget;
use crate::xds::sotw::SotwStream;

const MAX_NAME: usize = 64;
const MAX_STREAM: usize = 1_500;
const MAX_TOTAL: usize = 2_500;

/// Names the snapshots may serve: `--cluster` ones and `--manage` template ones.
const SERVED: [&str; 5] = ["a", "b", "c", "shop/web:http", "shop/api:8080"];

#[derive(Clone, Debug)]
enum Name {
    Served(usize),
    Template(u8),
    Unknown(String),
    Long(usize),
    NotUtf8(Vec<u8>),
}

impl Name {
    fn bytes(&self) -> Bytes {
        match self {
            Name::Served(i) => Bytes::from(SERVED[*i % SERVED.len()]),
            Name::Template(n) => Bytes::from(format!("shop/svc-{n}:http")),
            Name::Unknown(s) => Bytes::from(s.clone()),
            Name::Long(n) => Bytes::from("x".repeat(*n)),
            Name::NotUtf8(b) => Bytes::from(b.clone()),
        }
    }
}

fn name() -> impl Strategy<Value = Name> {
    prop_oneof![
        4 => (0..SERVED.len()).prop_map(Name::Served),
        2 => any::<u8>().prop_map(Name::Template),
        2 => "[a-z/:]{0,20}".prop_map(Name::Unknown),
        1 => (MAX_NAME - 2..MAX_NAME * 3).prop_map(Name::Long),
        1 => proptest::collection::vec(0x80u8..=0xff, 1..8).prop_map(Name::NotUtf8),
    ]
}

#[derive(Clone, Debug)]
enum Nonce {
    Empty,
    Current,
    Stale,
    Garbage(String),
}

fn nonce() -> impl Strategy<Value = Nonce> {
    prop_oneof![
        1 => Just(Nonce::Empty),
        3 => Just(Nonce::Current),
        1 => Just(Nonce::Stale),
        1 => ".{0,6}".prop_map(Nonce::Garbage),
    ]
}

fn type_url() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => Just(CLA_TYPE_URL.to_string()),
        1 => Just("type.googleapis.com/envoy.config.cluster.v3.Cluster".to_string()),
        1 => "[a-z./]{200,400}",
    ]
}

#[derive(Clone, Debug)]
enum Op {
    /// Resources (by index into SERVED) at these versions appear or change; others go.
    Snapshot {
        put: Vec<(usize, u64)>,
        forget: Vec<usize>,
        skip: bool,
    },
    Sotw {
        names: Vec<Name>,
        nonce: Nonce,
        type_url: String,
        nack: bool,
    },
    Delta {
        subscribe: Vec<Name>,
        unsubscribe: Vec<Name>,
        nonce: Nonce,
        type_url: String,
        nack: bool,
    },
    TakeSotw {
        max: usize,
    },
    TakeDelta {
        max: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let names = |n| proptest::collection::vec(name(), 0..n);
    prop_oneof![
        2 => (
            proptest::collection::vec((0..SERVED.len(), 1u64..5), 0..4),
            proptest::collection::vec(0..SERVED.len(), 0..2),
            any::<bool>(),
        )
            .prop_map(|(put, forget, skip)| Op::Snapshot { put, forget, skip }),
        3 => (names(8), nonce(), type_url(), any::<bool>())
            .prop_map(|(names, nonce, type_url, nack)| Op::Sotw { names, nonce, type_url, nack }),
        3 => (names(8), names(4), nonce(), type_url(), any::<bool>()).prop_map(
            |(subscribe, unsubscribe, nonce, type_url, nack)| Op::Delta {
                subscribe,
                unsubscribe,
                nonce,
                type_url,
                nack,
            }
        ),
        2 => prop_oneof![Just(usize::MAX), 40usize..400].prop_map(|max| Op::TakeSotw { max }),
        2 => prop_oneof![Just(usize::MAX), 40usize..400].prop_map(|max| Op::TakeDelta { max }),
    ]
}

struct World {
    table: Arc<Table>,
    seq: u64,
    snap: Snapshot,
    served: BTreeSet<String>,
}

impl World {
    fn new() -> World {
        let table = Arc::new(Table::default());
        World {
            snap: Snapshot {
                version: "v0".into(),
                ready: true,
                table: table.clone(),
                seq: 0,
                after: 0,
                changed: Arc::from(Vec::new()),
            },
            table,
            seq: 0,
            served: BTreeSet::new(),
        }
    }

    fn publish(&mut self, put: &[(usize, u64)], forget: &[usize], skip: bool) {
        let rs: Vec<Arc<Resource>> = put
            .iter()
            .map(|(i, v)| {
                let name = SERVED[*i];
                Arc::new(Resource::new(
                    name,
                    *v,
                    format!("{name}@{v}").as_bytes(),
                    1,
                    Instant::now(),
                ))
            })
            .collect();
        let gone: Vec<usize> = forget
            .iter()
            .filter(|i| !put.iter().any(|(p, _)| p == *i))
            .copied()
            .collect();
        let forget_hashes: Vec<u64> = gone.iter().map(|i| name_hash(SERVED[*i])).collect();
        self.table.put(&rs, &forget_hashes);
        for i in &gone {
            self.served.remove(SERVED[*i]);
        }
        for (i, _) in put {
            self.served.insert(SERVED[*i].to_string());
        }
        // A skipped snapshot: the streams see one that does not follow the last they saw.
        let after = if skip { self.seq + 1 } else { self.seq };
        self.seq = after + 1;
        let mut changed: Vec<u64> = rs.iter().map(|r| r.hash).collect();
        changed.extend(&forget_hashes);
        self.snap = Snapshot {
            version: format!("v{}", self.seq),
            ready: true,
            table: self.table.clone(),
            seq: self.seq,
            after,
            changed: Arc::from(changed),
        };
    }
}

fn nonce_text(n: &Nonce, last: u64) -> String {
    match n {
        Nonce::Empty => String::new(),
        Nonce::Current => last.to_string(),
        Nonce::Stale => last.saturating_sub(1).to_string(),
        Nonce::Garbage(s) => s.clone(),
    }
}

fn nack(on: bool) -> Option<RpcStatus> {
    on.then(|| RpcStatus {
        code: 3,
        message: "rejected".into(),
        details: vec![],
    })
}

proptest! {
    #[test]
    fn streams_keep_the_protocol_and_their_bounds(ops in proptest::collection::vec(op(), 1..40)) {
        let budget = Arc::new(RetainedBudget::new(MAX_NAME, MAX_STREAM, MAX_TOTAL));
        let names = Arc::new(Names::new(["a", "b", "c"]).managing(true));
        let mut world = World::new();
        let mut sotw = SotwStream::new(names.clone(), &world.snap).retaining(budget.clone());
        let mut delta = DeltaStream::new(names, &world.snap).retaining(budget.clone());
        let (mut sotw_nonce, mut delta_nonce) = (0u64, 0u64);
        let mut now = Instant::now();
        for op in ops {
            now += Duration::from_millis(10);
            match op {
                Op::Snapshot { put, forget, skip } => {
                    world.publish(&put, &forget, skip);
                    sotw.on_snapshot(&world.snap, now);
                    delta.on_snapshot(&world.snap, now);
                }
                Op::Sotw { names, nonce, type_url, nack: n } => {
                    let before = sotw.retained();
                    let req = RequestView {
                        version_info: world.snap.version.clone(),
                        node: Bytes::new(),
                        resource_names: names.iter().map(Name::bytes).collect(),
                        type_url,
                        response_nonce: nonce_text(&nonce, sotw_nonce),
                        error_detail: nack(n),
                    };
                    let handled = sotw.on_request(&req, &world.snap, now);
                    if handled.refused.is_some() {
                        prop_assert_eq!(sotw.retained(), before, "refused_whole");
                    }
                }
                Op::Delta { subscribe, unsubscribe, nonce, type_url, nack: n } => {
                    let before = delta.retained();
                    let req = DeltaRequestView {
                        node: Bytes::new(),
                        type_url,
                        resource_names_subscribe: subscribe.iter().map(Name::bytes).collect(),
                        resource_names_unsubscribe: unsubscribe.iter().map(Name::bytes).collect(),
                        initial_resource_versions: Default::default(),
                        response_nonce: nonce_text(&nonce, delta_nonce),
                        error_detail: nack(n),
                    };
                    let handled = delta.on_request(&req, &world.snap, now);
                    if handled.refused.is_some() {
                        prop_assert_eq!(delta.retained(), before, "refused_whole");
                    }
                }
                Op::TakeSotw { max } => {
                    if let Some(p) = sotw.take(&world.snap, max, now).response {
                        sotw_nonce = p.nonce;
                        let r = p.to_response();
                        prop_assert!(r.is_ok(), "responses_decode");
                        // The test's resources hold `name@version`.
                        for res in r.unwrap().resources {
                            let text = String::from_utf8_lossy(&res.value).to_string();
                            let name = text.split('@').next().unwrap_or_default();
                            prop_assert!(world.served.contains(name), "responses_decode: {} not served", text);
                        }
                    }
                }
                Op::TakeDelta { max } => {
                    if let Some(p) = delta.take(&world.snap, max, now).response {
                        delta_nonce = p.nonce;
                        let r = p.to_delta_response();
                        prop_assert!(r.is_ok(), "responses_decode");
                        for res in r.unwrap().resources {
                            prop_assert!(world.served.contains(&res.name), "responses_decode: {} not served", res.name);
                        }
                    }
                }
            }
            prop_assert!(sotw.retained() <= MAX_STREAM, "retained_within_limits: sotw {}", sotw.retained());
            prop_assert!(delta.retained() <= MAX_STREAM, "retained_within_limits: delta {}", delta.retained());
            prop_assert!(budget.total() <= MAX_TOTAL, "retained_within_limits: total {}", budget.total());
            prop_assert_eq!(budget.total(), sotw.retained() + delta.retained(), "retained_within_limits");
        }
        drop(sotw);
        drop(delta);
        prop_assert_eq!(budget.total(), 0, "bytes_given_back");
    }
}
