#!/usr/bin/python3
"""The burst-and-restart experiment (docs/experiments.md).

A fixed batch of jobs on a real Redis delayed queue, a pool of workers that call a rate-limited
downstream (the stub) through sluice and follow its instructions, and the failures of the seed
documents: a 429 burst to everyone at once, kill -9 of sluice during the delay window that follows,
kill -9 of half the workers, and an outage. The same batch then runs through the baseline (workers
that call the downstream directly and sleep on 429). Prints one table and exits 1 when a pass
condition of the sluice run fails: the batch drains, zero duplicate side effects, no job past its
attempt budget, nothing dead-lettered, every delay within the queue's limit.

Everything runs on loopback and stops by itself; processes are stopped by pid.
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from http.client import HTTPConnection, HTTPException

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import queues  # noqa: E402  (tests/e2e/queues.py)

PY = "/usr/bin/python3"


# ---- processes -----------------------------------------------------------------------------

def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Listening ports come from below the kernel's ephemeral range: a port the kernel handed out
# (bind to 0) and released could be taken by one of the run's outgoing connections (a
# sluice's to the stub, a worker's to Redis) before the process meant to listen on it binds
# it ("Address already in use"). Each port is handed out once per run; its own generator, so
# a test seeding `random` does not make two runs pick alike.
_PORT_LOW = 10000
_PORT_HIGH = max(_ephemeral_low() - 1, _PORT_LOW + 1000)  # a tiny range: overlap rather than fail
_ports_given = set()
_port_rng = random.Random()


def free_port():
    for _ in range(1000):
        port = _port_rng.randint(_PORT_LOW, _PORT_HIGH)
        if port in _ports_given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _ports_given.add(port)
        return port
    raise RuntimeError(f"no free port in {_PORT_LOW}-{_PORT_HIGH}")


def http(url, method="GET", data=None, timeout=5):
    req = urllib.request.Request(url, method=method, data=data)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def get_all(base, prefix, keys):
    """GET base+prefix+key for every key on one kept-alive connection: {key: parsed JSON}."""
    u = urllib.parse.urlsplit(base)
    conn, out = None, {}
    for k in keys:
        for attempt in (1, 2):
            try:
                if conn is None:
                    conn = HTTPConnection(u.hostname, u.port, timeout=10)
                conn.request("GET", prefix + urllib.parse.quote(k, safe=":"))
                resp = conn.getresponse()
                body = resp.read()
                out[k] = json.loads(body) if resp.status == 200 else {"http_status": resp.status}
                break
            except (OSError, HTTPException):
                conn.close()
                conn = None
                if attempt == 2:
                    raise
    if conn:
        conn.close()
    return out


def wait_until(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if pred():
                return
        except (OSError, redis.RedisError):
            pass
        time.sleep(0.02)
    raise RuntimeError(f"timed out waiting for {what}")


class Procs:
    """Every process the experiment starts, so that each is stopped by its pid."""

    def __init__(self, logdir):
        self.logdir, self.live = logdir, []

    def start(self, name, argv, env=None, stdout=None):
        with open(os.path.join(self.logdir, name + ".log"), "ab") as log:  # the child keeps it
            p = subprocess.Popen(argv, env=env, stdout=stdout or log, stderr=log,
                                 start_new_session=True)
        self.live.append(p)
        return p

    def kill9(self, p):
        """CLOCK_MONOTONIC ns when SIGKILL was sent and when the process was reaped."""
        sent = time.monotonic_ns()
        p.send_signal(signal.SIGKILL)
        p.wait()
        gone = time.monotonic_ns()
        self.live.remove(p)
        return sent, gone

    def stop(self, p, timeout=15):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGKILL)
                p.wait()
        if p in self.live:
            self.live.remove(p)

    def stop_all(self):
        for p in list(self.live):
            self.stop(p, timeout=5)


def start_redis(procs, d, name="redis"):
    port = free_port()
    p = procs.start(name, ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                           "--save", "", "--appendonly", "no", "--dir", d])
    r = redis.Redis(host="127.0.0.1", port=port)
    wait_until(lambda: r.ping(), 10, "redis-server")
    return p, port


def start_stub(procs, stub_bin, rate, burst, extra=()):
    p = procs.start("stub", [stub_bin, "--listen", "127.0.0.1:0", "--max-rate", str(rate),
                             "--burst", str(burst), *extra], stdout=subprocess.PIPE)
    line = p.stdout.readline().decode()
    if not line.startswith("listening "):
        raise RuntimeError(f"stub did not start: {line!r}")
    return p, "http://" + line.split()[1]


SLUICE_YAML = """\
listen: 127.0.0.1:{port}
admin: 127.0.0.1:{admin}
threads: {threads}
store: {store}
log: {{level: warn, access: false}}
upstreams:
  partner: {{url: "{stub}", timeout: {timeout}s, max_connections: 64}}
policies:
  writes:
    rate: {rate}/s
    burst: {burst}
    max_wait: {max_wait}ms
    retry: {{base: 1s, multiplier: 2, cap: 60s, max_attempts: {attempts}, max_delay: {max_delay}s{on}}}
{breaker}{shared}    idempotency: {{lease: {lease}s{verify}{duplicates}}}
routes:
  - {{name: grades, prefix: /v1, upstream: partner, policy: writes}}
"""


class Sluice:
    """One sluice process (restartable on the same config and store). `name` names its config
    and log in the temp dir; `store` is the YAML of its store block (default: RocksDB in
    <dir>/store), `shared` the policy's shared: setting (default: none, i.e. local)."""

    def __init__(self, procs, bin_, d, stub, args, name="sluice", store=None, shared=None,
                 threads=2):
        self.procs, self.bin, self.name = procs, bin_, name
        self.port, self.admin = free_port(), free_port()
        self.cfg = os.path.join(d, "sidecar.yaml" if name == "sluice" else name + ".yaml")
        store = store or "{path: %s%s}" % (os.path.join(d, "store"),
                                           ", sync: true" if args.store_sync else "")
        with open(self.cfg, "w") as f:
            f.write(SLUICE_YAML.format(port=self.port, admin=self.admin, stub=stub,
                                       store=store, threads=threads,
                                       shared=f"    shared: {shared}\n" if shared else "",
                                       rate=args.rate,
                                       burst=args.sluice_burst, attempts=args.max_attempts,
                                       max_delay=args.queue_max_delay,
                                       max_wait=args.max_wait_ms, timeout=args.upstream_timeout,
                                       lease=args.lease,
                                       verify=(", verify: {path: \"%s\", after: %dms}" %
                                               (args.verify_path, args.verify_after_ms)
                                               if getattr(args, "verify_path", None) else ""),
                                       duplicates=(", duplicates: %s" % args.duplicates
                                                   if getattr(args, "duplicates", None) else ""),
                                       on=f", on: [{args.retry_on}]" if args.retry_on else "",
                                       breaker="    breaker: {failures: 5, pause: 250ms, "
                                               "max_pause: %dms}\n" % args.breaker_max_pause_ms
                                               if args.breaker else ""))
        self.url = f"http://127.0.0.1:{self.port}"
        self.permit_wait_s = 0.0    # summed over the process lives that are gone
        self.p = None

    def start(self):
        self.p = self.procs.start(self.name, [self.bin, "-c", self.cfg])
        wait_until(lambda: http(f"http://127.0.0.1:{self.admin}/readyz", timeout=1)[0] == 200,
                   20, "sluice /readyz")

    def metric(self, name):
        """The sum of metric `name` over its label sets, in the live process (0 if it is not
        answering)."""
        try:
            _, body = http(f"http://127.0.0.1:{self.admin}/metrics", timeout=2)
        except OSError:
            return 0.0
        total = 0.0
        for line in body.decode().splitlines():
            if line.split("{")[0].split(" ")[0] == name:
                total += float(line.split()[-1])
        return total

    def permit_wait(self):
        """sluice_permit_wait_seconds_sum of the live process."""
        return self.metric("sluice_permit_wait_seconds_sum")

    def permit_wait_total(self):
        """Seconds requests waited for a permit, over every life of the process."""
        return self.permit_wait_s + self.permit_wait()

    def url_for(self, wid):
        """The sluice worker `wid` talks to: this one (one sidecar for every worker)."""
        return self.url

    def kill9(self):
        """CLOCK_MONOTONIC ns when SIGKILL was sent and when the process was gone."""
        self.permit_wait_s += self.permit_wait()
        return self.procs.kill9(self.p)

    def restart(self):
        """Seconds until the new process is ready (store reopened)."""
        t = time.monotonic()
        self.start()
        return time.monotonic() - t

    def stop(self):
        self.procs.stop(self.p)


# ---- one arm -------------------------------------------------------------------------------

def worker_argv(kind, args):
    if kind == "python":
        return [PY, os.path.join(ROOT, "deploy/examples/python/worker.py")]
    if kind == "python-acks":     # the same worker, recording when it saw each success
        return [PY, os.path.join(HERE, "ack_worker.py")]
    if kind == "baseline":
        return [PY, os.path.join(HERE, "baseline_worker.py")]
    if kind == "go":
        return [args.go_worker]
    if kind == "typescript":
        return ["node", os.path.join(args.ts_dir, "dist", "worker.js")]
    raise ValueError(kind)


class Pool:
    """W worker slots as W/threads processes of `threads` slots each."""

    def __init__(self, procs, kind, args, env, sluice=None):
        self.procs, self.argv, self.env = procs, worker_argv(kind, args), env
        n = max(1, args.workers // args.threads)
        self.ids = [f"w{i}" for i in range(n)]
        self.sluice = sluice    # its url_for(wid): the sluice each worker process talks to
        self.p = {}

    def start(self, wid):
        env = dict(self.env, WORKER_ID=wid)
        if self.sluice:
            env["SLUICE_URL"] = self.sluice.url_for(wid)
        self.p[wid] = self.procs.start(f"worker-{wid}", self.argv, env=env)

    def holds_frozen(self, wid, q):
        """Stops worker wid and says whether it holds a job; if not, lets it run on."""
        p = self.p[wid]
        p.send_signal(signal.SIGSTOP)
        time.sleep(0.05)      # a reply already on its way to the queue lands first
        if q.held_by(wid):
            return True
        p.send_signal(signal.SIGCONT)
        return False

    def kill9(self, wids):
        for wid in wids:
            self.procs.kill9(self.p[wid])

    def stop(self):
        for p in self.p.values():
            self.procs.stop(p, timeout=30)


def plan(args):
    """Event times in seconds from the start, as fractions of the batch's time at full rate.

    sluice dies in the middle of the burst, while its policy cools down and the bounced jobs wait
    in the delayed set ("a restart during the delay window"), and comes back as the
    burst ends. Nothing is in flight to the downstream then, so the outcome does not depend on
    where in a request the kill lands (see docs/experiments.md on unknown outcomes). The worker killed for
    good dies after the others are back from their kill -9, so that a running worker's periodic
    reap (not only the reap at start) has to find its jobs."""
    t = args.jobs / args.rate
    burst = args.burst_ms / 1000
    return {"burst": 0.25 * t, "kill_sluice": 0.25 * t + burst / 2,
            "restart_sluice": 0.25 * t + burst, "kill_workers": 0.5 * t, "outage": 0.7 * t,
            "kill_for_good": 0.55 * t}


def make_job(prefix, i):
    """Job i of the batch: the same method, path, key and body on every delivery."""
    return {"id": f"job-{i:06d}", "key": f"{prefix}:job-{i:06d}", "method": "POST",
            "path": f"/v1/grades/job-{i:06d}", "body": {"job": i, "score": i % 100},
            "enqueued_at": time.time()}


def run_arm(arm, kind, args, procs, rport, d, stub_bin, sluice_bin, hooks=None, stub_args=(),
            front=None):
    """One run of the batch. Besides the plan's kill -9 of half the workers (restarted under the
    same WORKER_ID), the sluice arm kills one other worker for good while it holds jobs, as a
    rollout replaces a pod: its jobs must come back through the other workers' reaper (Redis
    pattern) or BullMQ's stalled-job check. `hooks` (kill_test.py, fleet_experiment.py):
    extra_time() lengthens the deadline, start(ctx) runs once the workers do, busy() keeps the
    run going while true, finish(ctx, res) runs before sluice and the stub stop; when
    hooks.kills_sluice the plan's own kill and restart of sluice are left out (the hooks kill it).
    `stub_args`: more command-line flags for the stub. `front(stub_url)` (fleet_experiment.py):
    makes what the workers talk to instead of one Sluice, with the same methods (start, url_for,
    kill9, restart, permit_wait_total, stop)."""
    stub_p, stub = start_stub(procs, stub_bin, args.rate, args.stub_burst, stub_args)
    sluice = None
    if front:
        sluice = front(stub)
    elif arm == "sluice":
        sluice = Sluice(procs, sluice_bin, d, stub, args)
    if sluice:
        sluice.start()
    prefix = f"{arm}-{kind}"
    q = queues.make(kind, redis.Redis(host="127.0.0.1", port=rport), prefix, args)
    q.enqueue([make_job(prefix, i) for i in range(args.jobs)])
    # REDIS_URL for the workers (it wins over REDIS_ADDR; the TypeScript producer takes
    # REDIS_ADDR); a short heartbeat (1.5 s TTL) so that a dead worker's jobs are reaped within
    # the run.
    env = dict(os.environ, REDIS_ADDR=f"127.0.0.1:{rport}", QUEUE=q.name,
               REDIS_URL=f"redis://127.0.0.1:{rport}/0", HEARTBEAT_MS="500",
               CONCURRENCY=str(args.threads), AFTER_CALL_MS=str(args.after_call_ms),
               MAX_ATTEMPTS=str(args.max_attempts), HTTP_TIMEOUT="30",
               LOCK_MS="5000", STALLED_MS="1000")
    if not sluice:
        env["PARTNER_URL"] = stub
    pool = Pool(procs, kind, args, env, sluice)
    events = sorted(plan(args).items(), key=lambda e: e[1])
    kills = hooks and hooks.kills_sluice
    if kills:
        events = [e for e in events if e[0] not in ("kill_sluice", "restart_sluice")]
    # The worker killed for good: one the plan's kill_workers does not restart.
    doomed = pool.ids[1] if sluice and not kills and len(pool.ids) > 1 else None
    doom_at = dict(events).pop("kill_for_good")
    events = [e for e in events if e[0] != "kill_for_good"]
    bound = args.jobs / args.rate + (args.burst_ms + args.outage_ms) / 1000
    deadline = args.deadline or \
        max(60.0, args.timeout_factor * bound) + (hooks.extra_time() if hooks else 0)
    res = {"arm": arm, "worker": kind, "breaker": args.breaker, "jobs": args.jobs,
           "bound_s": bound, "peak_held": 0, "slot_s_held": 0.0, "max_delay_s": 0.0,
           "sluice_restart_s": None, "drain_s": None, "doomed": doomed, "orphans": None}

    t0 = time.monotonic()
    for wid in pool.ids:
        pool.start(wid)
    ctx = {"stub": stub, "sluice": sluice, "queue": q, "redis_port": rport, "dir": d}
    if hooks:
        hooks.start(ctx)
    last, restarts = t0, []
    while True:
        now = time.monotonic()
        while events and now - t0 >= events[0][1]:
            name, _ = events.pop(0)
            if name == "burst":      # every request at the downstream gets a 429 for a while
                http(stub + "/_stub/window", "POST",
                     f"{args.burst_ms} 429 0 retry-after={max(1, args.burst_ms // 1000)}".encode())
            elif name == "kill_sluice" and sluice:
                sluice.kill9()
            elif name == "restart_sluice" and sluice:
                res["sluice_restart_s"] = sluice.restart()
            elif name == "kill_workers":
                victims = pool.ids[::2]
                pool.kill9(victims)
                restarts.append((now + 0.5, victims))
            elif name == "outage":
                http(stub + "/_stub/window", "POST", f"{args.outage_ms} 503".encode())
        # Killed only while it holds a job, so that there is something to reap. It is stopped
        # (SIGSTOP) before the look, so it cannot ack its job between the look and the kill; its
        # job ids are read after the kill, when nothing but a reaper can move them.
        if doomed and now - t0 >= doom_at and pool.holds_frozen(doomed, q):
            pool.kill9([doomed])
            res["orphans"] = q.held_by(doomed)
            doomed = None
        elif doomed and now - t0 >= doom_at + 10:
            doomed = None     # never seen holding a job: failures() says so
        for when, victims in list(restarts):
            if now >= when:
                for wid in victims:
                    pool.start(wid)
                restarts.remove((when, victims))
        s = q.sample()
        res["peak_held"] = max(res["peak_held"], s["held"])
        res["slot_s_held"] += s["held"] * (now - last)
        res["max_delay_s"] = max(res["max_delay_s"], s["max_delay_ms"] / 1000)
        last = now
        if not events and not restarts and not doomed and s["done"] + s["dlq"] >= args.jobs and \
                s["ready"] == s["delayed"] == s["held"] == 0 and not (hooks and hooks.busy()):
            res["drain_s"] = now - t0
            break
        if now - t0 > deadline:
            break
        time.sleep(0.05)

    pool.stop()
    if res["orphans"] is not None:
        res["orphans_done"] = q.finished(res["orphans"])
    st = json.loads(http(stub + "/_stub/stats")[1])
    end = q.sample()
    res.update(done=end["done"], dlq=end["dlq"], provider_calls=st["requests"],
               side_effects=st["side_effects"], duplicates=st["duplicates"],
               max_attempts_used=st["max_calls_per_key"], asleep_s=q.asleep(),
               left=end["ready"] + end["delayed"] + end["held"], window_hits=st["window_hits"])
    res["ratio"] = res["drain_s"] / bound if res["drain_s"] else None
    res["n_orphans"] = len(res["orphans"]) if res["orphans"] is not None else None
    if hooks:
        hooks.finish(ctx, res)
    res["permit_wait_s"] = sluice.permit_wait_total() if sluice else 0.0
    if sluice:
        sluice.stop()
    procs.stop(stub_p)
    return res


# ---- report --------------------------------------------------------------------------------

ROWS = [
    ("jobs", "jobs", "{}"),
    ("time to drain (s)", "drain_s", "{:.2f}"),
    ("lower bound (s): jobs/rate + outage", "bound_s", "{:.2f}"),
    ("drain / bound", "ratio", "{:.3f}"),
    ("jobs done", "done", "{}"),
    ("jobs in DLQ", "dlq", "{}"),
    ("jobs left in the queue", "left", "{}"),
    ("provider calls", "provider_calls", "{}"),
    ("side effects", "side_effects", "{}"),
    ("duplicate side effects", "duplicates", "{}"),
    ("max attempts used by a job", "max_attempts_used", "{}"),
    ("jobs held by the worker killed for good", "n_orphans", "{}"),
    ("... finished by the other workers", "orphans_done", "{}"),
    ("peak in-flight worker slots", "peak_held", "{}"),
    ("worker slot-seconds holding a job", "slot_s_held", "{:.1f}"),
    ("slot-seconds asleep after 429/5xx", "asleep_s", "{:.1f}"),
    ("slot-seconds waiting for a permit", "permit_wait_s", "{:.1f}"),
    ("longest delay asked of the queue (s)", "max_delay_s", "{:.1f}"),
    ("sluice restart to ready (s)", "sluice_restart_s", "{:.2f}"),
]


def table(results):
    heads = [f"{r['arm']} ({r['worker']})" for r in results]
    if len(results) == 1:
        heads = [f"{heads[0]}{'' if r.get('breaker', True) else ', no breaker'}"
                 for r in results]
    w0 = max(len(r[0]) for r in ROWS)
    out = [f"{'':{w0}}  " + "  ".join(f"{h:>18}" for h in heads)]
    for label, key, fmt in ROWS:
        cells = []
        for r in results:
            v = r.get(key)
            cells.append(f"{'—' if v is None else fmt.format(v):>18}")
        out.append(f"{label:{w0}}  " + "  ".join(cells))
    return "\n".join(out)


def failures(r, args):
    f = []
    if not r["window_hits"]:
        f.append("neither the 429 burst nor the outage reached a request: nothing was tested")
    if r["sluice_restart_s"] is None:
        f.append("sluice was not killed and restarted")
    if r.get("doomed"):
        if r["orphans"] is None:
            f.append(f"worker {r['doomed']} was never seen holding a job: the kill for good "
                     "did not happen")
        elif not r["orphans"]:
            f.append(f"worker {r['doomed']} held no job once killed: nothing was left to reap")
        elif r["orphans_done"] != len(r["orphans"]):
            f.append(f"{len(r['orphans']) - r['orphans_done']} of the {len(r['orphans'])} jobs "
                     f"the worker killed for good held never finished: {r['orphans']}")
    if r["drain_s"] is None:
        f.append(f"the batch did not drain ({r['done']} done, {r['dlq']} dead, {r['left']} left)")
    if r["duplicates"]:
        f.append(f"{r['duplicates']} job(s) had a duplicate side effect")
    if r["max_attempts_used"] > args.max_attempts:
        f.append(f"a job used {r['max_attempts_used']} attempts (budget {args.max_attempts})")
    if r["dlq"]:
        f.append(f"{r['dlq']} job(s) dead-lettered")
    if r["max_delay_s"] > args.queue_max_delay:
        f.append(f"a delay of {r['max_delay_s']:.0f} s exceeds the queue's "
                 f"{args.queue_max_delay} s")
    if args.max_ratio and r["ratio"] and r["ratio"] > args.max_ratio:
        f.append(f"drain took {r['ratio']:.2f}x the bound (limit {args.max_ratio})")
    return f


def parser(description=__doc__.split("\n")[0]):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--jobs", type=int, default=600)
    ap.add_argument("--workers", type=int, default=16, help="worker slots in all")
    ap.add_argument("--threads", type=int, default=4, help="slots per worker process")
    ap.add_argument("--rate", type=int, default=100, help="downstream accepted rate, per s")
    ap.add_argument("--stub-burst", type=int, default=20)
    ap.add_argument("--sluice-burst", type=int, default=5)
    ap.add_argument("--max-attempts", type=int, default=8)
    ap.add_argument("--queue-max-delay", type=int, default=900, help="queue's delay limit, s")
    ap.add_argument("--burst-ms", type=int, default=1000, help="length of the 429 burst")
    ap.add_argument("--outage-ms", type=int, default=2000, help="length of the 503 outage")
    ap.add_argument("--max-wait-ms", type=int, default=2000, help="sluice's max_wait")
    ap.add_argument("--store-sync", action="store_true",
                    help="store.sync: true on the RocksDB store (every write fsynced, grouped)")
    ap.add_argument("--breaker", action=argparse.BooleanOptionalAction, default=True,
                    help="sluice's breaker block (pause the policy during an outage)")
    ap.add_argument("--breaker-max-pause-ms", type=int, default=1000,
                    help="the breaker's max_pause: its last pause may run this long past "
                         "the outage's end")
    ap.add_argument("--after-call-ms", type=int, default=20, help="work after the API call")
    ap.add_argument("--worker", default="python", choices=["python", "go", "typescript"])
    ap.add_argument("--arms", default="sluice,baseline")
    ap.add_argument("--max-ratio", type=float, default=0, help="fail above this drain/bound")
    ap.add_argument("--timeout-factor", type=float, default=6, help="give up at this x bound")
    ap.add_argument("--deadline", type=float, default=0,
                    help="give up after this many seconds (default: from --timeout-factor)")
    ap.add_argument("--go-worker", help="the built Go example worker")
    ap.add_argument("--ts-dir", default=os.path.join(ROOT, "deploy/examples/typescript"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    ap.add_argument("--upstream-timeout", type=int, default=5, help="sluice's upstream timeout, s")
    ap.add_argument("--lease", type=int, default=15, help="sluice's idempotency lease, s")
    ap.add_argument("--retry-on", help="sluice's retry.on list, e.g. '409, 429, 503' "
                    "(default: sluice's)")
    return ap


def end_run(bad, root, keep):
    """The end of a run: each failure printed, the logs kept when one failed
    (or when asked), else removed; the exit status."""
    for why in bad:
        print(f"FAIL {why}", file=sys.stderr)
    if bad or keep:
        print(f"logs: {root}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if bad else 0


def main():
    args = parser().parse_args()

    sluice_bin = os.environ.get("SLUICE_BIN", os.path.join(args.build, "sluice"))
    stub_bin = os.environ.get("SLUICE_STUB", os.path.join(args.build, "sluice-stub"))
    d = tempfile.mkdtemp(prefix="sluice-e2e-")
    procs = Procs(d)
    results = []
    try:
        _, rport = start_redis(procs, d)
        for arm in args.arms.split(","):
            kind = "baseline" if arm == "baseline" else args.worker
            print(f"running {arm} ({kind}): {args.jobs} jobs, {args.workers} slots, "
                  f"{args.rate}/s ...", file=sys.stderr, flush=True)
            results.append(run_arm(arm, kind, args, procs, rport, d, stub_bin, sluice_bin))
    finally:
        procs.stop_all()
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    bad = [f"({r['worker']}): {why}" for r in results if r["arm"] == "sluice"
           for why in failures(r, args)]
    return end_run(bad, d, args.keep)


if __name__ == "__main__":
    sys.exit(main())
