//! A request's context: `steer` decides, through `EnvoyRequest` (the
//! request's host calls); a held request waits in the worker.

use super::hostcalls;
use super::worker::Worker;
use crate::drain::Protocol;
use crate::steer::{RequestHost, Verdict};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, MapType};
use std::rc::Rc;

/// `xds.cluster_name` as the ABI's NUL-separated property path.
const CLUSTER_NAME: &[u8] = b"xds\0cluster_name";
/// The host the response came from (`IP:PORT`).
const UPSTREAM_ADDRESS: &[u8] = b"upstream\0address";
/// `HTTP/1.1`, `HTTP/2`, `HTTP/3`.
const REQUEST_PROTOCOL: &[u8] = b"request\0protocol";

/// The current request (the effective context) through host calls.
pub struct EnvoyRequest;

impl RequestHost for EnvoyRequest {
    fn cluster_name(&mut self) -> Option<Vec<u8>> {
        hostcalls::property(CLUSTER_NAME)
    }

    fn has_header(&mut self, name: &str) -> bool {
        hostcalls::has_header(MapType::HttpRequestHeaders, name)
    }

    fn remove_header(&mut self, name: &str) -> bool {
        hostcalls::remove_header(MapType::HttpRequestHeaders, name)
    }

    fn replace_header(&mut self, name: &str, value: &str) -> bool {
        hostcalls::replace_header(MapType::HttpRequestHeaders, name, value)
    }

    fn local_response(
        &mut self,
        status: u32,
        details: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> bool {
        hostcalls::local_response(status, details, headers, body)
    }
}

pub struct PickerHttp {
    worker: Rc<Worker>,
    context_id: u32,
    /// With `drain_window_ms`: the request's protocol, read with its headers (Envoy no longer
    /// serves them when the response starts).
    protocol: Option<Protocol>,
}

impl PickerHttp {
    pub fn new(worker: Rc<Worker>, context_id: u32) -> PickerHttp {
        PickerHttp {
            worker,
            context_id,
            protocol: None,
        }
    }
}

impl PickerHttp {
    /// With `drain_window_ms` set, registers the stream whose response starts now: its cluster,
    /// the host it came from, its protocol. A few host calls per response, none without drain.
    fn register_stream(&self) {
        let Some(drain) = &self.worker.drain else {
            return;
        };
        let (Some(cluster), Some(address)) = (
            hostcalls::property(CLUSTER_NAME),
            hostcalls::property(UPSTREAM_ADDRESS),
        ) else {
            return;
        };
        let (Ok(cluster), Ok(address)) = (String::from_utf8(cluster), String::from_utf8(address))
        else {
            return;
        };
        if !self.worker.steering.config.manages(&cluster) {
            return;
        }
        let protocol = self.protocol.unwrap_or(Protocol::Http2);
        drain
            .borrow_mut()
            .open(self.context_id, cluster, address, super::now_ms(), protocol);
    }
}

impl Context for PickerHttp {
    fn on_done(&mut self) -> bool {
        if let Some(drain) = &self.worker.drain {
            drain.borrow_mut().close(self.context_id);
        }
        true
    }
}

impl HttpContext for PickerHttp {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        if self.worker.drain.is_some() {
            self.protocol = Some(Protocol::of(
                hostcalls::header(MapType::HttpRequestHeaders, "content-type").as_deref(),
                hostcalls::header(MapType::HttpRequestHeaders, "upgrade").as_deref(),
                &hostcalls::property(REQUEST_PROTOCOL).unwrap_or_default(),
            ));
        }
        match self.worker.steering.request(&mut EnvoyRequest, true) {
            Verdict::Continue => Action::Continue,
            Verdict::Pause => Action::Pause,
            Verdict::Hold => {
                self.worker.hold(self.context_id);
                Action::Pause
            }
        }
    }

    fn on_http_response_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        // A response that ends with its headers holds nothing open.
        if !end_of_stream {
            self.register_stream();
        }
        Action::Continue
    }
}
