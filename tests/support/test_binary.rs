//! The end-to-end test binary as `make test` built it, for the runners that
//! run chosen tests of it (`test-compat`, `test-release`).
//!
//! It is found through the build command of `make unit` and `make
//! integration` (nextest's own: `cargo test --workspace --no-run`): every
//! test target, so every dev-dependency's features, and nothing is rebuilt.
//! `cargo test --workspace --test e2e` would resolve fewer features and
//! build the crates they change again.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The path of the `e2e` test binary; cargo names it at once when nothing
/// changed.
pub fn e2e() -> Result<PathBuf, String> {
    let out = Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()))
        .args(["test", "--workspace", "--no-run", "--message-format=json"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo test --workspace --no-run failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|m| {
            m["reason"] == "compiler-artifact"
                && m["target"]["name"] == "e2e"
                && m["target"]["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == "test"))
        })
        .and_then(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| "cargo named no e2e test binary".to_string())
}
