//! The refresh's `AdminApi` through proxy-wasm host calls: admin calls are
//! HTTP calls to the admin cluster, answers read from the call's response.

use super::hostcalls;
use crate::refresh::{AdminApi, CallRefused};
use proxy_wasm::hostcalls::dispatch_http_call;
use proxy_wasm::types::{BufferType, MapType};
use std::time::Duration;

pub struct HostAdmin;

impl AdminApi for HostAdmin {
    fn get(&mut self, cluster: &str, path: &str, timeout: Duration) -> Result<u32, CallRefused> {
        let headers = vec![
            (":method", "GET"),
            (":path", path),
            (":authority", cluster),
            ("accept", "application/json"),
        ];
        dispatch_http_call(cluster, headers, None, vec![], timeout)
            .map_err(|e| CallRefused(format!("{e:?}")))
    }

    fn response_status(&self) -> Option<Vec<u8>> {
        hostcalls::header(MapType::HttpCallResponseHeaders, ":status")
    }

    fn response_body(&self, size: usize) -> Option<Vec<u8>> {
        hostcalls::buffer(BufferType::HttpCallResponseBody, size)
    }

    fn now_us(&self) -> u64 {
        super::now_us()
    }
}
