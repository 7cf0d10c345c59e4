//! The listener's TLS metrics.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::telemetry::metric_group;
use crate::telemetry::metrics::Labels;

use super::config::Loaded;

metric_group! {
    /// The listener's TLS metrics (prefix `serving_picker_conditions_`).
    #[derive(Clone)]
    pub(super) struct TlsMetrics {
        handshakes: Counter = ("tls_handshakes", "TLS handshakes completed on the gRPC listener"),
        refusals: Family<Labels, Counter> = ("tls_refusals", "Connections refused at the TLS handshake, by reason (no_client_cert, unknown_ca, \
             san_not_allowed, bad_client_cert, not_tls, client_alert, timeout, displaced, incomplete, other)"),
        reloads: Family<Labels, Counter> = ("tls_reloads", "Changed TLS files read, by result (ok: in use for new connections; error: the last good ones kept)"),
        cert_not_after: Gauge = ("tls_certificate_not_after_seconds", "Expiry (Unix time) of the certificate served"),
        client_ca_not_after: Gauge = ("tls_client_ca_not_after_seconds", "Earliest expiry (Unix time) of the client CAs in use"),
        plaintext_exposed: Gauge = ("grpc_plaintext_exposed", "1 when the gRPC listener is plaintext on a non-loopback address"),
    }
}

impl TlsMetrics {
    pub(super) fn loaded(&self, l: &Loaded) {
        self.cert_not_after.set(l.cert.not_after);
        self.client_ca_not_after
            .set(l.client_ca_not_after.unwrap_or_default());
    }

    pub(super) fn reload(&self, result: &'static str) {
        self.reloads.get_or_create(&vec![("result", result)]).inc();
    }
}
