//! Watching directories for changed files, for the slices directory and
//! the TLS files alike.
//!
//! A directory is watched non-recursively through `notify` (inotify on
//! Linux), which sees files written, renamed into place, removed, and a
//! Secret volume's `..data` symlink swapped. Events that come in a burst
//! (a rename is several; a Secret update touches several names; a file
//! written in parts) are debounced by `notify-debouncer-mini` into one
//! change, `settle` after the burst's first event (longer while a file
//! keeps changing). A timer also reports a change every `every` as a
//! safety net (events can be lost: a full inotify queue, a network file
//! system), and once at once. The caller reads what it watches after each
//! change and compares with what it read last.

use std::path::Path;
use std::time::Duration;

use notify::{RecommendedWatcher, RecursiveMode};
use notify_debouncer_mini::{new_debouncer_opt, Config, DebounceEventResult, Debouncer};
use tokio::sync::mpsc;
use tokio::time::{Interval, MissedTickBehavior};

/// Directories watched, debounced, and re-read on a timer.
pub struct Watch {
    /// `None` when polling only (no watcher could be made).
    debouncer: Option<Debouncer<RecommendedWatcher>>,
    events: mpsc::UnboundedReceiver<()>,
    tick: Interval,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("events", &self.debouncer.is_some())
            .field("every", &self.tick.period())
            .finish_non_exhaustive()
    }
}

impl Watch {
    /// A watcher of no directory yet (see `add`): a change `settle` after
    /// a burst of events begins, and every `every`. An error when the
    /// system gives no watcher (see `polling`).
    pub fn new(settle: Duration, every: Duration) -> notify::Result<Watch> {
        let (tx, events) = mpsc::unbounded_channel();
        let config = Config::default().with_timeout(settle).with_batch_mode(true);
        let debouncer =
            new_debouncer_opt::<_, RecommendedWatcher>(config, move |res: DebounceEventResult| {
                match res {
                    Ok(_) => {
                        let _ = tx.send(());
                    }
                    Err(e) => tracing::debug!(error = %e, "file watch: an error event"),
                }
            })?;
        Ok(Watch {
            debouncer: Some(debouncer),
            events,
            tick: interval(every),
        })
    }

    /// No events: a change every `every` only.
    pub fn polling(every: Duration) -> Watch {
        let (_, events) = mpsc::unbounded_channel();
        Watch {
            debouncer: None,
            events,
            tick: interval(every),
        }
    }

    /// Watches `dir` (not its subdirectories) too.
    pub fn add(&mut self, dir: &Path) -> notify::Result<()> {
        match &mut self.debouncer {
            Some(d) => d.watcher().watch(dir, RecursiveMode::NonRecursive),
            None => Err(notify::Error::generic("no file watcher: polling only")),
        }
    }

    /// Waits for the next change: a debounced burst of events or the
    /// timer (whose first tick is at once).
    pub async fn changed(&mut self) {
        tokio::select! {
            // Disabled once no event can come (polling only).
            Some(()) = self.events.recv() => {
                // Bursts already debounced while the caller was busy.
                while self.events.try_recv().is_ok() {}
            }
            _ = self.tick.tick() => {}
        }
    }
}

fn interval(every: Duration) -> Interval {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tick
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("sp-watch-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[tokio::test]
    async fn a_burst_of_writes_is_one_change_and_the_timer_ticks_without_events() {
        let d = dir("burst");
        let mut w = Watch::new(Duration::from_millis(50), Duration::from_secs(3600)).unwrap();
        w.add(&d).unwrap();
        // The timer's first tick is at once.
        tokio::time::timeout(Duration::from_secs(1), w.changed())
            .await
            .unwrap();
        for i in 0..20 {
            std::fs::write(d.join("f.yaml"), format!("{i}")).unwrap();
        }
        tokio::time::timeout(Duration::from_secs(10), w.changed())
            .await
            .expect("a change after the writes");
        // Some 40 events make one change (two when the burst outlasts the
        // first deadline: a continuing change, then its end).
        let mut more = 0;
        while tokio::time::timeout(Duration::from_millis(500), w.changed())
            .await
            .is_ok()
        {
            more += 1;
            assert!(more <= 1, "a burst makes at most two changes");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[tokio::test]
    async fn a_symlink_swap_is_seen() {
        // How a Secret volume updates: a new `..data` symlink renamed over
        // the old one.
        let d = dir("swap");
        std::fs::create_dir_all(d.join("v1")).unwrap();
        std::fs::create_dir_all(d.join("v2")).unwrap();
        std::os::unix::fs::symlink("v1", d.join("..data")).unwrap();
        let mut w = Watch::new(Duration::from_millis(50), Duration::from_secs(3600)).unwrap();
        w.add(&d).unwrap();
        w.changed().await;
        std::os::unix::fs::symlink("v2", d.join("..data_tmp")).unwrap();
        std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
        tokio::time::timeout(Duration::from_secs(10), w.changed())
            .await
            .expect("the swap is a change");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[tokio::test]
    async fn polling_only_ticks() {
        let mut w = Watch::polling(Duration::from_millis(20));
        assert!(w.add(Path::new(".")).is_err());
        for _ in 0..3 {
            tokio::time::timeout(Duration::from_secs(2), w.changed())
                .await
                .unwrap();
        }
    }
}
