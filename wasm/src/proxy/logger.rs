//! The `log` backend: Envoy's log, each line prefixed with the filter's name
//! here once rather than in every message (bytes the module cannot spare).

use proxy_wasm::hostcalls;
use proxy_wasm::types::LogLevel;

struct Logger;

static LOGGER: Logger = Logger;

/// Installs the logger; `sync_log_level` then follows Envoy's level.
pub fn install() {
    // Only fails when a logger is set already: ours, by an earlier call.
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(log::LevelFilter::Info);
}

impl log::Log for Logger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        let level = match record.level() {
            log::Level::Trace => LogLevel::Trace,
            log::Level::Debug => LogLevel::Debug,
            log::Level::Info => LogLevel::Info,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Error => LogLevel::Error,
        };
        // Not unwrapped (as the SDK's logger does): a panic would abort the VM.
        let _ = hostcalls::log(level, &format!("serving_picker: {}", record.args()));
    }

    fn flush(&self) {}
}
