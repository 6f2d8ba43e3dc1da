#!/usr/bin/env python3
"""Helper for rate.sh (standard library only; not meant to be run alone).

  ratestat.py ports N                        N free loopback TCP ports, one a line
  ratestat.py cells SCALE RATES CONCS        the rate-accuracy plan: "rate conc seconds" lines
  ratestat.py wrk FILE                       parse `wrk --latency` output:
                                             "rps p50_us p99_us requests errors non2xx timeouts"
  ratestat.py arrivals FILE RATE BURST       analyse a /_stub/arrivals JSON array (see below)
  ratestat.py table-rate FILE CEILINGS       markdown table of the rate-accuracy cells
  ratestat.py table-cost FILE                markdown table of the hot-path cost runs

`arrivals` prints one line of space-separated fields:
  n span_s achieved_per_s error_pct over_raw over_1ms over_time_ms gap_p50_ms gap_p99_ms
  win_from_ms win_to_ms
where
  achieved  = (n - burst) / (last - first)
  over_raw  = max over all windows [a_i, a_j] of (j - i + 1) - (burst + rate * (a_j - a_i)),
              in requests; <= 0 means the SPEC 5 bound was never exceeded at the stub
  over_1ms  = the same with 1 ms of slack on every window: bound burst + rate * (a_j - a_i + 1 ms)
              (the stub stamps arrivals after loopback and scheduling; this absorbs that jitter)
  over_time = over_raw / rate in ms: how much every offending window would have to be
              lengthened to comply (0 when over_raw <= 0)
  gaps      = inter-arrival gaps after the initial burst (from arrival index `burst` on)
  win_*     = where the worst (raw) window lies, in ms after the first arrival
"""
import json
import math
import re
import socket
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


def cells(scale, rates, concs):
    """Each cell long enough for ~50 paced requests, at least 3 s, at most 10 s (times scale)."""
    for rate in rates.split():
        r = float(rate)
        base = min(10.0, max(3.0, 50.0 / r))
        secs = max(1, int(round(base * scale)))
        for c in concs.split():
            print(rate, c, secs)


def to_us(text):
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", text)
    return float(m.group(1)) * UNIT_US[m.group(2)]


def wrk(path):
    out = open(path).read()
    p50 = re.search(r"^\s*50(?:\.0+)?%\s+(\S+)", out, re.M)
    p99 = re.search(r"^\s*99(?:\.0+)?%\s+(\S+)", out, re.M)
    reqs = re.search(r"^\s*(\d+) requests in", out, re.M)
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", out, re.M)
    if not (reqs and rps):
        sys.exit("cannot parse wrk output in " + path)
    # Socket errors only: timeouts are requests still waiting for their permit at the end.
    errors = sum(int(x) for x in re.findall(r"(?:connect|read|write) (\d+)", out))
    timeouts = re.search(r"timeout (\d+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    # wrk prints no latency distribution when no request completed.
    print(f"{float(rps.group(1)):.1f} {to_us(p50.group(1)) if p50 else 0:.0f} "
          f"{to_us(p99.group(1)) if p99 else 0:.0f} {reqs.group(1)} {errors} "
          f"{int(non2xx.group(1)) if non2xx else 0} {int(timeouts.group(1)) if timeouts else 0}")


def quantile(sorted_xs, q):
    if not sorted_xs:
        return float("nan")
    k = min(len(sorted_xs) - 1, max(0, math.ceil(q * len(sorted_xs)) - 1))
    return sorted_xs[k]


def max_overshoot(a, rate, burst):
    """max_{i<=j} (j - i + 1) - burst - rate * (a_j - a_i), exactly, in O(n); with (i, j).

    For a fixed j the term is (j + 1 - rate * a_j - burst) + (rate * a_i - i), so a running
    maximum of rate * a_i - i over i <= j gives the best window ending at j."""
    best, bi, bj = -math.inf, 0, 0
    run, ri = -math.inf, 0
    for j, t in enumerate(a):
        if rate * t - j > run:
            run, ri = rate * t - j, j
        v = (j + 1 - rate * t - burst) + run
        if v > best:
            best, bi, bj = v, ri, j
    return best, bi, bj


def arrivals(path, rate, burst):
    rate = float(rate)
    burst = int(burst)
    a = [x / 1e9 for x in json.load(open(path))]
    n = len(a)
    if n < 2:
        print(n, "0 nan nan nan nan nan nan nan nan nan")
        return
    a.sort()  # already in arrival order; sorting only guards against equal stamps
    span = a[-1] - a[0]
    achieved = (n - burst) / span if span > 0 and n > burst else float("nan")
    err = (achieved - rate) / rate * 100
    raw, wi, wj = max_overshoot(a, rate, burst)
    slack = raw - rate * 1e-3  # 1 ms more on every window's length
    over_time = max(0.0, raw / rate * 1e3)
    gaps = sorted(a[i] - a[i - 1] for i in range(max(1, burst), n))
    print(f"{n} {span:.4f} {achieved:.3f} {err:+.3f} {raw:.3f} {slack:.3f} {over_time:.3f} "
          f"{quantile(gaps, 0.5) * 1e3:.3f} {quantile(gaps, 0.99) * 1e3:.3f} "
          f"{a[wi] * 1e3:.1f} {a[wj] * 1e3:.1f}")


def fmt_ms(v):
    v = float(v)
    if math.isnan(v):
        return "–"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def table_rate(path, ceilings_path):
    ceil = {}
    for line in open(ceilings_path):
        f = line.split()
        if len(f) >= 2:
            ceil[f[0]] = float(f[1])
    print("| rate/s | clients | run s | arrivals | achieved/s | error | overshoot raw (req) "
          "| overshoot, 1 ms slack (req) | raw as time (ms) | worst window (ms) "
          "| gap p50 (ms) | gap p99 (ms) "
          "| client p50 latency (ms) | 429s / errors | note |")
    print("|" + "---:|" * 14 + "---|")
    for line in open(path):
        f = line.split()
        # rate conc secs | n span achieved err raw slack otime g50 g99 | rps p50us p99us reqs errs non2xx
        rate, conc, secs = f[0], f[1], f[2]
        n, _span, ach, err, raw, slack, otime, g50, g99, w0, w1 = f[3:14]
        _rps, lat50, _lat99, _reqs, errs, non2xx = f[14:20]  # (timeouts: still waiting)
        note = ""
        c = ceil.get(conc)
        if c is not None and c < 1.2 * float(rate):
            note = f"client-bound ({c:.0f}/s unpaced with {conc} client(s))"
        elif float(ach) < 0.95 * float(rate):
            note = "below rate"
        print(f"| {rate} | {conc} | {secs} | {n} | {float(ach):.2f} | {float(err):+.2f} % "
              f"| {float(raw):.2f} | {float(slack):.2f} | {float(otime):.3f} "
              f"| {float(w0):.0f}–{float(w1):.0f} "
              f"| {fmt_ms(g50)} | {fmt_ms(g99)} | {fmt_ms(float(lat50) / 1e3)} "
              f"| {non2xx} / {errs} | {note} |")


def table_cost(path):
    runs = {}
    order = []
    for line in open(path):
        f = line.split()
        target, rep, rps, p50, p99, _reqs, errs, non2xx, tmo = f[:9]
        if target not in runs:
            runs[target] = []
            order.append(target)
        runs[target].append((float(rps), float(p50), float(p99), int(errs) + int(non2xx) + int(tmo)))

    def med(xs):
        xs = sorted(xs)
        m = len(xs) // 2
        return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2

    summary = {t: (med([r[0] for r in v]), med([r[1] for r in v]), med([r[2] for r in v]),
                   sum(r[3] for r in v), [r[0] for r in v]) for t, v in runs.items()}
    pairs = {"sluice-policy": "sluice-nopolicy", "nginx-limit_req": "nginx-plain"}
    print("| target | runs req/s | median req/s | p50 latency | p99 latency | errors "
          "| cost of the bucket |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for t in order:
        rps, p50, p99, errs, all_rps = summary[t]
        cost = ""
        if t in pairs and pairs[t] in summary:
            base = summary[pairs[t]][0]
            cost = f"{(base - rps) / base * 100:+.1f} % throughput vs {pairs[t]}"
        print(f"| {t} | {' / '.join(f'{x:.0f}' for x in all_rps)} | {rps:.0f} "
              f"| {p50 / 1e3:.2f} ms | {p99 / 1e3:.2f} ms | {errs} | {cost} |")


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    cmd, args = argv[1], argv[2:]
    if cmd == "ports":
        ports(int(args[0]))
    elif cmd == "cells":
        cells(float(args[0]), args[1], args[2])
    elif cmd == "wrk":
        wrk(args[0])
    elif cmd == "arrivals":
        arrivals(*args[:3])
    elif cmd == "table-rate":
        table_rate(args[0], args[1])
    elif cmd == "table-cost":
        table_cost(args[0])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
