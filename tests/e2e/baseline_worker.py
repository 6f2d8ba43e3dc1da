#!/usr/bin/python3
"""The experiment's baseline: the usual worker, without sluice.

It calls the partner directly and, on a 429 or 5xx, sleeps (Retry-After, else exponential backoff
with full jitter) and retries in place while holding its slot, up to MAX_ATTEMPTS, then
dead-letters. Attempts live in the process, so a redelivery after a crash starts counting again.
Same queue and settings as deploy/examples/python/worker.py, whose queue pieces (key names,
the promotion script, crash recovery) it reuses; PARTNER_URL replaces SLUICE_URL, and the
seconds spent asleep are added to QUEUE:stats:asleep.
"""
import http.client
import json
import os
import random
import signal
import sys
import threading
import time
import urllib.parse


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "deploy", "examples", "python"))
from worker import (AFTER_CALL_MS, CONCURRENCY, DELAYED, DLQ, DONE, PROMOTE,  # noqa: E402
                    QUEUE, READY, WORKER_ID, connect, recover)

PARTNER_URL = os.environ["PARTNER_URL"]
MAX_ATTEMPTS = int(os.environ.get("MAX_ATTEMPTS", "8"))
BASE_S, CAP_S = 1.0, 60.0
ASLEEP = f"{QUEUE}:stats:asleep"
stopping = threading.Event()


def slot(index):
    r = connect()
    promote = r.register_script(PROMOTE)
    processing = f"{QUEUE}:processing:{WORKER_ID}-{index}"
    url = urllib.parse.urlsplit(PARTNER_URL)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    while not stopping.is_set():
        promote(keys=[DELAYED, READY], args=[int(time.time() * 1000), 100])
        raw = r.blmove(READY, processing, 0.2, "RIGHT", "LEFT")
        if raw is None:
            continue
        job = json.loads(raw)
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                conn.request("POST", job["path"], body=json.dumps(job.get("body", {})),
                             headers={"Content-Type": "application/json",
                                      "Idempotency-Key": job["key"]})
                resp = conn.getresponse()
                resp.read()
                status, retry_after = resp.status, resp.getheader("Retry-After")
            except (OSError, http.client.HTTPException):
                conn.close()
                status, retry_after = 503, None
            if status < 400:
                time.sleep(AFTER_CALL_MS / 1000)
                with r.pipeline(transaction=True) as p:
                    p.lrem(processing, 1, raw).sadd(DONE, job["id"]).execute()
                break
            if status != 429 and status < 500 or attempt == MAX_ATTEMPTS:
                r.lpush(DLQ, json.dumps({"job": job, "status": status, "attempt": attempt}))
                r.lrem(processing, 1, raw)
                break
            # The pattern sluice replaces: hold the slot and sleep.
            try:
                pause = float(retry_after)
            except (TypeError, ValueError):
                pause = random.uniform(0, min(CAP_S, BASE_S * 2 ** (attempt - 1)))
            time.sleep(pause)
            r.incrbyfloat(ASLEEP, pause)


def main():
    recover(connect())
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    threads = [threading.Thread(target=slot, args=(i,)) for i in range(CONCURRENCY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
