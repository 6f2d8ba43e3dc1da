#!/usr/bin/env python3
"""Helper for rate.sh (standard library only; not meant to be run alone).

  ratestat.py ports N                   N free loopback TCP ports, one a line
  ratestat.py bus-ports N               N free loopback TCP ports p whose p + 10000 (a Redis
                                        Cluster node's bus) is free too, none another's bus
  ratestat.py cells SCALE RATES CONCS   the rate-accuracy plan, "rate clients seconds" lines
  ratestat.py cell DIR RATE CLIENTS SECONDS BURST
                                        analyse DIR/arrivals.json (the stub's /_stub/arrivals),
                                        DIR/stats.json and DIR/wrk.txt: one row on stdout,
                                        a progress line on stderr
  ratestat.py wrk FILE                  "rps p50_us p99_us requests errors non2xx timeouts"
  ratestat.py sniff PORT OUT PREFIX     (root) until SIGTERM, stamp every TCP segment sent on lo
                                        to PORT whose payload starts with PREFIX, with the
                                        kernel's timestamp taken in the sender's send(); write
                                        the JSON array of ns relative to the first to OUT
  ratestat.py report ROWS CEILINGS COST_RUNS BURST COST_SECONDS COST_CONNS
                                        the two markdown tables

Figures of one cell (arrival times a_0 <= ... <= a_{n-1}, in s from the first):
  achieved  = (n - burst) / (a_{n-1} - a_0)
  over_raw  = max over all windows [a_i, a_j] of (j - i + 1) - (burst + rate * (a_j - a_i)), in
              requests; <= 0 means the docs/contract.md §5 bound held at the stub. Exact, O(n).
  over_1ms  = the same with 1 ms of slack on every window, bound burst + rate * (a_j - a_i + 1 ms):
              the stub stamps an arrival when its loop has read the headers, after loopback
              and scheduling, so a few hundred µs of jitter look like a (small) overshoot.
  over_time = over_raw / rate, in ms: how much the worst window would have to be longer to
              comply; comparable across rates.
  window    = where the worst window lies (ms after the first arrival).
  gaps      = inter-arrival gaps after the initial burst (from arrival index `burst` on).
With rate.sh SNIFF=1, the same overshoot is also computed from the send times that `sniff`
captured (DIR/sent.json): those do not depend on when the stub's loop got to run.
"""
import ctypes
import json
import math
import random
import re
import signal
import socket
import statistics
import struct
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


def bus_ports(n):
    """Each p in 20000..39999 (so p + 10000 < 65536), both bound here before it is chosen; all
    are held until the last is found, so no two collide, nor one with another's bus."""
    held, chosen = [], []
    for _ in range(1000 * n):
        if len(chosen) == n:
            break
        p = random.randrange(20000, 40000)
        if any(p in (q, q + 10000, q - 10000) for q in chosen):
            continue
        socks = []
        try:
            for q in (p, p + 10000):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", q))
        except OSError:
            for s in socks:
                s.close()
            continue
        held += socks
        chosen.append(p)
    for s in held:
        s.close()
    if len(chosen) < n:
        sys.exit(f"bus-ports: only {len(chosen)} of {n} found")
    print(*chosen, sep="\n")


def cells(scale, rates, concs):
    """Each cell ~50 paced requests long, at least 3 s, at most 10 s, times scale (>= 1 s)."""
    for rate in rates.split():
        base = min(10.0, max(3.0, 50.0 / float(rate)))
        secs = max(1, int(base * scale + 0.5))
        for c in concs.split():
            print(rate, c, secs)


def to_us(text):
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", text)
    return float(m.group(1)) * UNIT_US[m.group(2)]


def parse_wrk(path):
    """(rps, p50_us, p99_us, requests, socket_errors, non2xx, timeouts)"""
    out = open(path).read()
    p50 = re.search(r"^\s*50(?:\.0+)?%\s+(\S+)", out, re.M)
    p99 = re.search(r"^\s*99(?:\.0+)?%\s+(\S+)", out, re.M)
    reqs = re.search(r"^\s*(\d+) requests in", out, re.M)
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", out, re.M)
    if not (reqs and rps):
        sys.exit("cannot parse wrk output in " + path)
    errors = sum(int(x) for x in re.findall(r"(?:connect|read|write) (\d+)", out))
    timeouts = re.search(r"timeout (\d+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    # wrk prints no latency distribution when no request completed.
    return (float(rps.group(1)), to_us(p50.group(1)) if p50 else float("nan"),
            to_us(p99.group(1)) if p99 else float("nan"), int(reqs.group(1)), errors,
            int(non2xx.group(1)) if non2xx else 0, int(timeouts.group(1)) if timeouts else 0)


def sniff(port, out, prefix):
    """Send times of requests to PORT, from an AF_PACKET socket on lo (needs CAP_NET_RAW).

    On loopback the kernel hands the outgoing packet to packet sockets from within the
    sender's send(); SO_TIMESTAMPNS gives that instant. A classic BPF filter keeps only
    IPv4 TCP segments to PORT, so the socket sees a few packets per request."""
    port, prefix = int(port), prefix.encode()
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))  # ETH_P_ALL
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    prog = [(0x28, 0, 0, 12), (0x15, 0, 8, 0x800),   # ldh [12]; jeq IPv4 else drop
            (0x30, 0, 0, 23), (0x15, 0, 6, 6),        # ldb [23]; jeq TCP else drop
            (0x28, 0, 0, 20), (0x45, 4, 0, 0x1fff),   # ldh [20]; fragment: drop
            (0xb1, 0, 0, 14), (0x48, 0, 0, 16),       # ldxb 4*([14]&0xf); ldh [x+16]
            (0x15, 0, 1, port),                       # jeq dst port else drop
            (0x06, 0, 0, 262144), (0x06, 0, 0, 0)]    # ret all; ret 0
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in prog))
    s.setsockopt(socket.SOL_SOCKET, 26, struct.pack("HL", len(prog), ctypes.addressof(code)))
    s.setsockopt(socket.SOL_SOCKET, 35, 1)  # SO_ATTACH_FILTER above; SO_TIMESTAMPNS
    s.bind(("lo", 0))
    stamps = []

    def on_term(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)
    try:
        while True:
            data, anc, _flags, addr = s.recvmsg(4096, 64)
            if addr[2] != socket.PACKET_OUTGOING:  # lo shows each packet out and in
                continue
            tcp = 14 + (data[14] & 0xF) * 4
            payload = data[tcp + (data[tcp + 12] >> 4) * 4:]
            k = payload.count(prefix) if payload.startswith(prefix) else 0
            for _level, kind, val in anc:
                if k and kind == 35:  # SCM_TIMESTAMPNS
                    sec, nsec = struct.unpack("qq", val[:16])
                    stamps.extend([sec * 1000000000 + nsec] * k)
    except KeyboardInterrupt:
        pass
    t0 = stamps[0] if stamps else 0
    with open(out, "w") as f:
        json.dump([t - t0 for t in stamps], f)


def quantile(sorted_xs, q):
    if not sorted_xs:
        return float("nan")
    k = min(len(sorted_xs) - 1, max(0, math.ceil(q * len(sorted_xs)) - 1))
    return sorted_xs[k]


def max_overshoot(a, rate, burst):
    """max_{i<=j} (j - i + 1) - burst - rate * (a_j - a_i), exactly, in O(n); with its (i, j).

    For a fixed j the term is (j + 1 - rate * a_j - burst) + (rate * a_i - i): a running
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


def analyse(a, rate, burst):
    """Figures of one cell from arrival times in s; a dict."""
    n = len(a)
    nan = float("nan")
    r = dict(n=n, span=nan, achieved=nan, err=nan, raw=nan, slack=nan, otime=nan,
             g50=nan, g99=nan, w0=nan, w1=nan)
    if n < 2:
        return r
    a = sorted(a)  # already in arrival order; this only guards against equal stamps
    span = a[-1] - a[0]
    r["span"] = span
    if span > 0 and n > burst:
        r["achieved"] = (n - burst) / span
        r["err"] = (r["achieved"] - rate) / rate * 100
    raw, wi, wj = max_overshoot(a, rate, burst)
    r.update(raw=raw, slack=raw - rate * 1e-3, otime=max(0.0, raw / rate * 1e3),
             w0=a[wi] * 1e3, w1=a[wj] * 1e3)
    gaps = sorted(a[i] - a[i - 1] for i in range(max(1, burst), n))
    r.update(g50=quantile(gaps, 0.5) * 1e3, g99=quantile(gaps, 0.99) * 1e3)
    return r


FIELDS = ["rate", "clients", "secs", "n", "span", "achieved", "err", "raw", "slack", "otime",
          "w0", "w1", "g50", "g99", "rps", "lat50_us", "lat99_us", "errors", "non2xx",
          "recorded", "accepted", "sent_n", "sent_raw", "sent_otime", "sent_w0", "sent_w1"]


def cell(d, rate, clients, secs, burst):
    rate_f, burst_i = float(rate), int(burst)
    a = [x / 1e9 for x in json.load(open(f"{d}/arrivals.json"))]
    stats = json.load(open(f"{d}/stats.json"))
    rps, p50, p99, _reqs, errors, non2xx, _timeouts = parse_wrk(f"{d}/wrk.txt")
    r = analyse(a, rate_f, burst_i)
    r.update(rate=rate, clients=clients, secs=secs, rps=rps, lat50_us=p50, lat99_us=p99,
             errors=errors, non2xx=non2xx, recorded=stats["arrivals"],
             accepted=stats["accepted"])
    try:
        sent = [x / 1e9 for x in json.load(open(f"{d}/sent.json"))]
    except FileNotFoundError:
        sent = None
    nan = float("nan")
    r.update(sent_n=-1, sent_raw=nan, sent_otime=nan, sent_w0=nan, sent_w1=nan)
    if sent is not None:
        q = analyse(sent, rate_f, burst_i)
        r.update(sent_n=q["n"], sent_raw=q["raw"], sent_otime=q["otime"], sent_w0=q["w0"],
                 sent_w1=q["w1"])
        if q["n"] != r["n"]:
            print(f"warning: captured {q['n']} sends, the stub {r['n']} arrivals",
                  file=sys.stderr)
    if stats["arrivals"] != stats["accepted"]:
        print(f"warning: the stub recorded {stats['arrivals']} of {stats['accepted']} arrivals",
              file=sys.stderr)
    print(" ".join(str(r[f]) for f in FIELDS))
    print(f"  {rate:>5}/s  c={clients:<3} {secs:>2}s: {r['n']:6d} arrivals, achieved "
          f"{r['achieved']:10.3f}/s ({r['err']:+.2f} %), overshoot raw {r['raw']:.2f}, "
          f"1 ms slack {r['slack']:.2f}, at {r['w0']:.0f}-{r['w1']:.0f} ms"
          + (f"; at send {r['sent_raw']:.2f}" if sent is not None else ""), file=sys.stderr)


def fmt_ms(v):
    if math.isnan(v):
        return "–"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def table_rate(rows_path, ceilings_path, burst):
    rows = [dict(zip(FIELDS, line.split())) for line in open(rows_path) if line.strip()]
    if not rows:
        return
    ceil = {}
    for line in open(ceilings_path):
        f = line.split()
        if len(f) >= 2:
            ceil[f[0]] = float(f[1])
    print(f"Rate accuracy: closed-loop wrk through one policy (burst {burst}, max_wait 1h), "
          "sluice threads: 2; figures from the stub's arrival times. Overshoot = max over all "
          "windows of arrivals - (burst + rate × window length), in requests: <= 0 means the "
          "docs/contract.md §5 bound held. Raw = as stamped; 1 ms slack = every window 1 ms longer (stub "
          "stamping jitter); as time = raw / rate."
          + (" At send: the same from the kernel's timestamps of sluice's send() to the "
             "stub (SNIFF=1), independent of the stub's scheduling." if any(
                 int(r["sent_n"]) >= 0 for r in rows) else ""))
    print()
    sniffed = any(int(r["sent_n"]) >= 0 for r in rows)
    print("| rate/s | clients | s | arrivals | achieved/s | error | overshoot raw "
          "| overshoot 1 ms slack | raw as time (ms) | worst window (ms) | gap p50 (ms) "
          "| gap p99 (ms) | client p50 (ms) | 429 / errors | "
          + ("overshoot at send (as time, ms) | worst send window (ms) | " if sniffed else "")
          + "note |")
    print("|" + "---:|" * (16 if sniffed else 14) + "---|")
    for r in rows:
        g = {k: float(r[k]) for k in FIELDS if k not in ("rate", "clients", "secs")}
        rate = float(r["rate"])
        note = ""
        if g["achieved"] < 0.95 * rate:
            c = ceil.get(r["clients"])
            note = "closed loop did not saturate the bucket"
            if c is not None:
                note += f" (no-policy ceiling with {r['clients']} client(s): {c:.0f}/s)"
        print(f"| {r['rate']} | {r['clients']} | {r['secs']} | {int(g['n'])} "
              f"| {g['achieved']:.2f} | {g['err']:+.2f} % | {g['raw']:.2f} | {g['slack']:.2f} "
              f"| {g['otime']:.2f} | {g['w0']:.0f}–{g['w1']:.0f} | {fmt_ms(g['g50'])} "
              f"| {fmt_ms(g['g99'])} | {fmt_ms(g['lat50_us'] / 1e3)} "
              f"| {int(g['non2xx'])} / {int(g['errors'])} | "
              + (f"{g['sent_raw']:.2f} ({g['sent_otime']:.2f}) "
                 f"| {g['sent_w0']:.0f}–{g['sent_w1']:.0f} | " if sniffed else "")
              + f"{note} |")


def table_cost(runs_path, secs, conns):
    runs, order = {}, []
    for line in open(runs_path):
        f = line.split()
        if len(f) < 4:
            continue
        target, rep, path, cpu_ns = f[0], int(f[1]), f[2], int(f[3])
        if target not in runs:
            runs[target] = {}
            order.append(target)
        w = parse_wrk(path)
        runs[target][rep] = w + (cpu_ns / 1e3 / w[3] if w[3] else float("nan"),)
    if not runs:
        return
    pairs = {"sluice-policy": "sluice-nopolicy", "nginx-limit_req": "nginx-plain"}
    print(f"Cost of the bucket: wrk -t1 -c{conns} -d{secs}s, stub --body-size 2, sluice "
          "threads: 1, nginx 1 worker (master_process off); the four targets interleaved in "
          "every rep. CPU/req = the proxy process's on-CPU time (all threads, "
          "/proc/PID/task/*/schedstat) / requests answered: less sensitive than req/s to "
          "other load on the machine. Costs: the median over reps of the per-rep ratio "
          "against the same server without the limit (negative = faster with the limit, "
          "i.e. noise).")
    print()
    print("| target | req/s per rep | median req/s | p50 latency | p99 latency "
          "| CPU/req per rep (µs) | median CPU/req (µs) | errors | cost in req/s | cost in CPU/req |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t in order:
        reps = runs[t]
        ks = sorted(reps)
        rps = [reps[k][0] for k in ks]
        cpu = [reps[k][7] for k in ks]
        p50 = statistics.median(reps[k][1] for k in ks)
        p99 = statistics.median(reps[k][2] for k in ks)
        errs = sum(reps[k][4] + reps[k][5] + reps[k][6] for k in ks)
        base = runs.get(pairs.get(t, ""), {})
        cost_rps = cost_cpu = ""
        both = [k for k in ks if k in base]
        if both:
            r = [1 - reps[k][0] / base[k][0] for k in both]
            c = [reps[k][7] / base[k][7] - 1 for k in both]
            cost_rps = (f"{statistics.median(r) * 100:+.1f} % "
                        f"({', '.join(f'{x * 100:+.0f}' for x in r)})")
            cost_cpu = (f"{statistics.median(c) * 100:+.1f} % "
                        f"({', '.join(f'{x * 100:+.0f}' for x in c)})")
        print(f"| {t} | {' / '.join(f'{x:.0f}' for x in rps)} | {statistics.median(rps):.0f} "
              f"| {p50 / 1e3:.2f} ms | {p99 / 1e3:.2f} ms "
              f"| {' / '.join(f'{x:.1f}' for x in cpu)} | {statistics.median(cpu):.1f} "
              f"| {errs} | {cost_rps} | {cost_cpu} |")


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    cmd, args = argv[1], argv[2:]
    if cmd == "ports":
        ports(int(args[0]))
    elif cmd == "bus-ports":
        bus_ports(int(args[0]))
    elif cmd == "cells":
        cells(float(args[0]), args[1], args[2])
    elif cmd == "cell":
        cell(*args[:5])
    elif cmd == "sniff":
        sniff(*args[:3])
    elif cmd == "wrk":
        print(*parse_wrk(args[0]))
    elif cmd == "report":
        rows, ceilings, cost_runs, burst, secs, conns = args[:6]
        table_rate(rows, ceilings, burst)
        if open(rows).read().strip() and open(cost_runs).read().strip():
            print()
        table_cost(cost_runs, secs, conns)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
