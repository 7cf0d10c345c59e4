//! Routing scenarios as data: the backends of one EDS cluster, how EDS
//! publishes each of them, and where the traffic must go. The behaviour
//! table's rows, EDS health statuses and condition values of every type are
//! rows of such tables (`Scenario`), a rolling update a list of steps
//! (`Step`), each checked the same way (`expect`).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::{
    assert_batch, expect_routing, no_serving_503, per_backend, picked_any, served_by, settle,
    settle_for, wait_until, Backend, Endpoint, Envoy, EnvoyBuilder, Form, BATCH, CONSECUTIVE,
    SETTLE_TIMEOUT,
};

/// The cluster every scenario routes to, and the path that reaches it.
pub const CLUSTER: &str = "backend";
pub const PATH: &str = "/backend/x";

/// How EDS publishes a backend.
#[derive(Clone, Copy, Debug)]
pub enum Published {
    /// Ready, serving, not terminating.
    Serving,
    /// Not ready, not serving, not terminating (a pod before readiness).
    NotServing,
    /// Serving and terminating (a pod in its preStop).
    ServingTerminating,
    /// Terminating and no longer serving.
    TerminatingNotServing,
    /// No metadata at all.
    NoMetadata,
    /// No metadata, only this EDS `health_status`.
    Health(&'static str),
    /// The conditions as this JSON object gives them (any type, any subset).
    Conditions(&'static str),
}

/// One endpoint of a scenario: the backend's name and how it is published.
#[derive(Clone, Copy, Debug)]
pub struct Ep {
    pub backend: &'static str,
    pub published: Published,
    pub weight: Option<u32>,
}

/// `backend` published as `published`.
pub const fn ep(backend: &'static str, published: Published) -> Ep {
    Ep {
        backend,
        published,
        weight: None,
    }
}

impl Ep {
    pub const fn weight(self, weight: u32) -> Ep {
        Ep {
            weight: Some(weight),
            ..self
        }
    }

    fn endpoint(&self, backend: &Backend) -> Endpoint {
        let addr = backend.addr();
        let e = match self.published {
            Published::Serving => Endpoint::serving(addr),
            Published::NotServing => Endpoint::not_serving(addr),
            Published::ServingTerminating => Endpoint::serving_terminating(addr),
            Published::TerminatingNotServing => Endpoint::terminating_not_serving(addr),
            Published::NoMetadata => Endpoint::no_metadata(addr),
            Published::Health(status) => Endpoint::health(addr, status),
            Published::Conditions(json) => {
                let kv: Value = serde_json::from_str(json)
                    .unwrap_or_else(|e| panic!("conditions {json:?}: {e}"));
                let mut e = Endpoint::bare(addr);
                e.ready = kv.get("ready").cloned();
                e.serving = kv.get("serving").cloned();
                e.terminating = kv.get("terminating").cloned();
                e
            }
        };
        match self.weight {
            Some(w) => e.weight(w),
            None => e,
        }
    }
}

/// Where the traffic must go.
#[derive(Clone, Copy, Debug)]
pub enum Expect {
    /// Every answer from one of these backends (one tier), picked by the
    /// module; with more than one, each gets at least a fifth of 60.
    Picked(&'static [&'static str]),
    /// The module's 503 `no-serving-endpoint`, and no backend reached.
    NoServing,
    /// 400 answers picked among `among`, `backend` answering `share` (+- 0.08) of them.
    Share {
        among: &'static [&'static str],
        backend: &'static str,
        share: f64,
    },
}

/// A scenario's backends, by name, each a real loopback server.
pub struct Backends(Vec<Backend>);

impl Backends {
    /// One backend per name, in order of first mention.
    pub fn start<'a>(names: impl IntoIterator<Item = &'a str>) -> Backends {
        let mut started: Vec<Backend> = Vec::new();
        for name in names {
            if !started.iter().any(|b| b.name() == name) {
                started.push(Backend::start(name));
            }
        }
        Backends(started)
    }

    pub fn get(&self, name: &str) -> &Backend {
        self.0
            .iter()
            .find(|b| b.name() == name)
            .unwrap_or_else(|| panic!("no backend {name} in this scenario"))
    }

    pub fn all(&self) -> &[Backend] {
        &self.0
    }

    /// The EDS endpoints of `eps`.
    pub fn endpoints(&self, eps: &[Ep]) -> Vec<Endpoint> {
        eps.iter()
            .map(|e| e.endpoint(self.get(e.backend)))
            .collect()
    }

    fn named(&self, names: &[&str]) -> Vec<&Backend> {
        names.iter().map(|n| self.get(n)).collect()
    }
}

/// Asserts where the traffic of `envoy`'s `PATH` goes once it settles.
/// `since_start`: the backends' counts are the scenario's whole history
/// (a fresh Envoy), so a `NoServing` backend must never have been reached;
/// otherwise (a step of a walk) the counts are reset once the 503 settles.
pub fn expect(envoy: &Envoy, backends: &Backends, expect: Expect, what: &str, since_start: bool) {
    match expect {
        Expect::Picked([one]) => {
            expect_routing(envoy, PATH, &[], what, picked_any(&[backends.get(one)]));
        }
        Expect::Picked(names) => {
            let tier = backends.named(names);
            settle(envoy, PATH, &[], what, picked_any(&tier));
            // Settled on the tier, possibly still on the state before: wait
            // until every member has been picked.
            for b in &tier {
                wait_until(
                    &format!("{what}: {} picked", b.name()),
                    SETTLE_TIMEOUT,
                    || {
                        let r = envoy.get(PATH, &[]);
                        served_by(b)(&r) && picked_any(&tier)(&r)
                    },
                );
            }
            let rs = assert_batch(envoy, PATH, &[], 60, what, picked_any(&tier));
            let counts = per_backend(&rs);
            for n in names {
                assert!(
                    counts.get(*n).copied().unwrap_or(0) >= 12,
                    "{what}: each of {names:?} should get at least 12 of 60: {counts:?}"
                );
            }
        }
        Expect::NoServing => {
            settle(envoy, PATH, &[], what, no_serving_503(CLUSTER));
            if !since_start {
                backends.all().iter().for_each(Backend::reset);
            }
            assert_batch(envoy, PATH, &[], BATCH, what, no_serving_503(CLUSTER));
            for b in backends.all() {
                assert_eq!(b.count(), 0, "{what}: {} was reached", b.name());
            }
        }
        Expect::Share {
            among,
            backend,
            share,
        } => {
            let tier = backends.named(among);
            let picked = picked_any(&tier);
            settle_for(
                envoy,
                PATH,
                &[],
                what,
                SETTLE_TIMEOUT,
                2 * CONSECUTIVE,
                &picked,
            );
            let n = 400;
            let rs = assert_batch(envoy, PATH, &[], n, what, &picked);
            let counts: BTreeMap<String, usize> = per_backend(&rs);
            let got = counts.get(backend).copied().unwrap_or(0) as f64 / n as f64;
            assert!(
                (got - share).abs() <= 0.08,
                "{what}: {backend} should get {share} +- 0.08 of {n} requests, got {got:.3}: {counts:?}"
            );
        }
    }
}

/// A fresh Envoy of one form with one EDS cluster, and where its traffic goes.
pub struct Scenario {
    /// Names the Envoy's directory (with the form).
    pub tag: &'static str,
    pub endpoints: &'static [Ep],
    pub expect: Expect,
    /// Where the native form differs (what its LB policy can see of Envoy's
    /// host health), why, and what it does instead.
    pub native: Option<(&'static str, Expect)>,
}

impl Scenario {
    pub fn run(&self, form: Form) {
        let backends = Backends::start(self.endpoints.iter().map(|e| e.backend));
        let envoy = EnvoyBuilder::new()
            .form(form)
            .tag(&format!("{}-{}", self.tag, form.name()))
            .eds_cluster(CLUSTER, &backends.endpoints(self.endpoints))
            .start();
        let (what, want) = match (form, self.native) {
            (Form::Native, Some((why, native))) => (format!("{}: native: {why}", self.tag), native),
            _ => (self.tag.to_string(), self.expect),
        };
        expect(&envoy, &backends, want, &format!("{what}: {want:?}"), true);
    }
}

/// One step of a walk: the cluster's endpoints after an EDS update, and
/// where the traffic goes then.
pub struct Step {
    pub what: &'static str,
    pub endpoints: &'static [Ep],
    pub expect: Expect,
}

/// A fresh Envoy of one form, its cluster published as the first step's
/// endpoints, then each later step's (the EDS file rewritten), every step
/// settled and checked in turn. Returns the Envoy and the walk's backends.
pub fn walk(form: Form, tag: &str, steps: &[Step]) -> (Envoy, Backends) {
    let backends = Backends::start(steps.iter().flat_map(|s| s.endpoints).map(|e| e.backend));
    let Some((first, rest)) = steps.split_first() else {
        panic!("a walk of no steps");
    };
    let envoy = EnvoyBuilder::new()
        .form(form)
        .tag(&format!("{tag}-{}", form.name()))
        .eds_cluster(CLUSTER, &backends.endpoints(first.endpoints))
        .start();
    expect(&envoy, &backends, first.expect, first.what, true);
    for step in rest {
        envoy.set_endpoints(CLUSTER, &backends.endpoints(step.endpoints));
        eprintln!(
            "walk step (EDS v{}): {}",
            envoy.eds(CLUSTER).version(),
            step.what
        );
        expect(&envoy, &backends, step.expect, step.what, false);
    }
    (envoy, backends)
}
