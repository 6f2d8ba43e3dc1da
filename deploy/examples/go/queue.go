package main

// The Redis delayed-queue pattern of ../README.md: jobs wait in QUEUE:ready
// (a list), delayed jobs in QUEUE:delayed (a sorted set scored by the Unix
// millisecond they become due), and the job a slot holds stays in its own
// QUEUE:processing:<worker>-<slot> list until it is acked, requeued or
// dead-lettered, so that a crash never loses it.

import (
	"fmt"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"
)

// redisTimeout bounds every command, so a Redis that stops answering turns
// into an error (and a reconnect) instead of a stuck slot. It must exceed the
// BLMOVE block time.
const redisTimeout = 10 * time.Second

// dial opens one connection to REDIS_URL (redis://[:password@]host:port/db;
// redigo sends AUTH and SELECT itself).
func dial(url string) (redis.Conn, error) {
	return redis.DialURL(url,
		redis.DialConnectTimeout(5*time.Second),
		redis.DialReadTimeout(redisTimeout),
		redis.DialWriteTimeout(redisTimeout))
}

// promoteScript moves due delayed jobs to the right end of the ready list
// (the end workers take from: they have waited long enough already). Being
// one script, it is atomic: two workers promoting at once cannot both move
// the same job.
var promoteScript = redis.NewScript(2, `
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, job in ipairs(due) do
  redis.call('ZREM', KEYS[1], job)
  redis.call('RPUSH', KEYS[2], job)
end
return #due`)

// reapScript hands a dead worker's processing list (KEYS[1]) back to the
// ready list (KEYS[3]), next in line, but only if the owner's heartbeat key
// (KEYS[2]) is still missing when it runs: checking and moving in one script
// means an owner that comes back in between keeps its job, and two reapers
// never move the same job. -1: the owner is alive.
var reapScript = redis.NewScript(3, `
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
local n = 0
while redis.call('LMOVE', KEYS[1], KEYS[3], 'RIGHT', 'RIGHT') do n = n + 1 end
return n`)

// queue is one slot's view of the queue, over its own Redis connection
// (BLMOVE blocks the connection, so slots cannot share one).
type queue struct {
	url        string
	prefix     string
	ready      string
	delayed    string
	done       string
	dlq        string
	processing string
	conn       redis.Conn // nil until needed, and again after a network error
}

func newQueue(url, prefix, worker string, slot int) *queue {
	return &queue{
		url:        url,
		prefix:     prefix,
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

func aliveKey(prefix, worker string) string {
	return prefix + ":worker:" + worker + ":alive"
}

// c returns the slot's connection, dialling it first if needed.
func (q *queue) c() (redis.Conn, error) {
	if q.conn == nil {
		c, err := dial(q.url)
		if err != nil {
			return nil, err
		}
		q.conn = c
	}
	return q.conn, nil
}

// do runs one command. After a network error (redigo marks the connection
// with Err()) the connection is dropped, so the next call starts on a fresh
// one; an error reply (redis.Error) leaves it usable.
func (q *queue) do(cmd string, args ...interface{}) (interface{}, error) {
	c, err := q.c()
	if err != nil {
		return nil, err
	}
	v, err := c.Do(cmd, args...)
	q.check()
	return v, err
}

func (q *queue) check() {
	if q.conn != nil && q.conn.Err() != nil {
		q.conn.Close()
		q.conn = nil
	}
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
		if err != nil || v == nil { // nil: the list is empty
			return n, err
		}
		n++
	}
}

// take promotes due delayed jobs, then waits up to 0.2 s for a ready job and
// moves it to the processing list. ok is false when none came.
func (q *queue) take() (raw string, ok bool, err error) {
	c, err := q.c()
	if err != nil {
		return "", false, err
	}
	defer q.check()
	if _, err := promoteScript.Do(c, q.delayed, q.ready, time.Now().UnixMilli(), 100); err != nil {
		return "", false, fmt.Errorf("promote: %w", err)
	}
	raw, err = redis.String(c.Do("BLMOVE", q.ready, q.processing, "RIGHT", "LEFT", "0.2"))
	if err == redis.ErrNil { // nothing ready within 0.2 s
		return "", false, nil
	}
	if err != nil {
		return "", false, err
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
		[]interface{}{"LREM", q.processing, 1, raw},
		[]interface{}{"SADD", q.done, id},
	)
}

// requeue delays the job: the same raw string becomes a delayed-set member,
// due at now+delay. No attempt is counted here: sluice counts attempts per
// idempotency key.
func (q *queue) requeue(raw string, delay time.Duration) error {
	due := time.Now().Add(delay).UnixMilli()
	return q.transaction(
		[]interface{}{"ZADD", q.delayed, due, raw},
		[]interface{}{"LREM", q.processing, 1, raw},
	)
}

func (q *queue) deadLetter(raw, entry string) error {
	return q.transaction(
		[]interface{}{"LPUSH", q.dlq, entry},
		[]interface{}{"LREM", q.processing, 1, raw},
	)
}

// transaction pipelines MULTI, the commands and EXEC in one round trip. A
// command Redis refuses (a wrong argument) aborts the whole transaction.
func (q *queue) transaction(cmds ...[]interface{}) error {
	c, err := q.c()
	if err != nil {
		return err
	}
	defer q.check()
	c.Send("MULTI")
	for _, cmd := range cmds {
		c.Send(cmd[0].(string), cmd[1:]...)
	}
	results, err := redis.Values(c.Do("EXEC"))
	if err != nil {
		return fmt.Errorf("EXEC: %w", err)
	}
	for i, r := range results {
		if e, bad := r.(redis.Error); bad {
			return fmt.Errorf("%s: %w", cmds[i][0], e)
		}
	}
	return nil
}

// heartbeat (re)sets this worker's heartbeat key, alive for ttl.
func heartbeat(c redis.Conn, prefix, worker string, ttl time.Duration) error {
	_, err := c.Do("SET", aliveKey(prefix, worker), time.Now().Unix(), "PX", ttl.Milliseconds())
	return err
}

// reap moves back to the ready list the jobs of every processing list whose
// owner's heartbeat is gone, and returns how many it moved. A processing list
// is <prefix>:processing:<worker>-<slot>; the worker id may itself contain
// dashes (pod names do), the slot is after the last one.
func reap(c redis.Conn, prefix, self string, logf func(string, ...interface{})) (int, error) {
	match := prefix + ":processing:"
	var keys []string
	for cursor := 0; ; {
		v, err := redis.Values(c.Do("SCAN", cursor, "MATCH", match+"*", "COUNT", 100))
		if err != nil {
			return 0, err
		}
		page, _ := redis.Strings(v[1], nil)
		keys = append(keys, page...)
		if cursor, _ = redis.Int(v[0], nil); cursor == 0 {
			break
		}
	}
	moved := 0
	for _, key := range keys {
		owner := strings.TrimPrefix(key, match)
		if i := strings.LastIndexByte(owner, '-'); i >= 0 {
			owner = owner[:i]
		}
		if owner == self {
			continue
		}
		n, err := redis.Int(reapScript.Do(c, key, aliveKey(prefix, owner), prefix+":ready"))
		if err != nil {
			return moved, err
		}
		if n > 0 {
			moved += n
			logf("reaped %d job(s) of %s (no heartbeat) from %s", n, owner, key)
		}
	}
	return moved, nil
}
