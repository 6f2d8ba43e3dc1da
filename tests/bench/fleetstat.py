#!/usr/bin/env python3
"""Helper for fleet.sh (standard library only): one row for one run.

  fleetstat.py DIR SIDECARS RATE BURST SLUICE_CPU_NS REDIS_CPU_NS ROUND_TRIPS COMMANDS [INNER
               [SCRIPT_US [READS]]]

DIR holds wrk0.txt.. (one per sidecar), arrivals.json and stats.json (the stub's). Prints the
fleet's requests/s, the achieved rate at the stub and the worst overshoot of burst + rate * t
over its arrivals (ratestat.py's exact O(n) scan), wrk's p50 and p99 (the worst sidecar's),
sluice CPU per request (all sidecars together), Redis CPU per request, Redis round trips per
request (the store calls the sidecars counted) and Redis commands per request (a script's inner
calls included; INNER, when given, the same without EVALSHA itself: the commands that do the
work), and SCRIPT_US, Redis's own time inside its scripts (INFO commandstats' usec of EVALSHA),
per request as "scripts"; READS, the socket reads Redis made, as round trips per read (above 1:
the sidecars' calls pipelined, several in one read)."""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ratestat  # noqa: E402


def main(argv):
    d, rate, burst = argv[1], float(argv[3]), int(argv[4])
    sl_cpu, redis_cpu, trips, cmds = int(argv[5]), int(argv[6]), int(argv[7]), int(argv[8])
    inner = int(argv[9]) if len(argv) > 9 else cmds
    script_us = int(argv[10]) if len(argv) > 10 else 0
    reads = int(argv[11]) if len(argv) > 11 else 0
    wrks = [ratestat.parse_wrk(f) for f in sorted(glob.glob(f"{d}/wrk*.txt"))]
    rps = sum(w[0] for w in wrks)
    reqs = max(sum(w[3] for w in wrks), 1)
    p50 = max(w[1] for w in wrks)
    p99 = max(w[2] for w in wrks)
    non2xx = sum(w[5] for w in wrks)
    a = [x / 1e9 for x in json.load(open(f"{d}/arrivals.json"))]
    r = ratestat.analyse(a, rate, burst)
    print(f"{rps:8.0f} req/s | stub {r['achieved']:9.1f}/s ({r['err']:+.1f} % of {rate:g}) "
          f"overshoot {r['raw']:6.2f} | p50 {p50 / 1e3:6.2f} ms p99 {p99 / 1e3:6.2f} ms | "
          f"sluice {sl_cpu / reqs / 1e3:5.1f} µs/req | redis {redis_cpu / reqs / 1e3:4.1f} µs/req "
          f"(scripts {script_us / reqs:4.1f}) {trips / reqs:4.2f} trips/req {cmds / reqs:4.2f} cmd/req "
          f"({inner / reqs:4.2f} without EVALSHA) {trips / max(reads, 1):4.2f} trips/read "
          f"| non-2xx {non2xx}")


if __name__ == "__main__":
    main(sys.argv)
