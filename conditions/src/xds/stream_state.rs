//! One stream's protocol state, either protocol behind one type: what the
//! server and the fan-out hold per stream. Above `sotw` and `delta`, which
//! share `protocol` and know nothing of each other or of this.

use std::time::Instant;

use crate::eds::snapshot::Snapshot;
use crate::xds::delta::DeltaStream;
use crate::xds::protocol::{SnapshotEffect, Taken};
use crate::xds::sotw::SotwStream;

/// One stream's protocol state, either protocol.
#[derive(Debug)]
pub enum StreamState {
    /// State of the world (`StreamAggregatedResources`, `StreamEndpoints`).
    Sotw(SotwStream),
    /// Incremental (`DeltaAggregatedResources`, `DeltaEndpoints`).
    Delta(DeltaStream),
}

impl StreamState {
    /// A new snapshot was published: what it means for the stream.
    pub fn on_snapshot(&mut self, snap: &Snapshot, now: Instant) -> SnapshotEffect {
        match self {
            StreamState::Sotw(s) => s.on_snapshot(snap, now),
            StreamState::Delta(s) => s.on_snapshot(snap, now),
        }
    }

    /// The response the transport takes now, from `snap` (the newest), of at most `max` bytes.
    pub fn take(&mut self, snap: &Snapshot, max: usize, now: Instant) -> Taken {
        match self {
            StreamState::Sotw(s) => s.take(snap, max, now),
            StreamState::Delta(s) => s.take(snap, max, now),
        }
    }

    /// Since when a response has been due and not taken by the transport.
    pub fn due_since(&self) -> Option<Instant> {
        match self {
            StreamState::Sotw(s) => s.due_since(),
            StreamState::Delta(s) => s.due_since(),
        }
    }

    /// Names subscribed (served now or not).
    pub fn subscribed(&self) -> usize {
        match self {
            StreamState::Sotw(s) => s.subscriptions().len(),
            StreamState::Delta(s) => s.subscriptions().len(),
        }
    }

    /// Bytes the stream keeps between requests (`retained`).
    pub fn retained(&self) -> usize {
        match self {
            StreamState::Sotw(s) => s.retained(),
            StreamState::Delta(s) => s.retained(),
        }
    }

    /// Whether the resource keyed `hash` is subscribed.
    pub fn subscribes(&self, hash: u64) -> bool {
        match self {
            StreamState::Sotw(s) => s.subscriptions().contains(hash),
            StreamState::Delta(s) => s.subscriptions().contains(hash),
        }
    }
}
