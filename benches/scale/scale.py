#!/usr/bin/env python3
"""Helpers of benches/scale/run.sh (stdlib only).

  gen     DIR CLUSTERS HOSTS --ports ... --wasm PATH   EDS files, bootstraps, expected counts
  change  DIR FRACTION [--only N]                      a rolling-update step, renamed into place
  load    PORT PATH RATE SECONDS CONNS OUT             paced keep-alive GETs, latency summary
  cpu     PID                                          per-thread and machine CPU ticks (JSON)
  cpudiff A B                                          CPU shares between two `cpu` samples
  cpuwin  A B                                          main thread's CPU between two `cpu` samples
  waitlog LOG OFFSET SINCE_MS TIMEOUT_S                waits for a refresh line logged at/after SINCE_MS
  logscan LOG [OFFSET]                                 the filter's log lines from OFFSET on
  repsummary KV KIND                                   one line of a repeated-change phase's figures
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
    written first, then all are renamed into place back to back. With --only N, only cluster N
    (index, modulo the cluster count) changes: one Deployment's rolling update, one EDS file.
    Prints the expected host count."""
    args = list(argv)
    only = None
    if "--only" in args:
        i = args.index("--only")
        only = int(args[i + 1])
        del args[i:i + 2]
    d, fraction = args[0], float(args[1])
    with open(os.path.join(d, "state.json")) as f:
        state = json.load(f)
    rnd = random.Random(7)
    state["version"] += 1
    g = state["next_g"]
    flipped = added = 0
    renames = []
    clusters = state["clusters"]
    if only is not None:
        clusters = [clusters[only % len(clusters)]]
    for c in clusters:
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
    """Per thread: [name, utime+stime ticks, on-CPU ns from schedstat (None without it)]."""
    pid = argv[0]
    threads = {}
    base = "/proc/%s/task" % pid
    for tid in os.listdir(base):
        try:
            with open("%s/%s/stat" % (base, tid)) as f:
                st = f.read()
            name = st[st.index("(") + 1:st.rindex(")")]
            fields = st[st.rindex(")") + 2:].split()
            ns = None
            try:
                with open("%s/%s/schedstat" % (base, tid)) as f:
                    ns = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
            threads[tid] = [name, int(fields[11]) + int(fields[12]), ns]
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
    for tid, th in b["threads"].items():
        name, ticks = th[0], th[1]
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


def cmd_cpuwin(argv):
    """The main thread's (the one named "envoy") CPU between two `cpu` samples: ticks (utime+stime,
    1/hz s each) and schedstat ns; every thread name's beside it."""
    a, b = (json.load(open(p)) for p in argv[:2])

    def pick(sample, pred):
        return {tid: th for tid, th in sample["threads"].items() if pred(th[0])}

    main_a, main_b = (pick(x, lambda n: n == "envoy") for x in (a, b))
    ticks = sum(th[1] - main_a.get(tid, [None, 0, 0])[1] for tid, th in main_b.items())
    ns = None
    if all(th[2] is not None for th in list(main_a.values()) + list(main_b.values())):
        ns = sum(th[2] - (main_a.get(tid, [None, 0, 0])[2] or 0) for tid, th in main_b.items())
    by_name = {}  # every thread name: [ticks, ns] in the window
    for tid, th in b["threads"].items():
        old = a["threads"].get(tid) or [th[0], 0, 0]
        acc = by_name.setdefault(th[0], [0, 0])
        acc[0] += th[1] - old[1]
        acc[1] += (th[2] or 0) - (old[2] or 0)
    print(json.dumps({"t0": a["t"], "t1": b["t"], "secs": b["t"] - a["t"], "hz": a["hz"], "ticks": ticks,
                      "ns": ns, "main_threads": len(main_b), "by_name": by_name}))


# ------------------------------------------------------------------ log


REFRESH = re.compile(r"^\[([^\]]+)\]\[(\d+)\].*serving_picker: refresh: (\d+) clusters, (\d+) admin bytes, "
                     r"(\d+) us in the VM, (\d+) ms end to end(?:, narrowed to (\d+) changed clusters)?")
LEADER = re.compile(r"^\[[^\]]+\]\[(\d+)\].*serving_picker: context (\w+) is now the admin poller")
# the start of a refresh and the change gate's reason ("full refresh (X)" in earlier builds)
FULL = re.compile(r"^\[([^\]]+)\].*serving_picker: (?:full )?refresh \((\w+)\)")
PUBLISHED = "serving_picker: published snapshot"


def log_ms(ts):
    """Envoy's log timestamp ("2026-12-03 08:17:34.329", local time) -> epoch ms."""
    return int(time.mktime(time.strptime(ts[:19], "%Y-%m-%d %H:%M:%S")) * 1000) + int(ts[20:23] or 0)


def cmd_waitlog(argv):
    """Waits for a refresh line (the filter's debug line of a refresh that saw a change) logged at or
    after SINCE_MS, from byte OFFSET on; with --periodic, for the start of a periodic full refresh
    instead. Reads Envoy's log file only: no admin call, so no work for Envoy's main thread. Prints
    its epoch ms; exit status 1 after TIMEOUT_S without one."""
    path, offset, since, timeout = argv[0], int(argv[1]), int(argv[2]), float(argv[3])
    periodic = "--periodic" in argv[4:]
    pattern = FULL if periodic else REFRESH
    deadline = time.monotonic() + timeout
    buf = b""
    with open(path, "rb") as f:
        f.seek(offset)
        while True:
            chunk = f.read()
            if chunk:
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for raw in lines:
                    m = pattern.search(raw.decode("utf-8", "replace"))
                    if m and (not periodic or m.group(2) == "Periodic") and log_ms(m.group(1)) >= since:
                        print(log_ms(m.group(1)))
                        return
            elif time.monotonic() > deadline:
                sys.exit(1)
            else:
                time.sleep(0.05)


def cmd_logscan(argv):
    """Refresh lines, leader changes and warnings from byte OFFSET on."""
    path, offset = argv[0], int(argv[1]) if len(argv) > 1 else 0
    refreshes, leaders, warnings, fulls = [], [], [], []
    pub_ms = None  # a publish line not yet paired with its refresh line
    with open(path, "rb") as f:
        f.seek(offset)
        for raw in f:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            m = REFRESH.search(line)
            if m:
                ms = log_ms(m.group(1))
                refreshes.append({"ts": m.group(1), "ms": ms, "tid": m.group(2), "clusters": int(m.group(3)),
                                  "admin_bytes": int(m.group(4)), "vm_us": int(m.group(5)),
                                  "e2e_ms": int(m.group(6)),
                                  "narrowed_to": None if m.group(7) is None else int(m.group(7)),
                                  # the publish line comes just before the refresh line (or, in
                                  # earlier builds, just after): the same callback
                                  "published": pub_ms is not None and 0 <= ms - pub_ms <= 100})
                pub_ms = None
                continue
            if PUBLISHED in line and line.startswith("["):
                ms = log_ms(line[1:line.index("]")])
                last = refreshes[-1] if refreshes else None
                if last and not last["published"] and 0 <= ms - last["ms"] <= 100:
                    last["published"] = True
                else:
                    pub_ms = ms
                continue
            m = FULL.search(line)
            if m:
                fulls.append({"ms": log_ms(m.group(1)), "reason": m.group(2)})
                continue
            m = LEADER.search(line)
            if m:
                leaders.append({"tid": m.group(1), "context": m.group(2)})
            if ("][warning]" in line or "][error]" in line or "][critical]" in line) and "serving_picker" in line:
                warnings.append(line[:400])
    print(json.dumps({"refreshes": refreshes, "leaders": leaders, "warnings": warnings, "fulls": fulls}))


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


def load_kv(path):
    """KEY<TAB>JSON lines (dotted keys nest) -> one object."""
    out = {}
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            key, val = line.rstrip("\n").split("\t", 1)
            node = out
            parts = key.split(".")
            for p in parts[:-1]:
                node = node.setdefault(p, {})
            node[parts[-1]] = json.loads(val)
    return out


def cmd_assemble(argv):
    """KEY<TAB>JSON lines (dotted keys nest) -> one JSON object."""
    print(json.dumps(load_kv(argv[0])))


# ------------------------------------------------------------------ repeated changes


KINDS = (("all", "all clusters, 1% each"), ("one", "one cluster, 10%"))


def win_ms(w, rate_win=None):
    """The main thread's CPU in window W in ms, as (from ticks, from schedstat ns); minus the rate
    of RATE_WIN times W's length when given. ns is None without schedstat."""
    hz = w["hz"]
    t = w["ticks"] - (rate_win["ticks"] / rate_win["secs"] * w["secs"] if rate_win else 0)
    n = None
    if w.get("ns") is not None and (rate_win is None or rate_win.get("ns") is not None):
        n = w["ns"] - (rate_win["ns"] / rate_win["secs"] * w["secs"] if rate_win else 0)
    return t * 1000.0 / hz, (None if n is None else n / 1e6)


def rep_figures(r, kind):
    """The figures of one kind's repeated-change phase (see run.sh's header)."""
    rep = r["rep"][kind]
    k = rep["k"]
    base, per, ph, st = rep["base"], rep["periodic"], rep["phase"], rep["stats"]
    fulls = lambda g: g["refresh_ok"] - g["skipped"]
    f = {"k": k, "files": rep["files"], "flipped": rep["flipped"], "added": rep["added"]}
    # phase minus the steady rate (gate polls only) over its length, per change
    t, n = win_ms(ph, base)
    f["ms"], f["ms_ns"] = t / k, (None if n is None else n / k)
    # one periodic full refresh that finds nothing changed, net of the same rate
    f["periodic_ms"], f["periodic_ms_ns"] = win_ms(per, base)
    f["base_rate_ms_s"] = win_ms(base)[0] / base["secs"]
    f["base_ok"] = fulls(st["m"]) == fulls(st["a"])
    f["periodic_ok"] = fulls(st["b"]) - fulls(st["m"]) == 1
    lo, hi = ph["t0"] * 1000, ph["t1"] * 1000
    lines = [x for x in rep["log"]["refreshes"] if lo <= x["ms"] <= hi]
    f["lines"], f["published"] = len(lines), sum(1 for x in lines if x.get("published"))
    f["narrowed"] = sum(1 for x in lines if x.get("narrowed_to") is not None)
    # the other threads (a worker holding the lease does the VM work there), net of their rates
    f["others"] = {}
    for tname, (pt, pn) in (ph.get("by_name") or {}).items():
        if tname == "envoy":
            continue
        bt, bn = (base.get("by_name") or {}).get(tname, [0, 0])
        f["others"][tname] = (pn - bn / base["secs"] * ph["secs"]) / 1e6 / k
    f["fulls"] = fulls(st["p1"]) - fulls(st["p0"])
    f["reasons"] = {}
    for x in rep["log"]["fulls"]:
        if lo <= x["ms"] <= hi:
            f["reasons"][x["reason"]] = f["reasons"].get(x["reason"], 0) + 1
    # full refreshes that found no change (periodic ones): their share, taken out. Such a refresh
    # logs no refresh line, or (when it re-plans after a narrowed one) a line that published nothing.
    replanned = sum(1 for x in lines if not x.get("published") and x.get("narrowed_to") is None)
    f["unchanged"] = max(0, f["fulls"] - f["lines"]) + replanned
    f["ms_wo_unchanged"] = f["ms"] - f["unchanged"] * f["periodic_ms"] / k
    f["ms_ns_wo_unchanged"] = (None if f["ms_ns"] is None or f["periodic_ms_ns"] is None
                               else f["ms_ns"] - f["unchanged"] * f["periodic_ms_ns"] / k)
    f["flags"] = (["%d change(s) waited by polling /stats (admin calls in the phase)" % rep["fallback_waits"]]
                  if rep.get("fallback_waits") else []) + (
                  ["snapshot.hosts reached the expected count only after the phase"] if rep.get("hosts_late") else [])
    f["skips_phase"] = st["p1"]["skipped"] - st["p0"]["skipped"]
    f["skips_base"] = st["m"]["skipped"] - st["a"]["skipped"]
    # rename -> the last refresh line before the next rename
    trens = rep["trens"]
    lat = []
    for i, t0 in enumerate(trens):
        nxt = trens[i + 1] if i + 1 < len(trens) else hi
        seen = [x["ms"] for x in lines if t0 <= x["ms"] < nxt]
        if seen:
            lat.append(max(seen) - t0)
    f["latency"] = lat
    f["vm_us"] = [x["vm_us"] for x in lines]
    f["admin_bytes"] = [x["admin_bytes"] for x in lines]
    f["e2e_ms"] = [x["e2e_ms"] for x in lines]
    f["raw"] = {"phase_s": ph["secs"], "phase_ticks": ph["ticks"], "phase_ns": ph.get("ns"),
                "base_s": base["secs"], "base_ticks": base["ticks"], "base_ns": base.get("ns"),
                "periodic_s": per["secs"], "periodic_ticks": per["ticks"]}
    ref = (r.get("ref") or {}).get(kind)
    if ref:
        rt, rn = win_ms(ref["phase"], ref["idle"])
        f["ref_ms"], f["ref_ms_ns"] = rt / k, (None if rn is None else rn / k)
        f["ref_updates_ok"] = ref["updates"] == ref["files"]
        f["ref_raw"] = {"phase_s": ref["phase"]["secs"], "phase_ticks": ref["phase"]["ticks"],
                        "idle_s": ref["idle"]["secs"], "idle_ticks": ref["idle"]["ticks"],
                        "updates": ref["updates"], "files": ref["files"]}
    return f


def cmd_repsummary(argv):
    """One line of a kind's figures from a scenario's results.kv (progress output)."""
    f = rep_figures(load_kv(argv[0]), argv[1])
    print("main thread %.0f ms per change (schedstat %s)%s, Envoy alone %s; rename -> refreshed median %s ms; "
          "%d full refreshes, %d refresh lines" % (
              f["ms"], "-" if f["ms_ns"] is None else "%.0f" % f["ms_ns"],
              "" if f["base_ok"] else " (steady window held a full refresh!)",
              "%.0f ms" % f["ref_ms"] if "ref_ms" in f else "-",
              "%.0f" % statistics.median(f["latency"]) if f["latency"] else "-", f["fulls"], f["lines"]))


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
    def both(t, n, nd=0):
        return "%.*f (schedstat %s)" % (nd, t, "-" if n is None else "%.*f" % (nd, n))

    def rep_rows(kind, label):
        F = lambda r: rep_figures(r, kind)
        row("repeated change, %s: n, flipped + added, EDS files" % label, lambda r: (lambda f: "%d, %d + %d, %d" % (
            f["k"], f["flipped"], f["added"], f["files"]))(F(r)))
        row("  rename -> published (refresh line), ms median / max", lambda r: (lambda f: "%.0f / %.0f (n=%d)" % (
            statistics.median(f["latency"]), max(f["latency"]), len(f["latency"])))(F(r)))
        row("  MAIN THREAD ms per change (minus steady rate)", lambda r: (lambda f: both(f["ms"], f["ms_ns"]) + (
            "" if f["base_ok"] else " STEADY WINDOW HELD A FULL REFRESH") + (
            "" if not f["unchanged"] else "; w/o %d unchanged full: %.0f (%s)" % (
                f["unchanged"], f["ms_wo_unchanged"],
                "-" if f["ms_ns_wo_unchanged"] is None else "%.0f" % f["ms_ns_wo_unchanged"])) + "".join(
            "; " + x for x in f["flags"]))(F(r)))
        row("    Envoy alone, no filter (taking the EDS in)", lambda r: (lambda f: both(f["ref_ms"], f["ref_ms_ns"]) + (
            "" if f["ref_updates_ok"] else " (update_success %d of %d)" % (
                f["ref_raw"]["updates"], f["ref_raw"]["files"])))(F(r)))
        row("    difference: the filter's (w/o unchanged full refr.)", lambda r: (lambda f: both(
            f["ms_wo_unchanged"] - f["ref_ms"],
            None if f["ms_ns_wo_unchanged"] is None or f["ref_ms_ns"] is None else f["ms_ns_wo_unchanged"] - f["ref_ms_ns"]))(F(r)))
        row("  VM us median / max; admin bytes median; e2e ms median", lambda r: (lambda f: "%s / %s; %s; %s" % (
            fmt_int(statistics.median(f["vm_us"])), fmt_int(max(f["vm_us"])), fmt_int(statistics.median(f["admin_bytes"])),
            fmt_int(statistics.median(f["e2e_ms"]))))(F(r)))
        row("    other threads, ms per change (net, >= 2 ms)", lambda r: (lambda f: ", ".join(
            "%s %.0f" % (n, v) for n, v in sorted(f["others"].items()) if abs(v) >= 2) or "none")(F(r)))
        row("  refreshes (stats) / refresh lines (narrowed) / published", lambda r: (lambda f: "%d / %d (%d) / %d; %s" % (
            f["fulls"], f["lines"], f["narrowed"], f["published"],
            ", ".join("%s %d" % kv for kv in sorted(f["reasons"].items())) or "no reason lines"))(F(r)))
        row("  raw: phase s, main ticks | steady s, ticks | polls skipped", lambda r: (lambda f: "%.1f, %d | %.1f, %d | %d / %d" % (
            f["raw"]["phase_s"], f["raw"]["phase_ticks"], f["raw"]["base_s"], f["raw"]["base_ticks"],
            f["skips_phase"], f["skips_base"]))(F(r)))
        row("  raw, no filter: phase s, ticks | idle s, ticks", lambda r: (lambda f: "%.1f, %d | %.1f, %d" % (
            f["ref_raw"]["phase_s"], f["ref_raw"]["phase_ticks"], f["ref_raw"]["idle_s"], f["ref_raw"]["idle_ticks"]))(F(r)))

    for kind, label in KINDS:
        rep_rows(kind, label)
    row("steady: main thread ms/s between full refreshes", lambda r: " / ".join(
        "%.1f" % rep_figures(r, k)["base_rate_ms_s"] for k, _ in KINDS if k in r["rep"]))
    row("steady: periodic full refresh (no change), main ms", lambda r: " / ".join(
        both(f["periodic_ms"], f["periodic_ms_ns"]) + ("" if f["periodic_ok"] else " (not 1 full refresh in it)")
        for f in (rep_figures(r, k) for k, _ in KINDS if k in r["rep"])))
    row("routing check: picks in the right tier", lambda r: r["routing"])
    row("refresh_error at: steady / +admin curls / +change / +30 / +repeat", lambda r: " / ".join(
        fmt_int(r["errors"].get(k)) for k in ("steady", "curls", "change", "after", "rep")))
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
            "cpuwin": cmd_cpuwin, "waitlog": cmd_waitlog, "repsummary": cmd_repsummary,
            "logscan": cmd_logscan, "table": cmd_table, "routecheck": cmd_routecheck,
            "assemble": cmd_assemble}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    cmds[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
