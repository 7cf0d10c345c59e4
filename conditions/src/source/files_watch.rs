//! How the slice directory is watched: inotify names the files that
//! changed, and only those are read again; the directory is not listed.
//!
//! - **Events** (`notify`, not recursive): each event's paths that count
//!   (`*.yaml|yml|json`, not dot files) are gathered, at most
//!   [`MAX_PENDING_PATHS`]; 20 ms after the first of a burst they are read
//!   (stat, and the file when its size, mtime or inode moved). Opens and
//!   reads are not changes: notify reports them (`IN_OPEN`), and a reader
//!   that woke on them would wake itself with its own reads.
//! - **Events lost** (the kernel's queue overflowed, more paths than the
//!   bound, a watcher error): the whole directory is scanned.
//! - **The safety net** is one `stat` of the directory every
//!   [`STAMP_EVERY`]: a file created, removed or renamed moves the
//!   directory's mtime, so a change whose event was lost is seen there; a
//!   file rewritten in place does not move it, and the whole directory is
//!   also scanned every [`FULL_RESCAN_EVERY`]. Each scan of the whole
//!   directory counts in `source_file_rescans_total{reason}`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::time::{Interval, MissedTickBehavior};

/// Events that come together (a rename is several) are read as one.
pub const DEBOUNCE: Duration = Duration::from_millis(20);
/// How often the directory's own mtime is compared (one `stat`).
pub const STAMP_EVERY: Duration = Duration::from_secs(2);
/// How often the whole directory is scanned whatever the events said.
pub const FULL_RESCAN_EVERY: Duration = Duration::from_secs(300);
/// Paths gathered between two reads; more, and the whole directory is
/// scanned instead (16,384 paths of up to 4 KiB: at most 64 MiB, in
/// practice a few hundred KiB).
pub const MAX_PENDING_PATHS: usize = 16_384;

/// Why the whole directory is scanned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rescan {
    /// The watcher lost events (kernel queue overflow, an error, or more
    /// changed paths than [`MAX_PENDING_PATHS`]).
    EventsLost,
    /// The directory's mtime moved with no event to say why.
    DirectoryChanged,
    /// The periodic scan ([`FULL_RESCAN_EVERY`]).
    Period,
}

impl Rescan {
    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Rescan::EventsLost => "events_lost",
            Rescan::DirectoryChanged => "directory_changed",
            Rescan::Period => "period",
        }
    }
}

/// What to read next.
#[derive(Debug, PartialEq, Eq)]
pub enum Wake {
    /// These files (each one that counts) changed, or are gone.
    Paths(Vec<PathBuf>),
    /// The whole directory, for this reason.
    Rescan(Rescan),
    /// The safety net's stat found nothing new.
    Quiet,
}

/// The paths events named since the last read.
#[derive(Default, Debug)]
struct Pending {
    paths: HashSet<PathBuf>,
    lost: bool,
}

/// The directory's identity as one `stat` shows it: a file created,
/// removed or renamed in it moves its mtime (and ctime).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    modified: Option<SystemTime>,
    changed: (i64, i64),
    inode: u64,
}

/// The directory's [`Stamp`].
pub fn stamp(dir: &Path) -> std::io::Result<Stamp> {
    let meta = std::fs::metadata(dir)?;
    #[cfg(unix)]
    let (changed, inode) = {
        use std::os::unix::fs::MetadataExt;
        ((meta.ctime(), meta.ctime_nsec()), meta.ino())
    };
    #[cfg(not(unix))]
    let (changed, inode) = ((0, 0), 0);
    Ok(Stamp {
        modified: meta.modified().ok(),
        changed,
        inode,
    })
}

/// Whether an event of this kind can mean a file's content or presence
/// changed (the TLS files' watch reads events the same way).
pub use crate::net::watch::is_change;

/// The slice directory's watch.
pub struct SliceWatch {
    dir: PathBuf,
    wakes: mpsc::Receiver<()>,
    pending: Arc<Mutex<Pending>>,
    stamp_tick: Interval,
    full_tick: Interval,
    /// The directory's stamp when its changes were last read.
    last: Option<Stamp>,
    _watcher: RecommendedWatcher,
}

fn lock(p: &Mutex<Pending>) -> std::sync::MutexGuard<'_, Pending> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

impl SliceWatch {
    /// Watches `dir` (which counts a path as [`super::files`] does:
    /// `counts`); the directory's stamp now is the one read last. Must run
    /// in a Tokio runtime.
    pub fn start(dir: &Path, counts: fn(&Path) -> bool) -> notify::Result<SliceWatch> {
        let (tx, wakes) = mpsc::channel::<()>(1);
        let pending = Arc::new(Mutex::new(Pending::default()));
        let gathered = pending.clone();
        let mut watcher =
            notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
                let mut p = lock(&gathered);
                match res {
                    Ok(ev) if ev.need_rescan() => p.lost = true,
                    Ok(ev) if !is_change(&ev.kind) => return,
                    Ok(ev) => {
                        for path in ev.paths.into_iter().filter(|p| counts(p)) {
                            if p.paths.len() >= MAX_PENDING_PATHS {
                                p.lost = true;
                                p.paths.clear();
                            }
                            if !p.lost {
                                p.paths.insert(path);
                            }
                        }
                        if p.paths.is_empty() && !p.lost {
                            return;
                        }
                    }
                    Err(_) => p.lost = true,
                }
                drop(p);
                let _ = tx.try_send(());
            })?;
        watcher.watch(dir, RecursiveMode::NonRecursive)?;
        let interval = |every: Duration| {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            tick
        };
        Ok(SliceWatch {
            dir: dir.to_path_buf(),
            wakes,
            pending,
            stamp_tick: interval(STAMP_EVERY),
            full_tick: interval(FULL_RESCAN_EVERY),
            last: stamp(dir).ok(),
            _watcher: watcher,
        })
    }

    /// Waits for what to read next: the files events named (after
    /// [`DEBOUNCE`]), or the whole directory (events lost, the directory
    /// changed without an event, the period), or `Quiet` (the safety net's
    /// stat, nothing new). An error: the directory could not be stat'ed.
    pub async fn next(&mut self) -> std::io::Result<Wake> {
        loop {
            match self.wait().await? {
                // A wake-up whose paths were taken by the one before.
                Wake::Paths(p) if p.is_empty() => continue,
                wake => return Ok(wake),
            }
        }
    }

    async fn wait(&mut self) -> std::io::Result<Wake> {
        tokio::select! {
            Some(()) = self.wakes.recv() => {
                tokio::time::sleep(DEBOUNCE).await;
                // The stamp before the paths: a change after it moves it again.
                self.last = stamp(&self.dir).ok();
                let taken = std::mem::take(&mut *lock(&self.pending));
                if taken.lost {
                    return Ok(Wake::Rescan(Rescan::EventsLost));
                }
                let mut paths: Vec<PathBuf> = taken.paths.into_iter().collect();
                paths.sort();
                Ok(Wake::Paths(paths))
            }
            _ = self.full_tick.tick() => {
                self.last = stamp(&self.dir).ok();
                Ok(Wake::Rescan(Rescan::Period))
            }
            _ = self.stamp_tick.tick() => {
                let now = stamp(&self.dir)?;
                {
                    let p = lock(&self.pending);
                    // Events already gathered are read on their own wake-up.
                    if !p.paths.is_empty() || p.lost {
                        return Ok(Wake::Quiet);
                    }
                }
                if self.last.as_ref() == Some(&now) {
                    return Ok(Wake::Quiet);
                }
                self.last = Some(now);
                Ok(Wake::Rescan(Rescan::DirectoryChanged))
            }
        }
    }

    /// After a scan of the whole directory: its stamp now.
    pub fn scanned(&mut self) {
        self.last = stamp(&self.dir).ok();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use notify::event::{AccessKind, AccessMode, EventKind};

    fn counts(p: &Path) -> bool {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        !name.starts_with('.') && name.ends_with(".yaml")
    }

    async fn next(w: &mut SliceWatch) -> Wake {
        tokio::time::timeout(Duration::from_secs(5), w.next())
            .await
            .expect("a wake-up within 5 s")
            .unwrap()
    }

    #[test]
    fn opens_and_reads_are_not_changes_a_close_after_writing_is() {
        use notify::event::{CreateKind, ModifyKind, RemoveKind, RenameMode};
        assert!(!is_change(&EventKind::Access(AccessKind::Open(
            AccessMode::Any
        ))));
        assert!(!is_change(&EventKind::Access(AccessKind::Read)));
        assert!(!is_change(&EventKind::Access(AccessKind::Close(
            AccessMode::Read
        ))));
        assert!(is_change(&EventKind::Access(AccessKind::Close(
            AccessMode::Write
        ))));
        assert!(is_change(&EventKind::Create(CreateKind::File)));
        assert!(is_change(&EventKind::Modify(ModifyKind::Name(
            RenameMode::To
        ))));
        assert!(is_change(&EventKind::Remove(RemoveKind::File)));
    }

    #[tokio::test]
    async fn events_name_the_files_and_reading_them_wakes_nothing() {
        let dir = std::env::temp_dir().join(format!("sp-slicewatch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..50 {
            std::fs::write(dir.join(format!("s{i}.yaml")), "x").unwrap();
        }
        let mut w = SliceWatch::start(&dir, counts).unwrap();
        // Written beside and renamed into place: one file named, the dot file not.
        std::fs::write(dir.join(".s7.yaml.tmp"), "y").unwrap();
        std::fs::rename(dir.join(".s7.yaml.tmp"), dir.join("s7.yaml")).unwrap();
        std::fs::write(dir.join("notes.txt"), "z").unwrap();
        assert_eq!(next(&mut w).await, Wake::Paths(vec![dir.join("s7.yaml")]));
        // Listing the directory and reading every file (what a scan does)
        // wakes nothing: within the safety net's first stat, only Quiet.
        for entry in std::fs::read_dir(&dir).unwrap() {
            let _ = std::fs::read(entry.unwrap().path());
        }
        let waited = tokio::time::timeout(STAMP_EVERY / 2, w.next()).await;
        assert!(waited.is_err(), "woke on reads: {waited:?}");
        // A removal names the file.
        std::fs::remove_file(dir.join("s3.yaml")).unwrap();
        assert_eq!(next(&mut w).await, Wake::Paths(vec![dir.join("s3.yaml")]));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_change_without_an_event_is_seen_by_the_directory_stamp() {
        let dir = std::env::temp_dir().join(format!("sp-slicewatch-stamp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut w = SliceWatch::start(&dir, counts).unwrap();
        // As if the event were lost: the stamp read last is an older one.
        w.last = Some(Stamp {
            modified: None,
            changed: (0, 0),
            inode: 0,
        });
        assert_eq!(next(&mut w).await, Wake::Rescan(Rescan::DirectoryChanged));
        // Then nothing moved: quiet.
        assert_eq!(next(&mut w).await, Wake::Quiet);
        // Lost events: the whole directory.
        lock(&w.pending).lost = true;
        let _ = w.wakes.try_recv();
        std::fs::write(dir.join("a.yaml"), "x").unwrap();
        assert_eq!(next(&mut w).await, Wake::Rescan(Rescan::EventsLost));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
