#!/usr/bin/python3
"""A queue worker that calls a partner API through sluice and does what each answer says.

The queue is the Redis delayed-queue pattern of ../README.md (a ready list, a delayed sorted set,
one processing list per worker slot, a done set and a dead-letter list). Each slot is a thread with
its own Redis and HTTP connections. The worker never sleeps on a 429 and never retries in place:
a job that must wait goes back to the delayed set and the slot takes the next job.

A reaper thread keeps this worker's heartbeat key alive and hands back to the ready list the jobs
of workers whose heartbeat is gone (a pod replaced by a rollout never comes back under its name).

Needs Python 3.9+ and redis-py (Debian: python3-redis). Settings come from the environment; see
../README.md. Run: SLUICE_URL=http://127.0.0.1:8080 REDIS_URL=redis://127.0.0.1:6379/0 ./worker.py
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
# REDIS_URL (redis://[:password@]host:port/db, rediss:// for TLS) wins; REDIS_ADDR (host:port) and
# REDIS_PASSWORD are the older settings, still honoured when REDIS_URL is unset.
REDIS_URL = os.environ.get("REDIS_URL") or \
    f"redis://{os.environ.get('REDIS_ADDR', '127.0.0.1:6379')}/0"
REDIS_PASSWORD = None if os.environ.get("REDIS_URL") else os.environ.get("REDIS_PASSWORD")
QUEUE = os.environ.get("QUEUE", "jobs")
WORKER_ID = os.environ.get("WORKER_ID", socket.gethostname())
CONCURRENCY = int(os.environ.get("CONCURRENCY", "4"))
AFTER_CALL_MS = int(os.environ.get("AFTER_CALL_MS", "0"))
HTTP_TIMEOUT = float(os.environ.get("HTTP_TIMEOUT", "90"))
# The heartbeat is refreshed every HEARTBEAT_MS and lives 3x that: one or two late refreshes (a
# slow Redis, a GC pause) do not make a live worker look dead.
HEARTBEAT_MS = int(os.environ.get("HEARTBEAT_MS", "5000"))
LOG = os.environ.get("LOG") == "1"

READY, DELAYED, DONE, DLQ = (f"{QUEUE}:{k}" for k in ("ready", "delayed", "done", "dlq"))
PROCESSING = f"{QUEUE}:processing:"    # + <worker>-<slot>


def alive_key(worker):
    return f"{QUEUE}:worker:{worker}:alive"

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

# Hands a dead worker's processing list back to the ready list (next in line), but only if the
# owner's heartbeat is still missing when the script runs: checking and moving in one script means
# an owner that comes back in between keeps its job, and two reapers never move the same job.
REAP = """
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
local n = 0
while redis.call('LMOVE', KEYS[1], KEYS[3], 'RIGHT', 'RIGHT') do n = n + 1 end
return n
"""

stopping = threading.Event()


def connect():
    return redis.Redis.from_url(REDIS_URL, password=REDIS_PASSWORD)


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
        self.r = connect()
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


def reap(r, script):
    """Moves back to the ready list the jobs of every processing list whose owner's heartbeat is
    gone. A processing list is <QUEUE>:processing:<worker>-<slot>; the worker id may itself
    contain dashes (pod names do), the slot is after the last one."""
    moved = 0
    for key in r.scan_iter(match=PROCESSING + "*", count=100):
        key = key.decode()
        owner = key[len(PROCESSING):].rsplit("-", 1)[0]
        if owner == WORKER_ID:
            continue
        n = script(keys=[key, alive_key(owner), READY])
        if n > 0:
            moved += n
            log(f"reaped {n} job(s) of {owner} (no heartbeat) from {key}")
    return moved


def heartbeat_and_reap(r):
    """The reaper thread: refresh our heartbeat every HEARTBEAT_MS, reap every 3x that (a dead
    worker's heartbeat takes that long to expire anyway). Redis errors are retried: a missed
    refresh or two is what the 3x TTL is for."""
    script = r.register_script(REAP)
    next_reap = 0.0
    while not stopping.is_set():
        try:
            r.set(alive_key(WORKER_ID), str(time.time()), px=3 * HEARTBEAT_MS)
            if time.monotonic() >= next_reap:
                reap(r, script)
                next_reap = time.monotonic() + 3 * HEARTBEAT_MS / 1000
        except redis.RedisError as e:
            log(f"heartbeat: redis: {e}")
        stopping.wait(HEARTBEAT_MS / 1000)


def main():
    r = connect()
    # The heartbeat goes up before anything else: from now on no other worker reaps our lists.
    # Our own lists (a previous run under the same WORKER_ID) are ours to recover; then the first
    # reap, for the workers that went away while none was running.
    r.set(alive_key(WORKER_ID), str(time.time()), px=3 * HEARTBEAT_MS)
    moved = recover(r)
    reaped = reap(r, r.register_script(REAP))
    where = r.connection_pool.connection_kwargs
    log(f"{CONCURRENCY} slots, queue {QUEUE!r} on {where.get('host')}:{where.get('port')}, "
        f"sluice {SLUICE_URL}, recovered {moved} job(s), reaped {reaped}")
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    slots = [Slot(i) for i in range(CONCURRENCY)]
    for s in slots:
        s.start()
    # daemon: it holds no job, and must not keep a finished worker alive.
    threading.Thread(target=heartbeat_and_reap, args=(r,), name="reaper", daemon=True).start()
    for s in slots:
        s.join()
    log("stopped")


if __name__ == "__main__":
    main()
