//! proxy-wasm glue: thin contexts around the pure logic in the crate root.
//!
//! Every decision is in the crate root (`steer` for a request, `poller` for
//! the root context); these files translate host events and calls. Imports
//! point one way: `root` (the root context) uses `http` (a request's
//! context), and both use `worker` (what a worker's requests share).
//! `hostcalls` is the only file with raw pointers.

mod admin;
mod hostcalls;
mod http;
mod logger;
mod metrics;
mod root;
mod shared_data;
mod worker;

use proxy_wasm::traits::RootContext;
use proxy_wasm::types::LogLevel;

proxy_wasm::main! {{
    logger::install();
    // Ours names the filter.
    std::panic::set_hook(Box::new(|info| {
        let _ = proxy_wasm::hostcalls::log(LogLevel::Critical, &format!("serving_picker panicked: {info}"));
    }));
    proxy_wasm::set_root_context(|context_id| -> Box<dyn RootContext> {
        Box::new(root::PickerRoot::new(context_id))
    });
}}

/// Wall-clock microseconds from the host (for cost figures, not decisions).
pub(crate) fn now_us() -> u64 {
    proxy_wasm::hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_micros() as u64)
}

pub(crate) fn now_ms() -> u64 {
    now_us() / 1000
}

/// Follows Envoy's log level for this VM so that disabled debug lines cost
/// nothing per request.
pub(crate) fn sync_log_level() {
    let filter = match proxy_wasm::hostcalls::get_log_level() {
        Ok(LogLevel::Trace) => log::LevelFilter::Trace,
        Ok(LogLevel::Debug) => log::LevelFilter::Debug,
        Ok(LogLevel::Info) => log::LevelFilter::Info,
        Ok(LogLevel::Warn) => log::LevelFilter::Warn,
        Ok(LogLevel::Error) => log::LevelFilter::Error,
        Ok(LogLevel::Critical) => log::LevelFilter::Error,
        Err(_) => log::LevelFilter::Info,
    };
    log::set_max_level(filter);
}
