//! Narrowing a refresh to the clusters whose stats moved. The change gate's
//! two stats answers are compared line by line, each moved line is pinned to
//! a known cluster, and only those clusters' endpoints are asked for (the
//! config dump's `name_regex`): Envoy renders, and the VM parses, a few
//! clusters instead of all of them. A move that cannot be pinned (the
//! cluster manager's counts, a cluster not seen before) asks for everything.
//!
//! Plain vectors and linear scans rather than maps, sets and sorts: the
//! clusters of one narrowed refresh are few (`MAX_NARROWED`), and every
//! generic map or sort would add kilobytes to the module.

use crate::admin_json::{ClusterHosts, EndpointsDump};
use std::fmt::Write as _;

/// Which clusters' endpoints a refresh needs.
#[derive(Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every cluster, and why (logged at debug).
    All(&'static str),
    /// Only these (once each, in the order their stats came), named as the
    /// config dump names them (EDS service names).
    Only(Vec<String>),
}

/// What is known of the clusters: how many, and the name the config dump
/// lists a cluster under (its EDS service name, if any), by its stats name.
pub struct KnownClusters<'k> {
    /// How many clusters there are.
    pub count: usize,
    /// The name the config dump lists a cluster under, by its stats name; `None` for a cluster it
    /// does not know.
    pub listed_as: &'k dyn Fn(&str) -> Option<String>,
}

/// A narrowed dump is asked for only while it covers at most this share of
/// the known clusters and of their hosts (beyond it Envoy renders about as
/// much either way), and at most this many clusters (a rolling update moves a
/// few at a time).
const MAX_SHARE_DIVISOR: usize = 2;
/// At most this many clusters in a narrowed dump.
pub const MAX_NARROWED: usize = 64;
/// Longest `name_regex` query value sent (percent-encoded), well inside
/// Envoy's request header limits.
const MAX_QUERY_BYTES: usize = 8 * 1024;

/// `name: value` lines of a stats answer, or `None` unless sorted by name
/// (as Envoy sorts them), which the comparison below relies on.
fn stat_lines(body: &[u8]) -> Option<Vec<(&str, &str)>> {
    let text = std::str::from_utf8(body).ok()?;
    let lines: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|line| line.split_once(": "))
        .collect();
    lines.windows(2).all(|w| w[0].0 < w[1].0).then_some(lines)
}

/// Names of the lines that differ, come or go between two sorted answers.
fn moved_lines<'a>(old: &[(&'a str, &'a str)], new: &[(&'a str, &'a str)]) -> Vec<&'a str> {
    let (mut i, mut j, mut moved) = (0, 0, Vec::new());
    loop {
        match (old.get(i), new.get(j)) {
            (Some(o), Some(n)) if o.0 == n.0 => {
                if o.1 != n.1 {
                    moved.push(n.0);
                }
                i += 1;
                j += 1;
            }
            (Some(o), Some(n)) if o.0 < n.0 => {
                moved.push(o.0);
                i += 1;
            }
            (Some(o), None) => {
                moved.push(o.0);
                i += 1;
            }
            (_, Some(n)) => {
                moved.push(n.0);
                j += 1;
            }
            (None, None) => return moved,
        }
    }
}

/// The cluster a per-cluster stat belongs to, as the dump lists it:
/// `cluster.<name>.<stat>`, where the name may hold dots itself, so the
/// longest known name wins.
fn owner(stat: &str, known: &KnownClusters) -> Option<String> {
    let rest = stat.strip_prefix("cluster.")?;
    rest.rmatch_indices('.')
        .find_map(|(dot, _)| (known.listed_as)(&rest[..dot]))
}

/// The clusters whose stats differ between two stats answers.
pub fn moved_clusters(before: &[u8], after: &[u8], known: &KnownClusters) -> Scope {
    let (Some(old), Some(new)) = (stat_lines(before), stat_lines(after)) else {
        return Scope::All("the stats are not sorted by name");
    };
    let mut clusters: Vec<String> = Vec::new();
    for stat in moved_lines(&old, &new) {
        if stat.starts_with("cluster_manager.") {
            return Scope::All("the cluster manager's counts moved");
        }
        let Some(listed) = owner(stat, known) else {
            return Scope::All("a stat moved that names no known cluster");
        };
        if !clusters.contains(&listed) {
            if clusters.len() == MAX_NARROWED {
                return Scope::All("too many clusters moved");
            }
            clusters.push(listed);
        }
    }
    if clusters.is_empty() {
        return Scope::All("no cluster's stats moved");
    }
    if clusters.len() * MAX_SHARE_DIVISOR > known.count {
        return Scope::All("most clusters moved");
    }
    Scope::Only(clusters)
}

/// Whether the stats that moved between two answers may mean a host change
/// that only `/clusters` shows: membership, health checks, ejections, or a
/// config update of a cluster with active health checks (those keep a host
/// that left EDS while it passes them: `pending_dynamic_removal`, which the
/// dump does not show). A DNS cluster's resolutions, every few seconds, move
/// only `update_success` of a cluster without checks: nothing to read there.
/// Answers that cannot be compared may mean anything.
pub fn hosts_moved(before: &[u8], after: &[u8]) -> bool {
    let (Some(old), Some(new)) = (stat_lines(before), stat_lines(after)) else {
        return true;
    };
    let checked = |prefix: &str| {
        new.iter()
            .any(|(name, _)| name.strip_prefix(prefix) == Some("health_check.healthy"))
    };
    moved_lines(&old, &new).iter().any(|stat| {
        match stat
            .strip_suffix("update_success")
            .or_else(|| stat.strip_suffix("update_empty"))
        {
            Some(prefix) => checked(prefix),
            None => true,
        }
    })
}

/// Whether fetching only `asked` saves much: not when their hosts are most
/// of the view's (one big cluster of 10,000 hosts costs the same either way,
/// and only a full refresh restarts the periodic timer).
pub fn worth_narrowing(view: &EndpointsDump, asked: &[String]) -> bool {
    let (mut moved, mut total) = (0usize, 0usize);
    for cluster in &view.clusters {
        total += cluster.hosts.len();
        if asked.contains(&cluster.name) {
            moved += cluster.hosts.len();
        }
    }
    moved * MAX_SHARE_DIVISOR <= total
}

/// The config dump path narrowed to `clusters`, when `admin_path` is a
/// config dump query that does not choose names itself.
pub fn narrowed_path(admin_path: &str, clusters: &[String]) -> Option<String> {
    if !admin_path.starts_with("/config_dump?") || admin_path.contains("name_regex") {
        return None;
    }
    let mut regex = String::from("^(");
    for (i, name) in clusters.iter().enumerate() {
        if i > 0 {
            regex.push('|');
        }
        for c in name.chars() {
            // RE2 takes any ASCII punctuation escaped as itself.
            if c.is_ascii_punctuation() {
                regex.push('\\');
            }
            regex.push(c);
        }
    }
    regex.push_str(")$");
    let query = percent_encode(&regex);
    if query.len() > MAX_QUERY_BYTES {
        return None;
    }
    Some(format!("{admin_path}&name_regex={query}"))
}

fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Why a narrowed answer is refused: the cluster it brought unasked, or
/// the asked one it lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MergeRefused {
    /// A cluster that was not asked for.
    Brought(String),
    /// An asked cluster missing from the answer.
    Lacks(String),
}

impl std::fmt::Display for MergeRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MergeRefused::Brought(name) => write!(f, "the narrowed dump brought cluster {name:?}"),
            MergeRefused::Lacks(name) => write!(f, "the narrowed dump lacks cluster {name:?}"),
        }
    }
}

impl std::error::Error for MergeRefused {}

/// Puts the narrowed answer's clusters in place of theirs in the last full
/// view, and says whether that changed anything. An answer that misses an
/// asked cluster or brings another is refused, leaving `view` as it was:
/// the caller then asks for everything.
pub fn merge(
    view: &mut EndpointsDump,
    part: &EndpointsDump,
    asked: &[String],
) -> Result<bool, MergeRefused> {
    if let Some(extra) = part.clusters.iter().find(|c| !asked.contains(&c.name)) {
        return Err(MergeRefused::Brought(extra.name.clone()));
    }
    let entries = |list: &[ClusterHosts], name: &str| -> Vec<ClusterHosts> {
        list.iter().filter(|c| c.name == name).cloned().collect()
    };
    let mut changed = false;
    for name in asked {
        if !part.clusters.iter().any(|c| &c.name == name) {
            return Err(MergeRefused::Lacks(name.clone()));
        }
        let old = view.clusters.iter().filter(|c| &c.name == name);
        changed |= !old.eq(part.clusters.iter().filter(|c| &c.name == name));
    }
    // Each asked name's fresh entries where its first old one stood (a name
    // is listed twice when two Envoy clusters share an EDS service name), so
    // that the view keeps the full dump's order.
    let mut placed: Vec<&str> = Vec::new();
    let mut clusters = Vec::with_capacity(view.clusters.len());
    for cluster in std::mem::take(&mut view.clusters) {
        if !asked.contains(&cluster.name) {
            clusters.push(cluster);
        } else if !placed.contains(&cluster.name.as_str()) {
            clusters.extend(entries(&part.clusters, &cluster.name));
            placed.extend(
                asked
                    .iter()
                    .find(|a| **a == cluster.name)
                    .map(String::as_str),
            );
        }
    }
    for name in asked.iter().filter(|a| !placed.contains(&a.as_str())) {
        clusters.extend(entries(&part.clusters, name));
    }
    view.clusters = clusters;
    view.notes.clone_from(&part.notes);
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin_json::parse_config_dump;

    /// Envoy names and dump names of the known clusters in these tests.
    const KNOWN: [(&str, &str); 6] = [
        ("a", "a"),
        ("b", "b"),
        ("b.c", "svc-bc"),
        ("d", "d"),
        ("e", "e"),
        ("f", "f"),
    ];

    fn moved(before: &[u8], after: &[u8]) -> Scope {
        let lookup = |name: &str| {
            KNOWN
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        };
        let known = KnownClusters {
            count: KNOWN.len(),
            listed_as: &lookup,
        };
        moved_clusters(before, after, &known)
    }

    #[test]
    fn config_updates_move_hosts_only_in_checked_clusters() {
        let dns = b"cluster.dns.update_success: 8\ncluster.eds.membership_total: 2\n";
        let before = b"cluster.dns.update_success: 7\ncluster.eds.membership_total: 2\n";
        assert!(!hosts_moved(before, dns));
        // An EDS push to a cluster with active checks may leave a host
        // pending removal that only `/clusters` shows.
        let checked = b"cluster.eds.health_check.healthy: 2\ncluster.eds.update_success: 4\n";
        let pushed = b"cluster.eds.health_check.healthy: 2\ncluster.eds.update_success: 5\n";
        assert!(hosts_moved(checked, pushed));
        let removal = b"cluster.dns.update_success: 7\ncluster.eds.membership_total: 1\n";
        assert!(hosts_moved(before, removal));
        let ejected = b"cluster.dns.update_success: 7\ncluster.eds.membership_total: 2\ncluster.eds.outlier_detection.ejections_active: 1\n";
        assert!(hosts_moved(before, ejected), "a line that comes counts");
        assert!(
            hosts_moved(b"b: 1\na: 1\n", b"b: 1\na: 1\n"),
            "unsorted: cannot tell"
        );
    }

    fn only(list: &[&str]) -> Scope {
        Scope::Only(list.iter().map(|s| s.to_string()).collect())
    }

    /// Sorted by name, as Envoy answers.
    const BEFORE: &[u8] = b"cluster.a.membership_total: 2
cluster.a.update_success: 1
cluster.b.c.update_success: 7
cluster.b.update_success: 3
cluster.d.update_success: 1
cluster.e.update_success: 1
cluster_manager.active_clusters: 6
";

    fn after(from: &str, to: &str) -> Vec<u8> {
        let text = std::str::from_utf8(BEFORE).unwrap();
        assert!(text.contains(from), "{from}");
        text.replacen(from, to, 1).into_bytes()
    }

    #[test]
    fn a_moved_line_names_its_cluster_by_the_longest_known_name() {
        let m = after("b.c.update_success: 7", "b.c.update_success: 8");
        assert_eq!(moved(BEFORE, &m), only(&["svc-bc"]));
        let m = after("b.update_success: 3", "b.update_success: 4");
        assert_eq!(moved(BEFORE, &m), only(&["b"]));
        let m = after("a.membership_total: 2", "a.membership_total: 3");
        assert_eq!(moved(BEFORE, &m), only(&["a"]));
    }

    #[test]
    fn lines_that_come_or_go_count_as_moves() {
        let gone = after("cluster.a.membership_total: 2\n", "");
        assert_eq!(moved(BEFORE, &gone), only(&["a"]));
        let came = after(
            "cluster.d.update_success: 1\n",
            "cluster.d.outlier_detection.ejections_active: 1\ncluster.d.update_success: 1\n",
        );
        assert_eq!(moved(BEFORE, &came), only(&["d"]));
        assert_eq!(moved(&came, BEFORE), only(&["d"]));
    }

    #[test]
    fn what_cannot_be_pinned_asks_for_everything() {
        let all = |s: Scope| matches!(s, Scope::All(_));
        let manager = after("active_clusters: 6", "active_clusters: 7");
        assert!(all(moved(BEFORE, &manager)));
        let unknown = after(
            "cluster_manager",
            "cluster.new.update_success: 1\ncluster_manager",
        );
        assert!(all(moved(BEFORE, &unknown)));
        assert!(all(moved(BEFORE, BEFORE)));
        let unsorted = after(
            "cluster.a.membership_total: 2\n",
            "cluster.z.membership_total: 2\n",
        );
        assert_eq!(
            moved(BEFORE, &unsorted),
            Scope::All("the stats are not sorted by name")
        );
    }

    #[test]
    fn most_clusters_moving_asks_for_everything() {
        let mut m = String::from_utf8(BEFORE.to_vec()).unwrap();
        for (from, to) in [
            ("a.update_success: 1", "a.update_success: 2"),
            ("b.update_success: 3", "b.update_success: 4"),
            ("d.update_success: 1", "d.update_success: 2"),
        ] {
            m = m.replacen(from, to, 1);
        }
        assert_eq!(moved(BEFORE, m.as_bytes()), only(&["a", "b", "d"]));
        m = m.replacen("e.update_success: 1", "e.update_success: 2", 1);
        assert_eq!(
            moved(BEFORE, m.as_bytes()),
            Scope::All("most clusters moved")
        );
    }

    #[test]
    fn more_than_max_narrowed_clusters_ask_for_everything() {
        let names: Vec<String> = (0..1000).map(|i| format!("c{i:04}")).collect();
        let stats = |bump: usize| {
            let mut body = String::new();
            for (i, n) in names.iter().enumerate() {
                let v = usize::from(i < bump);
                body.push_str(&format!("cluster.{n}.update_success: {v}\n"));
            }
            body.into_bytes()
        };
        let lookup = |name: &str| names.iter().find(|n| *n == name).cloned();
        let known = KnownClusters {
            count: names.len(),
            listed_as: &lookup,
        };
        let scope = moved_clusters(&stats(0), &stats(MAX_NARROWED), &known);
        assert!(matches!(&scope, Scope::Only(c) if c.len() == MAX_NARROWED));
        assert_eq!(
            moved_clusters(&stats(0), &stats(MAX_NARROWED + 1), &known),
            Scope::All("too many clusters moved")
        );
    }

    #[test]
    fn the_narrowed_path_escapes_and_encodes_names() {
        let set = asked(&["outbound|80||x.ns.svc", "svc-1"]);
        let path = narrowed_path("/config_dump?include_eds", &set).unwrap();
        assert_eq!(
            path,
            "/config_dump?include_eds&name_regex=%5E%28outbound%5C%7C80%5C%7C%5C%7Cx%5C.ns%5C.svc%7Csvc%5C-1%29%24"
        );
        assert_eq!(narrowed_path("/custom", &set), None);
        assert_eq!(
            narrowed_path("/config_dump?include_eds&name_regex=x", &set),
            None
        );
        let huge: Vec<String> = (0..2000).map(|i| format!("cluster-{i}")).collect();
        assert_eq!(narrowed_path("/config_dump?include_eds", &huge), None);
    }

    fn dump(json: &str) -> EndpointsDump {
        parse_config_dump(json.as_bytes(), "k8s.endpointslice").unwrap()
    }

    fn cluster_json(name: &str, port: u16) -> String {
        format!(
            r#"{{"endpoint_config":{{"cluster_name":"{name}","endpoints":[{{"lb_endpoints":[
              {{"endpoint":{{"address":{{"socket_address":{{"address":"10.0.0.1","port_value":{port}}}}}}}}}]}}]}}}}"#
        )
    }

    fn dump_of(clusters: &[(&str, u16)]) -> EndpointsDump {
        let entries: Vec<String> = clusters.iter().map(|(n, p)| cluster_json(n, *p)).collect();
        dump(&format!(
            r#"{{"configs":[{{"static_endpoint_configs":[{}]}}]}}"#,
            entries.join(",")
        ))
    }

    fn asked(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn narrowing_is_worth_it_only_for_a_minority_of_hosts() {
        let view = dump_of(&[("a", 1), ("b", 2), ("c", 3)]);
        assert!(worth_narrowing(&view, &asked(&["a"])));
        assert!(!worth_narrowing(&view, &asked(&["a", "b"])));
        let mut big = dump_of(&[("big", 1), ("small", 2)]);
        let host = big.clusters[0].hosts[0].clone();
        big.clusters[0].hosts = vec![host; 10];
        assert!(!worth_narrowing(&big, &asked(&["big"])));
        assert!(worth_narrowing(&big, &asked(&["small"])));
    }

    #[test]
    fn merge_puts_fresh_clusters_in_place() {
        let last = dump_of(&[("a", 1), ("b", 2), ("c", 3)]);
        let mut view = last.clone();
        assert_eq!(
            merge(&mut view, &dump_of(&[("b", 20)]), &asked(&["b"])),
            Ok(true)
        );
        assert_eq!(view, dump_of(&[("a", 1), ("b", 20), ("c", 3)]));
        let mut view = last.clone();
        assert_eq!(
            merge(&mut view, &dump_of(&[("c", 3)]), &asked(&["c"])),
            Ok(false)
        );
        assert_eq!(view, last);
        // A cluster the view did not have yet comes last.
        let mut view = last.clone();
        assert_eq!(
            merge(&mut view, &dump_of(&[("n", 9)]), &asked(&["n"])),
            Ok(true)
        );
        assert_eq!(view, dump_of(&[("a", 1), ("b", 2), ("c", 3), ("n", 9)]));
    }

    #[test]
    fn merge_keeps_duplicate_names_together() {
        // Two Envoy clusters sharing one EDS service name list it twice.
        let mut view = dump_of(&[("a", 1), ("s", 2), ("b", 7), ("s", 3)]);
        let part = dump_of(&[("s", 4), ("s", 5)]);
        assert_eq!(merge(&mut view, &part, &asked(&["s"])), Ok(true));
        assert_eq!(view, dump_of(&[("a", 1), ("s", 4), ("s", 5), ("b", 7)]));
        let part = dump_of(&[("s", 4), ("s", 5)]);
        assert_eq!(merge(&mut view, &part, &asked(&["s"])), Ok(false));
    }

    #[test]
    fn merge_refuses_answers_that_do_not_match_the_question() {
        let last = dump_of(&[("a", 1), ("b", 2)]);
        let mut view = last.clone();
        let missing = merge(&mut view, &dump_of(&[]), &asked(&["b"]))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("lacks cluster \"b\""), "{missing}");
        let extra = merge(&mut view, &dump_of(&[("a", 1), ("b", 2)]), &asked(&["b"]))
            .unwrap_err()
            .to_string();
        assert!(extra.contains("brought cluster \"a\""), "{extra}");
        assert_eq!(view, last, "a refused answer leaves the view as it was");
    }
}
