//! The companion's status page (`/debug/services.html` on its metrics port)
//! in a real headless Chromium (Debian's `chromium`): it loads, shows every
//! endpoint of the managed Service port with its conditions and tier, and
//! the Envoy subscribed (by node id) with the version it ACKed; after a
//! slice change, a new load shows the new tiers and the new version. A
//! second subscriber (an EDS client speaking the xDS protocol, since a real
//! Envoy NACKs nothing the companion sends) refuses a response: the page
//! shows its NACK with the error message it sent.
//! Fails when Chromium is not installed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::companion::{eds_from_companion, Companion, SliceDir, XdsApi};
use support::envoy::fresh_dir;
use support::*;

const NODE: &str = "status-page-envoy";

/// Chromium, headless, in a new empty profile; `what` is `--dump-dom` or
/// `--screenshot=FILE`. Ends it after 60 s.
fn chromium(args: &[&str], url: &str) -> String {
    let bin = std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".into());
    let profile = fresh_dir("chromium-profile");
    let mut child = Command::new(&bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("{bin}: {e} (Debian: apt-get install chromium; or set CHROMIUM)")
        });
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium {args:?} {url}: no answer in 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    reader.join().unwrap()
}

fn status(c: &Companion) -> Value {
    let r = c.get("/debug/services");
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_str(&r.body).unwrap()
}

/// Waits until Envoy ACKed the companion's current snapshot; returns it.
fn acked_current(c: &Companion) -> String {
    let start = Instant::now();
    loop {
        let s = status(c);
        let version = s["snapshot_version"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let acked = s["subscribers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|sub| sub["node"] == NODE && sub["acked_version"] == version.as_str());
        if acked && !version.is_empty() {
            return version;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "Envoy did not ACK the current snapshot: {s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn row(dom: &str, tier: &str, addr: std::net::SocketAddr) -> bool {
    dom.contains(&format!("<tr class=\"{tier}\" data-address=\"{addr}\">"))
}

/// The "stream drain" cell of the endpoint row of `addr`.
fn drain_cell(dom: &str, addr: std::net::SocketAddr) -> Option<&str> {
    let row = &dom[dom.find(&format!("data-address=\"{addr}\">"))?..];
    let row = &row[..row.find("</tr>")?];
    let cell = &row[row.find("<td class=\"drain\">")? + "<td class=\"drain\">".len()..];
    Some(&cell[..cell.find("</td>")?])
}

#[test]
fn the_status_page_in_a_real_chromium_follows_a_slice_change() {
    let (a, b, c) = (
        Backend::start("A"),
        Backend::start("B"),
        Backend::start("C"),
    );
    let slices = SliceDir::create(&fresh_dir("status-slices"));
    slices.set_endpoints(
        "web",
        &[
            Endpoint::serving(a.addr()),
            Endpoint::serving_terminating(b.addr()),
            Endpoint::not_serving(c.addr()),
        ],
    );
    let companion = Companion::start(slices.path(), &[("backend", "web")], &[]);
    let _envoy = EnvoyBuilder::new()
        .tag("status-page")
        .eds_cluster("backend", &[])
        .bootstrap_hook(eds_from_companion(companion.listen_addr(), XdsApi::Ads))
        .bootstrap_hook(|b: &mut Value, _: &Path| b["node"]["id"] = NODE.into())
        .form(Form::Wasm)
        .start();
    let url = format!("http://{}/debug/services.html", companion.metrics_addr());

    let v1 = acked_current(&companion);
    // The default output: the terminating fallback at priority 1, the not
    // serving endpoint not sent at all.
    let endpoints = status(&companion)["services"][0]["endpoints"].clone();
    let at = |addr: std::net::SocketAddr| {
        endpoints
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["address"] == addr.to_string().as_str())
            .cloned()
            .unwrap()
    };
    assert_eq!(at(a.addr())["priority"], 0, "{endpoints}");
    assert_eq!(at(b.addr())["priority"], 1, "{endpoints}");
    assert_eq!(at(c.addr())["priority"], Value::Null, "{endpoints}");
    assert_eq!(at(c.addr())["health"], "not sent", "{endpoints}");
    // Row 5: B, terminating beside the ready A, drains.
    assert_eq!(at(b.addr())["stream_drain"], "draining", "{endpoints}");
    assert_eq!(at(a.addr())["stream_drain"], Value::Null, "{endpoints}");
    let dom = chromium(&["--dump-dom"], &url);
    assert!(dom.contains("cluster backend: e2e/web port http"), "{dom}");
    assert!(row(&dom, "ready", a.addr()), "A ready:\n{dom}");
    assert!(row(&dom, "terminating_fallback", b.addr()), "B:\n{dom}");
    assert!(row(&dom, "no_serving", c.addr()), "C:\n{dom}");
    assert!(dom.contains("<b class=\"serves-from\">ready</b>"), "{dom}");
    assert!(
        dom.contains(NODE) && dom.contains(&v1),
        "subscriber:\n{dom}"
    );
    assert!(dom.contains("Bounded: at most 1000 endpoint rows"), "{dom}");
    assert_eq!(drain_cell(&dom, b.addr()), Some("draining"), "{dom}");
    assert_eq!(drain_cell(&dom, a.addr()), Some("-"), "{dom}");
    assert!(
        dom.contains("serving_picker.drain.ended.{grpc,http1,http2,websocket}.reset"),
        "{dom}"
    );

    // A stops serving: the page shows the fallback tier and the new version.
    slices.set_endpoints(
        "web",
        &[
            Endpoint::not_serving(a.addr()),
            Endpoint::serving_terminating(b.addr()),
            Endpoint::not_serving(c.addr()),
        ],
    );
    let start = Instant::now();
    let v2 = loop {
        let v = acked_current(&companion);
        if v != v1 {
            break v;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no new snapshot");
        std::thread::sleep(Duration::from_millis(100));
    };
    let dom = chromium(&["--dump-dom"], &url);
    assert!(row(&dom, "no_serving", a.addr()), "A not serving:\n{dom}");
    assert!(row(&dom, "terminating_fallback", b.addr()), "B:\n{dom}");
    assert!(
        dom.contains("<b class=\"serves-from\">terminating_fallback</b>"),
        "{dom}"
    );
    assert!(dom.contains(&v2) && !dom.contains(&v1), "versions:\n{dom}");
    // Row 3: B is the only serving choice, its streams are kept.
    assert_eq!(
        drain_cell(&dom, b.addr()),
        Some("only serving choice"),
        "{dom}"
    );

    // A subscriber that refuses: its NACK and message on the page.
    nack_once(
        companion.listen_addr(),
        "status-page-nacker",
        "rejected by the test: <bad> & co",
    );
    let start = Instant::now();
    while !status(&companion)
        .to_string()
        .contains("rejected by the test")
    {
        assert!(start.elapsed() < Duration::from_secs(10), "no NACK shown");
        std::thread::sleep(Duration::from_millis(50));
    }
    let dom = chromium(&["--dump-dom"], &url);
    assert!(dom.contains("status-page-nacker"), "{dom}");
    assert!(
        dom.contains("rejected by the test: &lt;bad&gt; &amp; co"),
        "NACK message:\n{dom}"
    );

    // And it renders: a screenshot (kept with the test's files).
    let png = fresh_dir("status-screenshot").join("status-page.png");
    chromium(
        &[
            &format!("--screenshot={}", png.display()),
            "--window-size=1200,800",
        ],
        &url,
    );
    let bytes = std::fs::read(&png).unwrap();
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000,
        "{}",
        png.display()
    );
    eprintln!("status page screenshot: {}", png.display());
}

/// Subscribes to `backend` as `node` over EDS, takes the first response and
/// NACKs it with `message`.
fn nack_once(addr: std::net::SocketAddr, node: &str, message: &str) {
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
    use envoy_types::pb::envoy::service::endpoint::v3::endpoint_discovery_service_client::EndpointDiscoveryServiceClient;
    use envoy_types::pb::google::rpc::Status as RpcStatus;
    use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = EndpointDiscoveryServiceClient::new(channel);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let request = |nonce: &str, error: Option<RpcStatus>| DiscoveryRequest {
            node: Some(Node {
                id: node.to_string(),
                ..Default::default()
            }),
            resource_names: vec!["backend".to_string()],
            type_url: "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
                .to_string(),
            response_nonce: nonce.to_string(),
            error_detail: error,
            ..Default::default()
        };
        tx.send(request("", None)).await.unwrap();
        let mut responses = client
            .stream_endpoints(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let first = tokio::time::timeout(Duration::from_secs(10), responses.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let error = RpcStatus {
            code: 3,
            message: message.to_string(),
            ..Default::default()
        };
        tx.send(request(&first.nonce, Some(error))).await.unwrap();
        // Held open until the companion has read it.
        tokio::time::sleep(Duration::from_millis(500)).await;
    });
}
