//! A request's context: `steer` decides, through `EnvoyRequest` (the
//! request's host calls); a held request waits in the worker.

use super::hostcalls;
use super::worker::Worker;
use crate::steer::{RequestHost, Verdict};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, MapType};
use std::rc::Rc;

/// `xds.cluster_name` as the ABI's NUL-separated property path.
const CLUSTER_NAME: &[u8] = b"xds\0cluster_name";

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
}

impl PickerHttp {
    pub fn new(worker: Rc<Worker>, context_id: u32) -> PickerHttp {
        PickerHttp { worker, context_id }
    }
}

impl Context for PickerHttp {}

impl HttpContext for PickerHttp {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        match self.worker.steering.request(&mut EnvoyRequest, true) {
            Verdict::Continue => Action::Continue,
            Verdict::Pause => Action::Pause,
            Verdict::Hold => {
                self.worker.hold(self.context_id);
                Action::Pause
            }
        }
    }
}
