#!/usr/bin/env python3
"""Quota benchmark (tests/bench/README.md, "quota.sh"): a stub partner with a
fixed-window quota (Q requests per W seconds, advertised on every answer in
one header style, 429 beyond it), 64 closed-loop clients through sluice, in
three arms, each with a fresh stub and sluice:

  follow  rate 10 x the quota, quota: {follow: true}
  guess   rate 10 x the quota, no quota block (today's operator guess)
  exact   rate Q / W, burst 1 (a hand-tuned exact rate)

Per arm: the partner's refusals after the first window, the share of the
quota used from the second window to the change, the p99 wait of the
answers that were 200; then the partner halves its quota (POST
/_stub/quota) and the refusals after the change are counted. With
SIDECARS=N (> 1) the arms run in fleet mode: one redis-server, N sluices
with `shared: redis` and `fleet_size: N` in front of the same stub, the
clients spread over them round robin. Every process started here is
stopped by its pid. Prints one table; asserts nothing.
"""
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

Q = int(os.environ.get("QUOTA", "20"))
W = int(os.environ.get("WINDOW", "2"))
CLIENTS = int(os.environ.get("CLIENTS", "64"))
BEFORE = int(os.environ.get("WINDOWS_BEFORE", "5"))   # windows before the halving
AFTER = int(os.environ.get("WINDOWS_AFTER", "4"))     # windows after it
STYLES = os.environ.get("STYLES", "draft old x").split()
ARMS = os.environ.get("ARMS", "follow guess exact").split()
SIDECARS = int(os.environ.get("SIDECARS", "1"))
DELAY_MS = int(os.environ.get("DELAY_MS", "0"))       # the partner's answer time


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def call(port, method, path, body=None, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, body=body)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def stats(port):
    return json.loads(call(port, "GET", "/_stub/stats")[1])


class Client(threading.Thread):
    def __init__(self, port, log, stop):
        super().__init__(daemon=True)
        self.port, self.log, self.stop = port, log, stop

    def run(self):
        conn = None
        while not self.stop.is_set():
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            t0 = time.monotonic()
            try:
                conn.request("GET", "/w")
                r = conn.getresponse()
                r.read()
                st = r.status
            except (OSError, http.client.HTTPException):
                conn.close()
                conn, st = None, 0
            self.log.append((t0, time.monotonic(), st))
            if st != 200:
                # A worker requeues the job: it comes back a little later.
                self.stop.wait(0.2)


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def wait_ready(admin):
    for _ in range(200):
        try:
            if call(admin, "GET", "/readyz", timeout=1)[0] == 200:
                return
        except OSError:
            time.sleep(0.05)


def start_redis(tmp, pids):
    """One redis-server on loopback for the fleet arms; its port."""
    rp = free_port()
    r = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(rp),
                          "--save", "", "--appendonly", "no", "--dir", tmp],
                         stdout=subprocess.DEVNULL)
    pids.append(r.pid)
    for _ in range(100):
        try:
            import socket
            socket.create_connection(("127.0.0.1", rp), timeout=0.2).close()
            return rp
        except OSError:
            time.sleep(0.05)
    return rp


def arm(build, tmp, style, policy):
    pids = []
    try:
        sp = free_port()
        stub = subprocess.Popen([f"{build}/sluice-stub", "--listen", f"127.0.0.1:{sp}",
                                 "--quota", str(Q), "--quota-window", str(W),
                                 "--quota-style", style, "--delay-ms", str(DELAY_MS)],
                                stdout=subprocess.DEVNULL)
        t_epoch = time.monotonic()   # the stub's windows start about now
        pids.append(stub.pid)
        if SIDECARS > 1:
            rp = start_redis(tmp, pids)
            store = (f'{{backend: redis, url: "redis://127.0.0.1:{rp}/0", '
                     f'fleet_size: {SIDECARS}}}')
            policy += "    shared: redis\n"
        ports = []
        for i in range(SIDECARS):
            port, admin = free_port(), free_port()
            if SIDECARS == 1:
                store = f"{{path: {tmp}/data-{style}-{len(policy)}}}"
            cfg = f"""listen: 127.0.0.1:{port}
admin: 127.0.0.1:{admin}
threads: 2
store: {store}
log: {{level: warn, access: false}}
upstreams: {{stub: {{url: "http://127.0.0.1:{sp}", max_connections: 128}}}}
policies:
  p:
    max_wait: 10s
{policy}routes:
  - {{prefix: /, upstream: stub, policy: p}}
"""
            path = f"{tmp}/sidecar{i}.yaml"
            with open(path, "w") as f:
                f.write(cfg)
            sl = subprocess.Popen([f"{build}/sluice", "-c", path],
                                  stderr=open(f"{tmp}/sluice.err", "a"))
            pids.insert(0, sl.pid)
            ports.append((port, admin))
        for _, admin in ports:
            wait_ready(admin)
        log, stop = [], threading.Event()
        cs = [Client(ports[i % SIDECARS][0], log, stop) for i in range(CLIENTS)]
        for c in cs:
            c.start()

        def at_window(k):   # just after window k's end (windows from 0)
            d = t_epoch + k * W + 0.05 - time.monotonic()
            if d > 0:
                time.sleep(d)
            st = stats(sp)
            # Accepted up to the end of window k - 1 exactly: those the stub
            # counted in its window k so far (a reset's first permits) are not.
            if st.get("quota_window") == k:
                st["accepted"] -= st["quota_used"]
            return st

        s1 = at_window(1)
        s_change = at_window(BEFORE)
        call(sp, "POST", "/_stub/quota", str(Q // 2).encode())
        s_end = at_window(BEFORE + AFTER)
        stop.set()
        for c in cs:
            c.join()
        ok_waits = [(e - s) * 1000 for s, e, st in log if st == 200]
        return {
            "refused_after_first": s_change["quota_refused"] - s1["quota_refused"],
            "used": (s_change["accepted"] - s1["accepted"]) / (Q * (BEFORE - 1)),
            "p99_ms": pct(ok_waits, 0.99),
            "refused_after_change": s_end["quota_refused"] - s_change["quota_refused"],
            "used_after": (s_end["accepted"] - s_change["accepted"]) / (Q // 2 * AFTER),
            "requeued": sum(1 for *_, st in log if st != 200),
        }
    finally:
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


def main():
    build = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="sluice-quota.")
    rate = Q / W
    arms = {
        "follow": f"    rate: {10 * rate:g}/s\n    burst: 10\n    quota: {{follow: true}}\n",
        "guess": f"    rate: {10 * rate:g}/s\n    burst: 10\n",
        "exact": f"    rate: {rate:g}/s\n    burst: 1\n",
    }
    arms = {k: v for k, v in arms.items() if k in ARMS}
    try:
        for style in STYLES:
            res = {}
            for name, pol in arms.items():
                print(f"quota.py: {style} {name} ({(BEFORE + AFTER) * W} s)", file=sys.stderr)
                res[name] = arm(build, tmp, style, pol)
            fleet = f", {SIDECARS} sidecars on one redis-server" if SIDECARS > 1 else ""
            print(f"\nstyle {style}: quota {Q} per {W} s, {CLIENTS} clients{fleet}, halved to "
                  f"{Q // 2} after {BEFORE} windows")
            print(f"{'':36} " + " ".join(f"{a:>8}" for a in arms))
            for label, k, f in [
                    ("partner 429s, windows 2..%d" % BEFORE, "refused_after_first", "%d"),
                    ("quota used, windows 2..%d" % BEFORE, "used", "%.3f"),
                    ("p99 wait of 200s (ms)", "p99_ms", "%.0f"),
                    ("partner 429s after halving", "refused_after_change", "%d"),
                    ("quota used after halving", "used_after", "%.3f"),
                    ("answers requeued (all)", "requeued", "%d")]:
                print(f"{label:36} " + " ".join(f"{f % res[a][k]:>8}" for a in arms))
    finally:
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
