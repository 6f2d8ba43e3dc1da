// Reads job payloads from stdin, one JSON object a line, and adds them to the BullMQ queue
// QUEUE, 500 at a time. Each job: name "call", jobId = payload.id (so enqueueing the same
// line twice adds it once), attempts 1 (sluice counts the attempts, BullMQ never retries).
//
//   node dist/enqueue.js < jobs.jsonl      -> prints "enqueued N"

import { createInterface } from "node:readline";
import { Queue } from "bullmq";
import { redisConnection } from "./redis";

const QUEUE = process.env.QUEUE || "jobs";
const BATCH = 500;

interface Payload {
  id: string;
  key: string;
  method?: string;
  path: string;
  body?: unknown;
  enqueued_at?: number;
}

async function main(): Promise<number> {
  const queue = new Queue<Payload>(QUEUE, { connection: redisConnection(false) });
  let batch: { name: string; data: Payload; opts: { jobId: string; attempts: number } }[] = [];
  let count = 0;
  let lineNo = 0;

  const flush = async () => {
    if (batch.length === 0) return;
    await queue.addBulk(batch);
    count += batch.length;
    batch = [];
  };

  try {
    for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
      lineNo++;
      if (line.trim() === "") continue;
      const p = JSON.parse(line) as Payload;
      if (p === null || typeof p !== "object" || p.id === undefined || !p.path) {
        throw new Error(`line ${lineNo}: a payload needs at least "id" and "path"`);
      }
      // BullMQ refuses custom ids that are integers ("42") or contain ':'.
      const jobId = String(p.id);
      if (p.enqueued_at === undefined) p.enqueued_at = Date.now() / 1000;
      batch.push({ name: "call", data: p, opts: { jobId, attempts: 1 } });
      if (batch.length >= BATCH) await flush();
    }
    await flush();
  } finally {
    await queue.close();
  }
  console.log(`enqueued ${count}`);
  return 0;
}

main().then(
  (code) => process.exit(code),
  (err: Error) => {
    console.error(`enqueue: ${err.message}`);
    process.exit(1);
  },
);
