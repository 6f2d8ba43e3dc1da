// Shared by worker.ts and enqueue.ts: the Redis connection options BullMQ gets.

import type { ConnectionOptions } from "bullmq";

/** The environment variable `name` as a number, or `fallback` when unset or empty. */
export function envNumber(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw.trim() === "") return fallback;
  const n = Number(raw);
  if (!Number.isFinite(n)) throw new Error(`${name}=${JSON.stringify(raw)} is not a number`);
  return n;
}

/**
 * REDIS_ADDR is host:port (IPv6 as [::1]:6379), default 127.0.0.1:6379.
 * worker: wait for Redis forever (a worker outlives Redis restarts); otherwise (the producer)
 * fail a command after a few reconnection attempts instead of hanging.
 */
export function redisConnection(worker: boolean): ConnectionOptions {
  const addr = process.env.REDIS_ADDR || "127.0.0.1:6379";
  const m = /^\[?([^\]]*?)\]?:(\d+)$/.exec(addr);
  if (!m) throw new Error(`REDIS_ADDR=${JSON.stringify(addr)} is not host:port`);
  return {
    host: m[1],
    port: Number(m[2]),
    // BullMQ requires null for a Worker: ioredis keeps retrying a command while Redis is
    // away instead of failing it. A producer would rather fail fast.
    maxRetriesPerRequest: worker ? null : 3,
    // BullMQ's default reconnects forever (worker); the producer gives up after ~10 s.
    ...(worker ? {} : { retryStrategy: (times: number) => (times > 10 ? null : 1000) }),
  };
}
