//! A cluster's EndpointSlices at Kubernetes' scalability limits, and their
//! churn, for the scale harness: 10,000 Services, 150,000 endpoints, one to
//! three slices per Service, a few Services of 1,000 and 10,000 endpoints
//! (slices of at most 100, as the EndpointSlice controller writes them),
//! every Service labelled for `--manage`.
//!
//! A transition is one pod's change, written as the one slice it is in
//! (the controller's default, `--endpointslice-updates-batch-period` 0),
//! with the `endpoints.kubernetes.io/last-change-trigger-time` annotation:
//! a ready pod starts terminating (serving), a terminating pod is replaced
//! by a new one (not ready), a new pod becomes ready.

use std::time::SystemTime;

use serde_json::{json, Value};

/// Namespace of every Service.
pub const NAMESPACE: &str = "scale";
/// The label `--manage` selects.
pub const MANAGE_LABEL: &str = "serving-picker.io/conditions";
/// Endpoints per slice at most.
pub const PER_SLICE: usize = 100;

/// A pod as its slice shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pod {
    Ready,
    /// Serving and terminating (its preStop).
    Terminating,
    /// Not ready yet (a new pod).
    Starting,
}

/// One Service: its pods in slots (a slot is a pod's place in a slice).
#[derive(Clone, Debug)]
pub struct Service {
    pub name: String,
    pub per_slice: usize,
    /// (ip number, state); `None`: a free slot.
    pub pods: Vec<Option<(u32, Pod)>>,
}

/// The whole cluster's Services.
#[derive(Clone, Debug)]
pub struct Cluster {
    pub services: Vec<Service>,
    next_ip: u32,
    rng: u64,
}

/// The size of a cluster.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub services: usize,
    pub endpoints: usize,
    /// Services of 10,000 endpoints, of 1,000.
    pub of_10000: usize,
    pub of_1000: usize,
}

impl Shape {
    /// Kubernetes' limits: 10,000 Services, 150,000 endpoints (one of
    /// 10,000 endpoints, five of 1,000).
    pub const LIMITS: Shape = Shape {
        services: 10_000,
        endpoints: 150_000,
        of_10000: 1,
        of_1000: 5,
    };
}

/// The name of Service `i`.
pub fn service_name(i: usize) -> String {
    format!("svc-{i:05}")
}

/// The template resource name of Service `i`'s port `http`.
pub fn resource_name(i: usize) -> String {
    format!("{NAMESPACE}/{}:http", service_name(i))
}

/// RFC 3339 with nanoseconds, UTC, as the EndpointSlice controller writes
/// the trigger time.
pub fn rfc3339_nanos(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

impl Cluster {
    pub fn new(shape: Shape) -> Cluster {
        let big = shape.of_10000 * 10_000 + shape.of_1000 * 1000;
        let small = shape
            .services
            .saturating_sub(shape.of_10000 + shape.of_1000);
        let rest = shape.endpoints.saturating_sub(big);
        let mut c = Cluster {
            services: Vec::with_capacity(shape.services),
            next_ip: 0,
            rng: 0x2545_F491_4F6C_DD1D,
        };
        for i in 0..shape.services {
            let (n, per_slice) = if i < shape.of_10000 {
                (10_000, PER_SLICE)
            } else if i < shape.of_10000 + shape.of_1000 {
                (1000, PER_SLICE)
            } else {
                let k = i - shape.of_10000 - shape.of_1000;
                let n = rest / small.max(1) + usize::from(k < rest % small.max(1));
                // One to three slices.
                let slices = 1 + k % 3;
                (n, n.div_ceil(slices).max(1))
            };
            let pods = (0..n).map(|_| Some((c.ip(), Pod::Ready))).collect();
            c.services.push(Service {
                name: service_name(i),
                per_slice,
                pods,
            });
        }
        c
    }

    fn ip(&mut self) -> u32 {
        self.next_ip += 1;
        self.next_ip
    }

    fn below(&mut self, n: usize) -> usize {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng % n.max(1) as u64) as usize
    }

    /// Endpoints over all Services.
    pub fn endpoints(&self) -> usize {
        self.services
            .iter()
            .map(|s| s.pods.iter().flatten().count())
            .sum()
    }

    /// Slices of Service `i`.
    pub fn slice_count(&self, i: usize) -> usize {
        self.services
            .get(i)
            .map_or(0, |s| s.pods.len().div_ceil(s.per_slice).max(1))
    }

    /// Slice `k` of Service `i` as the API serves it; `trigger`: its
    /// trigger-time annotation.
    pub fn slice(&self, i: usize, k: usize, trigger: Option<SystemTime>) -> Value {
        let s = &self.services[i];
        let from = k * s.per_slice;
        let to = (from + s.per_slice).min(s.pods.len());
        let endpoints: Vec<Value> = s.pods[from.min(to)..to]
            .iter()
            .flatten()
            .map(|(ip, pod)| {
                let (ready, serving, terminating) = match pod {
                    Pod::Ready => (true, true, false),
                    Pod::Terminating => (false, true, true),
                    Pod::Starting => (false, false, false),
                };
                json!({
                    "addresses": [format!("10.{}.{}.{}", ip >> 16 & 255, ip >> 8 & 255, ip & 255)],
                    "conditions": {"ready": ready, "serving": serving, "terminating": terminating},
                    "zone": format!("zone-{}", ip % 3),
                    "nodeName": format!("node-{}", ip % 5000),
                })
            })
            .collect();
        let mut obj = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{}-{k:03}", s.name), "namespace": NAMESPACE,
                         "labels": {"kubernetes.io/service-name": s.name, MANAGE_LABEL: "true"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": endpoints,
        });
        if let Some(t) = trigger {
            obj["metadata"]["annotations"] = json!({
                "endpoints.kubernetes.io/last-change-trigger-time": rfc3339_nanos(t)
            });
        }
        obj
    }

    /// Every slice of every Service.
    pub fn all_slices(&self) -> Vec<Value> {
        (0..self.services.len())
            .flat_map(|i| (0..self.slice_count(i)).map(move |k| (i, k)))
            .map(|(i, k)| self.slice(i, k, None))
            .collect()
    }

    /// One pod transition in a Service picked at random among `services`
    /// (indices): the slice it changes, (Service, slice).
    pub fn transition(&mut self, services: std::ops::Range<usize>) -> (usize, usize) {
        let i = services.start + self.below(services.len());
        let n = self.services[i].pods.len();
        let slot = self.below(n);
        let fresh = self.ip();
        let s = &mut self.services[i];
        if let Some(p) = s.pods.get_mut(slot) {
            *p = Some(match *p {
                Some((ip, Pod::Ready)) => (ip, Pod::Terminating),
                Some((_, Pod::Terminating)) | None => (fresh, Pod::Starting),
                Some((ip, Pod::Starting)) => (ip, Pod::Ready),
            });
        }
        (i, slot / s.per_slice)
    }

    /// The slices a rolling update of Service `i` writes, in order, at 25 %
    /// maxSurge: a quarter of new pods created (not ready), then ready,
    /// then as many old ones terminating, then gone; until every pod is
    /// new. Each step is one pod's transition: (Service, slice).
    pub fn roll(&mut self, i: usize) -> Vec<(usize, usize)> {
        let mut steps = Vec::new();
        let n = self.services[i].pods.iter().flatten().count();
        let surge = n.div_ceil(4).max(1);
        let mut old: Vec<usize> = (0..self.services[i].pods.len())
            .filter(|k| self.services[i].pods[*k].is_some())
            .collect();
        while !old.is_empty() {
            let batch: Vec<usize> = old.drain(..surge.min(old.len())).collect();
            let mut created = Vec::new();
            for _ in &batch {
                let ip = self.ip();
                let s = &mut self.services[i];
                let slot = match s.pods.iter().position(Option::is_none) {
                    Some(free) => free,
                    None => {
                        s.pods.push(None);
                        s.pods.len() - 1
                    }
                };
                s.pods[slot] = Some((ip, Pod::Starting));
                created.push(slot);
                steps.push((i, slot / s.per_slice));
            }
            for slot in &created {
                let s = &mut self.services[i];
                if let Some(Some((_, p))) = s.pods.get_mut(*slot) {
                    *p = Pod::Ready;
                }
                steps.push((i, slot / s.per_slice));
            }
            for slot in &batch {
                let s = &mut self.services[i];
                if let Some(Some((_, p))) = s.pods.get_mut(*slot) {
                    *p = Pod::Terminating;
                }
                steps.push((i, slot / s.per_slice));
            }
            for slot in &batch {
                let s = &mut self.services[i];
                if let Some(p) = s.pods.get_mut(*slot) {
                    *p = None;
                }
                steps.push((i, slot / s.per_slice));
            }
        }
        steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limits_shape_has_the_limits() {
        let c = Cluster::new(Shape::LIMITS);
        assert_eq!(c.services.len(), 10_000);
        assert_eq!(c.endpoints(), 150_000);
        assert_eq!(c.slice_count(0), 100);
        assert_eq!(c.slice_count(1), 10);
        for i in 6..10_000 {
            assert!((1..=3).contains(&c.slice_count(i)), "{i}");
        }
        let v = c.slice(6, 0, Some(SystemTime::UNIX_EPOCH));
        assert_eq!(v["metadata"]["labels"][MANAGE_LABEL], "true");
        assert_eq!(
            v["metadata"]["annotations"]["endpoints.kubernetes.io/last-change-trigger-time"],
            "1970-01-01T00:00:00.000000000Z"
        );
    }

    #[test]
    fn a_roll_replaces_every_pod_a_quarter_at_a_time() {
        let mut c = Cluster::new(Shape {
            services: 2,
            endpoints: 1010,
            of_10000: 0,
            of_1000: 1,
        });
        let steps = c.roll(0);
        assert_eq!(steps.len(), 4 * 1000);
        assert_eq!(c.services[0].pods.iter().flatten().count(), 1000);
        assert!(c.services[0]
            .pods
            .iter()
            .flatten()
            .all(|(ip, p)| *p == Pod::Ready && *ip > 1010));
        let mut t = c.clone();
        let (i, k) = t.transition(1..2);
        assert_eq!(i, 1);
        assert!(k < t.slice_count(1));
    }

    #[test]
    fn trigger_times_read_as_rfc3339() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::new(1_796_479_200, 5);
        assert_eq!(rfc3339_nanos(t), "2026-12-05T14:00:00.000000005Z");
    }
}
