#!/usr/bin/env python3
"""Helpers of benches/scale/run.sh (stdlib only).

  gen     DIR CLUSTERS HOSTS --ports ... --wasm PATH   EDS files, bootstraps, expected counts
  change  DIR FRACTION                                 a rolling-update step, renamed into place
  load    PORT PATH RATE SECONDS CONNS OUT             paced keep-alive GETs, latency summary
  cpu     PID                                          per-thread and machine CPU ticks (JSON)
  cpudiff A B                                          CPU shares between two `cpu` samples
  logscan LOG [OFFSET]                                 the filter's log lines from OFFSET on
  routecheck DIR PREFIX                                picks of the check requests (access log)
  assemble KV                                          KEY<TAB>JSON lines -> one result object
  table   RESULTS...                                   the final table
"""
import http.client
import json
import os
import random
import re
import statistics
import sys
import time

ZONES = ["zone-a", "zone-b", "zone-c"]
NS = "k8s.endpointslice"
PORT = 8080


# ------------------------------------------------------------------ endpoints


def address(g):
    """Global host index -> 127.1.x.y (nothing listens there)."""
    return "127.%d.%d.%d" % (1 + g // 62500, (g // 250) % 250, g % 250 + 1)


def conditions(state):
    return {
        "ready": {"ready": True, "serving": True, "terminating": False},
        "serving_terminating": {"ready": False, "serving": True, "terminating": True},
        "terminating_not_serving": {"ready": False, "serving": False, "terminating": True},
        "not_ready": {"ready": False, "serving": False, "terminating": False},
    }[state]


def pick_state(rnd):
    r = rnd.random()
    if r < 0.90:
        return "ready"
    if r < 0.95:
        return "serving_terminating"
    return "terminating_not_serving" if rnd.random() < 0.5 else "not_ready"


def pick_weight(rnd):
    r = rnd.random()
    return 1 if r < 0.80 else (2 if r < 0.95 else 5)


def tier_count(hosts):
    """What the filter's plan keeps (all priority 0, no local_zone): ready hosts if any, else
    serving ones (serving+terminating), else none."""
    addrs = lambda pred: {h["addr"] for h in hosts if pred(h["state"])}
    ready = addrs(lambda s: s == "ready")
    if ready:
        return len(ready)
    return len(addrs(lambda s: s == "serving_terminating"))


def cla(name, hosts):
    by_zone = {}
    for h in hosts:
        md = dict(conditions(h["state"]))
        md["zone"] = h["zone"]
        by_zone.setdefault(h["zone"], []).append({
            "endpoint": {"address": {"socket_address": {"address": h["addr"], "port_value": PORT}}},
            "load_balancing_weight": h["weight"],
            "metadata": {"filter_metadata": {NS: md}},
        })
    return {
        "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
        "cluster_name": name,
        "endpoints": [
            {"locality": {"region": "region-1", "zone": z}, "priority": 0, "lb_endpoints": eps}
            for z, eps in sorted(by_zone.items())
        ],
    }


def write_eds(d, name, hosts, version):
    """A new file beside the watched one, renamed into place (what a watched directory needs)."""
    edir = os.path.join(d, "eds", name)
    os.makedirs(edir, exist_ok=True)
    tmp = os.path.join(edir, ".eds.json.%d.tmp" % version)
    with open(tmp, "w") as f:
        json.dump({"version_info": str(version), "resources": [cla(name, hosts)]}, f, indent=1)
    return tmp, os.path.join(edir, "eds.json")


def expected(state):
    # + real_backend (STATIC, one host without metadata: serving); envoy_admin is not managed.
    hosts = sum(tier_count(c["hosts"]) for c in state["clusters"]) + 1
    return {"clusters": len(state["clusters"]) + 1, "hosts": hosts,
            "endpoints": sum(len(c["hosts"]) for c in state["clusters"])}


# ------------------------------------------------------------------ bootstrap


def override_policy():
    return {"policies": [{"typed_extension_config": {
        "name": "envoy.load_balancing_policies.override_host",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
            "override_host_sources": [{"header": "x-gateway-destination-endpoint"}],
            "fallback_policy": {"policies": [{"typed_extension_config": {
                "name": "envoy.load_balancing_policies.round_robin",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"},
            }}]},
        },
    }}]}


def hcm(stat_prefix, routes, filters, access_log=None):
    tc = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": stat_prefix,
        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}]},
        "http_filters": filters + [{
            "name": "envoy.filters.http.router",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
        }],
    }
    if access_log:
        tc["access_log"] = [{
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": access_log,
                "log_format": {"text_format_source": {"inline_string":
                    "ACCESS %REQ(:PATH)% code=%RESPONSE_CODE% flags=%RESPONSE_FLAGS% cluster=%UPSTREAM_CLUSTER% "
                    "override=%REQ(X-GATEWAY-DESTINATION-ENDPOINT)% upstream=%UPSTREAM_HOST%\n"}},
            },
        }]
    return {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": tc}]}


def sock(port, addr="127.0.0.1"):
    return {"socket_address": {"address": addr, "port_value": port}}


def static_cluster(name, port, policy=None):
    c = {"name": name, "type": "STATIC", "connect_timeout": "1s",
         "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
             {"endpoint": {"address": sock(port)}}]}]}}
    if policy:
        c["load_balancing_policy"] = policy
    return c


def bootstrap(d, names, listen, admin, backend, wasm, plugin_config):
    eds_clusters = []
    for n in names:
        edir = os.path.join(d, "eds", n)
        eds_clusters.append({
            "name": n, "type": "EDS", "connect_timeout": "1s",
            "eds_cluster_config": {"eds_config": {"resource_api_version": "V3", "path_config_source": {
                "path": os.path.join(edir, "eds.json"), "watched_directory": {"path": edir}}}},
            # as in envoy.yaml: an ejected host is read as not serving (no traffic here, no ejection)
            "outlier_detection": {"consecutive_5xx": 5, "consecutive_local_origin_failure": 2,
                                  "split_external_local_origin_errors": True,
                                  "interval": "1s", "base_ejection_time": "10s"},
            "load_balancing_policy": override_policy(),
        })
    routes = [{"match": {"prefix": "/c/%s/" % n}, "route": {"cluster": n}} for n in names]
    routes.append({"match": {"prefix": "/"}, "route": {"cluster": "real_backend"}})
    filters = []
    if wasm:
        filters.append({
            "name": "envoy.filters.http.wasm",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                "config": {
                    "name": "serving_picker",
                    "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                                      "value": plugin_config},
                    "vm_config": {"runtime": "envoy.wasm.runtime.v8", "code": {"local": {"filename": wasm}}},
                },
            },
        })
    direct = [{"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": "ok\n"}}}]
    return {
        "node": {"id": "bench-scale", "cluster": "bench-scale"},
        "admin": {"address": sock(admin)},
        "static_resources": {
            "listeners": [
                {"name": "main", "address": sock(listen),
                 "filter_chains": [hcm("ingress", routes, filters, os.path.join(d, "access.log"))]},
                # the one real upstream: a direct_response listener of the same Envoy
                {"name": "backend", "address": sock(backend),
                 "filter_chains": [hcm("backend", direct, [])]},
            ],
            "clusters": [static_cluster("envoy_admin", admin),
                         static_cluster("real_backend", backend, override_policy())] + eds_clusters,
        },
    }


def cmd_gen(argv):
    d, nclusters, nhosts = argv[0], int(argv[1]), int(argv[2])
    listen, admin, backend = (int(x) for x in argv[3:6])
    wasm, plugin_config = argv[6], argv[7]
    rnd = random.Random(1000 * nclusters + nhosts)
    width = max(3, len(str(nclusters - 1)))
    state = {"clusters": [], "next_g": 0, "version": 1}
    g = 0
    for c in range(nclusters):
        hosts = []
        for j in range(nhosts):
            if nhosts == 3:  # the baseline: like the demo, one of each
                st = ["ready", "serving_terminating", "not_ready"][j]
            else:
                st = "ready" if j == 0 else pick_state(rnd)
            hosts.append({"addr": address(g), "state": st, "zone": ZONES[rnd.randrange(3)],
                          "weight": pick_weight(rnd)})
            g += 1
        state["clusters"].append({"name": "svc-%0*d" % (width, c), "hosts": hosts})
    state["next_g"] = g
    eds_bytes = 0
    for c in state["clusters"]:
        tmp, path = write_eds(d, c["name"], c["hosts"], 1)
        os.rename(tmp, path)
        eds_bytes += os.path.getsize(path)
    names = [c["name"] for c in state["clusters"]]
    for kind, w in (("filter", wasm), ("nofilter", None)):
        with open(os.path.join(d, "bootstrap-%s.json" % kind), "w") as f:
            json.dump(bootstrap(d, names, listen, admin, backend, w, plugin_config), f, indent=1)
    with open(os.path.join(d, "state.json"), "w") as f:
        json.dump(state, f)
    exp = expected(state)
    exp["eds_bytes"] = eds_bytes
    exp["first_cluster"] = names[0]
    exp["first_ready"] = sorted("%s:%d" % (h["addr"], PORT) for h in state["clusters"][0]["hosts"]
                                if h["state"] == "ready")
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(exp, f)
    print("%d %d %d %d" % (exp["clusters"], exp["hosts"], exp["endpoints"], eds_bytes))


def cmd_change(argv):
    """A rolling-update step on FRACTION of every cluster's endpoints (at least one each): that many
    ready pods become serving+terminating and as many new, not yet ready pods appear. Every file is
    written first, then all are renamed into place back to back. Prints the expected host count."""
    d, fraction = argv[0], float(argv[1])
    with open(os.path.join(d, "state.json")) as f:
        state = json.load(f)
    rnd = random.Random(7)
    state["version"] += 1
    g = state["next_g"]
    flipped = added = 0
    renames = []
    for c in state["clusters"]:
        k = max(1, round(len(c["hosts"]) * fraction))
        ready = [h for h in c["hosts"] if h["state"] == "ready"]
        for h in rnd.sample(ready, min(k, len(ready))):
            h["state"] = "serving_terminating"
            flipped += 1
        for _ in range(k):
            c["hosts"].append({"addr": address(g), "state": "not_ready", "zone": ZONES[rnd.randrange(3)],
                               "weight": 1})
            g += 1
            added += 1
        renames.append(write_eds(d, c["name"], c["hosts"], state["version"]))
    state["next_g"] = g
    for tmp, path in renames:
        os.rename(tmp, path)
    renamed_ms = int(time.time() * 1000)
    with open(os.path.join(d, "state.json"), "w") as f:
        json.dump(state, f)
    exp = expected(state)
    print("%d %d %d %d %d %d" % (exp["hosts"], exp["endpoints"], flipped, added, len(renames), renamed_ms))


# ------------------------------------------------------------------ load


def pct(sorted_vals, p):
    if not sorted_vals:
        return float("nan")
    i = min(len(sorted_vals) - 1, max(0, int(round(p / 100.0 * len(sorted_vals) + 0.5)) - 1))
    return sorted_vals[i]


def cmd_load(argv):
    """Paced GETs (RATE per second for SECONDS) round robin over CONNS keep-alive connections
    (Envoy spreads connections over its workers). Latency from send to full response."""
    port, path, rate, seconds, nconns, out = int(argv[0]), argv[1], float(argv[2]), float(argv[3]), int(argv[4]), argv[5]
    conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=10) for _ in range(nconns)]
    lat, codes, errors, stamps = [], {}, 0, []
    start = time.monotonic()
    n = int(rate * seconds)
    for i in range(n):
        due = start + i / rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        c = conns[i % nconns]
        t0 = time.monotonic()
        try:
            c.request("GET", path)
            r = c.getresponse()
            r.read()
            dt = time.monotonic() - t0
            lat.append(dt * 1000.0)
            stamps.append((time.time(), dt * 1000.0))
            codes[r.status] = codes.get(r.status, 0) + 1
        except Exception:  # reconnect and go on
            errors += 1
            c.close()
            conns[i % nconns] = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    s = sorted(lat)
    res = {"n": len(lat), "errors": errors, "codes": codes,
           "p50": pct(s, 50), "p99": pct(s, 99), "max": s[-1] if s else float("nan"),
           "slowest": sorted(stamps, key=lambda x: -x[1])[:5]}
    with open(out, "w") as f:
        json.dump(res, f)


# ------------------------------------------------------------------ cpu


def cmd_cpu(argv):
    pid = argv[0]
    threads = {}
    base = "/proc/%s/task" % pid
    for tid in os.listdir(base):
        try:
            with open("%s/%s/stat" % (base, tid)) as f:
                st = f.read()
            name = st[st.index("(") + 1:st.rindex(")")]
            fields = st[st.rindex(")") + 2:].split()
            threads[tid] = [name, int(fields[11]) + int(fields[12])]
        except (OSError, ValueError):
            pass
    with open("/proc/stat") as f:
        cpu = f.readline().split()[1:]
    v = [int(x) for x in cpu]
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)
    print(json.dumps({"t": time.time(), "threads": threads, "machine_busy": busy,
                      "hz": os.sysconf("SC_CLK_TCK"), "ncpu": os.cpu_count()}))


def cmd_cpudiff(argv):
    a, b = (json.load(open(p)) for p in argv[:2])
    secs = b["t"] - a["t"]
    hz = a["hz"]
    share = lambda ticks: 100.0 * ticks / hz / secs
    by = {"main": 0, "workers": 0, "other_threads": 0}
    worst_worker = 0
    for tid, (name, ticks) in b["threads"].items():
        d = ticks - a["threads"].get(tid, [name, 0])[1]
        if name.startswith("wrk:"):
            by["workers"] += d
            worst_worker = max(worst_worker, d)
        elif name == "envoy":
            by["main"] += d
        else:
            by["other_threads"] += d
    envoy = sum(by.values())
    machine = b["machine_busy"] - a["machine_busy"]
    print(json.dumps({"secs": secs, "main_pct": share(by["main"]), "workers_pct": share(by["workers"]),
                      "busiest_worker_pct": share(worst_worker),
                      "envoy_pct": share(envoy), "machine_pct": share(machine),
                      "other_pct": share(machine - envoy), "ncpu": a["ncpu"]}))


# ------------------------------------------------------------------ log


REFRESH = re.compile(r"^\[([^\]]+)\]\[(\d+)\].*serving_picker: refresh: (\d+) clusters, (\d+) admin bytes, "
                     r"(\d+) us in the VM, (\d+) ms end to end")
LEADER = re.compile(r"^\[[^\]]+\]\[(\d+)\].*serving_picker: context (\w+) is now the admin poller")


def cmd_logscan(argv):
    """Refresh lines, leader changes and warnings from byte OFFSET on."""
    path, offset = argv[0], int(argv[1]) if len(argv) > 1 else 0
    refreshes, leaders, warnings = [], [], []
    with open(path, "rb") as f:
        f.seek(offset)
        for raw in f:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            m = REFRESH.search(line)
            if m:
                refreshes.append({"ts": m.group(1), "tid": m.group(2), "clusters": int(m.group(3)),
                                  "admin_bytes": int(m.group(4)), "vm_us": int(m.group(5)),
                                  "e2e_ms": int(m.group(6)), "published": False})
                continue
            if "serving_picker: published snapshot" in line and refreshes:
                refreshes[-1]["published"] = True
                continue
            m = LEADER.search(line)
            if m:
                leaders.append({"tid": m.group(1), "context": m.group(2)})
            if ("][warning]" in line or "][error]" in line or "][critical]" in line) and "serving_picker" in line:
                warnings.append(line[:400])
    print(json.dumps({"refreshes": refreshes, "leaders": leaders, "warnings": warnings}))


# ------------------------------------------------------------------ routing, results


def cmd_routecheck(argv):
    """Access log lines of the check requests: the first override address must be in the tier the
    first cluster has now (ready hosts, else serving+terminating) and the upstream Envoy tried must
    be that address."""
    d, prefix = argv[0], argv[1]
    state = json.load(open(os.path.join(d, "state.json")))  # the endpoints as they are now
    hosts = state["clusters"][0]["hosts"]
    tier = [h for h in hosts if h["state"] == "ready"] or [h for h in hosts if h["state"] == "serving_terminating"]
    ready = {"%s:%d" % (h["addr"], PORT) for h in tier}
    good = total = 0
    bad = []
    with open(os.path.join(d, "access.log")) as f:
        for line in f:
            if not line.startswith("ACCESS " + prefix):
                continue
            total += 1
            kv = dict(p.split("=", 1) for p in line.split()[2:] if "=" in p)
            first = kv.get("override", "-").split(",")[0]
            if first in ready and kv.get("upstream") == first:
                good += 1
            else:
                bad.append(line.strip())
    print(json.dumps("%d/%d%s" % (good, total, (" BAD: " + bad[0]) if bad else "")))


def cmd_assemble(argv):
    """KEY<TAB>JSON lines (dotted keys nest) -> one JSON object."""
    out = {}
    with open(argv[0]) as f:
        for line in f:
            if not line.strip():
                continue
            key, val = line.rstrip("\n").split("\t", 1)
            node = out
            parts = key.split(".")
            for p in parts[:-1]:
                node = node.setdefault(p, {})
            node[parts[-1]] = json.loads(val)
    print(json.dumps(out))


# ------------------------------------------------------------------ table


def fmt_int(v):
    return "-" if v is None else "{:,}".format(int(v))


def cmd_table(argv):
    results = [json.load(open(p)) for p in argv]
    rows = []

    def row(label, f):
        vals = []
        for r in results:
            try:
                v = f(r)
            except (KeyError, TypeError, IndexError, ValueError, ZeroDivisionError):
                v = None
            vals.append("-" if v is None else str(v))
        rows.append((label, vals))

    def ms(v, nd=0):
        return None if v is None else ("%.*f" % (nd, v))

    def mb(kb):
        return None if kb is None else "%.1f" % (kb / 1024.0)

    def lat(d):
        return None if not d or not d.get("n") else "%.1f / %.1f / %.1f (n=%d%s)" % (
            d["p50"], d["p99"], d["max"], d["n"],
            "" if set(d["codes"]) == {"200"} and not d["errors"] else ", codes %s err %d" % (d["codes"], d["errors"]))

    def pub(refreshes):
        return [x for x in refreshes if x.get("published")]

    def refresh(x):
        return None if not x else "%s us VM, %s ms e2e, %s B" % (fmt_int(x["vm_us"]), fmt_int(x["e2e_ms"]),
                                                                 fmt_int(x["admin_bytes"]))

    row("EDS endpoints (clusters x hosts)", lambda r: "%s (%d x %d)" % (fmt_int(r["endpoints"]), r["nclusters"], r["nhosts"]))
    row("EDS files, bytes", lambda r: fmt_int(r["eds_bytes"]))
    row("expected snapshot hosts / clusters", lambda r: "%s / %s" % (fmt_int(r["expect_hosts"]), fmt_int(r["expect_clusters"])))
    row("Envoy start -> /ready, ms", lambda r: ms(r["start_to_ready_ms"]))
    row("snapshot.hosts at /ready", lambda r: fmt_int(r["hosts_at_ready"]))
    row("/ready -> full snapshot published, ms", lambda r: ms(r["ready_to_full_ms"]))
    row("refreshes logged / published until full", lambda r: "%d / %d" % (len(r["first"]["refreshes"]), len(pub(r["first"]["refreshes"]))))
    row("first load: the refresh that published it", lambda r: refresh(pub(r["first"]["refreshes"])[-1]))
    row("first load: gauges busy_us / admin_bytes", lambda r: "%s / %s" % (fmt_int(r["g_first"]["refresh_busy_us"]), fmt_int(r["g_first"]["admin_bytes"])))
    row("snapshot.bytes (encoded)", lambda r: fmt_int(r["g_first"]["bytes"]))
    row("steady polls: busy_us gauge (last full refresh) median / max (n)", lambda r: "%s / %s (%d)" % (
        fmt_int(statistics.median(r["steady_busy"])), fmt_int(max(r["steady_busy"])), len(r["steady_busy"])))
    row("steady refreshes: e2e ms median (debug log)", lambda r: fmt_int(statistics.median(x["e2e_ms"] for x in r["steady_log"]["refreshes"])))
    row("  of them logged as changed (dump re-parsed)", lambda r: "%d (published %d)" % (len(r["steady_log"]["refreshes"]), len(pub(r["steady_log"]["refreshes"]))))
    row("steady CPU % of a core: main / workers / Envoy", lambda r: "%.1f / %.1f / %.1f" % (
        r["cpu_steady"]["main_pct"], r["cpu_steady"]["workers_pct"], r["cpu_steady"]["envoy_pct"]))
    row("config_dump(EDS) bytes", lambda r: fmt_int(r["curl"]["dump_bytes"]))
    row("  curl ms: no filter / filter polling", lambda r: "%s / %s" % (ms(r["curl_nofilter"]["dump_ms"], 1), ms(r["curl"]["dump_ms"], 1)))
    row("/clusters?format=json bytes", lambda r: fmt_int(r["curl"]["clusters_bytes"]))
    row("  curl ms: no filter / filter polling", lambda r: "%s / %s" % (ms(r["curl_nofilter"]["clusters_ms"], 1), ms(r["curl"]["clusters_ms"], 1)))
    row("1% change: endpoints flipped + added, files", lambda r: "%d + %d, %d" % (r["change"]["flipped"], r["change"]["added"], r["change"]["files"]))
    row("1% change: rename -> snapshot, ms", lambda r: ms(r["change"]["to_snapshot_ms"]))
    row("1% change: snapshots published", lambda r: len(pub(r["change"]["refreshes"])))
    row("1% change: last published refresh", lambda r: refresh(pub(r["change"]["refreshes"])[-1]))
    row("1% change: max VM us of published refreshes", lambda r: fmt_int(max(x["vm_us"] for x in pub(r["change"]["refreshes"]))))
    row("after the change: busy_us median (n)", lambda r: "%s (%d)" % (fmt_int(statistics.median(r["after_busy"])), len(r["after_busy"])))
    row("RSS MB: at /ready", lambda r: mb(r["rss"]["ready"]))
    row("RSS MB: full snapshot", lambda r: mb(r["rss"]["full"]))
    row("RSS MB: steady (~10 refreshes later)", lambda r: mb(r["rss"]["steady"]))
    row("RSS MB: after change +10 / +20 / +30 refreshes", lambda r: " / ".join(mb(x) for x in r["rss"]["series"]))
    row("RSS MB: same Envoy without the filter", lambda r: mb(r["rss"]["nofilter"]))
    row("latency ms p50/p99/max: no filter", lambda r: lat(r["lat"]["nofilter"]))
    row("latency ms: filter, steady refreshes", lambda r: lat(r["lat"]["steady"]))
    row("latency ms: filter, during the 1% change", lambda r: lat(r["lat"]["change"]))
    row("routing check: picks in the right tier", lambda r: r["routing"])
    row("refresh_error at: steady / +admin curls / +change / +30", lambda r: " / ".join(
        fmt_int(r["errors"][k]) for k in ("steady", "curls", "change", "after")))
    row("polls ok (full refreshes + gate skips) / errors / published", lambda r: "%s (%s + %s) / %s / %s" % (
        fmt_int(r["g_end"]["refresh_ok"]), fmt_int(r["g_end"]["refresh_ok"] - r["g_end"].get("skipped", 0)),
        fmt_int(r["g_end"].get("skipped", 0)), fmt_int(r["g_end"]["refresh_error"]), fmt_int(r["g_end"]["published"])))
    row("filter warnings in the log", lambda r: len(r["warnings"]))
    row("leader thread", lambda r: r["leader"])
    row("machine CPU % (all cores) / others, steady", lambda r: "%.0f / %.0f" % (
        r["cpu_steady"]["machine_pct"], r["cpu_steady"]["other_pct"]))
    row("loadavg at start", lambda r: r["loadavg"])

    head = ["figure"] + [r["scenario"] for r in results]
    w0 = max(len(l) for l, _ in rows + [(head[0], None)])
    ws = [max([len(head[i + 1])] + [len(v[i]) for _, v in rows]) for i in range(len(results))]
    line = lambda cells: "| " + cells[0].ljust(w0) + " | " + " | ".join(c.ljust(ws[i]) for i, c in enumerate(cells[1:])) + " |"
    print(line(head))
    print("|" + "-" * (w0 + 2) + "|" + "|".join("-" * (w + 2) for w in ws) + "|")
    for label, vals in rows:
        print(line([label] + vals))


def main():
    cmds = {"gen": cmd_gen, "change": cmd_change, "load": cmd_load, "cpu": cmd_cpu, "cpudiff": cmd_cpudiff,
            "logscan": cmd_logscan, "table": cmd_table, "routecheck": cmd_routecheck,
            "assemble": cmd_assemble}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    cmds[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
