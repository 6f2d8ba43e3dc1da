#!/usr/bin/env python3
"""Helper for store.sh and metrics.sh (standard library only; not meant to be run alone).

  smstat.py ports N                  N free loopback TCP ports, one a line
  smstat.py record TSV HZ NCPU LABEL REP WRKFILE PROC WRK BUSY TOTAL STUB
                                     parse `wrk --latency` output, append one row to TSV (tick
                                     counts are CPU deltas over the run), print a progress line
  smstat.py hist BEFORE AFTER ROUTE  from two /metrics scrapes: "within_1ms count" of
                                     sluice_request_duration_seconds{route=ROUTE} in between
  smstat.py perfshare FILE           share of samples in metric recording, from `perf report`
  smstat.py store-report DIR         store.sh's tables, from the files it wrote in DIR
  smstat.py metrics-report DIR       metrics.sh's tables, from the files it wrote in DIR
  smstat.py gc-report DIR            groupcommit.sh's table, from the files it wrote in DIR
"""
import os
import re
import statistics
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchstat import fmt_us, parse_wrk, ports  # noqa: E402  (passthrough.sh's helper)

MIB = 1024 * 1024


def record(tsv, hz, ncpu, label, rep, wrk_path, proc, wrk_t, busy, total, stub):
    rps, p50, p99, reqs, errors = parse_wrk(wrk_path)
    proc, wrk_t, busy, total, stub, hz, ncpu = (int(x) for x in (proc, wrk_t, busy, total, stub,
                                                                   hz, ncpu))
    with open(tsv, "a") as f:
        print(label, rep, f"{rps:.0f} {p50:.0f} {p99:.0f}", reqs, errors, proc, wrk_t, busy,
              total, stub, hz, ncpu, file=f)
    others = max(busy - proc - wrk_t - stub, 0) / (total / ncpu) if total else 0
    print(f"  {label:16} rep {rep}: {rps:7.0f} req/s  p50 {fmt_us(p50):>8}  p99 {fmt_us(p99):>8}"
          f"  sluice {proc / hz * 1e6 / max(reqs, 1):5.1f} µs/req  others {others:.2f} cores"
          f"  errors {errors}")


def read_runs(tsv):
    """label -> list of dicts, one per repetition."""
    runs = {}
    for line in open(tsv):
        f = line.split()
        label = f[0]
        rps, p50, p99, reqs, errs, proc, wrk_t, busy, total, stub, hz, ncpu = (
            float(x) for x in f[2:])
        runs.setdefault(label, []).append({
            "rps": rps, "p50": p50, "p99": p99, "reqs": reqs, "errors": errs,
            "cpu": proc / hz * 1e6 / reqs,
            "stub_cpu": stub / hz * 1e6 / reqs,
            "others": max(busy - proc - wrk_t - stub, 0) / (total / ncpu) if total else 0,
        })
    return runs


def med(rows, key):
    return statistics.median(r[key] for r in rows)


def spread(rows, key):
    """(min, max) over the repetitions."""
    return min(r[key] for r in rows), max(r[key] for r in rows)


def metric_values(path, name, labels):
    """{le or '': value} of a histogram's series with the given label text."""
    out = {}
    for line in open(path):
        if not line.startswith(name) or labels not in line:
            continue
        m = re.match(r'(\S+?)(?:\{(.*)\})? (\S+)$', line.strip())
        if not m:
            continue
        le = re.search(r'le="([^"]+)"', m.group(2) or "")
        # summed over the series that match (request durations carry an outcome too)
        key = (m.group(1), le.group(1) if le else "")
        out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def hist(before, after, route):
    name = "sluice_request_duration_seconds"
    lab = f'route="{route}"'
    b, a = metric_values(before, name, lab), metric_values(after, name, lab)
    key_le = (name + "_bucket", "0.001")
    key_n = (name + "_count", "")
    within = a.get(key_le, 0) - b.get(key_le, 0)
    count = a.get(key_n, 0) - b.get(key_n, 0)
    print(f"{within:.0f} {count:.0f}")


def kv(line):
    return dict(p.split("=", 1) for p in line.split()[1:])


def verdict(ok, miss):
    return "**met**" if ok else f"**missed** ({miss})"


# ---- store.sh ------------------------------------------------------------------

def store_report(d):
    runs = read_runs(os.path.join(d, "runs.tsv")) if os.path.exists(os.path.join(d, "runs.tsv")) else {}
    rss = {}
    if os.path.exists(os.path.join(d, "rss.tsv")):
        for line in open(os.path.join(d, "rss.tsv")):
            keys, idle, idle_hwm, hwm, after, du, within, count, stub_hits = line.split()
            rss[keys] = (int(idle), int(idle_hwm), int(hwm), int(after), int(du), int(within),
                         int(count), int(stub_hits))
    targets = []

    if rss:
        print("\n#### Replays from the store vs pass-through (sluice `threads: 1`)\n")
        print("| keys | route | conns | req/s (min–max) | p50 | p99 (min–max) | sluice CPU/req | "
              "stub CPU/req | others | errors |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for keys in rss:
            for conns in sorted({lab.split("-")[2] for lab in runs if lab.split("-")[1] == keys},
                                key=lambda c: -int(c[1:])):
                for kind in ("replay", "pass", "direct"):
                    rows = runs.get(f"{kind}-{keys}-{conns}")
                    if not rows:
                        continue
                    lo, hi = spread(rows, "rps")
                    sl, st = f"{med(rows, 'cpu'):.1f} µs", f"{med(rows, 'stub_cpu'):.1f} µs"
                    if kind == "direct":   # wrk straight to the stub: its CPU is the stub's
                        sl, st = "-", sl
                    name = "direct (stub alone)" if kind == "direct" else kind
                    print(f"| {int(keys):,} | {name} | {conns[1:]} | {med(rows, 'rps'):,.0f} "
                          f"({lo:,.0f}–{hi:,.0f}) | {fmt_us(med(rows, 'p50'))} | "
                          f"{fmt_us(med(rows, 'p99'))} ({fmt_us(spread(rows, 'p99')[0])}–"
                          f"{fmt_us(spread(rows, 'p99')[1])}) | {sl} | {st} | "
                          f"{med(rows, 'others'):.2f} | "
                          f"{sum(r['errors'] for r in rows):.0f} |")
        print("\n| keys | replay/pass req/s (c64) | replay/pass sluice CPU/req | "
              "replays ≤ 1 ms inside sluice (c1 runs) | sluice RSS idle (peak so far) / peak / "
              "after | "
              "store on disk | replays that reached the stub |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for keys, (idle, idle_hwm, hwm, after, du, within, count, stub_hits) in rss.items():
            rep, pas = runs.get(f"replay-{keys}-c64"), runs.get(f"pass-{keys}-c64")
            ratio = med(rep, "rps") / med(pas, "rps") if rep and pas else float("nan")
            cpu_ratio = med(rep, "cpu") / med(pas, "cpu") if rep and pas else float("nan")
            share = f"{within / count * 100:.2f} % of {count:,}" if count else "-"
            print(f"| {int(keys):,} | {ratio:.2f} | {cpu_ratio:.2f} | {share} | "
                  f"{idle / 1024:.1f} ({idle_hwm / 1024:.1f}) / {hwm / 1024:.1f} / "
                  f"{after / 1024:.1f} MiB | "
                  f"{du / MIB:.1f} MiB | {stub_hits} |")
        top = max(rss, key=int)
        idle, idle_hwm, hwm, after, du, within, count, stub_hits = rss[top]
        rep, pas = runs.get(f"replay-{top}-c64"), runs.get(f"pass-{top}-c64")
        lat = runs.get(f"replay-{top}-c1")
        for keys in rss:
            r, p = runs.get(f"replay-{keys}-c64"), runs.get(f"pass-{keys}-c64")
            if r and p:
                x = med(r, "rps") / med(p, "rps")
                targets.append(f"replays at least as fast as pass-through, {int(keys):,} keys: "
                               f"{x:.2f}× — " + verdict(x >= 1, f"{(1 - x) * 100:.0f} % slower"))
        if lat:
            p99 = med(lat, "p99")
            lo, hi = spread(lat, "p99")
            floor = runs.get(f"direct-{top}-c1")
            extra = ""
            if floor:
                extra = (f"; the stub alone: {fmt_us(med(floor, 'p99'))}; inside sluice "
                         f"{within / count * 100:.2f} % of replays took ≤ 1 ms" if count else "")
            targets.append(f"p99 replay latency under 1 ms at {int(top):,} keys: wrk -c1 median "
                           f"{fmt_us(p99)} over {len(lat)} runs ({fmt_us(lo)}–{fmt_us(hi)}){extra}"
                           f" — " + verdict(p99 < 1000, f"by {fmt_us(p99 - 1000)}"))
        targets.append(f"RSS under 64 MiB at {int(top):,} keys (VmHWM): {hwm / 1024:.1f} MiB — " +
                       verdict(hwm < 64 * 1024, f"by {hwm / 1024 - 64:.1f} MiB"))

    fills = [kv(l) for l in open(os.path.join(d, "fill.txt"))
             if l.startswith("fill ")] if os.path.exists(os.path.join(d, "fill.txt")) else []
    lease = os.path.join(d, "lease.txt")
    if os.path.exists(lease):
        by = {}
        for line in open(lease):
            if line.startswith("lease "):
                r = kv(line)
                by.setdefault((r["sync"], r["threads"]), []).append(r)
        print("\n#### Lease acquire + complete on fresh keys (storebench, no HTTP)\n")
        print("| sync | threads | pairs/s | p50 pair | p99 pair | max pair | runs |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for (sync, threads), rows in sorted(by.items()):
            ps = [float(r["pairs_per_s"]) for r in rows]
            m = lambda k: statistics.median(float(r[k]) for r in rows)
            print(f"| {'true' if sync == '1' else 'false'} | {threads} | "
                  f"{statistics.median(ps):,.0f} ({min(ps):,.0f}–{max(ps):,.0f}) | "
                  f"{fmt_us(m('p50_us'))} | {fmt_us(m('p99_us'))} | {fmt_us(m('max_us'))} | "
                  f"{len(rows)} |")
        for f in fills:
            print(f"| false (fill of {int(f['count']):,} keys) | 1 | "
                  f"{float(f['pairs_per_s']):,.0f} | | | | 1 |")

    exp = os.path.join(d, "expire.txt")
    if os.path.exists(exp):
        sizes, sweep, times, count, idle = {}, None, {}, 0, None
        for path, tag in ((exp, "s"), (os.path.join(d, "expire-compact.txt"), "c")):
            if not os.path.exists(path):
                continue
            for line in open(path):
                r = kv(line) if "=" in line else {}
                if line.startswith("size "):
                    sizes[(tag, r["phase"])] = (int(r["apparent"]), int(r["alloc"]))
                elif line.startswith("sweep "):
                    sweep = r
                elif line.startswith("idle_sweep "):
                    idle = r
                elif line.startswith(("compact ", "close ")):
                    times[(tag, r["phase"])] = float(r["seconds"])
                elif line.startswith("records "):
                    count = int(r["count"])
        print(f"\n#### Store size on disk, {count:,} records, before and after their ttl expiry\n")
        print("| step | size (apparent, `du -sb`) | size (allocated, `du -s`) | time |")
        print("|---|---:|---:|---:|")
        t = lambda tag, ph: f"{times[(tag, ph)]:.2f} s" if (tag, ph) in times else ""
        rows = [
            ("s", "before_expiry", "**before expiry** (closed, memtable flushed)", ""),
            ("s", "swept", f"expired, swept (batches of {sweep['batch'] if sweep else '?'}, back "
                           "to back), store open", f"{float(sweep['seconds']):.2f} s" if sweep else ""),
            ("s", "swept_closed", "then closed (memtable flushed): **after expiry, sweep only**",
             t("s", "swept_closed")),
            ("s", "swept_compacted", "then reopened and `store_rocksdb_compact`, store open",
             t("s", "swept_compacted")),
            ("s", "swept_compacted_closed", "then closed: **after sweep + compaction**", ""),
            ("c", "compacted", "copy of the store, expired, no sweep: `store_rocksdb_compact`, "
                               "store open", t("c", "compacted")),
            ("c", "compacted_closed", "then closed: **after expiry, compaction only**", ""),
        ]
        for tag, phase, text, tm in rows:
            if (tag, phase) in sizes:
                a, b = sizes[(tag, phase)]
                print(f"| {text} | {a / MIB:.2f} MiB | {b / MIB:.2f} MiB | {tm} |")
        if sweep:
            n = int(sweep["batches"])
            print(f"\nSweep: {int(sweep['removed']):,} records removed by {n} calls of "
                  f"`store_sweep(max={sweep['batch']})` ({n - 1} that removed some, 1 that found "
                  f"none), {float(sweep['seconds']):.2f} s back to back; one call took "
                  f"{float(sweep['batch_median_ms']):.1f} ms (median), "
                  f"{float(sweep['batch_p99_ms']):.1f} ms (p99), {float(sweep['batch_max_ms']):.1f}"
                  f" ms (max). sluice makes one such call a second on its main thread, so at that "
                  f"pace it needs about {n - 1} s ({(n - 1) / 60:.1f} min) to sweep "
                  f"{int(sweep['removed']):,} expired records.")
        if idle:
            print(f"\nWhile nothing has expired, a call scans up to 16 × {idle['batch']} live "
                  f"records and deletes none: {float(idle['median_ms']):.1f} ms (median of "
                  f"{idle['calls']} calls, max {float(idle['max_ms']):.1f} ms) on this store, "
                  f"once a second on sluice's main thread.")

    if targets:
        print("\n#### Targets\n")
        for t in targets:
            print(f"- {t}")


# ---- metrics.sh ----------------------------------------------------------------

# Where a request records its metrics: exchange_completed (record_metrics, record_statsd and
# record_upstream are static and inlined into it at -O2) and the metrics_* calls it makes.
METRIC_SYMBOLS = re.compile(r"^(exchange_completed|record_metrics|record_statsd|record_upstream|"
                            r"record_queue_age|metrics_add|metrics_observe|statsd_\w+)$")


def perf_shares(path):
    """{symbol: percent} of the recording symbols, and the total sample count."""
    shares, samples = {}, 0
    for line in open(path):
        m = re.match(r"^# Samples: ([\d.]+)([KM]?)", line)
        if m:
            samples += int(float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6}[m.group(2)])
        m = re.match(r"^\s+([\d.]+)%\s+\[\.\]\s+(\S+)", line)
        if m and METRIC_SYMBOLS.match(m.group(2)):
            shares[m.group(2)] = shares.get(m.group(2), 0) + float(m.group(1))
    return shares, samples


def perfshare(path):
    shares, samples = perf_shares(path)
    parts = ", ".join(f"{k} {v:.2f} %" for k, v in sorted(shares.items(), key=lambda kv: -kv[1]))
    print(f"{sum(shares.values()):.2f} % of {samples} samples ({parts or 'none'})")

def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def metrics_report(d):
    runs = read_runs(os.path.join(d, "runs.tsv"))
    on, off = runs.get("metrics-on"), runs.get("metrics-off")
    drps = dcpu = None
    if on and off:
        print("\n#### Pass-through with metrics on vs off (sluice `threads: 1`, no policy)\n")
        print("| build | req/s | p50 | p99 | sluice CPU/req | stub CPU/req | others | errors | runs |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name, rows in (("metrics on (normal)", on), ("metrics off (`SLUICE_METRICS_OFF`)", off)):
            lo, hi = spread(rows, "rps")
            clo, chi = spread(rows, "cpu")
            print(f"| {name} | {med(rows, 'rps'):,.0f} ({lo:,.0f}–{hi:,.0f}) | "
                  f"{fmt_us(med(rows, 'p50'))} | {fmt_us(med(rows, 'p99'))} | "
                  f"{med(rows, 'cpu'):.2f} µs ({clo:.2f}–{chi:.2f}) | "
                  f"{med(rows, 'stub_cpu'):.2f} µs | {med(rows, 'others'):.2f} | "
                  f"{sum(r['errors'] for r in rows):.0f} | {len(rows)} |")
        drps = (med(off, "rps") / med(on, "rps") - 1) * 100
        dcpu = (med(on, "cpu") / med(off, "cpu") - 1) * 100
        # paired differences: run i of one build against run i of the other (adjacent runs)
        pairs = list(zip(on, off))
        prps = [(b["rps"] / a["rps"] - 1) * 100 for a, b in pairs]
        pcpu = [(a["cpu"] / b["cpu"] - 1) * 100 for a, b in pairs]
        print(f"\nmetrics off vs on: req/s {drps:+.1f} % (paired runs: median "
              f"{statistics.median(prps):+.1f} %, range {min(prps):+.1f} … {max(prps):+.1f} %); "
              f"sluice CPU/req with metrics {dcpu:+.1f} % (paired: median "
              f"{statistics.median(pcpu):+.1f} %, range {min(pcpu):+.1f} … {max(pcpu):+.1f} %).")

    pon, poff = os.path.join(d, "perf-on.txt"), os.path.join(d, "perf-off.txt")
    perf_delta = None
    if os.path.exists(pon) and os.path.exists(poff):
        son, non = perf_shares(pon)
        soff, noff = perf_shares(poff)
        perf_delta = sum(son.values()) - sum(soff.values())
        fmt = lambda sh: ", ".join(f"`{k}` {v:.2f} %" for k, v in
                                   sorted(sh.items(), key=lambda kv: -kv[1])) or "none"
        print(f"\n`perf record -F 1999` on sluice during one more run of each build: share of "
              f"its CPU samples in the symbols where a request records metrics — metrics on: "
              f"{sum(son.values()):.2f} % of {non} samples ({fmt(son)}); metrics off: "
              f"{sum(soff.values()):.2f} % of {noff} samples ({fmt(soff)}). Difference: "
              f"**{perf_delta:.2f} %** of sluice's CPU.")

    scrapes = []
    for name, path in (("idle", "scrape-idle.txt"), ("under load", "scrape-load.txt")):
        p = os.path.join(d, path)
        if not os.path.exists(p):
            continue
        rows = [l.split() for l in open(p) if l.strip()]
        t = [float(r[0]) * 1e3 for r in rows]
        size = int(rows[-1][1])
        scrapes.append((name, t, size))
    info = {}
    if os.path.exists(os.path.join(d, "scrape-info.txt")):
        info = kv("x " + open(os.path.join(d, "scrape-info.txt")).read().strip())
    if scrapes:
        print(f"\n#### One scrape of `GET /metrics`: {info.get('routes', '?')} routes, "
              f"{info.get('policies', '?')} policies\n")
        print("| sluice state | scrapes | median | p99 | max | output |")
        print("|---|---:|---:|---:|---:|---:|")
    for name, t, size in scrapes:
        print(f"| {name} | {len(t)} | {statistics.median(t):.2f} ms | {quantile(t, 0.99):.2f} ms | "
              f"{max(t):.2f} ms | {size / 1024:.0f} KiB, {info.get('lines', '?')} lines "
              f"({info.get('series', '?')} samples) |")

    print("\n#### Targets\n")
    if drps is not None:
        mp, mc = statistics.median(prps), statistics.median(pcpu)
        print(f"- pass-through throughput with metrics on vs off under 3 % apart: off/on req/s, "
              f"median of the {len(prps)} paired runs {mp:+.1f} % (medians of each build: "
              f"{drps:+.1f} %) — " + verdict(abs(mp) < 3, f"by {abs(mp) - 3:.1f} points"))
        print(f"- the same in sluice CPU per request: on/off, median of the paired runs "
              f"{mc:+.1f} % (medians of each build: {dcpu:+.1f} %) — " +
              verdict(abs(mc) < 3, f"by {abs(mc) - 3:.1f} points"))
    if perf_delta is not None:
        print(f"- the same from the profiles: metric recording takes {perf_delta:.2f} % of "
              f"sluice's CPU — " + verdict(perf_delta < 3, f"by {perf_delta - 3:.1f} points"))
    for name, t, size in scrapes:
        m, p99 = statistics.median(t), quantile(t, 0.99)
        print(f"- one scrape under 5 ms ({name}): median {m:.2f} ms, p99 {p99:.2f} ms — " +
              verdict(p99 < 5, f"p99 by {p99 - 5:.2f} ms" if m < 5 else f"median by {m - 5:.2f} ms"))


def gc_report(d):
    runs = read_runs(os.path.join(d, "runs.tsv"))
    fwd = {}
    for line in open(os.path.join(d, "forwarded.tsv")):
        label, _, n = line.split()
        fwd[label] = fwd.get(label, 0) + int(n)
    print("\n#### Keyed completions per second (fresh keys, every request leased, forwarded "
          "and completed)\n")
    print("| build | store.sync | completions/s | p50 | p99 | sluice CPU/req | errors | "
          "forwarded / requests | runs |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for label in ("before-sync-false", "before-sync-true", "after-sync-false", "after-sync-true"):
        rows = runs.get(label)
        if not rows:
            continue
        lo, hi = spread(rows, "rps")
        build, sync = label.split("-sync-")
        print(f"| {build} | {sync} | {med(rows, 'rps'):,.0f} ({lo:,.0f}–{hi:,.0f}) | "
              f"{fmt_us(med(rows, 'p50'))} | {fmt_us(med(rows, 'p99'))} | "
              f"{med(rows, 'cpu'):.1f} µs | {sum(r['errors'] for r in rows):.0f} | "
              f"{fwd.get(label, 0):,} / {sum(r['reqs'] for r in rows):,.0f} | {len(rows)} |")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "ports":
        ports(int(sys.argv[2]))
    elif cmd == "record" and len(sys.argv) == 13:
        record(*sys.argv[2:])
    elif cmd == "perfshare" and len(sys.argv) == 3:
        perfshare(sys.argv[2])
    elif cmd == "hist" and len(sys.argv) == 5:
        hist(*sys.argv[2:])
    elif cmd == "store-report" and len(sys.argv) == 3:
        store_report(sys.argv[2])
    elif cmd == "metrics-report" and len(sys.argv) == 3:
        metrics_report(sys.argv[2])
    elif cmd == "gc-report" and len(sys.argv) == 3:
        gc_report(sys.argv[2])
    else:
        sys.exit(__doc__)
