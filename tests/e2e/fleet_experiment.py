#!/usr/bin/python3
"""The burst-and-restart experiment, fleet edition: several sluices, one Redis.

The batch of experiment.py (a real Redis delayed queue, the stub as a downstream that accepts
--rate/s, the 429 burst, the kill -9 of half the workers and of one for good, the outage) runs
through a fleet of --sluices sluices, one per pod: worker process wN talks to sluice N mod
--sluices, so a job that comes back to the queue is usually taken by a worker of another
sluice. During the burst one sluice is killed -9 by its pid and restarted. Besides the
redeliveries the kills cause, at --redeliver-rounds moments the last --redeliver jobs a worker
saw succeed are delivered again, first in line, as an at-least-once queue does after a lost ack.

Two arms, each on a fresh stub:

- fleet: the sluices share one real redis-server (store.backend: redis, the policy shared:
  redis): one bucket at --rate for the whole fleet, one idempotency ledger and attempt count;
- local: each sluice on its own RocksDB store, its policy paced alone (shared: local) at the
  same --rate: the per-pod setup fleet mode replaces.

Prints one table and exits 1 when a pass condition of the fleet arm fails: the experiment's own
(the batch drains, zero duplicate side effects at the stub, nothing dead-lettered, drain within
--max-ratio of the bound, ...), no job over its attempt budget at the stub, every delivery after
a job's first success answered from the ledger (replayed), and at least one such delivery through
another sluice. The local arm is only reported, unless --check-local: then its redeliveries
through another sluice must show as duplicates and its pods must have overrun the partner's rate.

With --lookup the partner (the stub) ignores Idempotency-Key but offers a lookup by it, and the
policy verifies every unknown outcome with it (idempotency.verify, after --verify-after-ms): the
leases of the sluice killed -9 are then settled by the other sluices once its liveness key has
lapsed, not at their expiry. --duplicates wait makes a redelivery that meets its key in progress
on another sluice wait there for the replay.

Everything runs on loopback and stops by itself; processes are stopped by pid.
"""
import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import experiment as ex  # noqa: E402  (tests/e2e/experiment.py)

MODES = {"fleet": "redis", "local": "local"}     # arm: the policy's shared: setting


class Fleet:
    """The sluices of one arm, one per pod (experiment.run_arm's `front`). Mode "redis": one
    redis-server holds every sluice's store and the policy's bucket; mode "local": each has its
    RocksDB store in <dir>/store-N. The plan's kill -9 and restart hit one of them, the victim."""

    def __init__(self, procs, bin_, d, stub, args, mode, store_port=None):
        n = args.sluices
        self.members = []
        for i in range(n):
            if mode == "redis":
                store = ('{backend: redis, url: "redis://127.0.0.1:%d/0", fleet_size: %d, '
                         'timeout: %dms}' % (store_port, n, args.store_timeout_ms))
            else:
                store = "{path: %s}" % os.path.join(d, f"store-{i}")
            self.members.append(ex.Sluice(procs, bin_, d, stub, args, name=f"sluice-{i}",
                                          store=store, shared=mode, threads=1))
        self.victim = n - 1
        self.killed = None      # (index, pid) of the process the plan killed
        self.store_errors_gone = 0.0    # sluice_store_errors_total of the killed life

    def index(self, url):
        return next(i for i, m in enumerate(self.members) if m.url == url)

    def start(self):
        for m in self.members:
            m.start()

    def url_for(self, wid):
        return self.members[int(wid[1:]) % len(self.members)].url

    def kill9(self):
        victim = self.members[self.victim]
        self.killed = (self.victim, victim.p.pid)
        self.store_errors_gone += victim.metric("sluice_store_errors_total")
        return victim.kill9()

    def restart(self):
        return self.members[self.victim].restart()

    def permit_wait_total(self):
        return sum(m.permit_wait_total() for m in self.members)

    def store_errors(self):
        """Store calls that failed (a Redis reply later than store.timeout counts), all lives."""
        return self.store_errors_gone + sum(m.metric("sluice_store_errors_total")
                                            for m in self.members)

    def stop(self):
        for m in self.members:
            m.stop()


class Redeliverer:
    """experiment.run_arm hooks: delivers completed jobs again while the batch runs, then reads
    what each job cost at the stub and which sluice answered each of its successes."""

    kills_sluice = False    # the plan's kill and restart of one sluice stay

    def __init__(self, args):
        self.args = args
        t, n = args.jobs / args.rate, args.redeliver_rounds
        self.times = [t * (0.1 + 0.8 * i / max(1, n - 1)) for i in range(n)]
        self.redelivered = 0
        self.stop_evt = threading.Event()
        self.thread, self.error, self.t0_ns = None, None, 0

    def extra_time(self):
        return 0.0

    def start(self, ctx):
        self.t0_ns = time.monotonic_ns()     # the workers were just started
        self.thread = threading.Thread(target=self.run, args=(ctx["queue"],), daemon=True)
        self.thread.start()

    def run(self, q):
        t0, done = time.monotonic(), set()
        try:
            for at in self.times:
                if self.stop_evt.wait(max(0.0, t0 + at - time.monotonic())):
                    return
                recent = q.r.lrange(q.key("successes"), -8 * self.args.redeliver, -1)
                keys = []
                for entry in reversed(recent):
                    key = entry.decode().split()[0]
                    if key not in done and key not in keys:
                        keys.append(key)
                for key in keys[:self.args.redeliver]:
                    # RPUSH: the next job a worker takes (they BLMOVE from the right).
                    q.r.rpush(q.key("ready"), json.dumps(ex.make_job(q.name, int(key[-6:]))))
                    done.add(key)
                    self.redelivered += 1
        except redis.RedisError as e:     # reported as a failure of the run
            self.error = f"redelivery failed: {e!r}"

    def busy(self):
        return self.thread is not None and self.thread.is_alive()

    def finish(self, ctx, res):
        self.stop_evt.set()
        self.thread.join()
        q, stub, fleet = ctx["queue"], ctx["stub"], ctx["sluice"]
        res.update(redelivered=self.redelivered, redeliver_error=self.error,
                   sluices=len(fleet.members), killed=fleet.killed,
                   store_errors=int(fleet.store_errors()))
        res.update(successes(q, fleet))
        keys = [f"{q.name}:job-{i:06d}" for i in range(self.args.jobs)]
        per_key = ex.get_all(stub, "/_stub/keys/", keys)
        res["over_budget"] = sum(1 for k in per_key.values()
                                 if k.get("calls", 0) > self.args.max_attempts)
        res["extra_effects"] = sum(max(0, k.get("side_effects", 0) - 1)
                                   for k in per_key.values())
        recv = [e["recv_ns"] for k in per_key.values() for e in k.get("effects", [])]
        if recv:
            res["effects_span"] = tuple((t - self.t0_ns) / 1e9 for t in (min(recv), max(recv)))
        st = json.loads(ex.http(stub + "/_stub/stats")[1])
        res["rejected"] = st["rejected"]
        with open(os.path.join(ctx["dir"], "arrivals.json"), "wb") as f:    # for --keep
            f.write(ex.http(stub + "/_stub/arrivals")[1])


def successes(q, fleet):
    """From <queue>:successes: deliveries of a job after its first success, how many of those
    went through another sluice than the first, and how many of each the ledger answered."""
    first, out = {}, {"again": 0, "again_replayed": 0, "again_other": 0,
                      "again_other_replayed": 0}
    for raw in q.r.lrange(q.key("successes"), 0, -1):
        key, url, outcome = raw.decode().split()
        via = fleet.index(url)
        if key not in first:
            first[key] = via
            continue
        replayed = outcome == "replayed"
        out["again"] += 1
        out["again_replayed"] += replayed
        if via != first[key]:
            out["again_other"] += 1
            out["again_other_replayed"] += replayed
    return out


def store_stats(port, jobs):
    """Round trips (EVALSHA calls) and commands per job on the fleet's Redis."""
    r = redis.Redis(host="127.0.0.1", port=port)
    stats = r.info("commandstats")
    evalsha = stats.get("cmdstat_evalsha", {}).get("calls", 0)
    total = sum(v.get("calls", 0) for v in stats.values())
    cpu = r.info("cpu")
    return {"evalsha_per_job": evalsha / jobs, "cmds_per_job": total / jobs,
            "redis_cpu_s": cpu["used_cpu_sys"] + cpu["used_cpu_user"]}


LOOKUP_PREFIX = "/v1/lookup/"     # the stub's lookup; the route's prefix is /v1


def run_arm(arm, args, root, rport, stub_bin, sluice_bin):
    if arm == "local" and args.local_jobs:
        args = argparse.Namespace(**dict(vars(args), jobs=args.local_jobs))
    stub_args = ["--lookup", LOOKUP_PREFIX] if args.lookup else []
    args = argparse.Namespace(**dict(vars(args),
                                     verify_path=LOOKUP_PREFIX + "{key}" if args.lookup else None))
    d = os.path.join(root, arm)
    os.makedirs(d)
    procs = ex.Procs(d)
    hooks = Redeliverer(args)
    try:
        store_port = ex.start_redis(procs, d, "store-redis")[1] if arm == "fleet" else None
        res = ex.run_arm(arm, "python-acks", args, procs, rport, d, stub_bin, sluice_bin,
                         hooks=hooks, stub_args=stub_args,
                         front=lambda stub: Fleet(procs, sluice_bin, d, stub, args,
                                                  MODES[arm], store_port))
        if store_port:
            res.update(store_stats(store_port, args.jobs))
    finally:
        hooks.stop_evt.set()
        procs.stop_all()
    return res


# ---- report --------------------------------------------------------------------------------

def opt(fmt, key):
    return lambda r: "—" if r.get(key) is None else fmt.format(r[key])


ROWS = [
    ("sluices (one per pod) / worker slots", lambda r: f"{r['sluices']} / {r['slots']}"),
    ("jobs", opt("{}", "jobs")),
    ("time to drain (s)", opt("{:.2f}", "drain_s")),
    ("first / last side effect at the partner (s)",
     lambda r: "{:.2f} / {:.2f}".format(*r["effects_span"]) if r.get("effects_span") else "—"),
    ("lower bound (s): jobs/rate + burst + outage", opt("{:.2f}", "bound_s")),
    ("drain / bound", opt("{:.3f}", "ratio")),
    ("jobs done / dead-lettered / left", lambda r: f"{r['done']} / {r['dlq']} / {r['left']}"),
    ("provider calls", opt("{}", "provider_calls")),
    ("... refused over the partner's rate (429)", opt("{}", "rejected")),
    ("side effects", opt("{}", "side_effects")),
    ("duplicate side effects (jobs)", lambda r: f"{r['extra_effects']} ({r['duplicates']})"),
    ("jobs over their attempt budget", opt("{}", "over_budget")),
    ("most calls for one job", opt("{}", "max_attempts_used")),
    ("completed jobs delivered again (injected)", opt("{}", "redelivered")),
    ("deliveries after a job's first success", opt("{}", "again")),
    ("... through another sluice", opt("{}", "again_other")),
    ("... of those, replayed from the ledger", opt("{}", "again_other_replayed")),
    ("jobs held by the worker killed for good", opt("{}", "n_orphans")),
    ("... finished by the other workers", opt("{}", "orphans_done")),
    ("sluice killed -9 and restarted: to ready (s)", opt("{:.2f}", "sluice_restart_s")),
    ("slot-seconds waiting for a permit", opt("{:.1f}", "permit_wait_s")),
    ("store errors (sluice_store_errors_total)", opt("{}", "store_errors")),
    ("longest delay asked of the queue (s)", opt("{:.1f}", "max_delay_s")),
    ("fleet Redis: round trips (EVALSHA) per job", opt("{:.2f}", "evalsha_per_job")),
    ("fleet Redis: commands per job", opt("{:.1f}", "cmds_per_job")),
]

HEADS = {"fleet": "fleet (shared: redis)", "local": "per-pod RocksDB"}


def table(results):
    w0 = max(len(label) for label, _ in ROWS)
    out = [f"{'':{w0}}  " + "  ".join(f"{HEADS[r['arm']]:>22}" for r in results)]
    for label, f in ROWS:
        out.append(f"{label:{w0}}  " + "  ".join(f"{f(r):>22}" for r in results))
    return "\n".join(out)


def failures(r, args):
    """The fleet arm's pass conditions (the local arm's with --check-local)."""
    if r["arm"] == "local":
        return local_failures(r)
    f = ex.failures(r, args)
    if r["redeliver_error"]:
        f.append(r["redeliver_error"])
    if r["over_budget"]:
        f.append(f"{r['over_budget']} job(s) made more than {args.max_attempts} calls")
    if r["again_replayed"] != r["again"]:
        f.append(f"{r['again'] - r['again_replayed']} of {r['again']} deliveries after a "
                 "job's first success were not replayed from the ledger")
    if not r["again_other"]:
        f.append("no delivery after a job's success went through another sluice: "
                 "nothing was tested")
    return f


def local_failures(r):
    """--check-local: what fleet mode removes must be visible without it."""
    f = []
    if not r["again_other"]:
        f.append("no delivery after a job's success went through another sluice")
    elif not r["duplicates"]:
        f.append("deliveries through another sluice made no duplicate")
    if not r["rejected"]:
        f.append("the pods, each at the partner's rate, never overran it")
    return f


def main():
    ap = ex.parser(__doc__.split("\n")[0])
    ap.set_defaults(arms="fleet,local", worker="python")
    ap.add_argument("--sluices", type=int, default=4, help="sluices in the fleet (pods)")
    ap.add_argument("--redeliver-rounds", type=int, default=6,
                    help="moments, spread over the batch, at which completed jobs come again")
    ap.add_argument("--redeliver", type=int, default=4,
                    help="jobs delivered again each time: the last ones a worker saw succeed")
    # On a loaded 2-core machine redis-server (or a sluice loop) is now and then off the CPU for
    # over 100 ms, the default store.timeout: every request in flight then counts Redis as
    # unreachable (store_unavailable, nothing forwarded), and a lease whose reply came too late
    # holds its key until the lease runs out. That is the designed reaction to a slow Redis,
    # which the integration tests cover; here it would only measure the machine's load.
    ap.add_argument("--store-timeout-ms", type=int, default=1000,
                    help="store.timeout of the fleet's sluices (sluice's default: 100)")
    ap.add_argument("--local-jobs", type=int, default=0,
                    help="jobs of the local arm (default: --jobs); it only has to show harm")
    ap.add_argument("--check-local", action="store_true",
                    help="fail unless the local arm shows duplicates and rate overruns")
    ap.add_argument("--lookup", action="store_true",
                    help="the stub offers a lookup by key and the policy verifies with it")
    ap.add_argument("--verify-after-ms", type=int, default=200,
                    help="idempotency.verify's after, with --lookup")
    ap.add_argument("--duplicates", choices=["refuse", "wait"],
                    help="the policy's idempotency.duplicates (default: sluice's, refuse)")
    args = ap.parse_args()
    arms = args.arms.split(",")
    for arm in arms:
        if arm not in MODES:
            ap.error(f"unknown arm {arm!r} (fleet, local)")
    if args.workers // args.threads < args.sluices:
        ap.error("fewer worker processes (--workers / --threads) than sluices")
    # A SIGTERM (ctest's timeout) still stops every process by its pid.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    sluice_bin = os.environ.get("SLUICE_BIN", os.path.join(args.build, "sluice"))
    stub_bin = os.environ.get("SLUICE_STUB", os.path.join(args.build, "sluice-stub"))
    root = tempfile.mkdtemp(prefix="sluice-fleet-e2e-")
    procs = ex.Procs(root)
    results = []
    try:
        _, rport = ex.start_redis(procs, root, "queue-redis")
        for arm in arms:
            jobs = args.local_jobs if arm == "local" and args.local_jobs else args.jobs
            print(f"running {arm}: {args.sluices} sluices, {jobs} jobs, {args.workers} "
                  f"slots, {args.rate}/s ...", file=sys.stderr, flush=True)
            res = run_arm(arm, args, root, rport, stub_bin, sluice_bin)
            res["slots"] = args.workers
            results.append(res)
    finally:
        procs.stop_all()
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    bad = [f"{r['arm']}: {w}" for r in results if r["arm"] == "fleet" or args.check_local
           for w in failures(r, args)]
    return ex.end_run(bad, root, args.keep)


if __name__ == "__main__":
    sys.exit(main())
