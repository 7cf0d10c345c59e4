//! Bytes a stream keeps between requests, bounded per stream and over all
//! streams: [`RetainedBudget`] (the limits and the total), [`Retained`]
//! (one stream's share, given back when the stream ends).
//!
//! What a stream keeps, and how it is bounded:
//! - its subscriptions: [`SUB_BYTES`] a name (the key, what it was sent,
//!   and its entry while due), metered here;
//! - on a delta stream, the names to answer as removed (names not served)
//!   until a response carries them: their bytes and [`NAME_OVERHEAD`]
//!   each, metered here; a name
//!   longer than `--max-name-bytes` is refused before it is kept;
//! - its node id, cut to `telemetry::status::MAX_NODE_ID` characters, and
//!   at most 8 other type URLs, each cut to [`TYPE_URL_KEPT`] bytes: a
//!   fixed bound per stream, within `--max-streams`;
//! - nonces as numbers, never as the client's text.
//!
//! A request that would take a stream over `--max-stream-retained-bytes`
//! or all streams over `--max-retained-bytes` is refused whole (nothing of
//! it is kept) and ends its stream with RESOURCE_EXHAUSTED naming the
//! flag; the refusal is counted (`limit_hits_total{limit}`) and logged at a
//! bounded rate by the server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::limits::names as limit;

/// Bytes a subscribed name costs a stream: its entry (16 bytes) and its
/// entry in the due list while due (16 more).
pub const SUB_BYTES: usize = 32;
/// Bytes a kept name costs beside its text (its `String`): a name of no
/// bytes (or not UTF-8) costs this much.
pub const NAME_OVERHEAD: usize = std::mem::size_of::<String>();
/// Bytes of a type URL the server does not serve kept (for its log line).
pub const TYPE_URL_KEPT: usize = 256;

/// A request refused by a byte limit: the limit's flag, and the message
/// the stream ends with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The limit's flag (without `--`).
    pub limit: &'static str,
    /// The RESOURCE_EXHAUSTED message.
    pub message: String,
}

/// The byte limits and what all streams keep now.
#[derive(Debug)]
pub struct RetainedBudget {
    max_name: usize,
    max_stream: usize,
    max_total: usize,
    total: AtomicUsize,
}

impl RetainedBudget {
    /// A budget of `max_total` bytes over all streams, `max_stream` per
    /// stream, names of at most `max_name` bytes.
    pub fn new(max_name: usize, max_stream: usize, max_total: usize) -> RetainedBudget {
        RetainedBudget {
            max_name,
            max_stream,
            max_total,
            total: AtomicUsize::new(0),
        }
    }

    /// No limit (tests, FetchEndpoints' one-shot state).
    pub fn unbounded() -> Arc<RetainedBudget> {
        Arc::new(RetainedBudget::new(usize::MAX, usize::MAX, usize::MAX))
    }

    /// Bytes kept over all streams now.
    pub fn total(&self) -> usize {
        self.total.load(Ordering::SeqCst)
    }

    /// A name of `len` bytes may be kept; else the refusal.
    pub fn check_name(&self, len: usize) -> Result<(), Refusal> {
        if len > self.max_name {
            return Err(Refusal {
                limit: limit::MAX_NAME_BYTES,
                message: format!(
                    "a resource name of {len} bytes is over --max-name-bytes {}",
                    self.max_name
                ),
            });
        }
        Ok(())
    }
}

/// One stream's share of a [`RetainedBudget`]; given back when dropped.
#[derive(Debug)]
pub struct Retained {
    budget: Arc<RetainedBudget>,
    held: usize,
}

impl Retained {
    /// A stream's share, holding nothing yet.
    pub fn new(budget: Arc<RetainedBudget>) -> Retained {
        Retained { budget, held: 0 }
    }

    /// Bytes this stream keeps.
    pub fn held(&self) -> usize {
        self.held
    }

    /// The budget this share is taken from.
    pub fn budget(&self) -> Arc<RetainedBudget> {
        self.budget.clone()
    }

    /// The budget's name check.
    pub fn check_name(&self, len: usize) -> Result<(), Refusal> {
        self.budget.check_name(len)
    }

    /// The stream now keeps `bytes`: taken from (or given back to) the
    /// total. Over a limit nothing changes and the refusal is returned.
    pub fn set(&mut self, bytes: usize) -> Result<(), Refusal> {
        if bytes <= self.held {
            self.budget
                .total
                .fetch_sub(self.held - bytes, Ordering::SeqCst);
            self.held = bytes;
            return Ok(());
        }
        let b = &self.budget;
        if bytes > b.max_stream {
            return Err(Refusal {
                limit: limit::MAX_STREAM_RETAINED_BYTES,
                message: format!(
                    "the stream would keep {bytes} bytes of resource names, over --max-stream-retained-bytes {}",
                    b.max_stream
                ),
            });
        }
        let more = bytes - self.held;
        let reserved = b
            .total
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                t.checked_add(more).filter(|n| *n <= b.max_total)
            });
        match reserved {
            Ok(_) => {
                self.held = bytes;
                Ok(())
            }
            Err(t) => Err(Refusal {
                limit: limit::MAX_RETAINED_BYTES,
                message: format!(
                    "xDS streams keep {t} bytes of resource names; {more} more is over --max-retained-bytes {}; retry later",
                    b.max_total
                ),
            }),
        }
    }
}

impl Drop for Retained {
    fn drop(&mut self) {
        self.budget.total.fetch_sub(self.held, Ordering::SeqCst);
    }
}

/// `s` cut to at most `max` bytes, on a character boundary.
pub fn cut_bytes(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or("")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_stream_takes_and_gives_back_within_both_limits() {
        let b = Arc::new(RetainedBudget::new(10, 100, 150));
        let mut one = Retained::new(b.clone());
        let mut two = Retained::new(b.clone());
        one.set(100).unwrap();
        assert_eq!(
            one.set(101).unwrap_err().limit,
            limit::MAX_STREAM_RETAINED_BYTES
        );
        assert_eq!(one.held(), 100, "a refusal changes nothing");
        assert_eq!(two.set(60).unwrap_err().limit, limit::MAX_RETAINED_BYTES);
        assert_eq!(b.total(), 100);
        two.set(50).unwrap();
        assert_eq!(b.total(), 150);
        one.set(20).unwrap();
        assert_eq!(b.total(), 70);
        drop(two);
        assert_eq!(b.total(), 20, "an ended stream gives its bytes back");
        drop(one);
        assert_eq!(b.total(), 0);
        assert_eq!(b.check_name(11).unwrap_err().limit, limit::MAX_NAME_BYTES);
        assert!(b.check_name(10).is_ok());
    }

    #[test]
    fn cuts_keep_whole_characters() {
        assert_eq!(cut_bytes("abc", 5), "abc");
        assert_eq!(cut_bytes("aé", 2), "a");
        assert_eq!(cut_bytes("aé", 3), "aé");
    }
}
