//! What the xDS streams share ([`Core`]: snapshots, names, limits, the
//! open streams) and the [`XdsServer`] that owns it. The services route
//! calls to streams (`routing`); each stream has a request task
//! (`request_task`, reading through `request_reader`) and a response body
//! (`response_body`). Served by hand rather than through tonic's generated
//! servers, whose codec copies every response into a buffer of the
//! stream's own: here the resource bytes go to HTTP/2 shared.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;
use tokio::sync::{watch, Notify, Semaphore};
use tonic::Status;

use crate::eds::snapshot::Snapshot;
use crate::limits::{names as limit, XdsLimits};
use crate::net::listener::{Conn, Connections};
use crate::telemetry::ratelog::LogBudget;
use crate::xds::callbacks::Callbacks;
use crate::xds::protocol::Names;
use crate::xds::retained::RetainedBudget;
use crate::xds::stream_state::StreamState;

/// Opened and closed streams: logged up to 20 a second.
pub(super) static OPEN_LOG: LogBudget = LogBudget::new(20, Duration::from_secs(1));

/// What every stream shares: snapshots, names, limits, callbacks.
pub(crate) struct Core {
    pub(crate) snapshots: watch::Receiver<Arc<Snapshot>>,
    pub(crate) names: Arc<Names>,
    pub(crate) limits: XdsLimits,
    pub(crate) callbacks: Arc<dyn Callbacks>,
    pub(super) connections: Option<Arc<Connections>>,
    pub(crate) streams: Streams,
    /// `--request-buffer-bytes`, as permits of one byte.
    pub(crate) request_budget: Arc<Semaphore>,
    /// Names subscribed over all streams (`--max-subscriptions`).
    pub(crate) subscriptions: AtomicUsize,
    /// Bytes the streams keep between requests (`--max-retained-bytes`).
    pub(crate) retained: Arc<RetainedBudget>,
}

/// The open streams.
#[derive(Default)]
pub(crate) struct Streams {
    pub(super) next_id: AtomicU64,
    pub(super) open: AtomicUsize,
    map: Mutex<HashMap<u64, Arc<StreamShared>>>,
}

impl Streams {
    pub(super) fn map(&self) -> MutexGuard<'_, HashMap<u64, Arc<StreamShared>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every open stream, at this moment.
    pub(crate) fn list(&self) -> Vec<Arc<StreamShared>> {
        self.map().values().cloned().collect()
    }

    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

/// One stream, as its request task, its body and the fan-out see it.
pub(crate) struct StreamShared {
    pub(super) id: u64,
    pub(crate) api: &'static str,
    pub(crate) peer: String,
    pub(crate) node: Mutex<String>,
    pub(crate) state: Mutex<StreamState>,
    /// Its names counted in `Core::subscriptions`.
    pub(super) counted: AtomicUsize,
    /// The body's waker: a response may be due.
    pub(crate) wake: AtomicWaker,
    /// How the stream ends, once its request side has ended.
    pub(super) end: Mutex<Option<Status>>,
    /// Since when a taken response has been partly handed to HTTP/2.
    pub(crate) sending_since: Mutex<Option<Instant>>,
    /// Until when the stream's last wait for its share of the response
    /// work lasted (`--max-stream-send-rate`): a response due is not late
    /// (`--send-timeout`) before then.
    pub(crate) held_until: Mutex<Option<Instant>>,
    /// The body is gone: the request task stops.
    pub(super) closed: Notify,
    /// Cut by the send timeout (counted once).
    pub(crate) cut: AtomicBool,
    pub(crate) conn: Option<Arc<Conn>>,
}

impl StreamShared {
    pub(crate) fn state(&self) -> MutexGuard<'_, StreamState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn node(&self) -> String {
        self.node.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn sending_since(&self) -> Option<Instant> {
        *self.sending_since.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn set_sending_since(&self, t: Option<Instant>) {
        *self.sending_since.lock().unwrap_or_else(|p| p.into_inner()) = t;
    }

    pub(crate) fn held_until(&self) -> Option<Instant> {
        *self.held_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn set_held_until(&self, t: Instant) {
        *self.held_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
    }

    /// Ends the stream with `status` once the response in flight is out.
    pub(crate) fn end_with(&self, status: Status) {
        *self.end.lock().unwrap_or_else(|p| p.into_inner()) = Some(status);
        self.wake.wake();
    }
}

/// The xDS services over the published snapshots.
#[derive(Clone)]
pub struct XdsServer {
    pub(crate) core: Arc<Core>,
}

impl XdsServer {
    /// `names`: the resources served (the `--cluster` names);
    /// `connections`: the listener's, for the per-connection stream limit
    /// and the send timeout's cut (`None`: neither).
    pub fn new(
        snapshots: watch::Receiver<Arc<Snapshot>>,
        names: Names,
        limits: XdsLimits,
        callbacks: Arc<dyn Callbacks>,
        connections: Option<Arc<Connections>>,
    ) -> XdsServer {
        callbacks.limit_set(limit::MAX_STREAMS, limits.max_streams as i64);
        callbacks.limit_set(limit::MAX_RESOURCE_NAMES, limits.max_resource_names as i64);
        callbacks.limit_set(limit::MAX_REQUEST_BYTES, limits.max_request_bytes as i64);
        callbacks.limit_set(limit::MAX_RESPONSE_BYTES, limits.max_response_bytes as i64);
        callbacks.limit_set(
            limit::REQUEST_BUFFER_BYTES,
            limits.request_buffer_bytes as i64,
        );
        let request_budget = Arc::new(Semaphore::new(
            limits.request_buffer_bytes.min(Semaphore::MAX_PERMITS),
        ));
        callbacks.limit_set(limit::SEND_TIMEOUT, limits.send_timeout.as_secs() as i64);
        callbacks.limit_set(limit::MAX_SUBSCRIPTIONS, limits.max_subscriptions as i64);
        callbacks.limit_set(
            limit::MAX_STREAMS_PER_PEER,
            limits.max_streams_per_peer as i64,
        );
        callbacks.limit_set(
            limit::FIRST_REQUEST_TIMEOUT,
            limits.first_request_timeout.as_secs() as i64,
        );
        callbacks.limit_set(
            limit::REQUEST_RECEIVE_TIMEOUT,
            limits.request_receive_timeout.as_secs() as i64,
        );
        callbacks.limit_set(
            limit::REQUEST_BUFFER_BYTES_PER_PEER,
            limits.request_buffer_bytes_per_peer as i64,
        );
        callbacks.limit_set(limit::MAX_NAME_BYTES, limits.max_name_bytes as i64);
        callbacks.limit_set(
            limit::MAX_STREAM_RETAINED_BYTES,
            limits.max_stream_retained_bytes as i64,
        );
        callbacks.limit_set(limit::MAX_RETAINED_BYTES, limits.max_retained_bytes as i64);
        callbacks.limit_set(
            limit::MAX_STREAM_SEND_RATE,
            i64::try_from(limits.max_stream_send_rate).unwrap_or(i64::MAX),
        );
        callbacks.limit_set(
            limit::MAX_STREAM_SEND_BURST,
            i64::try_from(limits.max_stream_send_burst).unwrap_or(i64::MAX),
        );
        callbacks.limit_set(
            limit::MAX_STREAM_REQUEST_RATE,
            i64::try_from(limits.max_stream_request_rate).unwrap_or(i64::MAX),
        );
        callbacks.limit_set(
            limit::MAX_STREAM_REQUEST_BURST,
            i64::try_from(limits.max_stream_request_burst).unwrap_or(i64::MAX),
        );
        let retained = Arc::new(RetainedBudget::new(
            limits.max_name_bytes,
            limits.max_stream_retained_bytes,
            limits.max_retained_bytes,
        ));
        XdsServer {
            core: Arc::new(Core {
                snapshots,
                names: Arc::new(names),
                limits,
                callbacks,
                connections,
                streams: Streams::default(),
                request_budget,
                subscriptions: AtomicUsize::new(0),
                retained,
            }),
        }
    }

    /// xDS streams open.
    pub fn streams(&self) -> usize {
        self.core.streams.open()
    }

    /// Names subscribed over all streams.
    pub fn subscriptions(&self) -> usize {
        self.core.subscriptions.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::eds::assignment::CLA_TYPE_URL;
    use crate::eds::snapshot::{Resource, Table};
    use crate::xds::requests;
    use crate::xds::routing::{ads, eds, ADS, EDS};
    use bytes::{Bytes, BytesMut};
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    };
    use http_body::Frame;
    use http_body_util::BodyExt;
    use prost::Message;
    use std::time::SystemTime;
    use tokio::sync::mpsc;
    use tonic::body::Body;

    /// What the server reported, for the tests.
    #[derive(Default)]
    struct Recorder {
        events: Mutex<Vec<String>>,
    }

    impl Recorder {
        fn push(&self, e: String) {
            self.events.lock().unwrap().push(e);
        }
        fn has(&self, prefix: &str) -> bool {
            self.events
                .lock()
                .unwrap()
                .iter()
                .any(|e| e.starts_with(prefix))
        }
    }

    impl Callbacks for Recorder {
        fn limit_set(&self, _: &'static str, _: i64) {}
        fn limit_hit(&self, limit: &'static str) {
            self.push(format!("limit_hit {limit}"));
        }
        fn stream_refused(&self, limit: &'static str) {
            self.push(format!("refused {limit}"));
        }
        fn stream_opened(&self) {
            self.push("opened".into());
        }
        fn stream_identified(&self, node: &str, _: &str) {
            self.push(format!("identified {node}"));
        }
        fn stream_closed(&self, _: &str) {
            self.push("closed".into());
        }
        fn request_received(&self, _: usize) {}
        fn request_buffer_bytes(&self, _: usize) {}
        fn unknown_names(&self, n: usize) {
            self.push(format!("unknown {n}"));
        }
        fn response_started(&self, resources: usize, _: &[Duration]) {
            self.push(format!("started {resources}"));
        }
        fn response_sent(&self, _: usize) {}
        fn acked(&self, node: &str, _: &str, _: &str, _: Option<Duration>) {
            self.push(format!("acked {node}"));
        }
        fn nacked(&self, _: &str, _: &str, _: &str, _: &str) {}
        fn programmed(&self, _: &str, triggers: &[SystemTime]) {
            self.push(format!("programmed {}", triggers.len()));
        }
        fn subscriptions(&self, _: usize) {}
        fn coalesced(&self) {}
        fn oldest_unsent(&self, _: Duration) {}
        fn subscribers(&self, _: &str, _: i64) {}
        fn stream_reset(&self, _: &'static str) {}
        fn send_held(&self, node: &str, _: Duration) {
            self.push(format!("held {node}"));
        }
        fn request_held(&self, node: &str, _: Duration) {
            self.push(format!("request_held {node}"));
        }
    }

    fn snapshot(table: &Arc<Table>, seq: u64, names: &[(&str, u64)]) -> Arc<Snapshot> {
        let rs: Vec<Arc<Resource>> = names
            .iter()
            .map(|(n, v)| {
                Arc::new(Resource::new(
                    n,
                    *v,
                    format!("{n}@{v}").as_bytes(),
                    1,
                    Instant::now(),
                ))
            })
            .collect();
        table.put(&rs, &[]);
        Arc::new(Snapshot {
            version: format!("v{seq}"),
            ready: true,
            table: table.clone(),
            seq,
            after: seq - 1,
            changed: Arc::from(rs.iter().map(|r| r.hash).collect::<Vec<_>>()),
        })
    }

    /// How a stream ended: `<grpc-status> <grpc-message>`.
    #[derive(Debug)]
    struct Ended(String);

    struct Client {
        tx: mpsc::Sender<Result<Frame<Bytes>, Status>>,
        body: Body,
        buf: BytesMut,
        /// A trailers-only answer's status.
        status: Option<String>,
    }

    impl Client {
        async fn send(&self, msg: &impl Message) {
            let mut b = BytesMut::new();
            b.extend_from_slice(&[0]);
            b.extend_from_slice(&(msg.encoded_len() as u32).to_be_bytes());
            msg.encode(&mut b).unwrap();
            self.tx.send(Ok(Frame::data(b.freeze()))).await.unwrap();
        }

        /// The next message, or the trailers' grpc-status when the stream ends.
        async fn next(&mut self) -> Result<Bytes, Ended> {
            if let Some(s) = self.status.take() {
                return Err(Ended(s));
            }
            loop {
                if let Some(m) = requests::next_message(&mut self.buf, usize::MAX).unwrap() {
                    return Ok(m);
                }
                let frame = tokio::time::timeout(Duration::from_secs(5), self.body.frame())
                    .await
                    .expect("a frame within 5 s")
                    .expect("the stream goes on")
                    .unwrap();
                match frame.into_data() {
                    Ok(d) => self.buf.extend_from_slice(&d),
                    Err(f) => {
                        let t = f.into_trailers().unwrap();
                        return Err(Ended(format!(
                            "{} {}",
                            t.get("grpc-status").unwrap().to_str().unwrap(),
                            t.get("grpc-message")
                                .map(|m| m.to_str().unwrap().to_string())
                                .unwrap_or_default()
                        )));
                    }
                }
            }
        }
    }

    async fn open(server: &XdsServer, path: &str) -> Client {
        let (tx, rx) = mpsc::channel(8);
        let body = Body::new(http_body_util::StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ));
        let req = http::Request::builder()
            .uri(format!("http://xds{path}"))
            .body(body)
            .unwrap();
        let (svc, m) = path.trim_start_matches('/').split_once('/').unwrap();
        let resp = if svc == ADS {
            ads(&server.core, req)
        } else {
            eds(&server.core, req)
        };
        let _ = m;
        let resp = resp.await.unwrap();
        let status = resp.headers().get("grpc-status").map(|code| {
            format!(
                "{} {}",
                code.to_str().unwrap(),
                resp.headers()
                    .get("grpc-message")
                    .map(|m| m.to_str().unwrap().to_string())
                    .unwrap_or_default()
            )
        });
        Client {
            tx,
            body: resp.into_body(),
            buf: BytesMut::new(),
            status,
        }
    }

    fn server(
        limits: XdsLimits,
    ) -> (
        XdsServer,
        watch::Sender<Arc<Snapshot>>,
        Arc<Recorder>,
        Arc<Table>,
    ) {
        let table = Arc::new(Table::default());
        let (tx, rx) = watch::channel(snapshot(&table, 1, &[("a", 1), ("b", 2)]));
        let rec = Arc::new(Recorder::default());
        let s = XdsServer::new(rx, Names::new(["a", "b"]), limits, rec.clone(), None);
        (s, tx, rec, table)
    }

    fn sotw(names: &[&str], nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            node: Some(Node {
                id: "envoy-1".into(),
                ..Default::default()
            }),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            type_url: CLA_TYPE_URL.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_state_of_the_world_stream_subscribes_is_answered_and_acks_a_change() {
        let (s, tx, rec, table) = server(XdsLimits::default());
        tokio::spawn(s.clone().run_fanout());
        let mut c = open(&s, &format!("/{ADS}/StreamAggregatedResources")).await;
        c.send(&sotw(&["a", "b"], "")).await;
        let r = DiscoveryResponse::decode(c.next().await.unwrap()).unwrap();
        assert_eq!(r.resources.len(), 2);
        assert!(rec.has("identified envoy-1"));
        c.send(&sotw(&["a", "b"], &r.nonce)).await;
        // A change to b: b alone, and its ACK times it.
        tx.send_replace(snapshot(&table, 2, &[("b", 7)]));
        let r2 = DiscoveryResponse::decode(c.next().await.unwrap()).unwrap();
        assert_eq!(r2.resources.len(), 1);
        assert_eq!(r2.resources[0].value, b"b@7");
        c.send(&sotw(&["a", "b"], &r2.nonce)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(rec.has("programmed 1"));
        assert_eq!(s.subscriptions(), 2);
    }

    #[tokio::test]
    async fn a_repeated_ack_gets_every_assignment_under_a_new_nonce() {
        let (s, _tx, rec, _table) = server(XdsLimits::default());
        let mut c = open(&s, &format!("/{ADS}/StreamAggregatedResources")).await;
        c.send(&sotw(&["a", "b"], "")).await;
        let r = DiscoveryResponse::decode(c.next().await.unwrap()).unwrap();
        let mut ack = sotw(&["a", "b"], &r.nonce);
        ack.version_info = r.version_info.clone();
        c.send(&ack).await;
        // Envoy re-created a cluster: its last ACK again.
        c.send(&ack).await;
        let r2 = DiscoveryResponse::decode(c.next().await.unwrap()).unwrap();
        assert_eq!(r2.resources.len(), 2);
        assert_ne!(r2.nonce, r.nonce);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let acks = rec
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.starts_with("acked"))
            .count();
        assert_eq!(acks, 1, "the repeat is not counted as an ACK");
    }

    #[tokio::test]
    async fn a_delta_stream_gets_removed_for_names_not_served() {
        let (s, _tx, rec, _table) = server(XdsLimits::default());
        let mut c = open(&s, &format!("/{ADS}/DeltaAggregatedResources")).await;
        c.send(&DeltaDiscoveryRequest {
            type_url: CLA_TYPE_URL.into(),
            resource_names_subscribe: vec!["a".into(), "nope".into()],
            ..Default::default()
        })
        .await;
        let r = DeltaDiscoveryResponse::decode(c.next().await.unwrap()).unwrap();
        assert_eq!(r.resources.len(), 1);
        assert_eq!(r.resources[0].name, "a");
        assert_eq!(r.removed_resources, ["nope"]);
        assert!(rec.has("unknown 1"));
        // A plain EDS delta stream too.
        let mut e = open(&s, &format!("/{EDS}/DeltaEndpoints")).await;
        e.send(&DeltaDiscoveryRequest {
            type_url: CLA_TYPE_URL.into(),
            resource_names_subscribe: vec!["b".into()],
            ..Default::default()
        })
        .await;
        let r = DeltaDiscoveryResponse::decode(e.next().await.unwrap()).unwrap();
        assert_eq!(r.resources[0].name, "b");
    }

    #[tokio::test]
    async fn limits_end_streams_with_resource_exhausted_naming_the_flag() {
        let limits = XdsLimits {
            max_resource_names: 1,
            max_streams: 1,
            ..XdsLimits::default()
        };
        let (s, _tx, rec, _table) = server(limits);
        let mut c = open(&s, &format!("/{EDS}/StreamEndpoints")).await;
        // A second stream is over --max-streams.
        let mut refused = open(&s, &format!("/{ADS}/StreamAggregatedResources")).await;
        let status = refused.next().await.unwrap_err().0;
        assert!(
            status.starts_with("8 ") && status.contains("max-streams"),
            "{status}"
        );
        c.send(&sotw(&["a", "b"], "")).await;
        let status = c.next().await.unwrap_err().0;
        assert!(
            status.starts_with("8 ") && status.contains("--max-resource-names"),
            "{status}"
        );
        assert!(rec.has("limit_hit max-resource-names"));
        assert!(rec.has("refused max-streams"));
    }

    /// The unary FetchEndpoints holds nothing: it is answered UNIMPLEMENTED
    /// before its request is read, however large it announces itself.
    #[tokio::test]
    async fn fetch_endpoints_is_unimplemented_and_reads_nothing() {
        let (s, _tx, rec, _table) = server(XdsLimits::default());
        let mut c = open(&s, &format!("/{EDS}/FetchEndpoints")).await;
        let status = c.next().await.unwrap_err().0;
        assert!(
            status.starts_with("12 ") && status.contains("StreamEndpoints"),
            "{status}"
        );
        assert_eq!(
            s.core.request_budget.available_permits(),
            XdsLimits::default().request_buffer_bytes
        );
        assert_eq!(s.streams(), 0);
        assert!(!rec.has("opened"));
    }

    /// A stream whose first request does not come in time ends with
    /// DEADLINE_EXCEEDED naming the flag; so does one whose message, begun,
    /// is not complete in time.
    #[tokio::test]
    async fn deadlines_end_streams_that_do_not_send_their_requests() {
        let limits = XdsLimits {
            first_request_timeout: Duration::from_millis(200),
            request_receive_timeout: Duration::from_millis(200),
            ..XdsLimits::default()
        };
        let (s, _tx, rec, _table) = server(limits);
        let mut idle = open(&s, &format!("/{ADS}/StreamAggregatedResources")).await;
        let status = idle.next().await.unwrap_err().0;
        assert!(
            status.starts_with("4 ") && status.contains("--first-request-timeout"),
            "{status}"
        );
        let mut half = open(&s, &format!("/{ADS}/StreamAggregatedResources")).await;
        half.send(&sotw(&["a"], "")).await;
        DiscoveryResponse::decode(half.next().await.unwrap()).unwrap();
        let mut head = BytesMut::new();
        head.extend_from_slice(&[0, 0, 0, 1, 0]);
        head.extend_from_slice(&[0x0a; 100]);
        half.tx.send(Ok(Frame::data(head.freeze()))).await.unwrap();
        let status = half.next().await.unwrap_err().0;
        assert!(
            status.starts_with("4 ") && status.contains("--request-receive-timeout"),
            "{status}"
        );
        assert!(rec.has("limit_hit first-request-timeout"));
        assert!(rec.has("limit_hit request-receive-timeout"));
    }

    /// A client that keeps asking for responses spends its stream's send
    /// budget and waits on itself: another stream's push goes at once,
    /// and the held stream then gets the newest state in one response.
    #[tokio::test]
    async fn a_churning_stream_waits_for_its_send_budget_and_another_stream_does_not() {
        // Waits of up to 3 s (a 300-byte response at 100 bytes a second),
        // longer than the send timeout: a wait is not a stream that does
        // not read.
        let limits = XdsLimits {
            max_stream_send_rate: 100,
            max_stream_send_burst: 1000,
            send_timeout: Duration::from_secs(2),
            ..XdsLimits::default()
        };
        let (s, tx, rec, table) = server(limits);
        tokio::spawn(s.clone().run_fanout());
        let mut quiet = open(&s, &format!("/{ADS}/StreamAggregatedResources")).await;
        quiet.send(&sotw(&["a"], "")).await;
        let r = DiscoveryResponse::decode(quiet.next().await.unwrap()).unwrap();
        quiet.send(&sotw(&["a"], &r.nonce)).await;
        let mut churner = open(&s, &format!("/{ADS}/DeltaAggregatedResources")).await;
        let churn = |nonce: String| DeltaDiscoveryRequest {
            node: Some(Node {
                id: "churner".into(),
                ..Default::default()
            }),
            type_url: CLA_TYPE_URL.into(),
            resource_names_subscribe: vec!["a".into(), "b".into()],
            response_nonce: nonce,
            ..Default::default()
        };
        // Subscribing again and again: every request is answered in full,
        // until the burst is spent and a response waits.
        let mut nonce = String::new();
        let mut answered = 0;
        while !rec.has("held churner") {
            assert!(
                answered < 20,
                "1,000 bytes of burst spent within 20 responses"
            );
            churner.send(&churn(nonce)).await;
            let r = DeltaDiscoveryResponse::decode(churner.next().await.unwrap()).unwrap();
            assert_eq!(r.resources.len(), 2, "a response waits, it is never cut");
            nonce = r.nonce;
            answered += 1;
        }
        assert!(answered > 1, "the burst goes at once");
        // In debt again after the response it waited for: its ACK, then a
        // change to a.
        churner
            .send(&DeltaDiscoveryRequest {
                type_url: CLA_TYPE_URL.into(),
                response_nonce: nonce,
                ..Default::default()
            })
            .await;
        tx.send_replace(snapshot(&table, 2, &[("a", 2)]));
        let r = DiscoveryResponse::decode(quiet.next().await.unwrap()).unwrap();
        assert_eq!(r.resources[0].value, b"a@2", "the quiet stream's push");
        assert!(!rec.has("held envoy-1"), "the quiet stream never waits");
        assert!(
            tokio::time::timeout(Duration::from_millis(300), churner.next())
                .await
                .is_err(),
            "the churner waits for its budget"
        );
        // Changes coalesce while it waits: it gets the newest, once.
        tx.send_replace(snapshot(&table, 3, &[("a", 3)]));
        let r = DeltaDiscoveryResponse::decode(churner.next().await.unwrap()).unwrap();
        assert_eq!(r.resources.len(), 1);
        assert_eq!(r.resources[0].name, "a");
        assert_eq!(
            r.resources[0].resource.as_ref().unwrap().value,
            b"a@3".to_vec()
        );
        // Its waits, longer than --send-timeout, are not a stream that
        // does not read.
        assert!(!rec.has("limit_hit send-timeout"));
        assert!(s.streams() == 2);
    }

    /// A client whose requests change more names than its share is not
    /// read for a while (only its own requests and ACKs wait); another
    /// stream's push and ACK go on meanwhile.
    #[tokio::test]
    async fn a_stream_whose_requests_change_too_many_names_waits_and_another_does_not() {
        let limits = XdsLimits {
            max_stream_request_rate: 1000,
            max_stream_request_burst: 100,
            ..XdsLimits::default()
        };
        let (s, tx, rec, table) = server(limits);
        tokio::spawn(s.clone().run_fanout());
        let mut quiet = open(&s, &format!("/{ADS}/StreamAggregatedResources")).await;
        quiet.send(&sotw(&["a"], "")).await;
        let r = DiscoveryResponse::decode(quiet.next().await.unwrap()).unwrap();
        quiet.send(&sotw(&["a"], &r.nonce)).await;
        let mut churner = open(&s, &format!("/{ADS}/DeltaAggregatedResources")).await;
        // 10 names of 50 bytes and "a": 529 bytes of names (8 more each),
        // over the burst of 100: the next request waits ~0.4 s.
        let mut names: Vec<String> = (0..10).map(|i| format!("{i:050}")).collect();
        names.push("a".into());
        churner
            .send(&DeltaDiscoveryRequest {
                node: Some(Node {
                    id: "churner".into(),
                    ..Default::default()
                }),
                type_url: CLA_TYPE_URL.into(),
                resource_names_subscribe: names,
                ..Default::default()
            })
            .await;
        let r = DeltaDiscoveryResponse::decode(churner.next().await.unwrap()).unwrap();
        assert_eq!(r.removed_resources.len(), 10, "answered at once");
        // Its ACK, subscribing b too: not read until the debt is paid.
        churner
            .send(&DeltaDiscoveryRequest {
                type_url: CLA_TYPE_URL.into(),
                resource_names_subscribe: vec!["b".into()],
                response_nonce: r.nonce,
                ..Default::default()
            })
            .await;
        tx.send_replace(snapshot(&table, 2, &[("a", 2)]));
        let r = DiscoveryResponse::decode(quiet.next().await.unwrap()).unwrap();
        assert_eq!(r.resources[0].value, b"a@2", "the quiet stream's push");
        quiet.send(&sotw(&["a"], &r.nonce)).await;
        assert!(
            tokio::time::timeout(Duration::from_millis(150), churner.next())
                .await
                .is_err(),
            "the churner's ACK is not read yet: nothing more is sent to it"
        );
        assert!(rec.has("request_held churner"));
        assert!(rec.has("programmed 1"), "the quiet stream's ACK was read");
        assert!(!rec.has("request_held envoy-1"));
        // Then its request is read: a's change and b, in one response.
        let r = DeltaDiscoveryResponse::decode(churner.next().await.unwrap()).unwrap();
        let mut got: Vec<_> = r.resources.iter().map(|x| x.name.as_str()).collect();
        got.sort_unstable();
        assert_eq!(got, ["a", "b"]);
    }

    #[tokio::test]
    async fn a_delta_stream_over_a_byte_limit_ends_and_gives_its_bytes_back() {
        let limits = XdsLimits {
            max_name_bytes: 16,
            ..XdsLimits::default()
        };
        let (s, _tx, rec, _table) = server(limits);
        let mut c = open(&s, &format!("/{ADS}/DeltaAggregatedResources")).await;
        c.send(&DeltaDiscoveryRequest {
            type_url: CLA_TYPE_URL.into(),
            resource_names_subscribe: vec!["a".into(), "nope".into()],
            ..Default::default()
        })
        .await;
        let r = DeltaDiscoveryResponse::decode(c.next().await.unwrap()).unwrap();
        assert_eq!(r.removed_resources, ["nope"]);
        assert!(s.core.retained.total() > 0);
        c.send(&DeltaDiscoveryRequest {
            type_url: CLA_TYPE_URL.into(),
            resource_names_subscribe: vec!["n".repeat(17)],
            response_nonce: r.nonce,
            ..Default::default()
        })
        .await;
        let status = c.next().await.unwrap_err().0;
        assert!(
            status.starts_with("8 ") && status.contains("--max-name-bytes"),
            "{status}"
        );
        assert!(rec.has("limit_hit max-name-bytes"));
        drop(c);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            s.core.retained.total(),
            0,
            "the ended stream's bytes are back"
        );
    }

    #[tokio::test]
    async fn unknown_methods_are_unimplemented() {
        let (s, _tx, _rec, _table) = server(XdsLimits::default());
        let mut c = open(&s, &format!("/{ADS}/NoSuchMethod")).await;
        let status = c.next().await.unwrap_err().0;
        assert!(status.starts_with("12 "), "{status}");
    }
}
