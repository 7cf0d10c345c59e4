//! Reloading the TLS files when they change: their directories watched,
//! and re-read every `POLL_EVERY` as a safety net
//! (`net::watch`).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::load::{load, read_all, Contents, LoadError};
use super::server::TlsServer;
use super::x509::rfc3339;
use super::POLL_EVERY;
use crate::net::watch::Watch;

/// Events arriving together (a Secret update touches several names) are
/// read once, this long after the first.
const SETTLE: Duration = Duration::from_millis(200);

impl TlsServer {
    /// Reads the files; takes new content that loads (true), keeps the
    /// last good configuration otherwise (logged and counted once per
    /// distinct failure).
    pub(super) fn reload(
        &self,
        last: &mut Contents,
        failed: &mut Option<Result<Contents, LoadError>>,
    ) -> bool {
        let read = read_all(&self.files);
        let contents = match read {
            Ok(c) if c == *last => {
                *failed = None;
                return false;
            }
            Ok(c) => c,
            Err(e) => {
                let again = matches!(failed, Some(Err(f)) if *f == e);
                if !again {
                    self.metrics.reload("error");
                    tracing::warn!(error = %e, "TLS files: cannot read a changed file; the last good ones stay in use");
                    *failed = Some(Err(e));
                }
                return false;
            }
        };
        if matches!(failed, Some(Ok(f)) if *f == contents) {
            return false;
        }
        match load(&self.files, &contents, SystemTime::now()) {
            Ok(loaded) => {
                self.metrics.reload("ok");
                self.metrics.loaded(&loaded);
                tracing::info!(
                    serial = %loaded.cert.serial,
                    not_after = %rfc3339(loaded.cert.not_after),
                    sans = ?loaded.cert.sans,
                    "TLS files reloaded: new connections get them, open ones keep theirs"
                );
                *self.config.write().unwrap_or_else(|p| p.into_inner()) = loaded.config;
                *last = contents;
                *failed = None;
                true
            }
            Err(e) => {
                self.metrics.reload("error");
                tracing::warn!(error = %e, "TLS files changed but do not load: the last good ones stay in use");
                *failed = Some(Ok(contents));
                false
            }
        }
    }
}

/// Watches the files until the process ends.
pub(super) async fn watch(server: Arc<TlsServer>, mut last: Contents) {
    let mut watch = match Watch::new(SETTLE, POLL_EVERY) {
        Ok(mut w) => {
            for dir in server.files.dirs() {
                if let Err(e) = w.add(&dir) {
                    tracing::warn!(dir = %dir.display(), error = %e, "TLS files: cannot watch the directory; re-read every {} s", POLL_EVERY.as_secs());
                }
            }
            w
        }
        Err(e) => {
            tracing::warn!(error = %e, "TLS files: no file watcher; re-read every {} s", POLL_EVERY.as_secs());
            Watch::polling(POLL_EVERY)
        }
    };
    let mut failed = None;
    loop {
        watch.changed().await;
        server.reload(&mut last, &mut failed);
    }
}
