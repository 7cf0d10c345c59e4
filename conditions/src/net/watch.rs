//! How the TLS files are watched (the slice directory has its own watch,
//! `source::files_watch`, which names the files that changed): the
//! directories' changes through inotify (`notify`), settled so that a burst
//! (a rename into place, a Secret volume's `..data` symlink swap) is one
//! wake-up, plus a wake-up every `poll` as a safety net (a missed event, a
//! directory that could not be watched). The owner reads its files again on
//! each wake-up and keeps what it has when nothing changed. Opens, reads and
//! closes without writing are not changes ([`is_change`]): inotify reports
//! them, and an owner woken by them would wake itself with its own reads.

use std::path::PathBuf;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, EventKind};
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::time::{Interval, MissedTickBehavior};

/// Whether an event of this kind can mean a file's content or presence
/// changed: not an open, a read or a close without writing.
pub fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// The wake-ups of a set of directories.
pub struct DirWatch {
    wakes: mpsc::Receiver<()>,
    tick: Interval,
    /// How long a burst of events takes to settle into one wake-up.
    settle: Duration,
    /// Kept for its thread and its watches; `None` without a watcher.
    _watcher: Option<RecommendedWatcher>,
}

/// A directory that could not be watched, and why (the safety net still
/// reads it every `poll`).
#[derive(Debug)]
pub struct NotWatched {
    /// The directory.
    pub dir: PathBuf,
    /// Why the watcher refused it.
    pub error: String,
}

impl DirWatch {
    /// Watches `dirs` (not recursively); events `settle` apart are one
    /// wake-up. Returns the directories it could not watch. Must run in a
    /// Tokio runtime. The first [`DirWatch::next`] returns at once.
    pub fn start(
        dirs: impl IntoIterator<Item = PathBuf>,
        settle: Duration,
        poll: Duration,
    ) -> (DirWatch, Vec<NotWatched>) {
        // One pending wake-up is enough: the owner reads everything anyway.
        let (tx, wakes) = mpsc::channel::<()>(1);
        let mut not_watched = Vec::new();
        let dirs: Vec<PathBuf> = dirs.into_iter().collect();
        let watcher =
            match notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
                // An error may hide a change: wake the owner, it reads everything.
                if res.as_ref().map_or(true, |e| is_change(&e.kind)) {
                    let _ = tx.try_send(());
                }
            }) {
                Ok(mut d) => {
                    for dir in &dirs {
                        if let Err(e) = d.watch(dir, RecursiveMode::NonRecursive) {
                            not_watched.push(NotWatched {
                                dir: dir.clone(),
                                error: e.to_string(),
                            });
                        }
                    }
                    Some(d)
                }
                Err(e) => {
                    not_watched.extend(dirs.iter().map(|dir| NotWatched {
                        dir: dir.clone(),
                        error: format!("no file watcher: {e}"),
                    }));
                    None
                }
            };
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        (
            DirWatch {
                wakes,
                tick,
                settle,
                _watcher: watcher,
            },
            not_watched,
        )
    }

    /// Waits for the next wake-up: a settled change, or the safety net.
    pub async fn next(&mut self) {
        tokio::select! {
            // A closed channel (no watcher) leaves the safety net alone.
            Some(()) = self.wakes.recv() => {
                // The rest of the burst comes within `settle`: one wake-up.
                tokio::time::sleep(self.settle).await;
                while self.wakes.try_recv().is_ok() {}
            }
            _ = self.tick.tick() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use std::time::Instant;

    #[tokio::test]
    async fn a_burst_of_changes_is_one_wake_up_and_the_safety_net_ticks() {
        let dir = std::env::temp_dir().join(format!("sp-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (mut w, not_watched) = DirWatch::start(
            [dir.clone()],
            Duration::from_millis(50),
            Duration::from_secs(3600),
        );
        assert!(not_watched.is_empty(), "{not_watched:?}");
        w.next().await; // the first tick
        for i in 0..20 {
            std::fs::write(dir.join(format!("f{i}")), "x").unwrap();
        }
        tokio::time::timeout(Duration::from_secs(5), w.next())
            .await
            .unwrap();
        // Debounced: far fewer wake-ups than the twenty writes.
        let mut more = 0;
        while tokio::time::timeout(Duration::from_millis(500), w.next())
            .await
            .is_ok()
        {
            more += 1;
        }
        assert!(more < 5, "{more} more wake-ups after the first");
        std::fs::remove_dir_all(&dir).unwrap();

        let started = Instant::now();
        let (mut w, not_watched) = DirWatch::start(
            [PathBuf::from("/nonexistent/sp-watch")],
            Duration::from_millis(50),
            Duration::from_millis(100),
        );
        assert_eq!(not_watched.len(), 1);
        w.next().await;
        w.next().await;
        assert!(started.elapsed() >= Duration::from_millis(100));
    }

    #[tokio::test]
    async fn reading_the_watched_files_is_no_wake_up() {
        // The owner reads its files on every wake-up: were opens and reads
        // changes, each wake-up would cause the next, for ever.
        let dir = std::env::temp_dir().join(format!("sp-watch-read-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tls.crt"), "x").unwrap();
        let (mut w, not_watched) = DirWatch::start(
            [dir.clone()],
            Duration::from_millis(50),
            Duration::from_secs(3600),
        );
        assert!(not_watched.is_empty(), "{not_watched:?}");
        w.next().await; // the first tick
        for _ in 0..20 {
            std::fs::read(dir.join("tls.crt")).unwrap();
        }
        assert!(
            tokio::time::timeout(Duration::from_millis(500), w.next())
                .await
                .is_err(),
            "a read woke the owner"
        );
        std::fs::write(dir.join("tls.crt"), "y").unwrap();
        tokio::time::timeout(Duration::from_secs(5), w.next())
            .await
            .expect("a write wakes the owner");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_secret_volume_symlink_swap_is_a_wake_up() {
        // How the kubelet updates a Secret volume: a new `..data` symlink
        // renamed over the old one; the files themselves are not written.
        let dir = std::env::temp_dir().join(format!("sp-watch-swap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("v1")).unwrap();
        std::fs::create_dir_all(dir.join("v2")).unwrap();
        std::os::unix::fs::symlink("v1", dir.join("..data")).unwrap();
        let (mut w, not_watched) = DirWatch::start(
            [dir.clone()],
            Duration::from_millis(50),
            Duration::from_secs(3600),
        );
        assert!(not_watched.is_empty(), "{not_watched:?}");
        w.next().await; // the first tick
        std::os::unix::fs::symlink("v2", dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .expect("the swap wakes the owner before the safety net");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
