// A BullMQ worker that calls a partner API through sluice and does what every
// `Sluice-Outcome` says (docs/contract.md §4, deploy/examples/README.md).
//
//   ok, replayed                        -> return: the job is completed
//   requeue, reason upstream_cooldown   -> worker.rateLimit(delay_ms) + RateLimitError: the
//                                          job back in `wait`, the whole queue paused
//   requeue, any other reason           -> job.moveToDelayed(now + delay_ms) + DelayedError:
//                                          back in `delayed`, no BullMQ attempt spent
//   dead_letter, permanent_error,
//   rejected                            -> UnrecoverableError: the job goes to the `failed` set
//                                          (BullMQ's dead-letter queue) at once, no retry
//   sluice unreachable (fetch throws)   -> delayed 2 s + up to 1 s of jitter, no attempt spent
//   no Sluice-Outcome header            -> delayed 5 s, logged
//
// It never sleeps on a 429 and never retries in place: a waiting job holds no worker slot.

import { hostname } from "node:os";
import { DelayedError, Job, UnrecoverableError, Worker } from "bullmq";
import { envNumber, redisConnection, redisTargetText } from "./redis";

/** One job's data: the payload object of deploy/examples/README.md. */
interface Payload {
  id: string;
  key: string; // Idempotency-Key: the business action, stable across redeliveries
  method?: string; // default POST
  path: string; // e.g. /v1/grades/job-000042, appended to SLUICE_URL
  body?: unknown; // sent as JSON
  enqueued_at?: number; // Unix seconds (float) when the job was enqueued
}

/** What a completed job returns (BullMQ stores it as the job's `returnvalue`). */
interface Result {
  status: number;
  outcome: string;
}

const QUEUE = process.env.QUEUE || "jobs";
// BullMQ needs no stable worker id for crash recovery (its stalled-job check does it); the
// name is stored on each job it processes (`pb` field) and shown by Queue.getWorkers().
const WORKER_ID = process.env.WORKER_ID || hostname();
const SLUICE_URL = (process.env.SLUICE_URL || "http://127.0.0.1:8080").replace(/\/+$/, "");
const CONCURRENCY = envNumber("CONCURRENCY", 4);
const AFTER_CALL_MS = envNumber("AFTER_CALL_MS", 0);
const HTTP_TIMEOUT = envNumber("HTTP_TIMEOUT", 90); // seconds
const LOCK_MS = envNumber("LOCK_MS", 30000);
const STALLED_MS = envNumber("STALLED_MS", 30000);
const MAX_STALLED = envNumber("MAX_STALLED", 1000);
const LOG = process.env.LOG === "1";
// Keep finished jobs for inspection by default; KEEP_COMPLETED / KEEP_FAILED = N keeps only the last N.
const KEEP_COMPLETED = process.env.KEEP_COMPLETED ? envNumber("KEEP_COMPLETED", 0) : undefined;
const KEEP_FAILED = process.env.KEEP_FAILED ? envNumber("KEEP_FAILED", 0) : undefined;

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

function log(msg: string): void {
  console.log(`${new Date().toISOString()} ${msg}`);
}

/**
 * Put the job back in BullMQ's `delayed` set and release the worker slot. `moveToDelayed`
 * does not count a BullMQ attempt (attemptsMade stays as it is); the DelayedError tells the
 * worker the job has been moved, so it neither completes nor fails it.
 */
async function delayJob(
  job: Job<Payload>,
  token: string | undefined,
  delayMs: number,
  why: string,
  pauseMs = 0,
): Promise<never> {
  const ms = Math.max(1, Math.round(delayMs));
  if (LOG) log(`job ${job.id} delayed ${ms} ms: ${why}`);
  await job.moveToDelayed(Date.now() + ms, token);
  // The job is already back in `delayed`; the slot may still idle a moment before the next one.
  if (pauseMs > 0) await sleep(pauseMs);
  throw new DelayedError();
}

/** Retry-After as milliseconds: delay-seconds or an HTTP-date; undefined when absent or malformed. */
function retryAfterMs(value: string | null): number | undefined {
  if (value === null) return undefined;
  const v = value.trim();
  if (/^\d+$/.test(v)) return Number(v) * 1000;
  const date = Date.parse(v);
  return Number.isNaN(date) ? undefined : Math.max(1000, date - Date.now());
}

/** The JSON object of a body, or {} when it is not one. */
function parseObject(text: string): Record<string, unknown> {
  try {
    const v: unknown = JSON.parse(text);
    return v !== null && typeof v === "object" && !Array.isArray(v) ? (v as Record<string, unknown>) : {};
  } catch {
    return {};
  }
}

/**
 * The failed reason stored on a dead-lettered job (job.failedReason), e.g.
 *   dead_letter: upstream_429 after attempt 8 (status 429)
 *   rejected: no_route: no route for POST /nope (status 404)
 *   permanent_error: status 422: {"error":"unknown student"}
 */
function deadLetterReason(outcome: string, status: number, text: string): string {
  // dead_letter carries `reason` and `attempt`; rejected is problem+json (`reason`, `title`,
  // `detail`); permanent_error carries the upstream's own body, whatever it is.
  const body = parseObject(text);
  const why = body.reason ?? body.title;
  if (why === undefined) {
    const snippet = text.length > 200 ? `${text.slice(0, 200)}...` : text;
    return `${outcome}: status ${status}${snippet ? `: ${snippet}` : ""}`;
  }
  let reason = `${outcome}: ${String(why)}`;
  if (typeof body.detail === "string" && body.detail !== why) reason += `: ${body.detail}`;
  if (typeof body.attempt === "number") reason += ` after attempt ${body.attempt}`;
  return `${reason} (status ${status})`;
}

async function processJob(job: Job<Payload>, token?: string): Promise<Result> {
  const p = job.data;
  const method = (p.method || "POST").toUpperCase();
  const headers: Record<string, string> = { "Content-Type": "application/json" };
  if (p.key) headers["Idempotency-Key"] = p.key;
  if (p.enqueued_at !== undefined) headers["Sluice-Enqueued-At"] = String(p.enqueued_at);
  const hasBody = method !== "GET" && method !== "HEAD" && p.body !== undefined;

  let res: Response;
  let text: string;
  try {
    res = await fetch(SLUICE_URL + p.path, {
      method,
      headers,
      body: hasBody ? JSON.stringify(p.body) : undefined,
      signal: AbortSignal.timeout(HTTP_TIMEOUT * 1000),
    });
    text = await res.text();
  } catch (err) {
    // Connection refused or reset, or no answer within HTTP_TIMEOUT: sluice is restarting (or
    // gone). Not the job's fault: delay it by 2-3 s and spend no attempt. Running it again is
    // safe: sluice replays a finished call or answers lease_held for one in flight.
    const e = err as Error & { cause?: { code?: string; message?: string } };
    const why = e.cause?.code || e.cause?.message || e.name || String(err);
    // The slot then pauses 0.5 s: every job would meet the same closed port, and churning the
    // whole queue into `delayed` during a restart helps nobody.
    return delayJob(job, token, 2000 + Math.random() * 1000, `sluice unreachable (${why})`, 500);
  }

  const outcome = res.headers.get("sluice-outcome");
  switch (outcome) {
    case "ok":
    case "replayed":
      if (AFTER_CALL_MS > 0) await sleep(AFTER_CALL_MS);
      if (LOG) log(`job ${job.id} ${outcome} ${res.status}`);
      return { status: res.status, outcome };

    case "requeue": {
      const body = parseObject(text);
      const delayMs =
        typeof body.delay_ms === "number" && body.delay_ms > 0
          ? body.delay_ms
          : retryAfterMs(res.headers.get("retry-after")) ?? 1000;
      if (body.reason === "upstream_cooldown") {
        // The partner itself asked for a pause (a 429 with Retry-After): every job of the queue
        // would get the same answer until it ends, so pause the queue the BullMQ way instead of
        // bouncing job after job through sluice. rateLimit() sets the queue's limiter key for
        // delay_ms (all workers of the queue stop fetching); RateLimitError puts this job back
        // in `wait` without spending an attempt. (bullmq 5 marks worker.rateLimit deprecated in
        // favour of queue.rateLimit, the same SET, which would need a Queue connection here.)
        log(`job ${job.id}: upstream_cooldown, pausing the queue ${Math.round(delayMs)} ms`);
        await worker.rateLimit(Math.max(1, Math.round(delayMs)));
        throw Worker.RateLimitError();
      }
      const why = `requeue ${res.status} ${String(body.reason ?? "")} attempt ${String(body.attempt ?? "?")}`;
      return delayJob(job, token, delayMs, why);
    }

    case "dead_letter":
    case "permanent_error":
    case "rejected": {
      // UnrecoverableError skips BullMQ's own retries whatever `attempts` says: the job
      // lands in the failed set with this reason (job.failedReason), for a human to look at.
      const reason = deadLetterReason(outcome, res.status, text);
      if (LOG) log(`job ${job.id} failed: ${reason}`);
      throw new UnrecoverableError(reason);
    }

    default:
      // Not sluice (a load balancer, a wrong SLUICE_URL...) or an outcome this worker does not know.
      log(`job ${job.id}: answer ${res.status} without a known Sluice-Outcome (${JSON.stringify(outcome)}), delayed 5 s`);
      return delayJob(job, token, 5000, "no Sluice-Outcome");
  }
}

const worker = new Worker<Payload, Result>(QUEUE, processJob, {
  connection: redisConnection(true),
  name: WORKER_ID,
  concurrency: CONCURRENCY,
  lockDuration: LOCK_MS,
  stalledInterval: STALLED_MS,
  // A job whose worker died (kill -9, OOM, node drain) stays in `active` until its lock expires;
  // the stalled check then puts it back in `wait`. BullMQ's default (1) fails a job stalled twice.
  // Running such a job again is safe here -- sluice replays the stored answer or says lease_held
  // (requeue) -- so never fail a job for stalling.
  maxStalledCount: MAX_STALLED,
  // BullMQ honours worker.rateLimit() only when the worker has a limiter (moveToActive checks the
  // limiter key against limiter.max). This one never limits by itself: sluice paces the calls.
  limiter: { max: 1_000_000, duration: 1000 },
  // Unset = keep every completed and failed job (the failed set is the dead-letter queue).
  removeOnComplete: KEEP_COMPLETED !== undefined ? { count: KEEP_COMPLETED } : undefined,
  removeOnFail: KEEP_FAILED !== undefined ? { count: KEEP_FAILED } : undefined,
});

// Without an 'error' listener an ioredis hiccup would be an unhandled 'error' event.
worker.on("error", (err) => log(`worker error: ${err.message}`));

let stopping = false;
async function stop(signal: string): Promise<void> {
  if (stopping) {
    log(`${signal} again: exiting without waiting`);
    process.exit(1);
  }
  stopping = true;
  log(`${signal}: finishing the jobs in hand`);
  try {
    await worker.close(); // stops taking jobs, waits for the ones being processed
  } catch (err) {
    log(`close: ${(err as Error).message}`);
  }
  log("stopped");
  process.exit(0);
}
process.on("SIGTERM", () => void stop("SIGTERM"));
process.on("SIGINT", () => void stop("SIGINT"));

log(
  `worker ${WORKER_ID} start queue=${QUEUE} redis=${redisTargetText()} sluice=${SLUICE_URL} ` +
    `concurrency=${CONCURRENCY} lock_ms=${LOCK_MS} stalled_ms=${STALLED_MS} max_stalled=${MAX_STALLED}`,
);
