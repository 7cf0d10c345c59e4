//! The source's metrics: its events, errors, and when it last succeeded
//! and last saw a change (what ServingPickerSourceFailing reads).

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::telemetry::metric_group;
use crate::telemetry::metrics::{unix_now, Labels};

metric_group! {
    /// The source's metrics (prefix `serving_picker_conditions_`), first in
    /// `/metrics` (`run::Telemetry`).
    #[derive(Clone)]
    pub struct SourceMetrics {
        watch_events: Family<Labels, Counter> = ("watch_events", "Events from the source, by kind (apply, delete, init, init_apply, init_done, files_reload)"),
        source_errors: Family<Labels, Counter> = ("source_errors", "Source errors, by kind (watch, file)"),
        last_success: Gauge<f64, AtomicU64> = ("source_last_success_timestamp_seconds", "Unix time of the source's last success: a full list or a watch event (Kubernetes API), a read of the slice directory (files); 0 before the first"),
        last_change: Gauge<f64, AtomicU64> = ("source_last_change_timestamp_seconds", "Unix time of the last EndpointSlice change the source saw after its first list (a watch event, a changed slice file); 0 before"),
        file_rescans: Family<Labels, Counter> = ("source_file_rescans", "Scans of the whole --slices-dir after the first, by reason (events_lost: the watcher's queue overflowed or failed; directory_changed: its mtime moved without an event; period: every 5 minutes); other changes read only the files inotify names"),
    }
}

impl SourceMetrics {
    /// One event from the source (`watch_events{kind}`).
    pub fn watch_event(&self, kind: &'static str) {
        self.watch_events.get_or_create(&vec![("kind", kind)]).inc();
    }

    /// A source starts: its errors of `kind` from 0, so that an alert on
    /// increase() sees the first one.
    pub fn started(&self, error_kind: &'static str) {
        drop(
            self.source_errors
                .get_or_create(&vec![("kind", error_kind)]),
        );
    }

    /// The source succeeded (a full list, a watch event, a directory
    /// read); `changed`: it saw a slice change after its first list.
    pub fn progress(&self, changed: bool) {
        let now = unix_now();
        self.last_success.set(now);
        if changed {
            self.last_change.set(now);
        }
    }

    /// One scan of the whole slice directory (`source_file_rescans{reason}`).
    pub fn file_rescan(&self, reason: &'static str) {
        self.file_rescans
            .get_or_create(&vec![("reason", reason)])
            .inc();
    }

    /// One error of the source (`source_errors{kind}`: `watch`, `file`).
    pub fn error(&self, kind: &'static str) {
        self.source_errors
            .get_or_create(&vec![("kind", kind)])
            .inc();
    }
}
