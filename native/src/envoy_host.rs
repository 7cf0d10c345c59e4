//! Envoy behind the policy's traits: the adapter between `abi` (the raw
//! callbacks) and `policy` (plain Rust). Nothing here decides anything.

use std::os::raw::c_int;

use crate::abi::{self, ConfigHandle, Context, Lb};
use crate::policy::{LbInstance, Level, PolicyConfig, Proxy, Request};
use crate::table::{HostHealth, HostSource, Slot};

/// The policy as Envoy runs it.
pub type EnvoyPolicy = PolicyConfig<Envoy>;
/// One load balancer of the policy as Envoy runs it (a worker's, for one cluster).
pub type EnvoyLbInstance = LbInstance<Envoy>;

fn level(level: Level) -> c_int {
    match level {
        Level::Debug => abi::LOG_DEBUG,
        Level::Info => abi::LOG_INFO,
        Level::Warn => abi::LOG_WARN,
        Level::Error => abi::LOG_ERROR,
    }
}

/// Logs through Envoy's `dynamic_modules` logger (no configuration needed:
/// program_init and the panic guard use it too).
pub fn log(at: Level, message: &str) {
    abi::log(level(at), message);
}

/// Envoy's side of one policy configuration: its logger and the metrics
/// defined on its LB config object.
pub struct Envoy {
    config: ConfigHandle,
}

impl Envoy {
    /// Envoy's side of the configuration behind `config`.
    pub fn new(config: ConfigHandle) -> Envoy {
        Envoy { config }
    }
}

impl Proxy for Envoy {
    fn log(&self, at: Level, message: &str) {
        log(at, message);
    }
    fn log_enabled(&self, at: Level) -> bool {
        abi::log_enabled(level(at))
    }
    fn define_counter(&self, name: &str) -> Option<usize> {
        self.config.define_counter(name)
    }
    fn define_gauge(&self, name: &str) -> Option<usize> {
        self.config.define_gauge(name)
    }
    fn increment_counter(&self, id: usize, by: u64) {
        self.config.increment_counter(id, by);
    }
    fn set_gauge(&self, id: usize, value: u64) {
        self.config.set_gauge(id, value);
    }
    fn add_gauge(&self, id: usize, delta: i64) {
        self.config.add_gauge(id, delta);
    }
    fn thread_cpu_micros(&self) -> u64 {
        abi::thread_cpu_micros()
    }
}

/// A cluster's hosts as Envoy's load balancer object shows them.
pub struct EnvoyHosts(pub Lb);

impl HostSource for EnvoyHosts {
    fn priority_count(&self) -> usize {
        self.0.priority_count()
    }
    fn host_count(&self, p: u32) -> usize {
        self.0.host_count(p)
    }
    fn healthy_count(&self, p: u32) -> usize {
        self.0.healthy_count(p)
    }
    fn healthy_address(&self, p: u32, i: usize) -> Option<&str> {
        self.0.healthy_address(p, i)
    }
    fn address(&self, p: u32, i: usize) -> Option<&str> {
        self.0.address(p, i)
    }
    fn weight(&self, p: u32, i: usize) -> u32 {
        self.0.weight(p, i)
    }
    fn health(&self, p: u32, i: usize) -> HostHealth {
        match self.0.health(p, i) {
            abi::HEALTH_HEALTHY => HostHealth::Healthy,
            abi::HEALTH_DEGRADED => HostHealth::Degraded,
            _ => HostHealth::Unhealthy,
        }
    }
    fn locality_zone(&self, p: u32, i: usize) -> Option<&str> {
        self.0.locality_zone(p, i)
    }
    fn metadata_bool(&self, p: u32, i: usize, ns: &str, key: &str) -> Option<bool> {
        self.0.metadata_bool(p, i, ns, key)
    }
    fn metadata_str(&self, p: u32, i: usize, ns: &str, key: &str) -> Option<&str> {
        self.0.metadata_str(p, i, ns, key)
    }
}

/// One request's `LoadBalancerContext`, with the load balancer it asks.
pub struct EnvoyRequest {
    /// The cluster's load balancer.
    pub lb: Lb,
    /// The request's context (its retry state and host predicates).
    pub context: Context,
}

impl Request for EnvoyRequest {
    fn host_selection_retry_count(&self) -> u32 {
        self.context.host_selection_retry_count()
    }
    fn should_select_another_host(&self, slot: &Slot) -> bool {
        self.context
            .should_select_another_host(self.lb, slot.priority, slot.host_index as usize)
    }
}
