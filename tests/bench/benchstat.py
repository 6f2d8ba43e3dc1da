#!/usr/bin/env python3
"""Helper for passthrough.sh (not meant to be run alone).

  benchstat.py ports N          print N free loopback TCP ports, one a line
  benchstat.py record RUNS HZ NCPU SIZE TARGET REP WRKFILE PROXY STUB WRK BUSY TOTAL
                                parse `wrk --latency` output, append one line to RUNS (the tick
                                counts are CPU deltas over the run), print a progress line
  benchstat.py table RUNS RSS   print the summary tables from the TSV files the script wrote
"""
import re
import socket
import statistics
import sys

UNIT_US = {"us": 1.0, "ms": 1e3, "s": 1e6, "m": 60e6, "h": 3600e6}


def ports(n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    for s in socks:
        print(s.getsockname()[1])
        s.close()


def to_us(text):
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", text)
    return float(m.group(1)) * UNIT_US[m.group(2)]


def parse_wrk(path):
    out = open(path).read()
    p50 = re.search(r"^\s*50(?:\.0+)?%\s+(\S+)", out, re.M)
    p99 = re.search(r"^\s*99(?:\.0+)?%\s+(\S+)", out, re.M)
    reqs = re.search(r"^\s*(\d+) requests in", out, re.M)
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", out, re.M)
    if not (p50 and p99 and reqs and rps):
        sys.exit("cannot parse wrk output in " + path)
    errors = sum(int(x) for x in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors += int(non2xx.group(1)) if non2xx else 0
    return (float(rps.group(1)), to_us(p50.group(1)), to_us(p99.group(1)),
            int(reqs.group(1)), errors)


def record(runs_path, hz, ncpu, size, target, rep, wrk_path, *ticks):
    rps, p50, p99, reqs, errors = parse_wrk(wrk_path)
    proxy, stub, wrk_t, busy, total = (int(t) for t in ticks)
    with open(runs_path, "a") as f:
        print(size, target, rep, f"{rps:.0f} {p50:.0f} {p99:.0f}", reqs, errors,
              proxy, stub, wrk_t, busy, total, hz, ncpu, file=f)
    cpu = f"{proxy / int(hz) * 1e6 / reqs:5.1f} µs/req" if target != "direct" else " " * 12
    others = (busy - proxy - stub - wrk_t) / (total / int(ncpu))
    print(f"  {target:6} rep {rep}: {rps:7.0f} req/s  p50 {fmt_us(p50):>8}  p99 {fmt_us(p99):>8}"
          f"  proxy {cpu}  others {max(others, 0):.2f} cores  errors {errors}")


def fmt_us(v):
    return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.0f} µs"


def table(runs_path, rss_path):
    # runs: size target rep rps p50_us p99_us requests errors
    #       proxy_ticks stub_ticks wrk_ticks busy_ticks total_ticks clk_tck ncpu
    runs = {}
    for line in open(runs_path):
        f = line.split()
        size, target = f[0], f[1]
        rps, p50, p99, reqs, errs, pt, st, wt, busy, total, hz, ncpu = (float(x) for x in f[3:])
        proxy_cpu = pt / hz * 1e6 / reqs if target != "direct" else None
        stub_cpu = st / hz * 1e6 / reqs
        others = max(busy - pt - st - wt, 0) / (total / ncpu)
        runs.setdefault(size, {}).setdefault(target, []).append(
            (rps, p50, p99, proxy_cpu, stub_cpu, errs, others))
    rss = {}
    for line in open(rss_path):
        size, who, *kb = line.split()
        rss.setdefault(size, {})[who] = tuple(int(x) for x in kb)

    med = lambda rows, i: statistics.median(r[i] for r in rows)
    for size, by_target in runs.items():
        n = len(next(iter(by_target.values())))
        print(f"\nbody {size} B — median of {n} run(s)")
        print(f"{'':8} {'req/s':>8} {'p50':>9} {'p99':>9} {'proxy CPU/req':>14} "
              f"{'stub CPU/req':>13} {'others':>7} {'errors':>7}")
        m = {}
        for target in ("direct", "nginx", "sluice", "replay"):
            rows = by_target.get(target)
            if not rows:
                continue
            m[target] = {k: (med(rows, i) if rows[0][i] is not None else None)
                         for k, i in (("rps", 0), ("p50", 1), ("p99", 2), ("cpu", 3),
                                      ("stub", 4), ("others", 6))}
            cpu = f"{m[target]['cpu']:.1f} µs" if m[target]["cpu"] is not None else "-"
            print(f"{target:8} {m[target]['rps']:8.0f} {fmt_us(m[target]['p50']):>9} "
                  f"{fmt_us(m[target]['p99']):>9} {cpu:>14} "
                  f"{m[target]['stub']:10.1f} µs {m[target]['others']:7.2f} "
                  f"{sum(r[5] for r in rows):7.0f}")
        verdict = lambda r, t: "ok" if r <= t else f"MISS by {(r / t - 1) * 100:.0f} %"
        if "nginx" in m and "sluice" in m:
            rc = m["sluice"]["cpu"] / m["nginx"]["cpu"]
            rp = m["sluice"]["p99"] / m["nginx"]["p99"]
            print(f"sluice/nginx: CPU/req {rc:.2f} (target <= 1.0: {verdict(rc, 1.0)}), "
                  f"p99 {rp:.2f} (target <= 1.0: {verdict(rp, 1.0)})")
        if "nginx" in m and "replay" in m:
            rr = m["replay"]["cpu"] / m["nginx"]["cpu"]
            print(f"replay/nginx pass-through: CPU/req {rr:.2f} (target <= 0.6: {verdict(rr, 0.6)})")
        for who, (idle, idle_anon, peak, after, after_anon) in sorted(rss.get(size, {}).items(),
                                                                     reverse=True):
            note = ""
            if who == "sluice":
                note = ("  (target idle < 16 MiB: ok)" if idle < 16 * 1024
                        else f"  (target idle < 16 MiB: MISS by {idle / 1024 - 16:.1f} MiB)")
            print(f"{who} RSS: idle {idle / 1024:.1f} MiB (anon {idle_anon / 1024:.1f}), "
                  f"peak {peak / 1024:.1f} MiB, after load {after / 1024:.1f} MiB "
                  f"(anon {after_anon / 1024:.1f}){note}")
    print("\nCPU/req = utime + stime of the proxy (nginx: its worker) or the stub over the run, per "
          "request wrk completed.\nothers = CPU (in cores) used meanwhile by everything but wrk, "
          "the stub and the proxy: above ~0.1 the\nmachine was shared and the figures are noisy. "
          "RSS = VmRSS (VmHWM for peak); anon = RssAnon, the part not backed by files (libraries).")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "ports":
        ports(int(sys.argv[2]))
    elif cmd == "record" and len(sys.argv) == 14:
        record(*sys.argv[2:])
    elif cmd == "table":
        table(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
