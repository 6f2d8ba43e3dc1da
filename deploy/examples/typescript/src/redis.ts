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

/** Where Redis is, as the environment names it. */
interface RedisTarget {
  host: string;
  port: number;
  username?: string;
  password?: string;
  db: number;
  tls: boolean;
}

/**
 * REDIS_URL (redis://[[user]:password@]host:port[/db], rediss:// for TLS) wins, as in the Python
 * and Go examples; REDIS_ADDR (host:port, IPv6 as [::1]:6379, default 127.0.0.1:6379) is the
 * older setting, still honoured when REDIS_URL is unset. The password usually comes from a
 * Secret: "redis://:${REDIS_PASSWORD}@redis:6379/0", percent-encoded where it holds @ : / %.
 */
export function redisTarget(): RedisTarget {
  const url = process.env.REDIS_URL;
  if (url) return fromUrl(url);
  const addr = process.env.REDIS_ADDR || "127.0.0.1:6379";
  const m = /^\[?([^\]]*?)\]?:(\d+)$/.exec(addr);
  if (!m) throw new Error(`REDIS_ADDR=${JSON.stringify(addr)} is not host:port`);
  return { host: m[1], port: Number(m[2]), db: 0, tls: false };
}

function fromUrl(raw: string): RedisTarget {
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    throw new Error("REDIS_URL is not a URL (redis://[:password@]host:port[/db])");
  }
  if (u.protocol !== "redis:" && u.protocol !== "rediss:")
    throw new Error(`REDIS_URL: scheme ${u.protocol} is not redis: or rediss:`);
  const db = u.pathname === "" || u.pathname === "/" ? 0 : Number(u.pathname.slice(1));
  if (!Number.isInteger(db) || db < 0) throw new Error(`REDIS_URL: database ${u.pathname} is not a number`);
  return {
    host: u.hostname.replace(/^\[(.*)\]$/, "$1") || "127.0.0.1", // URL keeps IPv6 brackets
    port: u.port ? Number(u.port) : 6379,
    username: u.username ? decodeURIComponent(u.username) : undefined,
    password: u.password ? decodeURIComponent(u.password) : undefined,
    db,
    tls: u.protocol === "rediss:",
  };
}

/** The target without its password, for the start line. */
export function redisTargetText(): string {
  const t = redisTarget();
  const host = t.host.includes(":") ? `[${t.host}]` : t.host;
  return `${t.tls ? "rediss" : "redis"}://${t.password ? ":***@" : ""}${host}:${t.port}/${t.db}`;
}

/**
 * BullMQ connection options for redisTarget().
 * worker: wait for Redis forever (a worker outlives Redis restarts); otherwise (the producer)
 * fail a command after a few reconnection attempts instead of hanging.
 */
export function redisConnection(worker: boolean): ConnectionOptions {
  const t = redisTarget();
  return {
    host: t.host,
    port: t.port,
    db: t.db,
    ...(t.username ? { username: t.username } : {}),
    ...(t.password ? { password: t.password } : {}),
    ...(t.tls ? { tls: {} } : {}),
    // BullMQ requires null for a Worker: ioredis keeps retrying a command while Redis is
    // away instead of failing it. A producer would rather fail fast.
    maxRetriesPerRequest: worker ? null : 3,
    // BullMQ's default reconnects forever (worker); the producer gives up after ~10 s.
    ...(worker ? {} : { retryStrategy: (times: number) => (times > 10 ? null : 1000) }),
  };
}
