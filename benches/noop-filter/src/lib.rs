//! A proxy-wasm HTTP filter that does nothing: every HTTP context returns
//! `Action::Continue` (the trait defaults). Used by `benches/e2e/run.sh` to
//! measure the fixed cost of running any wasm filter in Envoy, so that the
//! serving-picker module can be compared against it rather than only
//! against a plain Envoy. The root context ignores its configuration.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(NoopRoot) });
}}

struct NoopRoot;

impl Context for NoopRoot {}

impl RootContext for NoopRoot {
    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(NoopHttp))
    }
}

struct NoopHttp;

impl Context for NoopHttp {}

impl HttpContext for NoopHttp {}
