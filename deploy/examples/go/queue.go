package main

// The Redis delayed-queue pattern of ../README.md: jobs wait in QUEUE:ready
// (a list), delayed jobs in QUEUE:delayed (a sorted set scored by the Unix
// millisecond they become due), and the job a slot holds stays in its own
// QUEUE:processing:<worker>-<slot> list until it is acked, requeued or
// dead-lettered, so that a crash never loses it.

import (
	"fmt"
	"strconv"
	"time"
)

// promoteScript moves due delayed jobs to the right end of the ready list
// (the end workers take from: they have waited long enough already). Being
// one script, it is atomic: two workers promoting at once cannot both move
// the same job.
const promoteScript = `
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, job in ipairs(due) do
  redis.call('ZREM', KEYS[1], job)
  redis.call('RPUSH', KEYS[2], job)
end
return #due`

// queue is one slot's view of the queue, over its own Redis connection
// (BLMOVE blocks the connection, so slots cannot share one).
type queue struct {
	addr       string
	ready      string
	delayed    string
	done       string
	dlq        string
	processing string
	conn       *redisConn // nil until needed, and again after a network error
}

func newQueue(addr, prefix, worker string, slot int) *queue {
	return &queue{
		addr:       addr,
		ready:      prefix + ":ready",
		delayed:    prefix + ":delayed",
		done:       prefix + ":done",
		dlq:        prefix + ":dlq",
		processing: processingKey(prefix, worker, slot),
	}
}

func processingKey(prefix, worker string, slot int) string {
	return fmt.Sprintf("%s:processing:%s-%d", prefix, worker, slot)
}

// do runs one command, connecting first if needed. After a network error the
// connection is dropped, so the next call starts on a fresh one (a half-read
// reply would otherwise poison every later command).
func (q *queue) do(args ...string) (interface{}, error) {
	if q.conn == nil {
		c, err := dialRedis(q.addr)
		if err != nil {
			return nil, err
		}
		q.conn = c
	}
	v, err := q.conn.do(args...)
	if err != nil && !isRedisError(err) {
		q.conn.Close()
		q.conn = nil
	}
	return v, err
}

func (q *queue) close() {
	if q.conn != nil {
		q.conn.Close()
		q.conn = nil
	}
}

// recover moves whatever this slot's processing list still holds (a job a
// previous run of this worker was handling when it died) back to the ready
// list, next in line. It returns how many jobs it moved.
func (q *queue) recover() (int, error) {
	n := 0
	for {
		v, err := q.do("LMOVE", q.processing, q.ready, "RIGHT", "RIGHT")
		if err != nil || v == nil {
			return n, err
		}
		n++
	}
}

// take promotes due delayed jobs, then waits up to 0.2 s for a ready job and
// moves it to the processing list. ok is false when none came.
func (q *queue) take() (raw string, ok bool, err error) {
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	if _, err := q.do("EVAL", promoteScript, "2", q.delayed, q.ready, now, "100"); err != nil {
		return "", false, fmt.Errorf("promote: %w", err)
	}
	v, err := q.do("BLMOVE", q.ready, q.processing, "RIGHT", "LEFT", "0.2")
	if err != nil || v == nil {
		return "", false, err
	}
	raw, ok = v.(string)
	if !ok {
		return "", false, fmt.Errorf("BLMOVE: unexpected reply %T", v)
	}
	return raw, true, nil
}

// The three ways a job leaves the processing list. Each runs as one
// MULTI/EXEC transaction: the new home of the job (done set, delayed set or
// dead-letter list) is written first and the LREM comes after it, so the job
// is never only in flight; and if the connection breaks before EXEC, Redis
// discards the whole transaction and the caller can simply try again. raw
// must be the exact string BLMOVE returned, or LREM would not find it.

func (q *queue) ack(raw, id string) error {
	return q.transaction(
		[]string{"LREM", q.processing, "1", raw},
		[]string{"SADD", q.done, id},
	)
}

// requeue delays the job: the same raw string becomes a delayed-set member,
// due at now+delay. No attempt is counted here: sluice counts attempts per
// idempotency key.
func (q *queue) requeue(raw string, delay time.Duration) error {
	due := time.Now().Add(delay).UnixMilli()
	return q.transaction(
		[]string{"ZADD", q.delayed, strconv.FormatInt(due, 10), raw},
		[]string{"LREM", q.processing, "1", raw},
	)
}

func (q *queue) deadLetter(raw, entry string) error {
	return q.transaction(
		[]string{"LPUSH", q.dlq, entry},
		[]string{"LREM", q.processing, "1", raw},
	)
}

func (q *queue) transaction(cmds ...[]string) error {
	if _, err := q.do("MULTI"); err != nil {
		return err
	}
	for _, cmd := range cmds {
		if _, err := q.do(cmd...); err != nil {
			if isRedisError(err) { // still connected: leave MULTI state
				q.do("DISCARD")
			}
			return fmt.Errorf("%s: %w", cmd[0], err)
		}
	}
	v, err := q.do("EXEC")
	if err != nil {
		return fmt.Errorf("EXEC: %w", err)
	}
	results, ok := v.([]interface{})
	if !ok {
		return fmt.Errorf("EXEC: transaction aborted")
	}
	for i, r := range results {
		if e, bad := r.(redisError); bad {
			return fmt.Errorf("%s: %w", cmds[i][0], e)
		}
	}
	return nil
}
