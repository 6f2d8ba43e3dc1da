#!/usr/bin/python3
"""The Python example worker (deploy/examples/python/worker.py), unchanged, plus the bookkeeping
the kill test needs: when a slot gets a success for a job (Sluice-Outcome ok or replayed), it
records the CLOCK_MONOTONIC time in nanoseconds, right after the answer arrived and before the
ack, in the Redis hash <QUEUE>:acked under the job's Idempotency-Key (HSETNX: the first success
counts). CLOCK_MONOTONIC is one clock for every process on the machine, so kill_test.py can
compare it with the stub's side-effect times. Every success is also appended to the list
<QUEUE>:successes as "<key> <SLUICE_URL> <outcome>", so that fleet_experiment.py can tell which
sluice answered each delivery of a job. Same environment as the example worker.
"""
import importlib.util
import os
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "..", "deploy", "examples", "python", "worker.py")

spec = importlib.util.spec_from_file_location("example_worker", WORKER)
worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(worker)

ACKED = f"{worker.QUEUE}:acked"
SUCCESSES = f"{worker.QUEUE}:successes"
_call = worker.Slot.call


def call(self, job):
    status, outcome, headers, body = _call(self, job)
    if outcome in ("ok", "replayed"):
        with self.r.pipeline(transaction=False) as p:
            p.hsetnx(ACKED, job["key"], time.monotonic_ns())
            p.rpush(SUCCESSES, f"{job['key']} {worker.SLUICE_URL} {outcome}")
            p.execute()
    return status, outcome, headers, body


worker.Slot.call = call

if __name__ == "__main__":
    worker.main()
