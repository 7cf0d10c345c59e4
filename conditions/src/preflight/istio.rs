//! Istio (mode istio, the wasm form): istiod found, a release serving-picker
//! is checked against, and what its persistent-session setting does.

use super::facts::IstioFacts;
use super::finding::{bad, ok, Finding, Level};
use super::versions;

/// istiod's flag that sets up the cookie sessions the Service label names.
const SESSION_FILTER_FLAG: &str = "PILOT_ENABLE_PERSISTENT_SESSION_FILTER";

/// The findings on Istio's side: istiod found, its release, its session setting.
pub fn judge(istio: &IstioFacts) -> Vec<Finding> {
    let istiods = match &istio.istiods {
        Some(Ok(found)) if !found.is_empty() => found,
        Some(Ok(_)) => {
            return vec![bad(
                Level::Fail,
                "istio",
                "no istiod found (Deployments labelled app=istiod, every namespace)",
                "install Istio 1.28 to 1.31 (docs/install.md)",
            )]
        }
        Some(Err(e)) => {
            return vec![bad(
                Level::Warn,
                "istio",
                format!("could not look for istiod in every namespace ({e})"),
                "run the preflight as a user who may list deployments, or check istiod's version by hand (1.28 to 1.31)",
            )]
        }
        None => return vec![],
    };
    let mut out = Vec::new();
    for w in istiods {
        let at = format!("{}/{}", w.namespace, w.name);
        out.push(match versions::workload_version(w) {
            Some((m, shown)) if versions::supported(&versions::ISTIO, m).is_some() => {
                ok("istio", format!("istiod {at}: Istio {shown}"))
            }
            Some((_, shown)) => bad(
                Level::Warn,
                "istio",
                format!("istiod {at}: Istio {shown}: serving-picker's objects are checked against 1.28 to 1.31"),
                "use Istio 1.28 to 1.31",
            ),
            None => bad(
                Level::Warn,
                "istio",
                format!("istiod {at}: its version cannot be read (image {:?})", w.image.as_deref().unwrap_or("-")),
                "check it is Istio 1.28 to 1.31",
            ),
        });
        let on = w
            .env
            .get(SESSION_FILTER_FLAG)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        out.push(ok(
            "istio",
            if on {
                format!("istiod {at}: {SESSION_FILTER_FLAG}=true: mesh-wide, every proxy's outbound and gateway HTTP listeners carry the stateful-session filter, and Services labelled istio.io/persistent-session get cookie sessions")
            } else {
                format!("istiod {at}: {SESSION_FILTER_FLAG} off (its default): the Service label sends terminating pods DRAINING, no cookie sessions")
            },
        ));
    }
    out
}
