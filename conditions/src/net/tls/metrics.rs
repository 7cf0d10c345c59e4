//! The listener's TLS metrics.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::telemetry::metrics::Labels;
use crate::telemetry::registered;

use super::config::Loaded;

/// The listener's TLS metrics (prefix `serving_picker_conditions_`).
#[derive(Clone)]
pub(super) struct TlsMetrics {
    pub(super) handshakes: Counter,
    pub(super) refusals: Family<Labels, Counter>,
    pub(super) reloads: Family<Labels, Counter>,
    pub(super) cert_not_after: Gauge,
    pub(super) client_ca_not_after: Gauge,
    pub(super) plaintext_exposed: Gauge,
}

impl TlsMetrics {
    pub(super) fn register(r: &mut Registry) -> TlsMetrics {
        TlsMetrics {
            handshakes: registered(
                r,
                "tls_handshakes",
                "TLS handshakes completed on the gRPC listener",
                Counter::default(),
            ),
            refusals: registered(
                r,
                "tls_refusals",
                "Connections refused at the TLS handshake, by reason (no_client_cert, unknown_ca, \
                 san_not_allowed, bad_client_cert, not_tls, client_alert, timeout, displaced, incomplete, other)",
                Family::default(),
            ),
            reloads: registered(
                r,
                "tls_reloads",
                "Changed TLS files read, by result (ok: in use for new connections; error: the last good ones kept)",
                Family::default(),
            ),
            cert_not_after: registered(
                r,
                "tls_certificate_not_after_seconds",
                "Expiry (Unix time) of the certificate served",
                Gauge::default(),
            ),
            client_ca_not_after: registered(
                r,
                "tls_client_ca_not_after_seconds",
                "Earliest expiry (Unix time) of the client CAs in use",
                Gauge::default(),
            ),
            plaintext_exposed: registered(
                r,
                "grpc_plaintext_exposed",
                "1 when the gRPC listener is plaintext on a non-loopback address",
                Gauge::default(),
            ),
        }
    }

    pub(super) fn loaded(&self, l: &Loaded) {
        self.cert_not_after.set(l.cert.not_after);
        self.client_ca_not_after
            .set(l.client_ca_not_after.unwrap_or_default());
    }

    pub(super) fn reload(&self, result: &'static str) {
        self.reloads.get_or_create(&vec![("result", result)]).inc();
    }
}
