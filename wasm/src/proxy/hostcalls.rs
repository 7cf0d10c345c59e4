//! Host calls that never trap. The SDK's wrappers panic on a status they do
//! not expect (seen: reading the headers of an admin call that failed), and a
//! panic aborts the VM. These return `None`/`false` instead; the ABI is
//! proxy-wasm 0.2.1, statuses read as plain integers. The glue's only raw
//! pointers are here.

// The proxy-wasm ABI's imports take raw pointers; the glue calls them only here.
#![allow(unsafe_code)]

use proxy_wasm::types::{BufferType, MapType, StreamType};
use std::ptr::null_mut;

const OK: u32 = 0;

#[link(wasm_import_module = "env")]
extern "C" {
    #[link_name = "proxy_get_header_map_value"]
    fn get_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    #[link_name = "proxy_remove_header_map_value"]
    fn remove_header_map_value(map_type: u32, key_data: *const u8, key_size: usize) -> u32;
    #[link_name = "proxy_replace_header_map_value"]
    fn replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    #[link_name = "proxy_get_property"]
    fn get_property_raw(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    #[link_name = "proxy_send_local_response"]
    fn send_local_response(
        status_code: u32,
        details_data: *const u8,
        details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    #[link_name = "proxy_close_stream"]
    fn close_stream(stream_type: u32) -> u32;
    #[link_name = "proxy_get_buffer_bytes"]
    fn get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_buffer_data: *mut *mut u8,
        return_buffer_size: *mut usize,
    ) -> u32;
}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    #[link_name = "random_get"]
    fn wasi_random_get(buf: *mut u8, len: usize) -> i32;
}

/// Fills `buf` from WASI's random source; false when it could not.
pub fn random_bytes(buf: &mut [u8]) -> bool {
    // SAFETY: WASI writes at most `len` bytes into the buffer it is given.
    unsafe { wasi_random_get(buf.as_mut_ptr(), buf.len()) == 0 }
}

/// Takes ownership of memory the host allocated through the SDK's exported allocator.
fn owned(data: *mut u8, size: usize) -> Option<Vec<u8>> {
    if data.is_null() {
        return None;
    }
    // SAFETY: the host filled `data` with `size` bytes from proxy_on_memory_allocate,
    // which allocates with this module's global allocator.
    Some(unsafe { Vec::from_raw_parts(data, size, size) })
}

/// The first value of a header; `None` only when the header is absent (or the
/// call failed). An empty first value is `Some` of no bytes: the host hands
/// back a null pointer for it, with status OK, and that still means present.
pub fn header(map: MapType, name: &str) -> Option<Vec<u8>> {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: valid pointers to a string and two out-parameters.
    let status = unsafe {
        get_header_map_value(map as u32, name.as_ptr(), name.len(), &mut data, &mut size)
    };
    if status == OK {
        Some(owned(data, size).unwrap_or_default())
    } else {
        None
    }
}

/// Whether a header is there, whatever its first value (an empty one included).
pub fn has_header(map: MapType, name: &str) -> bool {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: valid pointers to a string and two out-parameters.
    let status = unsafe {
        get_header_map_value(map as u32, name.as_ptr(), name.len(), &mut data, &mut size)
    };
    // The value, if any, is the module's to free.
    drop(owned(data, size));
    crate::steer::header_answer_present(status)
}

pub fn remove_header(map: MapType, name: &str) -> bool {
    // SAFETY: a valid pointer and length.
    unsafe { remove_header_map_value(map as u32, name.as_ptr(), name.len()) == OK }
}

pub fn replace_header(map: MapType, name: &str, value: &str) -> bool {
    // SAFETY: valid pointers and lengths.
    unsafe {
        replace_header_map_value(
            map as u32,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        ) == OK
    }
}

/// A property by its path, segments separated by NUL as the ABI wants (`b"xds\0cluster_name"`).
pub fn property(path: &[u8]) -> Option<Vec<u8>> {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: valid pointers to the path and two out-parameters.
    let status = unsafe { get_property_raw(path.as_ptr(), path.len(), &mut data, &mut size) };
    if status == OK {
        owned(data, size)
    } else {
        None
    }
}

pub fn buffer(buffer: BufferType, max_size: usize) -> Option<Vec<u8>> {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: valid out-parameters.
    let status = unsafe { get_buffer_bytes(buffer as u32, 0, max_size, &mut data, &mut size) };
    if status == OK {
        owned(data, size)
    } else {
        None
    }
}

/// Resets the effective context's stream (Envoy: `encoder_callbacks_->resetStream()`, a local
/// reset); false when the host refused.
pub fn reset_response() -> bool {
    // SAFETY: no pointers; 1 is the ABI's HttpResponse stream type.
    unsafe { close_stream(StreamType::HttpResponse as u32) == OK }
}

/// The ABI's header map: count, (name length, value length) pairs, then NUL-terminated names and values.
fn serialize_map(map: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        4 + map
            .iter()
            .map(|(k, v)| k.len() + v.len() + 10)
            .sum::<usize>(),
    );
    out.extend_from_slice(&(map.len() as u32).to_le_bytes());
    for (name, value) in map {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    }
    for (name, value) in map {
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.extend_from_slice(value.as_bytes());
        out.push(0);
    }
    out
}

/// A local reply; `details` shows in Envoy's %RESPONSE_CODE_DETAILS%.
pub fn local_response(status: u32, details: &str, headers: &[(&str, &str)], body: &[u8]) -> bool {
    let map = serialize_map(headers);
    // SAFETY: valid pointers and lengths for the call's duration.
    unsafe {
        send_local_response(
            status,
            details.as_ptr(),
            details.len(),
            body.as_ptr(),
            body.len(),
            map.as_ptr(),
            map.len(),
            -1,
        ) == OK
    }
}
