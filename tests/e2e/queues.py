"""The experiment's view of a queue: enqueue a batch, then sample it from outside the workers.

Two layouts: the Redis delayed-queue pattern of deploy/examples/README.md (Python, Go and the
baseline workers) and BullMQ's (the TypeScript worker). Sampling reads Redis only, so the figures
do not depend on what a worker reports about itself.
"""
import json
import os
import subprocess
import time


class RedisPattern:
    def __init__(self, r, name):
        self.r, self.name = r, name

    def key(self, k):
        return f"{self.name}:{k}"

    def enqueue(self, jobs):
        with self.r.pipeline(transaction=False) as p:
            for j in jobs:
                p.lpush(self.key("ready"), json.dumps(j))
            p.execute()

    def sample(self):
        with self.r.pipeline(transaction=False) as p:
            p.llen(self.key("ready")).zcard(self.key("delayed"))
            p.scard(self.key("done")).llen(self.key("dlq"))
            p.zrange(self.key("delayed"), -1, -1, withscores=True)
            ready, delayed, done, dlq, last = p.execute()
        held = 0
        for k in self.r.scan_iter(match=self.key("processing:*"), count=1000):
            held += self.r.llen(k)
        ahead = last[0][1] - time.time() * 1000 if last else 0
        return {"ready": ready, "delayed": delayed, "done": done, "dlq": dlq, "held": held,
                "max_delay_ms": max(0.0, ahead)}

    def asleep(self):
        return float(self.r.get(self.key("stats:asleep")) or 0)

    def held_by(self, worker):
        """Ids of the jobs in the processing lists of `worker` (<queue>:processing:<worker>-<slot>)."""
        ids = []
        for k in self.r.scan_iter(match=self.key(f"processing:{worker}-*"), count=1000):
            ids += [json.loads(raw)["id"] for raw in self.r.lrange(k, 0, -1)]
        return ids

    def finished(self, ids):
        """How many of `ids` are in the done set."""
        return sum(bool(self.r.sismember(self.key("done"), i)) for i in ids)


class BullMQ:
    """BullMQ 5 keys: bull:<queue>:wait|paused|active (lists), :prioritized|:delayed|:completed|
    :failed (sorted sets). A delayed job's score is its due time in ms times 4096 plus a counter."""

    def __init__(self, r, name, ts_dir, redis_port):
        self.r, self.name, self.ts_dir, self.port = r, name, ts_dir, redis_port

    def key(self, k):
        return f"bull:{self.name}:{k}"

    def enqueue(self, jobs):
        env = dict(os.environ, QUEUE=self.name, REDIS_ADDR=f"127.0.0.1:{self.port}")
        lines = "".join(json.dumps(j) + "\n" for j in jobs).encode()
        subprocess.run(["node", os.path.join(self.ts_dir, "dist", "enqueue.js")], input=lines,
                       env=env, check=True, stdout=subprocess.DEVNULL, timeout=120)

    def sample(self):
        with self.r.pipeline(transaction=False) as p:
            p.llen(self.key("wait")).llen(self.key("paused")).zcard(self.key("prioritized"))
            p.zcard(self.key("delayed")).llen(self.key("active"))
            p.zcard(self.key("completed")).zcard(self.key("failed"))
            p.zrange(self.key("delayed"), -1, -1, withscores=True)
            wait, paused, prio, delayed, active, done, failed, last = p.execute()
        ahead = (last[0][1] // 4096) - time.time() * 1000 if last else 0
        return {"ready": wait + paused + prio, "delayed": delayed, "done": done, "dlq": failed,
                "held": active, "max_delay_ms": max(0.0, ahead)}

    def asleep(self):
        return 0.0

    def held_by(self, worker):
        """Ids of the active jobs that `worker` took (BullMQ stores its name in field pb)."""
        ids = [i.decode() for i in self.r.lrange(self.key("active"), 0, -1)]
        return [i for i in ids if self.r.hget(self.key(i), "pb") == worker.encode()]

    def finished(self, ids):
        """How many of `ids` are in the completed set."""
        return sum(self.r.zscore(self.key("completed"), i) is not None for i in ids)


def make(kind, r, prefix, args):
    if kind == "typescript":
        return BullMQ(r, prefix, args.ts_dir, r.connection_pool.connection_kwargs["port"])
    return RedisPattern(r, prefix)
