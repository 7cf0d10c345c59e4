//! The status page as HTML, rendered from the page's model ([`Page`]): no
//! script, every load is current; every value escaped.

use std::fmt::Write as _;

use serde_json::Value;

use super::{Page, StreamDrain};

/// A value as the page prints it: escaped, `-` for none.
trait Cell {
    fn cell(&self) -> String;
}

impl Cell for str {
    fn cell(&self) -> String {
        self.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    }
}

impl Cell for String {
    fn cell(&self) -> String {
        self.as_str().cell()
    }
}

impl Cell for &str {
    fn cell(&self) -> String {
        (*self).cell()
    }
}

/// Numbers and booleans as the JSON writes them.
macro_rules! cell_as_json {
    ($($t:ty),*) => {$(
        impl Cell for $t {
            fn cell(&self) -> String {
                Value::from(*self).to_string()
            }
        }
    )*};
}
cell_as_json!(bool, u32, u64, usize, f64);

impl<T: Cell> Cell for Option<T> {
    fn cell(&self) -> String {
        self.as_ref().map_or_else(|| "-".to_string(), Cell::cell)
    }
}

/// Where the counts of streams ended for drain live: Envoy's stats, by
/// form (each `<protocol>.<outcome>` a counter), and the Prometheus names
/// Envoy's `/stats/prometheus` gives them (the shipped rules' convention:
/// deploy/monitoring).
const DRAIN_COUNTERS: &str = "<h2>Streams ended for drain</h2>\
<p id=\"drain-counters\">The companion sees conditions, not streams: the counts of long-lived streams ended for drain are each Envoy's, by protocol and outcome. \
wasm form: <code>serving_picker.drain.ended.{grpc,http1,http2,websocket}.reset</code> (Prometheus <code>serving_picker_drain_ended_grpc_reset</code> and alike), gauge <code>serving_picker.drain.draining_hosts</code>. \
native form: <code>dynamicmodulescustom.serving_picker.drain.ended.{grpc.trailers_unavailable,http1.reset,http2.reset,websocket.reset}</code> \
(Prometheus <code>envoy_dynamicmodulescustom_serving_picker_drain_ended_grpc_trailers_unavailable</code> and alike). \
They count only where the Envoy sets <code>drain_window_ms</code>.</p>\n";

pub(super) fn render(page: &Page) -> String {
    let mut h = String::with_capacity(16 * 1024);
    h.push_str("<!doctype html><html><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"5\">\
<title>serving-picker-conditions: services</title><style>\
body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.4em 0 1.4em}\
td,th{border:1px solid #ccc;padding:3px 8px;font-size:14px;text-align:left}th{background:#f0f0f0}\
.ready{background:#dff5df}.terminating_fallback{background:#fff3cd}.no_serving{background:#f8d7da}\
.nack{color:#a00}.small{color:#666;font-size:12px}</style></head><body>\n");
    let _ = writeln!(
        h,
        "<h1>serving-picker-conditions</h1><p>Snapshot <b id=\"version\">{}</b>, published {} s ago. Tiers as EDS priorities: {}.</p>",
        page.snapshot_version.cell(),
        page.published_seconds_ago.cell(),
        page.priority_output.cell()
    );
    let p = &page.programming_latency;
    let _ = writeln!(
        h,
        "<p id=\"programming\">Programming latency (change to each Envoy's ACK), last {} changes: p50 <b>{}</b> s, p99 <b>{}</b> s, max {} s ({} changes ACKed in all).</p>",
        p.recent.cell(),
        p.p50_seconds.cell(),
        p.p99_seconds.cell(),
        p.max_seconds.cell(),
        p.changes_acked.cell(),
    );
    if !page.native_lb_team_policies.is_empty() {
        h.push_str("<h2>Clusters that keep a team's load balancer (no native form)</h2>\n<table id=\"team-policies\"><tr><th>shape</th><th>clusters</th><th>one of them</th></tr>\n");
        for r in &page.native_lb_team_policies {
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                r.shape.cell(),
                r.clusters.cell(),
                r.example.cell()
            );
        }
        h.push_str("</table>\n");
    }
    h.push_str("<h2>Managed Service ports</h2>\n");
    for p in &page.services {
        let _ = writeln!(
            h,
            "<h3 class=\"port\" data-cluster=\"{c}\">cluster {c}: {s} port {pn}</h3><p>{n} endpoints, {sv} serving; Envoy serves from tier <b class=\"serves-from\">{t}</b>.</p>",
            c = p.cluster.cell(),
            s = p.service.cell(),
            pn = p.port_name.cell(),
            n = p.total.cell(),
            sv = p.serving.cell(),
            t = p.serves_from.cell(),
        );
        let d = p.stream_drain;
        if d.draining + d.only_serving_choice > 0 {
            let _ = writeln!(
                h,
                "<p class=\"stream-drain\">Stream drain: <b class=\"draining\">{}</b> draining (terminating beside a ready endpoint: Envoys with <code>drain_window_ms</code> end their long-lived streams within the window); <b class=\"only-serving-choice\">{}</b> serving+terminating kept as the only serving choice (their streams are never ended early).</p>",
                d.draining.cell(),
                d.only_serving_choice.cell(),
            );
        }
        h.push_str("<table><tr><th>address</th><th>ready</th><th>serving</th><th>terminating</th><th>zone</th><th>node</th><th>hints (zones)</th><th>hints (nodes)</th><th>tier</th><th>priority</th><th>health</th><th>stream drain</th></tr>\n");
        for e in &p.endpoints {
            let _ = writeln!(
                h,
                "<tr class=\"{t}\" data-address=\"{a}\"><td>{a}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"tier\">{t}</td><td>{}</td><td>{}</td><td class=\"drain\">{}</td></tr>",
                e.ready.cell(),
                e.serving.cell(),
                e.terminating.cell(),
                e.zone.cell(),
                e.node_name.cell(),
                e.hints_zones.cell(),
                e.hints_nodes.cell(),
                e.priority.cell(),
                e.health.cell(),
                e.stream_drain.map(StreamDrain::text).cell(),
                a = e.address.cell(),
                t = e.tier.cell(),
            );
        }
        h.push_str("</table>\n");
    }
    h.push_str(DRAIN_COUNTERS);
    h.push_str("<h2>Subscribers</h2><table><tr><th>node</th><th>peer</th><th>peers of this node id</th><th>open streams</th><th>last ACKed version</th><th>ACKed (s ago)</th><th>last changes applied (slowest)</th><th>last NACK</th></tr>\n");
    for s in &page.subscribers {
        let nack = s.last_nack.as_ref().map_or_else(
            || "-".to_string(),
            |n| {
                format!(
                    "<span class=\"nack\">version {} {} s ago from {}: {}</span>",
                    n.version.cell(),
                    n.seconds_ago.cell(),
                    n.peer.cell(),
                    n.message.cell()
                )
            },
        );
        let programmed = s.last_programmed.map_or_else(
            || "-".to_string(),
            |p| {
                format!(
                    "{} ({} s), {} s ago",
                    p.changes.cell(),
                    p.slowest_seconds.cell(),
                    p.seconds_ago.cell()
                )
            },
        );
        let _ = writeln!(
            h,
            "<tr class=\"subscriber\"><td>{}</td><td>{}</td><td class=\"peers\">{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"programmed\">{programmed}</td><td>{nack}</td></tr>",
            s.node.cell(),
            s.peer.cell(),
            s.peers.join(", ").cell(),
            s.open_streams.cell(),
            s.acked_version.cell(),
            s.acked_seconds_ago.cell(),
        );
    }
    h.push_str("</table>\n");
    let r = page.xds_retained_bytes;
    let _ = writeln!(
        h,
        "<p id=\"retained\">xDS streams keep <b>{}</b> bytes of resource names between requests (limit {}, --max-retained-bytes).</p>",
        r.held.cell(),
        r.limit.cell(),
    );
    let b = page.bounds;
    let _ = writeln!(
        h,
        "<p class=\"small\">Bounded: at most {} endpoint rows (left out here: {}), {} ports (left out here: {}), {} subscribers, names cut to {} characters, NACK messages to {}. JSON: <a href=\"/debug/services\">/debug/services</a>. Refreshes every 5 s.</p></body></html>",
        b.max_endpoint_rows.cell(),
        b.endpoint_rows_left_out.cell(),
        b.max_port_rows.cell(),
        b.ports_left_out.cell(),
        b.max_subscribers.cell(),
        b.max_text_chars.cell(),
        b.max_nack_message_chars.cell(),
    );
    h
}
