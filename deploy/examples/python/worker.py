#!/usr/bin/python3
"""A queue worker that calls a partner API through sluice and does what each answer says.

The queue is the Redis delayed-queue pattern of ../README.md (a ready list, a delayed sorted set,
one processing list per worker slot, a done set and a dead-letter list). Each slot is a thread with
its own Redis and HTTP connections. The worker never sleeps on a 429 and never retries in place:
a job that must wait goes back to the delayed set and the slot takes the next job.

Needs Python 3.9+ and redis-py (Debian: python3-redis). Settings come from the environment; see
../README.md. Run: SLUICE_URL=http://127.0.0.1:8080 REDIS_ADDR=127.0.0.1:6379 ./worker.py
"""
import http.client
import json
import os
import random
import signal
import socket
import sys
import threading
import time
import urllib.parse

import redis

SLUICE_URL = os.environ.get("SLUICE_URL", "http://127.0.0.1:8080")
REDIS_ADDR = os.environ.get("REDIS_ADDR", "127.0.0.1:6379")
QUEUE = os.environ.get("QUEUE", "jobs")
WORKER_ID = os.environ.get("WORKER_ID", socket.gethostname())
CONCURRENCY = int(os.environ.get("CONCURRENCY", "4"))
AFTER_CALL_MS = int(os.environ.get("AFTER_CALL_MS", "0"))
HTTP_TIMEOUT = float(os.environ.get("HTTP_TIMEOUT", "90"))
LOG = os.environ.get("LOG") == "1"

READY, DELAYED, DONE, DLQ = (f"{QUEUE}:{k}" for k in ("ready", "delayed", "done", "dlq"))

# Moves due delayed jobs to the front of the ready list in one step, so two workers never move the
# same job and a crash in the middle loses none.
PROMOTE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, job in ipairs(due) do
  redis.call('ZREM', KEYS[1], job)
  redis.call('RPUSH', KEYS[2], job)
end
return #due
"""

stopping = threading.Event()


def log(msg):
    print(f"worker {WORKER_ID}: {msg}", file=sys.stderr, flush=True)


def now_ms():
    return int(time.time() * 1000)


class Unreachable(Exception):
    """sluice did not answer at all (restarting): not an attempt at the partner."""


class Slot(threading.Thread):
    """One job at a time: take, call sluice, follow the answer, ack."""

    def __init__(self, index):
        super().__init__(name=f"slot-{index}")
        self.processing = f"{QUEUE}:processing:{WORKER_ID}-{index}"
        host, port = REDIS_ADDR.rsplit(":", 1)
        self.r = redis.Redis(host=host, port=int(port))
        self.promote = self.r.register_script(PROMOTE)
        self.http = None

    def run(self):
        while not stopping.is_set():
            try:
                self.promote(keys=[DELAYED, READY], args=[now_ms(), 100])
                raw = self.r.blmove(READY, self.processing, 0.2, "RIGHT", "LEFT")
                if raw is not None:
                    self.handle(raw)
            except redis.RedisError as e:
                log(f"redis: {e}; retrying in 1 s")
                time.sleep(1)

    def handle(self, raw):
        job = json.loads(raw)
        try:
            status, outcome, headers, body = self.call(job)
        except Unreachable as e:
            # Spend no attempt, and pause this slot a moment: every job would meet the same
            # closed port, and churning the whole queue into the delayed set helps nobody.
            self.requeue(raw, 2000 + random.randint(0, 1000), "sluice_unreachable", str(e))
            stopping.wait(0.5)
            return
        if outcome in ("ok", "replayed"):
            if AFTER_CALL_MS:
                time.sleep(AFTER_CALL_MS / 1000)   # the job's own work with the answer
            self.ack(raw, job["id"], outcome)
        elif outcome == "requeue":
            self.requeue(raw, delay_ms(headers, body), body.get("reason", "?"),
                         f"attempt {body.get('attempt')}")
        elif outcome in ("dead_letter", "permanent_error", "rejected"):
            self.dead_letter(raw, job, outcome, status, body)
        else:
            log(f"job {job['id']}: answer {status} without Sluice-Outcome: is SLUICE_URL sluice?")
            self.requeue(raw, 5000, "no_outcome", str(status))

    def call(self, job):
        """Returns (status, outcome, headers, JSON body or {}); raises Unreachable."""
        url = urllib.parse.urlsplit(SLUICE_URL)
        body = json.dumps(job.get("body", {}), separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "Idempotency-Key": job["key"],
                   "Sluice-Enqueued-At": str(job.get("enqueued_at", time.time()))}
        for tries in (1, 2):    # a kept-alive connection may have been closed: retry once
            try:
                if self.http is None:
                    self.http = http.client.HTTPConnection(url.hostname, url.port or 80,
                                                           timeout=HTTP_TIMEOUT)
                self.http.request(job.get("method", "POST"), url.path.rstrip("/") + job["path"],
                                  body=body, headers=headers)
                resp = self.http.getresponse()
                data = resp.read()
                break
            except (OSError, http.client.HTTPException) as e:
                self.http.close()
                self.http = None
                if tries == 2 or isinstance(e, ConnectionRefusedError):
                    raise Unreachable(repr(e)) from e
        try:
            parsed = json.loads(data) if data else {}
        except ValueError:
            parsed = {}
        if not isinstance(parsed, dict):
            parsed = {}
        return resp.status, resp.getheader("Sluice-Outcome"), resp, parsed

    def ack(self, raw, job_id, outcome):
        with self.r.pipeline(transaction=True) as p:
            p.lrem(self.processing, 1, raw).sadd(DONE, job_id).execute()
        if LOG:
            log(f"job {job_id}: {outcome}")

    def requeue(self, raw, delay, reason, detail):
        # The delayed copy is written before the original is acknowledged: a crash in between
        # leaves the job twice, never zero times (sluice makes the second run harmless).
        self.r.zadd(DELAYED, {raw: now_ms() + delay})
        self.r.lrem(self.processing, 1, raw)
        if LOG:
            log(f"job requeued in {delay} ms: {reason} ({detail})")

    def dead_letter(self, raw, job, outcome, status, body):
        entry = {"job": job, "outcome": outcome, "status": status,
                 "reason": body.get("reason") or body.get("title") or outcome,
                 "attempt": body.get("attempt")}
        self.r.lpush(DLQ, json.dumps(entry))
        self.r.lrem(self.processing, 1, raw)
        log(f"job {job['id']}: dead-lettered ({outcome}, {entry['reason']})")


def delay_ms(headers, body):
    """The instruction's delay: delay_ms, else Retry-After seconds, else 1 s."""
    if isinstance(body.get("delay_ms"), int):
        return max(1, body["delay_ms"])
    try:
        return int(headers.getheader("Retry-After")) * 1000
    except (TypeError, ValueError):
        return 1000


def recover(r):
    """Jobs a previous run of this worker held when it died go back to the ready list."""
    moved = 0
    for i in range(CONCURRENCY):
        while r.lmove(f"{QUEUE}:processing:{WORKER_ID}-{i}", READY, "RIGHT", "RIGHT"):
            moved += 1
    return moved


def main():
    host, port = REDIS_ADDR.rsplit(":", 1)
    moved = recover(redis.Redis(host=host, port=int(port)))
    log(f"{CONCURRENCY} slots, queue {QUEUE!r} on {REDIS_ADDR}, sluice {SLUICE_URL}, "
        f"recovered {moved} job(s)")
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    slots = [Slot(i) for i in range(CONCURRENCY)]
    for s in slots:
        s.start()
    for s in slots:
        s.join()
    log("stopped")


if __name__ == "__main__":
    main()
