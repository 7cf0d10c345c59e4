//! What upstream states about versions, as data: the Kubernetes releases
//! each platform release supports, the Envoy each Envoy Gateway release runs,
//! the Envoy minors the native module loads in; and how a version is read
//! from an image reference or a Kubernetes gitVersion.

use super::facts::Workload;

/// A `major.minor` release.
pub type Minor = (u32, u32);

/// The Kubernetes minors (of 1.x) one platform release supports, and where
/// upstream says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Supported {
    /// The platform release (`major.minor`).
    pub release: Minor,
    /// Oldest Kubernetes 1.x minor supported.
    pub oldest: u32,
    /// Newest Kubernetes 1.x minor supported; None when upstream states only
    /// a minimum.
    pub newest: Option<u32>,
}

/// cert-manager's supported Kubernetes versions
/// (cert-manager/website `content/docs/releases/README.md`: 1.21 and 1.20
/// in "Currently supported releases", 1.19 among the ended ones).
pub const CERT_MANAGER: [Supported; 3] = [
    Supported {
        release: (1, 19),
        oldest: 31,
        newest: Some(35),
    },
    Supported {
        release: (1, 20),
        oldest: 32,
        newest: Some(35),
    },
    Supported {
        release: (1, 21),
        oldest: 33,
        newest: Some(36),
    },
];
/// Where `CERT_MANAGER` comes from, named in the findings.
pub const CERT_MANAGER_SOURCE: &str = "cert-manager.io supported releases";

/// Envoy Gateway's compatibility matrix
/// (envoyproxy/gateway@v1.9.0 `site/content/en/news/releases/matrix.md`).
pub const ENVOY_GATEWAY: [Supported; 2] = [
    Supported {
        release: (1, 8),
        oldest: 32,
        newest: Some(35),
    },
    Supported {
        release: (1, 9),
        oldest: 33,
        newest: Some(36),
    },
];
/// Where `ENVOY_GATEWAY` comes from, named in the findings.
pub const ENVOY_GATEWAY_SOURCE: &str = "Envoy Gateway's compatibility matrix";

/// Istio's supported releases (istio/istio.io
/// `data/compatibility/supportStatus.yml`); 1.31 is not listed there yet:
/// its minimum is istioctl's (istio/istio@1.31.0-rc.0
/// `istioctl/pkg/install/k8sversion/version.go` `MinK8SVersion`, 32, as in
/// 1.30; 30 in 1.28 and 1.29).
pub const ISTIO: [Supported; 4] = [
    Supported {
        release: (1, 28),
        oldest: 30,
        newest: Some(34),
    },
    Supported {
        release: (1, 29),
        oldest: 31,
        newest: Some(35),
    },
    Supported {
        release: (1, 30),
        oldest: 32,
        newest: Some(36),
    },
    Supported {
        release: (1, 31),
        oldest: 32,
        newest: None,
    },
];
/// Where `ISTIO` comes from, named in the findings.
pub const ISTIO_SOURCE: &str = "Istio's supported releases";

/// The Envoy minor each Envoy Gateway release runs when nothing overrides
/// its proxy image (`DefaultEnvoyProxyImage`, envoyproxy/gateway
/// `api/v1alpha1/shared_types.go`: `distroless-v1.38.3` at v1.8.3,
/// `distroless-v1.39.0` at v1.9.0; the chart's
/// `global.images.envoyProxy.image` is empty by default).
pub const EG_DEFAULT_ENVOY: [(Minor, Minor); 2] = [((1, 8), (1, 38)), ((1, 9), (1, 39))];

/// The Envoy minors the native module is tested with and loads in
/// (native/src/envoy_version.rs `KNOWN`).
pub const NATIVE_TESTED: [Minor; 3] = [(1, 38), (1, 39), (1, 40)];
/// One minor after the newest tested one loads too, with a warning, under
/// upstream's promise that a module built for 1.N loads in 1.(N+1)
/// (envoyproxy/envoy#43219).
pub const NATIVE_LATER: Minor = (1, 41);

/// What upstream says of `minor` in `table`.
pub fn supported(table: &[Supported], release: Minor) -> Option<Supported> {
    table.iter().copied().find(|s| s.release == release)
}

/// The oldest Kubernetes minor any release of `table` supports.
pub fn oldest(table: &[Supported]) -> u32 {
    table.iter().map(|s| s.oldest).min().unwrap_or(0)
}

/// The `major.minor` of a version such as `v1.33.2`, `1.31.4-eks-1234`,
/// `v1.30+`, `distroless-v1.39.0`, `1.30.3-distroless`.
pub fn minor_of(version: &str) -> Option<Minor> {
    let v = version.trim();
    let v = v.strip_prefix("distroless-").unwrap_or(v);
    let v = v.trim_start_matches('v');
    let mut parts = v.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// The tag of an image reference, if it has one: `repo:tag`,
/// `host:5000/repo:tag`, `repo:tag@sha256:...` give `tag`; a reference
/// pinned by digest alone (`repo@sha256:...`) and an untagged one give None.
pub fn image_tag(image: &str) -> Option<&str> {
    let name = image.split('@').next().unwrap_or(image);
    let last = name.rsplit('/').next().unwrap_or(name);
    let (_, tag) = last.split_once(':')?;
    (!tag.is_empty()).then_some(tag)
}

/// Whether the image is pinned by digest.
pub fn image_digest(image: &str) -> Option<&str> {
    image.split_once('@').map(|(_, d)| d)
}

/// The Envoy minor an Envoy image runs, from its tag (`distroless-v1.39.0`,
/// `v1.40.0`, `1.38.3`); None for tags that name no release (`dev-...`).
pub fn envoy_minor(image: &str) -> Option<Minor> {
    let tag = image_tag(image)?;
    let m = minor_of(tag)?;
    (m.0 == 1).then_some(m)
}

/// The Envoy minor Envoy Gateway `release` runs by default.
pub fn eg_default_envoy(release: Minor) -> Option<Minor> {
    EG_DEFAULT_ENVOY
        .iter()
        .find(|(eg, _)| *eg == release)
        .map(|(_, envoy)| *envoy)
}

/// How the native module takes an Envoy minor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NativeFit {
    /// A tested release.
    Tested,
    /// The minor after the newest tested one: loads, with a warning.
    Later,
    /// Refused: the module does not load.
    Refused,
}

/// How the native module takes Envoy minor `envoy`.
pub fn native_fit(envoy: Minor) -> NativeFit {
    if NATIVE_TESTED.contains(&envoy) {
        NativeFit::Tested
    } else if envoy == NATIVE_LATER {
        NativeFit::Later
    } else {
        NativeFit::Refused
    }
}

/// `1.39` for `(1, 39)`.
pub fn show(m: Minor) -> String {
    format!("{}.{}", m.0, m.1)
}

/// A Deployment's release: its image tag, else (an image pinned by digest
/// alone) its `app.kubernetes.io/version` label; with where it was read.
pub(super) fn workload_version(w: &Workload) -> Option<(Minor, String)> {
    let image = w.image.as_deref().unwrap_or_default();
    if let Some(tag) = image_tag(image) {
        if let Some(m) = minor_of(tag) {
            return Some((m, format!("{tag} (image tag)")));
        }
    }
    let label = w.version_label.as_deref()?;
    let m = minor_of(label)?;
    let pinned = if image_digest(image).is_some() {
        "the image is pinned by digest; "
    } else {
        ""
    };
    Some((
        m,
        format!("{label} ({pinned}the Deployment's app.kubernetes.io/version)"),
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn minors_are_read_from_versions_and_tags() {
        assert_eq!(minor_of("v1.33.2"), Some((1, 33)));
        assert_eq!(minor_of("v1.31.4-eks-1234"), Some((1, 31)));
        assert_eq!(minor_of("v1.30+"), Some((1, 30)));
        assert_eq!(minor_of("distroless-v1.39.0"), Some((1, 39)));
        assert_eq!(minor_of("1.30.3-distroless"), Some((1, 30)));
        assert_eq!(minor_of("garbage"), None);
        assert_eq!(minor_of("latest"), None);
    }

    #[test]
    fn tags_and_digests_are_read_from_image_references() {
        let d = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        assert_eq!(
            image_tag("docker.io/envoyproxy/gateway:v1.9.0"),
            Some("v1.9.0")
        );
        assert_eq!(
            image_tag(&format!("docker.io/envoyproxy/gateway:v1.8.3@{d}")),
            Some("v1.8.3")
        );
        assert_eq!(
            image_tag(&format!("docker.io/envoyproxy/gateway@{d}")),
            None
        );
        assert_eq!(
            image_tag("registry:5000/mirror/gateway:v1.9.0"),
            Some("v1.9.0")
        );
        assert_eq!(image_tag("registry:5000/mirror/gateway"), None);
        assert_eq!(
            image_digest(&format!("r/g:v1.9.0@{d}")),
            Some(d),
            "the digest"
        );
        assert_eq!(
            envoy_minor("docker.io/envoyproxy/envoy:distroless-v1.39.0"),
            Some((1, 39))
        );
        assert_eq!(
            envoy_minor("docker.io/envoyproxy/envoy:distroless-dev"),
            None
        );
    }

    #[test]
    fn the_native_range_is_the_modules() {
        // The module's own list of tested releases (native/src/envoy_version.rs).
        let source = include_str!("../../../native/src/envoy_version.rs");
        let mut known: Vec<Minor> = source
            .split("minor: \"")
            .skip(1)
            .filter_map(|rest| minor_of(rest.split('"').next()?))
            .collect();
        known.sort();
        known.dedup();
        assert_eq!(known, NATIVE_TESTED, "native/src/envoy_version.rs KNOWN");
        assert_eq!(native_fit((1, 38)), NativeFit::Tested);
        assert_eq!(native_fit((1, 41)), NativeFit::Later);
        assert_eq!(native_fit((1, 37)), NativeFit::Refused);
        assert_eq!(native_fit((1, 42)), NativeFit::Refused);
        assert_eq!(NATIVE_LATER.1, NATIVE_TESTED[NATIVE_TESTED.len() - 1].1 + 1);
    }

    #[test]
    fn tables_answer_per_release() {
        assert_eq!(
            supported(&ENVOY_GATEWAY, (1, 9)).map(|s| s.oldest),
            Some(33)
        );
        assert_eq!(supported(&ENVOY_GATEWAY, (1, 7)), None);
        assert_eq!(oldest(&CERT_MANAGER), 31);
        assert_eq!(oldest(&ISTIO), 30);
        assert_eq!(eg_default_envoy((1, 8)), Some((1, 38)));
    }
}
