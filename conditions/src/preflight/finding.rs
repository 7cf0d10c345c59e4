//! A finding of the preflight: its weight, what was checked, what was
//! found and the fix; what every judge (`checks`, `certificates`,
//! `eg_checks`, `istio`) returns.

/// A finding's weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// As it should be.
    Ok,
    /// Works, but worth a look; the exit code stays 0.
    Warn,
    /// Will not work as it stands; the exit code is 1.
    Fail,
}

impl Level {
    /// The word printed at the start of the finding's line.
    pub fn word(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        }
    }
}

/// One judgement of the preflight: the line it prints, and the fix when it is not ok.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Ok, worth a look, or failing.
    pub level: Level,
    /// What was checked, a short word (`rbac`, `crds`, ...).
    pub check: &'static str,
    /// What was found.
    pub detail: String,
    /// What to do about it, printed under the finding.
    pub fix: Option<String>,
}

pub(super) fn ok(check: &'static str, detail: impl Into<String>) -> Finding {
    Finding {
        level: Level::Ok,
        check,
        detail: detail.into(),
        fix: None,
    }
}

pub(super) fn bad(
    level: Level,
    check: &'static str,
    detail: impl Into<String>,
    fix: impl Into<String>,
) -> Finding {
    Finding {
        level,
        check,
        detail: detail.into(),
        fix: Some(fix.into()),
    }
}
