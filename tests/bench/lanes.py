#!/usr/bin/env python3
"""Lanes benchmark (tests/bench/README.md, "lanes.sh"): one sluice, one stub,
two policies of the same numbers (rate 50/s, burst 1), `lanes` with lanes
interactive 30 % / batch 70 %, and `fifo` without lanes. Each arm, in turn:

  1. 128 batch clients saturate the policy (closed loop);
  2. phase "join": 8 interactive clients join, each sending one request a
     second (8/s, below their lane's 15/s): their wait, p50 and p99;
  3. phase "share": the 8 interactive clients send back to back (their lane
     never empties): the interactive share of the permits.

Over each arm: the overshoot of the bound at the stub (the most starts in
any window beyond burst + rate x t) and sluice's CPU per permit (schedstat of
all its threads over the arm, over the permits the stub saw). Every process
started here is stopped by its pid. Prints one table; asserts nothing.
"""
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

RATE = float(os.environ.get("RATE", "50"))
BATCH = int(os.environ.get("BATCH", "128"))
INTER = int(os.environ.get("INTER", "8"))
SHARE = 30.0
SECONDS = float(os.environ.get("PHASE_SECONDS", "10"))   # each phase
WARM = float(os.environ.get("WARM_SECONDS", "4"))        # batch alone first


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def cpu_ns(pid):
    t = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                t += int(f.read().split()[0])
        except OSError:
            pass
    return t


def get(port, path, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("GET", path)
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, body


class Client(threading.Thread):
    """One worker: a keep-alive connection, requests to `path` until stop."""

    def __init__(self, port, path, lane, log, stop, gap=None):
        super().__init__(daemon=True)
        self.port, self.path, self.lane, self.log = port, path, lane, log
        self.stop, self.gap = stop, gap
        self.next_at = time.monotonic() + (random.random() * gap if gap else 0)

    def run(self):
        conn = None
        while not self.stop.is_set():
            if self.gap:
                d = self.next_at - time.monotonic()
                if d > 0 and self.stop.wait(d):
                    break
                self.next_at += self.gap
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            t0 = time.monotonic()
            try:
                conn.request("POST", self.path, body=b"j")
                r = conn.getresponse()
                r.read()
                status = r.status
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = None
                status = 0
            self.log.append((self.lane, t0, time.monotonic(), status))


def pct(v, q):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def overshoot(arr, burst, rate):
    worst = -1e9
    for i in range(len(arr)):
        for j in range(i, min(len(arr), i + 400)):
            t = (arr[j] - arr[i]) / 1e9
            worst = max(worst, (j - i + 1) - (burst + rate * t))
    return worst


def run_arm(sl_port, sl_pid, stub_port, prefix):
    log, stop_b, stop_i = [], threading.Event(), threading.Event()
    c = http.client.HTTPConnection("127.0.0.1", stub_port)
    c.request("POST", "/_stub/reset", body=b"")
    c.getresponse().read()
    c.close()
    cpu0 = cpu_ns(sl_pid)
    batch = [Client(sl_port, prefix + "/sync", "batch", log, stop_b) for _ in range(BATCH)]
    for b in batch:
        b.start()
    time.sleep(WARM)
    t_join = time.monotonic()
    inter = [Client(sl_port, prefix + "/click", "interactive", log, stop_i, gap=1.0)
             for _ in range(INTER)]
    for t in inter:
        t.start()
    time.sleep(SECONDS)
    stop_i.set()
    for t in inter:
        t.join()
    stop_i.clear()
    t_share = time.monotonic()
    inter = [Client(sl_port, prefix + "/click", "interactive", log, stop_i)
             for _ in range(INTER)]
    for t in inter:
        t.start()
    time.sleep(SECONDS)
    t_end = time.monotonic()
    stop_i.set()
    stop_b.set()
    for t in inter + batch:
        t.join()
    cpu1 = cpu_ns(sl_pid)
    _, body = get(stub_port, "/_stub/arrivals")
    arr = json.loads(body)
    join = [(e - s) * 1000 for lane, s, e, st in log
            if lane == "interactive" and t_join + 1 <= s < t_share and st == 200]
    # Permits granted in the share phase, by the answer's time (1 s settling).
    done = [(lane, e) for lane, s, e, st in log if st == 200 and t_share + 1 <= e < t_end]
    ni = sum(1 for lane, _ in done if lane == "interactive")
    bw = [(e - s) * 1000 for lane, s, e, st in log
          if lane == "batch" and t_join <= s < t_end and st == 200]
    bad = sum(1 for *_, st in log if st != 200)
    return {
        "join_p50_ms": pct(join, 0.5), "join_p99_ms": pct(join, 0.99), "join_n": len(join),
        "share": ni / len(done) if done else float("nan"), "share_n": len(done),
        "batch_p50_ms": pct(bw, 0.5),
        "overshoot": overshoot(arr, 1, RATE), "permits": len(arr),
        "cpu_us_per_permit": (cpu1 - cpu0) / 1000 / max(1, len(arr)),
        "not_200": bad,
    }


def main():
    build = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="sluice-lanes.")
    pids = []

    def stop_all(*_):
        for p in pids:
            try:
                os.kill(p, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in pids:
            try:
                os.waitpid(p, 0)
            except ChildProcessError:
                pass

    try:
        stub_port, port, admin = free_port(), free_port(), free_port()
        stub = subprocess.Popen([f"{build}/sluice-stub", "--listen", f"127.0.0.1:{stub_port}",
                                 "--body-size", "2"], stdout=subprocess.DEVNULL)
        pids.append(stub.pid)
        lanes = (f"    lanes:\n"
                 f"      - {{name: interactive, share: {SHARE:g}%, max_wait: 30s}}\n"
                 f"      - {{name: batch, share: {100 - SHARE:g}%, max_wait: 120s}}\n")
        cfg = f"""listen: 127.0.0.1:{port}
admin: 127.0.0.1:{admin}
threads: 2
store: {{path: {tmp}/data}}
log: {{level: warn, access: false}}
upstreams: {{stub: {{url: "http://127.0.0.1:{stub_port}", max_connections: 256}}}}
policies:
  lanes:
    rate: {RATE:g}/s
    max_wait: 120s
{lanes}  fifo:
    rate: {RATE:g}/s
    max_wait: 120s
routes:
  - {{prefix: /L/click, upstream: stub, policy: lanes, lane: interactive}}
  - {{prefix: /L/sync, upstream: stub, policy: lanes, lane: batch}}
  - {{prefix: /F/click, upstream: stub, policy: fifo}}
  - {{prefix: /F/sync, upstream: stub, policy: fifo}}
"""
        with open(f"{tmp}/sidecar.yaml", "w") as f:
            f.write(cfg)
        sl = subprocess.Popen([f"{build}/sluice", "-c", f"{tmp}/sidecar.yaml"],
                              stderr=open(f"{tmp}/sluice.err", "w"))
        pids.insert(0, sl.pid)
        for _ in range(200):
            try:
                if get(admin, "/readyz", 1)[0] == 200:
                    break
            except OSError:
                time.sleep(0.05)
        res = {}
        for name, prefix in (("lanes", "/L"), ("fifo", "/F")):
            print(f"lanes.py: arm {name} ({WARM + 2 * SECONDS:.0f} s)", file=sys.stderr)
            res[name] = run_arm(port, sl.pid, stub_port, prefix)
        target = 2 / (SHARE / 100 * RATE) * 1000 + 10
        print(f"rate {RATE:g}/s, {BATCH} batch clients, {INTER} interactive "
              f"(join: 1 req/s each; share: back to back), interactive share {SHARE:g} %")
        print(f"{'':28} {'lanes':>10} {'no lanes':>10}")
        rows = [("interactive wait p50 (ms)", "join_p50_ms", "%.0f"),
                ("interactive wait p99 (ms)", "join_p99_ms", "%.0f"),
                ("  samples", "join_n", "%d"),
                ("batch wait p50 (ms)", "batch_p50_ms", "%.0f"),
                ("interactive share", "share", "%.3f"),
                ("  permits counted", "share_n", "%d"),
                ("overshoot (requests)", "overshoot", "%.2f"),
                ("permits at the stub", "permits", "%d"),
                ("sluice CPU/permit (us)", "cpu_us_per_permit", "%.1f"),
                ("answers not 200", "not_200", "%d")]
        for label, k, f in rows:
            print(f"{label:28} {f % res['lanes'][k]:>10} {f % res['fifo'][k]:>10}")
        print(f"target p99 <= 2 / (share x rate) + 10 ms = {target:.0f} ms; "
              f"CPU ratio lanes / no lanes = "
              f"{res['lanes']['cpu_us_per_permit'] / res['fifo']['cpu_us_per_permit']:.2f}")
    finally:
        stop_all()
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
