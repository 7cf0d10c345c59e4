//! The build identity every artefact carries: the workspace version and the
//! git commit it was built from (`0.1.0 (commit 1a2b…)`, with `-dirty` when
//! the tree had changes). The wasm filter logs it when a VM starts, the
//! native module in its load line, the companion in `--version`.
//!
//! The commit comes from [`COMMIT_VAR`] at compile time, which the Makefile
//! sets on the commands that build the shipped artefacts (`scripts/version.sh
//! commit`); a plain `cargo build` has none and says `unknown commit`.
//! [`build_identity!`](crate::build_identity) reads it in the crate that
//! calls it, so cargo rebuilds only those crates when the commit changes
//! (rustc records the variable in the crate's dep-info).

use std::fmt;

/// The compile-time variable that holds the commit: a full git hash, with
/// `-dirty` when the tree had changes.
pub const COMMIT_VAR: &str = "SERVING_PICKER_BUILD_COMMIT";

/// A build's version and commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildIdentity {
    /// The workspace version (Cargo.toml's `[workspace.package] version`).
    pub version: &'static str,
    /// The commit, `None` when the build was not told one.
    pub commit: Option<&'static str>,
}

impl BuildIdentity {
    /// `commit` as the build environment gave it: unset or empty is unknown.
    pub const fn new(version: &'static str, commit: Option<&'static str>) -> BuildIdentity {
        let commit = match commit {
            Some(c) if !c.is_empty() => Some(c),
            _ => None,
        };
        BuildIdentity { version, commit }
    }
}

impl fmt::Display for BuildIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.commit {
            Some(commit) => write!(f, "{} (commit {commit})", self.version),
            None => write!(f, "{} (unknown commit)", self.version),
        }
    }
}

/// The calling crate's [`BuildIdentity`]: its version and the commit in
/// `SERVING_PICKER_BUILD_COMMIT` when it was compiled.
#[macro_export]
macro_rules! build_identity {
    () => {
        $crate::build_info::BuildIdentity::new(
            env!("CARGO_PKG_VERSION"),
            option_env!("SERVING_PICKER_BUILD_COMMIT"),
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_version_and_the_commit() {
        let id = BuildIdentity::new("0.1.0", Some("0123abcd-dirty"));
        assert_eq!(id.to_string(), "0.1.0 (commit 0123abcd-dirty)");
    }

    #[test]
    fn no_commit_or_an_empty_one_is_unknown() {
        for commit in [None, Some("")] {
            let id = BuildIdentity::new("0.1.0", commit);
            assert_eq!(id.commit, None);
            assert_eq!(id.to_string(), "0.1.0 (unknown commit)");
        }
    }

    #[test]
    fn the_macro_reads_the_callers_version() {
        let id = crate::build_identity!();
        assert_eq!(id.version, env!("CARGO_PKG_VERSION"));
        assert_eq!(
            id.commit,
            option_env!("SERVING_PICKER_BUILD_COMMIT").filter(|c| !c.is_empty())
        );
    }
}
