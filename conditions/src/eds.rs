//! The xDS server: gRPC v3, state of the world, ClusterLoadAssignments over
//! ADS (`StreamAggregatedResources`) and plain EDS (`StreamEndpoints`).
//!
//! The protocol lives in [`EdsStream`], a state per stream that tests drive
//! without a network; the tonic services only pump requests and snapshots
//! through it.
//!
//! Rules (xDS protocol, state of the world):
//! - Each response gets a fresh nonce and the snapshot's version. EDS is not
//!   a "full state" type: a response carries only the subscribed resources
//!   whose version this stream has not sent yet, and Envoy keeps the others.
//! - A request whose nonce is not the last one sent is stale and ignored
//!   (Envoy sends a fresh one after the newer response).
//! - A request with `error_detail` NACKs the last response: logged and
//!   counted; the same version is not sent again (a new one will be).
//! - A subscription change (resource_names) sends the newly named resources
//!   at once. A name no `--cluster` defines gets nothing (logged once).
//! - Before the first full list nothing is sent; a stream that opened
//!   before gets everything it asked for once the snapshot is ready.
//! - A new stream (a new Envoy, or one that reconnects) has sent nothing,
//!   so its first request gets every subscribed resource.
//! - Other type URLs on an ADS stream (CDS, LDS...) are not served: no
//!   answer (an empty answer would remove them), logged once per stream.

use std::collections::{BTreeSet, HashMap};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::{
    aggregated_discovery_service_server::{
        AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
    },
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::endpoint::v3::endpoint_discovery_service_server::{
    EndpointDiscoveryService, EndpointDiscoveryServiceServer,
};
use futures::Stream;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::assignment::CLA_TYPE_URL;
use crate::metrics::Metrics;
use crate::publish::Snapshot;

/// What a request was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// The first request of a stream (no nonce).
    Initial,
    /// Accepts the last response.
    Ack { version: String },
    /// Rejects the last response.
    Nack { version: String, message: String },
    /// Answers an older response: ignored.
    Stale,
    /// A type this server does not serve: ignored.
    OtherType(String),
}

/// The result of one request: what it was, and the response to send.
#[derive(Debug)]
pub struct Handled {
    pub kind: RequestKind,
    /// Time from the response it ACKs to this ACK.
    pub ack_after: Option<Duration>,
    pub response: Option<DiscoveryResponse>,
    /// Subscribed names no cluster defines (first seen on this stream).
    pub unknown_names: Vec<String>,
}

/// One xDS stream's protocol state.
#[derive(Debug, Default)]
pub struct EdsStream {
    started: bool,
    subscribed: BTreeSet<String>,
    /// Resource versions this stream has sent.
    sent: HashMap<String, u64>,
    last_nonce: Option<String>,
    last_sent_at: Option<Instant>,
    nonces: u64,
    unknown_logged: BTreeSet<String>,
    /// Lags (change -> push) of the resources in the last response.
    pub last_lags: Vec<Duration>,
}

impl EdsStream {
    pub fn new() -> EdsStream {
        EdsStream::default()
    }

    pub fn subscribed(&self) -> &BTreeSet<String> {
        &self.subscribed
    }

    /// Handles one request against the current snapshot.
    pub fn on_request(&mut self, req: &DiscoveryRequest, snap: &Snapshot) -> Handled {
        let mut handled = Handled {
            kind: RequestKind::Initial,
            ack_after: None,
            response: None,
            unknown_names: Vec::new(),
        };
        if req.type_url != CLA_TYPE_URL {
            handled.kind = RequestKind::OtherType(req.type_url.clone());
            return handled;
        }
        if !req.response_nonce.is_empty() {
            if self.last_nonce.as_deref() != Some(req.response_nonce.as_str()) {
                handled.kind = RequestKind::Stale;
                return handled;
            }
            handled.kind = match &req.error_detail {
                Some(status) => RequestKind::Nack {
                    version: req.version_info.clone(),
                    message: status.message.clone(),
                },
                None => {
                    handled.ack_after = self.last_sent_at.map(|t| t.elapsed());
                    RequestKind::Ack {
                        version: req.version_info.clone(),
                    }
                }
            };
        }
        self.started = true;
        let names: BTreeSet<String> = req.resource_names.iter().cloned().collect();
        if names != self.subscribed {
            self.sent.retain(|n, _| names.contains(n));
            self.subscribed = names;
        }
        for n in &self.subscribed {
            if snap.ready
                && !snap.resources.contains_key(n)
                && self.unknown_logged.insert(n.clone())
            {
                handled.unknown_names.push(n.clone());
            }
        }
        handled.response = self.respond(snap);
        handled
    }

    /// A new snapshot: the response to send, if this stream lacks anything.
    pub fn on_snapshot(&mut self, snap: &Snapshot) -> Option<DiscoveryResponse> {
        if !self.started {
            return None;
        }
        self.respond(snap)
    }

    fn respond(&mut self, snap: &Snapshot) -> Option<DiscoveryResponse> {
        if !snap.ready {
            return None;
        }
        let now = Instant::now();
        let mut resources = Vec::new();
        self.last_lags.clear();
        for name in &self.subscribed {
            let Some(r) = snap.resources.get(name) else {
                continue;
            };
            if self.sent.get(name) != Some(&r.version) {
                self.sent.insert(name.clone(), r.version);
                resources.push(r.any.clone());
                self.last_lags
                    .push(now.saturating_duration_since(r.changed_at));
            }
        }
        if resources.is_empty() {
            return None;
        }
        self.nonces += 1;
        let nonce = self.nonces.to_string();
        self.last_nonce = Some(nonce.clone());
        self.last_sent_at = Some(now);
        Some(DiscoveryResponse {
            version_info: snap.version.clone(),
            resources,
            type_url: CLA_TYPE_URL.to_string(),
            nonce,
            ..Default::default()
        })
    }
}

/// The gRPC services (ADS and EDS) over the published snapshots.
#[derive(Clone)]
pub struct XdsServer {
    snapshots: watch::Receiver<Arc<Snapshot>>,
    metrics: Arc<Metrics>,
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

impl XdsServer {
    pub fn new(snapshots: watch::Receiver<Arc<Snapshot>>, metrics: Arc<Metrics>) -> XdsServer {
        XdsServer { snapshots, metrics }
    }

    /// Both services, for a tonic server.
    pub fn services(
        self,
    ) -> (
        AggregatedDiscoveryServiceServer<XdsServer>,
        EndpointDiscoveryServiceServer<XdsServer>,
    ) {
        (
            AggregatedDiscoveryServiceServer::new(self.clone())
                .max_encoding_message_size(usize::MAX),
            EndpointDiscoveryServiceServer::new(self).max_encoding_message_size(usize::MAX),
        )
    }

    fn stream(
        &self,
        api: &'static str,
        peer: String,
        mut inbound: Streaming<DiscoveryRequest>,
    ) -> ResponseStream<DiscoveryResponse> {
        let (tx, rx) = mpsc::channel::<Result<DiscoveryResponse, Status>>(4);
        let mut snapshots = self.snapshots.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            metrics.stream_opened();
            let mut state = EdsStream::new();
            let mut node = String::new();
            let mut other_types = BTreeSet::new();
            tracing::info!(api, peer = %peer, "xDS stream opened");
            loop {
                let response = tokio::select! {
                    msg = inbound.message() => match msg {
                        Ok(Some(req)) => {
                            if node.is_empty() {
                                if let Some(n) = &req.node {
                                    node = n.id.clone();
                                }
                            }
                            let snap = snapshots.borrow_and_update().clone();
                            let h = state.on_request(&req, &snap);
                            log_request(&h, &node, &req, &mut other_types, &metrics);
                            h.response
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::info!(api, node = %node, error = %e, "xDS stream ended by an error");
                            break;
                        }
                    },
                    changed = snapshots.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let snap = snapshots.borrow_and_update().clone();
                        state.on_snapshot(&snap)
                    }
                };
                if let Some(resp) = response {
                    let n = resp.resources.len();
                    tracing::debug!(node = %node, version = %resp.version_info, nonce = %resp.nonce, resources = n, "xDS push");
                    metrics.pushed(n, state.last_lags.iter().copied());
                    if tx.send(Ok(resp)).await.is_err() {
                        break;
                    }
                }
            }
            metrics.stream_closed();
            tracing::info!(api, node = %node, peer = %peer, "xDS stream closed");
        });
        Box::pin(ReceiverStream::new(rx))
    }
}

fn log_request(
    h: &Handled,
    node: &str,
    req: &DiscoveryRequest,
    other_types: &mut BTreeSet<String>,
    metrics: &Metrics,
) {
    match &h.kind {
        RequestKind::Initial => tracing::info!(
            node = %node,
            resources = ?req.resource_names,
            version = %req.version_info,
            "xDS subscription"
        ),
        RequestKind::Ack { version } => {
            metrics.acked(h.ack_after);
            tracing::debug!(node = %node, version = %version, "xDS ACK");
        }
        RequestKind::Nack { version, message } => {
            metrics.nacked();
            tracing::warn!(node = %node, version = %version, error = %message, "xDS NACK: Envoy rejected an assignment");
        }
        RequestKind::Stale => {
            tracing::debug!(node = %node, "xDS request with a stale nonce ignored")
        }
        RequestKind::OtherType(t) => {
            if other_types.insert(t.clone()) {
                tracing::warn!(node = %node, type_url = %t, "xDS type not served by this companion (only ClusterLoadAssignment): ignored");
            }
        }
    }
    for n in &h.unknown_names {
        tracing::warn!(node = %node, resource = %n, "Envoy asks for an EDS resource no --cluster defines");
    }
}

fn peer_of<T>(req: &Request<T>) -> String {
    req.remote_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|| "-".to_string())
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for XdsServer {
    type StreamAggregatedResourcesStream = ResponseStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = ResponseStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let peer = peer_of(&request);
        Ok(Response::new(self.stream(
            "ads",
            peer,
            request.into_inner(),
        )))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented(
            "incremental (delta) xDS is not served: use api_type GRPC (state of the world)",
        ))
    }
}

#[tonic::async_trait]
impl EndpointDiscoveryService for XdsServer {
    type StreamEndpointsStream = ResponseStream<DiscoveryResponse>;
    type DeltaEndpointsStream = ResponseStream<DeltaDiscoveryResponse>;

    async fn stream_endpoints(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamEndpointsStream>, Status> {
        let peer = peer_of(&request);
        Ok(Response::new(self.stream(
            "eds",
            peer,
            request.into_inner(),
        )))
    }

    async fn delta_endpoints(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaEndpointsStream>, Status> {
        Err(Status::unimplemented(
            "incremental (delta) xDS is not served: use api_type GRPC (state of the world)",
        ))
    }

    async fn fetch_endpoints(
        &self,
        request: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        let snap = self.snapshots.borrow().clone();
        if !snap.ready {
            return Err(Status::unavailable("no full list of EndpointSlices yet"));
        }
        let mut state = EdsStream::new();
        let mut req = request.into_inner();
        req.response_nonce.clear();
        match state.on_request(&req, &snap).response {
            Some(r) => Ok(Response::new(r)),
            None => Err(Status::not_found(
                "none of the resources asked for is served",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::publish::Resource;
    use envoy_types::pb::google::protobuf::Any;
    use envoy_types::pb::google::rpc::Status as RpcStatus;
    use std::collections::BTreeMap;

    fn snap(version: &str, ready: bool, resources: &[(&str, u64)]) -> Snapshot {
        let mut m = BTreeMap::new();
        for (name, v) in resources {
            m.insert(
                name.to_string(),
                Arc::new(Resource {
                    name: name.to_string(),
                    version: *v,
                    any: Any {
                        type_url: CLA_TYPE_URL.into(),
                        value: format!("{name}@{v}").into_bytes(),
                    },
                    endpoints: 0,
                    changed_at: Instant::now(),
                }),
            );
        }
        Snapshot {
            version: version.into(),
            ready,
            resources: m,
        }
    }

    fn req(names: &[&str], version: &str, nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version.into(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            type_url: CLA_TYPE_URL.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    fn sent(r: &DiscoveryResponse) -> Vec<String> {
        r.resources
            .iter()
            .map(|a| String::from_utf8(a.value.clone()).unwrap())
            .collect()
    }

    #[test]
    fn initial_request_gets_every_subscribed_resource_then_ack_is_quiet() {
        let s = snap("v1", true, &[("a", 1), ("b", 2), ("c", 3)]);
        let mut st = EdsStream::new();
        let h = st.on_request(&req(&["a", "b"], "", ""), &s);
        assert_eq!(h.kind, RequestKind::Initial);
        let r = h.response.unwrap();
        assert_eq!(sent(&r), vec!["a@1", "b@2"]);
        assert_eq!(r.version_info, "v1");
        assert_eq!(r.type_url, CLA_TYPE_URL);
        let h = st.on_request(&req(&["a", "b"], "v1", &r.nonce), &s);
        assert_eq!(
            h.kind,
            RequestKind::Ack {
                version: "v1".into()
            }
        );
        assert!(h.ack_after.is_some());
        assert!(
            h.response.is_none(),
            "an ACK of the current state needs no answer"
        );
    }

    #[test]
    fn a_new_snapshot_sends_only_changed_resources_with_fresh_nonces() {
        let mut st = EdsStream::new();
        let r1 = st
            .on_request(
                &req(&["a", "b"], "", ""),
                &snap("v1", true, &[("a", 1), ("b", 2)]),
            )
            .response
            .unwrap();
        let r2 = st
            .on_snapshot(&snap("v2", true, &[("a", 1), ("b", 5)]))
            .unwrap();
        assert_eq!(sent(&r2), vec!["b@5"]);
        assert_eq!(r2.version_info, "v2");
        assert_ne!(r2.nonce, r1.nonce);
        // Nothing changed for this stream: no response.
        assert!(st
            .on_snapshot(&snap("v3", true, &[("a", 1), ("b", 5), ("x", 9)]))
            .is_none());
        // The ACK of r1 arrives after r2 was sent: stale, ignored.
        let h = st.on_request(&req(&["a", "b"], "v1", &r1.nonce), &snap("v3", true, &[]));
        assert_eq!(h.kind, RequestKind::Stale);
        assert!(h.response.is_none());
    }

    #[test]
    fn nack_is_reported_and_not_answered_with_the_same_version() {
        let s = snap("v1", true, &[("a", 1)]);
        let mut st = EdsStream::new();
        let r = st.on_request(&req(&["a"], "", ""), &s).response.unwrap();
        let mut nack = req(&["a"], "", &r.nonce);
        nack.error_detail = Some(RpcStatus {
            code: 3,
            message: "bad".into(),
            details: vec![],
        });
        let h = st.on_request(&nack, &s);
        assert_eq!(
            h.kind,
            RequestKind::Nack {
                version: "".into(),
                message: "bad".into()
            }
        );
        assert!(h.response.is_none());
        // A newer version is sent again.
        assert_eq!(
            sent(&st.on_snapshot(&snap("v2", true, &[("a", 2)])).unwrap()),
            vec!["a@2"]
        );
    }

    #[test]
    fn subscription_changes_send_new_names_and_forget_dropped_ones() {
        let s = snap("v1", true, &[("a", 1), ("b", 2)]);
        let mut st = EdsStream::new();
        let r = st.on_request(&req(&["a"], "", ""), &s).response.unwrap();
        // Envoy adds cluster b (ACK of r carrying the new names).
        let r2 = st
            .on_request(&req(&["a", "b"], "v1", &r.nonce), &s)
            .response
            .unwrap();
        assert_eq!(sent(&r2), vec!["b@2"]);
        // b dropped, then asked again: sent again.
        let r3 = st.on_request(&req(&["a"], "v1", &r2.nonce), &s);
        assert!(r3.response.is_none());
        let last = st.last_nonce.clone().unwrap();
        let r4 = st
            .on_request(&req(&["a", "b"], "v1", &last), &s)
            .response
            .unwrap();
        assert_eq!(sent(&r4), vec!["b@2"]);
        // A name no cluster defines: reported once, nothing sent for it.
        let last = st.last_nonce.clone().unwrap();
        let h = st.on_request(&req(&["a", "b", "zz"], "v1", &last), &s);
        assert_eq!(h.unknown_names, vec!["zz"]);
        assert!(h.response.is_none());
        let h = st.on_request(&req(&["a", "b", "zz"], "v1", &last), &s);
        assert!(h.unknown_names.is_empty());
    }

    #[test]
    fn nothing_before_ready_everything_once_ready() {
        let mut st = EdsStream::new();
        let h = st.on_request(&req(&["a"], "", ""), &snap("", false, &[]));
        assert!(h.response.is_none());
        let r = st.on_snapshot(&snap("v1", true, &[("a", 1)])).unwrap();
        assert_eq!(sent(&r), vec!["a@1"]);
        // A stream that has not asked anything yet gets nothing pushed.
        let mut idle = EdsStream::new();
        assert!(idle.on_snapshot(&snap("v1", true, &[("a", 1)])).is_none());
    }

    #[test]
    fn a_reconnecting_envoy_gets_the_current_state() {
        let s = snap("v7", true, &[("a", 4), ("b", 6)]);
        // Envoy reconnects with the version it last accepted and no nonce.
        let mut st = EdsStream::new();
        let h = st.on_request(&req(&["a", "b"], "v3", ""), &s);
        assert_eq!(h.kind, RequestKind::Initial);
        assert_eq!(sent(&h.response.unwrap()), vec!["a@4", "b@6"]);
    }

    #[test]
    fn other_types_are_not_answered() {
        let s = snap("v1", true, &[("a", 1)]);
        let mut st = EdsStream::new();
        let mut r = req(&[], "", "");
        r.type_url = "type.googleapis.com/envoy.config.cluster.v3.Cluster".into();
        let h = st.on_request(&r, &s);
        assert!(matches!(h.kind, RequestKind::OtherType(_)));
        assert!(h.response.is_none());
    }
}
