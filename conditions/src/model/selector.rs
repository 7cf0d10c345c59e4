//! A Kubernetes label selector in its string form (`--manage`), matched
//! here against an object's labels: what the API server does with
//! `labelSelector`, for the slice directory and for watches that cannot
//! ask the API server to select (`eds` mode with both `--cluster` and
//! `--manage`). The forms: `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`,
//! `k notin (a,b)`, joined by commas (all must hold); "" selects all.

use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed label selector, with the text it was read from (what the API
/// server is asked with).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct LabelSelector {
    text: String,
    requirements: Vec<Requirement>,
}

/// A part of a label selector that does not read as a requirement.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("label selector {selector:?}: cannot read {part:?}")]
pub struct SelectorError {
    /// The whole selector.
    pub selector: String,
    /// The part that does not read.
    pub part: String,
}

fn key_ok(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn value_ok(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl std::str::FromStr for LabelSelector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<LabelSelector, SelectorError> {
        // Split on commas outside parentheses.
        let mut parts = Vec::new();
        let (mut depth, mut start) = (0i32, 0);
        for (i, c) in s.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&s[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&s[start..]);
        let bad = |p: &str| SelectorError {
            selector: s.to_string(),
            part: p.to_string(),
        };
        let mut reqs = Vec::new();
        for part in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
            let set = |op: &str| -> Option<(String, Vec<String>)> {
                let (k, rest) = part.split_once(op)?;
                let rest = rest.trim();
                let inner = rest.strip_prefix('(')?.strip_suffix(')')?;
                let values = inner.split(',').map(|v| v.trim().to_string()).collect();
                Some((k.trim().to_string(), values))
            };
            let req = if let Some((k, v)) = set(" notin ") {
                Requirement::NotIn(k, v)
            } else if let Some((k, v)) = set(" in ") {
                Requirement::In(k, v)
            } else if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotIn(k.trim().into(), vec![v.trim().into()])
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                Requirement::In(k.trim().into(), vec![v.trim().into()])
            } else if let Some(k) = part.strip_prefix('!') {
                Requirement::DoesNotExist(k.trim().into())
            } else {
                Requirement::Exists(part.into())
            };
            let (key, values) = match &req {
                Requirement::In(k, v) | Requirement::NotIn(k, v) => (k, v.as_slice()),
                Requirement::Exists(k) | Requirement::DoesNotExist(k) => (k, &[][..]),
            };
            if !key_ok(key) || !values.iter().all(|v| value_ok(v)) {
                return Err(bad(part));
            }
            reqs.push(req);
        }
        Ok(LabelSelector {
            text: s.to_string(),
            requirements: reqs,
        })
    }
}

impl std::fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl LabelSelector {
    /// The selector as given (for the API server's `labelSelector`).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// True when every requirement holds for `labels`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::In(k, v) => labels.get(k).is_some_and(|l| v.contains(l)),
            Requirement::NotIn(k, v) => labels.get(k).is_none_or(|l| !v.contains(l)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_form_selects_as_the_api_server_does() {
        let l = labels(&[("serving-picker.io/conditions", "true"), ("tier", "web")]);
        for (sel, want) in [
            ("", true),
            ("serving-picker.io/conditions=true", true),
            ("serving-picker.io/conditions==true", true),
            ("serving-picker.io/conditions=false", false),
            ("tier!=web", false),
            ("tier!=db", true),
            ("absent!=x", true),
            ("tier", true),
            ("!tier", false),
            ("!absent", true),
            ("tier in (db, web)", true),
            ("tier notin (db,web)", false),
            ("tier in (db),serving-picker.io/conditions=true", false),
            ("tier in (web), serving-picker.io/conditions=true", true),
        ] {
            let s: LabelSelector = sel.parse().unwrap();
            assert_eq!(s.matches(&l), want, "{sel}");
        }
        for bad in ["a=b c", "tier in (a b)", "=x", "a=(b"] {
            assert!(bad.parse::<LabelSelector>().is_err(), "{bad}");
        }
    }
}
