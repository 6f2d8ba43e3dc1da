#!/usr/bin/python3
"""Duplicates benchmark: N jobs each published twice, as Celery and BullMQ do on a redelivery race.

Both copies of a job reach sluice at the same moment (two workers took them), with the job's
Idempotency-Key; the partner (the stub) answers in 1 ms. A worker does what the contract asks: a
success (ok or replayed) is acked, a requeue is slept for its delay_ms and sent again. Measured
per job: the time from publishing until both copies are acked. Two runs on the same binary and
stub, one per setting of the policy's idempotency.duplicates:

- refuse (the default): the second copy gets lease_held at once, with the lease's remaining
  time (or its holder's remaining wait plus the upstream timeout) as its delay;
- wait: the second copy waits inside sluice for the holder's answer and gets its replay.

With --backend redis the two copies go through two sluices sharing one redis-server (fleet
mode: store.backend: redis, the policy shared: redis at a rate far above the load), one copy
each, so the waiting copy waits for the other sidecar's record.

With --before BIN each setting runs on that sluice binary too (another build: "before"),
against the same stub and Redis, alternating with this build's ("after") --rounds times, so the
two are compared in one run on one machine's load; --settings picks the settings (refuse,wait).

Prints median, p99 and max per setting, and how many copies reached the partner (must be N:
one per job, whatever the setting). A benchmark: it asserts nothing on times. Everything runs on
loopback from a temp dir; each process is stopped by its pid.

    /usr/bin/python3 tests/bench/duplicates.py [--jobs 200] [--parallel 16] [--build build]
        [--backend rocksdb|redis] [--settings refuse,wait] [--before BIN --rounds 3]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from http.client import HTTPConnection

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import experiment as ex  # noqa: E402  (free ports, processes by pid, readiness)

CONFIG = """\
listen: 127.0.0.1:{port}
admin: 127.0.0.1:{admin}
threads: 2
store: {store}
log: {{level: warn, access: false}}
upstreams:
  partner: {{url: "{stub}", timeout: {timeout}}}
policies:
  jobs:
    max_wait: {max_wait}
{shared}    idempotency: {{lease: {lease}, duplicates: {duplicates}}}
routes:
  - {{prefix: /v1, upstream: partner, policy: jobs}}
"""


def deliver(port, key, out, i):
    """One copy of a job, as a worker handles it: until a success, honouring each requeue."""
    conn = HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        while True:
            conn.request("POST", "/v1/charges", body=b'{"amount":1}',
                         headers={"Idempotency-Key": key, "Content-Type": "application/json"})
            resp = conn.getresponse()
            body = resp.read()
            if resp.status < 300:
                out[i] = (time.monotonic(), resp.getheader("Sluice-Outcome"))
                return
            delay = json.loads(body).get("delay_ms", 1000)
            time.sleep(delay / 1000)
    finally:
        conn.close()


def start_sluice(duplicates, i, args, procs, d, stub, run):
    """Sluice i of a setting: its port and process."""
    cfg = os.path.join(d, f"{duplicates}-{run['tag']}-{i}.yaml")
    port, admin = ex.free_port(), ex.free_port()
    if args.redis_port:
        # A key prefix per run: two builds never share a bucket or a record (an older
        # release may not read the newer one's).
        store = ('{backend: redis, url: "redis://127.0.0.1:%d/0", timeout: 1000ms, '
                 'key_prefix: "dups-%s"}' % (args.redis_port, run["tag"]))
        shared = "    rate: 100000/s\n    shared: redis\n"
    else:
        store, shared = "{path: %s}" % os.path.join(d, duplicates), ""
    with open(cfg, "w") as f:
        f.write(CONFIG.format(port=port, admin=admin, store=store, shared=shared,
                              stub=stub, timeout=args.timeout, max_wait=args.max_wait,
                              lease=args.lease, duplicates=duplicates))
    p = procs.start(f"sluice-{duplicates}-{run['tag']}-{i}", [run["bin"], "-c", cfg])
    ex.wait_until(lambda: ex.http(f"http://127.0.0.1:{admin}/readyz", timeout=1)[0] == 200,
                  20, "sluice /readyz")
    return port, p


def run_setting(duplicates, args, procs, d, stub, run):
    # One sluice, or (fleet mode) two: copy i through sluice i.
    fronts = [start_sluice(duplicates, i, args, procs, d, stub, run)
              for i in range(2 if args.redis_port else 1)]
    ports = [fronts[i % len(fronts)][0] for i in (0, 1)]
    before = json.loads(ex.http(stub + "/_stub/stats")[1])["requests"]
    times, outcomes = [], {}
    sem = threading.Semaphore(args.parallel)

    def job(n):
        with sem:
            key = f"{duplicates}-{run['tag']}-job-{n:06d}"
            got = [None, None]
            t0 = time.monotonic()
            ts = [threading.Thread(target=deliver, args=(ports[i], key, got, i)) for i in (0, 1)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            times.append(max(g[0] for g in got) - t0)
            for g in got:
                outcomes[g[1]] = outcomes.get(g[1], 0) + 1

    threads = [threading.Thread(target=job, args=(n,)) for n in range(args.jobs)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    calls = json.loads(ex.http(stub + "/_stub/stats")[1])["requests"] - before
    for _, p in fronts:
        procs.stop(p)
    times.sort()
    return {"duplicates": duplicates, "build": run["label"], "median": statistics.median(times),
            "p99": times[min(len(times) - 1, int(0.99 * len(times)))], "max": times[-1],
            "wall": wall, "calls": calls, "outcomes": outcomes}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=200, help="jobs, each published twice")
    ap.add_argument("--parallel", type=int, default=16, help="jobs in flight at once")
    ap.add_argument("--stub-delay-ms", type=int, default=1, help="the partner's answer time")
    ap.add_argument("--lease", default="5s", help="idempotency.lease")
    ap.add_argument("--timeout", default="2s", help="the upstream's timeout")
    ap.add_argument("--max-wait", default="2s", help="the policy's max_wait")
    ap.add_argument("--build", default="build", help="where sluice and sluice-stub are")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (configs, logs)")
    ap.add_argument("--backend", choices=["rocksdb", "redis"], default="rocksdb",
                    help="redis: two sluices on one redis-server, one copy through each")
    ap.add_argument("--settings", default="refuse,wait", help="duplicates settings to run")
    ap.add_argument("--before", help="another sluice binary, run alternately with this build's")
    ap.add_argument("--rounds", type=int, default=1, help="with --before: runs of each")
    args = ap.parse_args()
    args.sluice = os.environ.get("SLUICE_BIN", os.path.join(args.build, "sluice"))
    stub_bin = os.environ.get("SLUICE_STUB", os.path.join(args.build, "sluice-stub"))
    d = tempfile.mkdtemp(prefix="sluice-dups-")
    procs = ex.Procs(d)
    results = []
    try:
        _, stub = ex.start_stub(procs, stub_bin, 1e6, 1000,
                                ["--delay-ms", str(args.stub_delay_ms)])
        args.redis_port = (ex.start_redis(procs, d, "store-redis")[1]
                           if args.backend == "redis" else None)
        builds = [("after", args.sluice)]
        if args.before:
            builds = [("before", args.before), ("after", args.sluice)]
        for setting in args.settings.split(","):
            for rnd in range(args.rounds if args.before else 1):
                for label, binary in builds:
                    run = {"label": label, "bin": binary, "tag": f"{label}{rnd}"}
                    print(f"running duplicates: {setting} ({label}, round {rnd + 1}) ...",
                          file=sys.stderr, flush=True)
                    results.append(run_setting(setting, args, procs, d, stub, run))
    finally:
        procs.stop_all()
    print(f"{args.backend}: {args.jobs} jobs x 2 copies, {args.parallel} jobs at once, partner "
          f"{args.stub_delay_ms} ms, lease {args.lease}, timeout {args.timeout}, "
          f"max_wait {args.max_wait}")
    print(f"{'duplicates':<10} {'build':<6} {'both acked: median':>19} {'p99':>8} {'max':>8} "
          f"{'wall':>7} {'partner calls':>14}  outcomes")
    for r in results:
        print(f"{r['duplicates']:<10} {r['build']:<6} {r['median'] * 1000:>16.1f} ms "
              f"{r['p99'] * 1000:>5.0f} ms "
              f"{r['max'] * 1000:>5.0f} ms {r['wall']:>6.1f}s {r['calls']:>14}  "
              + ", ".join(f"{k}: {v}" for k, v in sorted(r["outcomes"].items())))
    if args.keep:
        print(f"kept {d}", file=sys.stderr)
    else:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
