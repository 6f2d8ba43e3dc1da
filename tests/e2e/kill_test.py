#!/usr/bin/python3
"""The kill test: kill -9 sluice at random moments of the burst-and-restart experiment.

The batch of experiment.py (real Redis delayed queue, the stub, sluice, the Python example
worker; the 429 burst, the kill -9 of half the workers, the outage) runs while a thread kills
sluice with SIGKILL `--kills` times, each at a random moment (uniform in `--gap-ms` after the
previous restart became ready), and restarts it at once with the same config and the same store.
Then the batch drains and the test checks, from the stub's per-key side-effect times (CLOCK_
MONOTONIC, shared by every process on the machine) and the time each worker saw its job's success:

- no completed result forgotten: no side effect of a key arrives at the stub after a worker was
  told that key succeeded (ok or replayed), and every acknowledged key is a completed record in
  the store at the end (admin GET /idempotency/{policy}/{key});
- duplicates (a key with more than one side effect) only where a kill caught the earlier side
  effect's request in flight: SIGKILL sent before the stub had answered it (or at most
  `--transit-ms` after: the answer on its way into sluice's store), the process gone after it
  arrived. Each case is printed with the kill and the interval;
- with the stub honouring Idempotency-Key (`--honour-idempotency`, a second variant with a fresh
  Redis, stub, sluice and store): no duplicate at all;
- with the stub ignoring keys but offering a lookup by them (`--lookup`, variant `lookup`) and
  sluice verifying every unknown outcome with it (idempotency.verify): no duplicate at all either,
  and each job caught in flight by a kill is replayed soon after the restart (the restart took
  its lease up and asked the partner), not a lease later.

Prints the duplicates of each variant and a summary table; exits 1 when a check fails. Both
variants are bounded in kills and time and stop by themselves; everything is on loopback and every
process is stopped by its pid.
"""
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import experiment as ex  # noqa: E402  (tests/e2e/experiment.py)

POLICY = "writes"           # the policy of experiment.py's sluice config
RETRY_ON = "409, 429, 502, 503, 504, connect_error, connection_lost, timeout"


class Killer:
    """experiment.run_arm hooks: kills and restarts sluice from a thread while the batch runs."""

    kills_sluice = True     # the plan's own kill and restart of sluice are left out

    def __init__(self, args, rng, t0_ns):
        self.args, self.rng, self.t0_ns = args, rng, t0_ns
        self.kills, self.error, self.redelivered = [], None, 0
        self.stop_evt = threading.Event()
        self.thread = None

    def extra_time(self):
        return self.args.kills * (self.args.gap_ms[1] / 1000 + 1.0)

    def start(self, ctx):
        self.thread = threading.Thread(target=self.run, args=(ctx["sluice"], ctx["dir"],
                                                              ctx["queue"]), daemon=True)
        self.thread.start()

    def run(self, sluice, d, q):
        lo, hi = self.args.gap_ms
        acked = f"{q.name}:acked"
        try:
            for n in range(1, self.args.kills + 1):
                if self.stop_evt.wait(self.rng.uniform(lo, hi) / 1000):
                    return
                # The last completions workers saw before the kill are delivered again after
                # the restart, first in line: at-least-once queues do that, and only the
                # store's record keeps them from reaching the partner a second time.
                seen = q.r.hgetall(acked)
                again = sorted(seen, key=lambda k: int(seen[k]))[-self.args.redeliver:] \
                    if self.args.redeliver else []
                sent, gone = sluice.kill9()
                with open(os.path.join(d, "sluice.log"), "a") as log:
                    log.write(f"kill-test: SIGKILL #{n} sent at {sent} ns CLOCK_MONOTONIC "
                              f"(t={(sent - self.t0_ns) / 1e9:.3f} s), process gone at {gone}\n")
                restart_s = sluice.restart()
                ready = time.monotonic_ns()
                for k in again:
                    q.r.rpush(q.key("ready"), json.dumps(ex.make_job(q.name, int(k[-6:]))))
                self.redelivered += len(again)
                self.kills.append({"n": n, "sent": sent, "gone": gone, "restart_s": restart_s,
                                   "ready": ready})
        except Exception as e:     # reported as a failure of the run
            self.error = f"kill/restart #{len(self.kills) + 1} failed: {e!r}"

    def busy(self):
        return self.thread is not None and self.thread.is_alive()

    def finish(self, ctx, res):
        self.stop_evt.set()
        self.thread.join()
        res["kills"] = self.kills
        res["killer_error"] = self.error
        res["redelivered"] = self.redelivered
        if self.kills:
            res["sluice_restart_s"] = statistics.mean(k["restart_s"] for k in self.kills)
            res["restart_max_s"] = max(k["restart_s"] for k in self.kills)
        q, stub, sluice = ctx["queue"], ctx["stub"], ctx["sluice"]
        r = redis.Redis(host="127.0.0.1", port=ctx["redis_port"])
        res["acked"] = {k.decode(): int(v) for k, v in r.hgetall(f"{q.name}:acked").items()}
        keys = [f"{q.name}:job-{i:06d}" for i in range(self.args.jobs)]
        res["keys"] = ex.get_all(stub, "/_stub/keys/", keys)
        res["stats"] = json.loads(ex.http(stub + "/_stub/stats")[1])
        admin = f"http://127.0.0.1:{sluice.admin}"
        res["records"] = ex.get_all(admin, f"/idempotency/{POLICY}/", sorted(res["acked"]))


# ---- the checks --------------------------------------------------------------------------------

def analyse(res, args, t0_ns):
    """Forgotten completions, duplicates and their explanation, from one variant's data."""
    kills = res["kills"]
    transit = args.transit_ms * 1_000_000
    forgotten, dups, unexplained, early = [], [], [], []
    for key, info in sorted(res["keys"].items()):
        effects = info.get("effects", [])
        acked = res["acked"].get(key)
        if acked is not None:
            for e in effects:
                if e["recv_ns"] > acked:
                    forgotten.append({"key": key, "acked": acked, "effect": e})
        for a, b in zip(effects, effects[1:]):
            done = a["done_ns"] or b["recv_ns"]
            hit, how = None, None
            for k in kills if acked is None or acked > b["recv_ns"] else ():
                if k["sent"] <= done and k["gone"] >= a["recv_ns"]:
                    hit, how = k, "in flight"
                    break
                if done < k["sent"] <= done + transit and k["gone"] >= a["recv_ns"]:
                    hit, how = k, "answer in transit"
                    break
            row = {"key": key, "n": len(effects), "first": a, "second": b, "kill": hit, "how": how,
                   "resent_s": (b["recv_ns"] - a["recv_ns"]) / 1e9}
            dups.append(row)
            if hit is None:
                unexplained.append(row)
            elif row["resent_s"] < args.lease - args.lease_slack:
                early.append(row)
    res.update(forgotten=forgotten, dup_rows=dups, unexplained=unexplained, early=early)
    res["settle_s"] = settle_times(res)
    res["dup_keys"] = sum(1 for i in res["keys"].values() if len(i.get("effects", [])) > 1)
    res["records_completed"] = sum(1 for v in res["records"].values()
                                   if v.get("state") == "completed")
    res["t0_ns"] = t0_ns


def settle_times(res):
    """For each job whose request a kill caught at the partner (its first side effect arrived
    before the SIGKILL and was not answered before it): seconds from the restart (ready) to the
    moment a worker saw that job succeed, i.e. to its replay."""
    out = []
    for key, info in res["keys"].items():
        effects, acked = info.get("effects", []), res["acked"].get(key)
        if not effects or acked is None:
            continue
        a = effects[0]
        for k in res["kills"]:
            if a["recv_ns"] <= k["sent"] and (not a["done_ns"] or a["done_ns"] >= k["sent"]):
                if acked > k["ready"]:
                    out.append((acked - k["ready"]) / 1e9)
                break
    return sorted(out)


def t(ns, t0):
    return f"{(ns - t0) / 1e9:9.3f}"


def dup_table(res):
    t0 = res["t0_ns"]
    head = (f"{'key':<28} {'#':>2} {'kill':>5} {'SIGKILL at':>10} {'gone at':>10}  "
            f"{'1st effect: arrived':>19} {'answered':>10} {'peer':>5}  {'resent at':>9} "
            f"{'after':>6}  explained")
    out = [head]
    for row in res["dup_rows"]:
        a, b, k = row["first"], row["second"], row["kill"]
        out.append(
            f"{row['key']:<28} {row['n']:>2} {('#%d' % k['n']) if k else '—':>5} "
            f"{t(k['sent'], t0) if k else '':>10} {t(k['gone'], t0) if k else '':>10}  "
            f"{t(a['recv_ns'], t0):>19} {t(a['done_ns'], t0) if a['done_ns'] else 'never':>10} "
            f"{'gone' if a['peer_gone'] else '-':>5}  {t(b['recv_ns'], t0):>9} "
            f"{row['resent_s']:5.2f}s  {row['how'] or 'NO: ' + why_not(row, res)}")
    return "\n".join(out)


def why_not(row, res):
    acked = res["acked"].get(row["key"])
    if acked is not None and acked < row["second"]["recv_ns"]:
        return "a worker had seen it succeed"
    return "no kill in flight"


ROWS = [
    ("kills (SIGKILL of sluice)", lambda r: len(r["kills"])),
    ("restarts on the same store", lambda r: len(r["kills"])),
    ("restart to ready, mean / max (s)",
     lambda r: f"{r['sluice_restart_s']:.3f} / {r['restart_max_s']:.3f}" if r["kills"] else "—"),
    ("jobs", lambda r: r["jobs"]),
    ("jobs done / dead-lettered / left", lambda r: f"{r['done']} / {r['dlq']} / {r['left']}"),
    ("completions seen by workers", lambda r: len(r["acked"])),
    ("completed jobs delivered again after a kill", lambda r: r["redelivered"]),
    ("... completed in the store at the end", lambda r: r["records_completed"]),
    ("forgotten completions (must be 0)", lambda r: len(r["forgotten"])),
    ("side effects at the stub", lambda r: r["side_effects"]),
    ("duplicate side effects (on how many keys)",
     lambda r: f"{len(r['dup_rows'])} ({r['dup_keys']})"),
    ("... kill while at the stub", lambda r: sum(x["how"] == "in flight" for x in r["dup_rows"])),
    ("... kill while the answer was in transit",
     lambda r: sum(x["how"] == "answer in transit" for x in r["dup_rows"])),
    ("... unexplained (must be 0)", lambda r: len(r["unexplained"])),
    ("... resent before the lease ran out", lambda r: len(r["early"])),
    ("jobs caught in flight: restart to replay, median / max (s)",
     lambda r: f"{statistics.median(r['settle_s']):.2f} / {max(r['settle_s']):.2f} "
               f"({len(r['settle_s'])})" if r["settle_s"] else "—"),
    ("stub's dedup: replays / 409 in progress",
     lambda r: f"{r['stats']['dedup_replays']} / {r['stats']['dedup_conflicts']}"),
    ("most attempts of one job (calls)", lambda r: r["max_attempts_used"]),
    ("batch drained in (s)", lambda r: f"{r['drain_s']:.1f}" if r["drain_s"] else "—"),
    ("time taken, all in (s)", lambda r: f"{r['wall_s']:.1f}"),
]


def summary(results):
    w0 = max(len(label) for label, _ in ROWS)
    out = [f"{'':{w0}}  " + "  ".join(f"{r['variant']:>22}" for r in results)]
    for label, f in ROWS:
        out.append(f"{label:{w0}}  " + "  ".join(f"{str(f(r)):>22}" for r in results))
    return "\n".join(out)


def failures(r, args):
    f = [w for w in ex.failures(r, args) if "duplicate side effect" not in w]
    if r["killer_error"]:
        f.append(r["killer_error"])
    if len(r["kills"]) < args.kills:
        f.append(f"only {len(r['kills'])} of {args.kills} kills happened before the deadline")
    for x in r["forgotten"]:
        f.append(f"forgotten completion: {x['key']} acknowledged to a worker at "
                 f"t={(x['acked'] - r['t0_ns']) / 1e9:.3f} s, side effect #{x['effect']['seq']} "
                 f"arrived at t={(x['effect']['recv_ns'] - r['t0_ns']) / 1e9:.3f} s")
    if r["records_completed"] != len(r["acked"]):
        missing = [k for k in r["acked"] if r["records"].get(k, {}).get("state") != "completed"]
        f.append(f"{len(missing)} acknowledged key(s) not completed in the store at the end: "
                 + ", ".join(f"{k} {r['records'].get(k)}" for k in missing[:5]))
    for x in r["unexplained"]:
        f.append(f"duplicate of {x['key']} without a kill in flight (see the table)")
    for x in r["early"]:
        f.append(f"{x['key']} resent {x['resent_s']:.2f} s after a killed attempt, within its "
                 f"{args.lease} s lease")
    if r["honour"] and r["duplicates"]:
        f.append(f"{r['duplicates']} duplicate(s) although the stub honoured Idempotency-Key")
    if r["variant"] == "lookup" and r["duplicates"]:
        f.append(f"{r['duplicates']} duplicate(s) although sluice verified every unknown "
                 "outcome with the stub's lookup")
    return f


LOOKUP_PREFIX = "/v1/lookup/"     # the stub's lookup; the route's prefix is /v1


def run_variant(name, honour, args, sluice_bin, stub_bin, root, seed):
    d = os.path.join(root, name)
    os.makedirs(d)
    procs = ex.Procs(d)
    t0_ns = time.monotonic_ns()
    killer = Killer(args, random.Random(seed), t0_ns)
    stub_args = ["--delay-ms", str(args.stub_delay_ms)] + (["--honour-idempotency"] if honour
                                                          else [])
    args.verify_path = None
    if name == "lookup":     # sluice asks the stub's lookup after every unknown outcome
        stub_args += ["--lookup", LOOKUP_PREFIX]
        args.verify_path = LOOKUP_PREFIX + "{key}"
    try:
        _, rport = ex.start_redis(procs, d)
        res = ex.run_arm("sluice", "python-acks", args, procs, rport, d, stub_bin, sluice_bin,
                         hooks=killer, stub_args=stub_args)
    finally:
        killer.stop_evt.set()
        procs.stop_all()
    res.update(variant=name, honour=honour, wall_s=(time.monotonic_ns() - t0_ns) / 1e9)
    analyse(res, args, t0_ns)
    return res


def gap(s):
    lo, hi = (int(x) for x in s.split(","))
    if not 0 <= lo <= hi:
        raise ValueError(s)
    return lo, hi


def main():
    ap = ex.parser(__doc__.split("\n")[0])
    # Longer burst and outage than the experiment's: with sluice down a third of the time and
    # every kill bouncing the requests inside it, traffic comes in pulses a 1 s window can miss.
    ap.set_defaults(jobs=None, arms="sluice", worker="python", lease=6, retry_on=RETRY_ON,
                    burst_ms=2000, outage_ms=3000)
    ap.add_argument("--kills", type=int, default=100, help="SIGKILLs of sluice per variant")
    ap.add_argument("--gap-ms", type=gap, default=(50, 400),
                    help="LO,HI: each kill comes uniform(LO, HI) ms after sluice became ready")
    ap.add_argument("--stub-delay-ms", type=int, default=10,
                    help="the stub answers after this long, so kills catch requests in flight")
    ap.add_argument("--transit-ms", type=int, default=50,
                    help="a kill this long after the stub answered still explains a duplicate "
                         "(the answer on its way into sluice's store)")
    ap.add_argument("--lease-slack", type=float, default=0.5,
                    help="a resend this much earlier than the lease is still fine, s")
    ap.add_argument("--redeliver", type=int, default=3,
                    help="after each restart, deliver again the last N jobs acknowledged before "
                         "the kill (they must be replayed, not sent)")
    ap.add_argument("--variants", default="plain,honour,lookup",
                    help="plain (the stub counts every side effect), honour (the stub "
                         "deduplicates by Idempotency-Key), lookup (the stub ignores keys but "
                         "offers a lookup by them, which sluice asks: idempotency.verify)")
    ap.add_argument("--verify-after-ms", type=int, default=200,
                    help="variant lookup: verify.after, ms")
    ap.add_argument("--seed", type=int, help="random seed of the kill times (default: random)")
    args = ap.parse_args()
    # A SIGTERM (ctest's timeout, Ctrl-C's cousin) still stops every process by its pid.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.jobs is None:    # enough for the batch to outlast the kills (they slow it down)
        args.jobs = max(200, int(0.6 * args.rate * args.kills * (sum(args.gap_ms) / 2000 + 0.15)))
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)

    sluice_bin = os.environ.get("SLUICE_BIN", os.path.join(args.build, "sluice"))
    stub_bin = os.environ.get("SLUICE_STUB", os.path.join(args.build, "sluice-stub"))
    root = tempfile.mkdtemp(prefix="sluice-kill-")
    # Every restart runs the same binary, even if the build dir is rebuilt meanwhile.
    shutil.copy2(sluice_bin, os.path.join(root, "sluice"))
    sluice_bin = os.path.join(root, "sluice")
    print(f"kill test: {args.kills} kills per variant, {args.jobs} jobs, {args.workers} slots, "
          f"{args.rate}/s, gap {args.gap_ms[0]}-{args.gap_ms[1]} ms, stub delay "
          f"{args.stub_delay_ms} ms, seed {seed}", file=sys.stderr, flush=True)

    results, bad = [], []
    for i, name in enumerate(args.variants.split(",")):
        if name not in ("plain", "honour", "lookup"):
            ap.error(f"unknown variant {name!r}")
        print(f"running {name} ...", file=sys.stderr, flush=True)
        r = run_variant(name, name == "honour", args, sluice_bin, stub_bin, root, seed + i)
        results.append(r)
        print(f"\n{name}: {len(r['dup_rows'])} duplicate side effect(s)"
              f"{' (each must follow a kill in flight)' if r['dup_rows'] else ''}")
        if r["dup_rows"]:
            print(dup_table(r))
        bad += [f"{name}: {w}" for w in failures(r, args)]
    print("\ntimes in s from the start of each variant; '1st effect' is the earlier side effect's "
          "request at the stub (arrived, answered; peer 'gone': sluice had closed the connection "
          "before the answer); 'after': resend minus first arrival\n")
    print(summary(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{k: v for k, v in r.items() if k not in ("keys", "records")}
                       for r in results], f, indent=1)
    return ex.end_run(bad, root, args.keep)


if __name__ == "__main__":
    sys.exit(main())
