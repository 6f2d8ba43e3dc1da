// Command worker takes jobs from a Redis delayed queue, calls a partner API
// through the sluice sidecar, and does what each answer's Sluice-Outcome says.
// The contract it follows is ../README.md.
package main

import (
	"context"
	"fmt"
	"log"
	"math/rand"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

type settings struct {
	sluiceURL   string
	redisURL    string
	queue       string
	workerID    string
	concurrency int
	afterCall   time.Duration
	httpTimeout time.Duration
	heartbeat   time.Duration
	logJobs     bool
}

func loadSettings() (settings, error) {
	host, _ := os.Hostname()
	s := settings{
		sluiceURL: strings.TrimRight(env("SLUICE_URL", "http://127.0.0.1:8080"), "/"),
		// REDIS_URL (redis://[:password@]host:port/db) wins; REDIS_ADDR
		// (host:port) is the older setting, still honoured without it.
		redisURL: env("REDIS_URL", "redis://"+env("REDIS_ADDR", "127.0.0.1:6379")),
		queue:    env("QUEUE", "jobs"),
		workerID: env("WORKER_ID", host),
		logJobs:  os.Getenv("LOG") == "1",
	}
	if s.workerID == "" {
		return s, fmt.Errorf("WORKER_ID is empty and the host name is unknown")
	}
	var err error
	if s.concurrency, err = envInt("CONCURRENCY", 4, 1); err != nil {
		return s, err
	}
	afterMS, err := envInt("AFTER_CALL_MS", 0, 0)
	if err != nil {
		return s, err
	}
	s.afterCall = time.Duration(afterMS) * time.Millisecond
	heartbeatMS, err := envInt("HEARTBEAT_MS", 5000, 10)
	if err != nil {
		return s, err
	}
	s.heartbeat = time.Duration(heartbeatMS) * time.Millisecond
	timeout, err := strconv.ParseFloat(env("HTTP_TIMEOUT", "90"), 64)
	if err != nil || timeout <= 0 {
		return s, fmt.Errorf("HTTP_TIMEOUT: want seconds > 0, got %q", os.Getenv("HTTP_TIMEOUT"))
	}
	s.httpTimeout = time.Duration(timeout * float64(time.Second))
	return s, nil
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envInt(name string, def, min int) (int, error) {
	n, err := strconv.Atoi(env(name, strconv.Itoa(def)))
	if err != nil || n < min {
		return 0, fmt.Errorf("%s: want an integer >= %d, got %q", name, min, os.Getenv(name))
	}
	return n, nil
}

type worker struct {
	settings
	client     *http.Client
	sluiceDown atomic.Bool // so that an outage is logged once, not once per job
}

func newWorker(s settings) *worker {
	transport := &http.Transport{
		Proxy:               nil, // sluice is beside us: never go through HTTP_PROXY
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        s.concurrency,
		MaxIdleConnsPerHost: s.concurrency, // one kept-alive connection per slot
		IdleConnTimeout:     90 * time.Second,
	}
	return &worker{settings: s, client: &http.Client{
		Transport: transport,
		Timeout:   s.httpTimeout,
		// A 3xx is the upstream's answer (sluice says ok): following it would
		// call some other host, around sluice.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

func main() {
	s, err := loadSettings()
	if err != nil {
		log.Print(err)
		os.Exit(2)
	}
	log.Printf("worker %s: SLUICE_URL=%s REDIS_URL=%s QUEUE=%s CONCURRENCY=%d AFTER_CALL_MS=%d HTTP_TIMEOUT=%gs HEARTBEAT_MS=%d",
		s.workerID, s.sluiceURL, redactURL(s.redisURL), s.queue, s.concurrency, s.afterCall.Milliseconds(), s.httpTimeout.Seconds(), s.heartbeat.Milliseconds())
	rand.Seed(time.Now().UnixNano())

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-ctx.Done()
		stop() // a second signal kills at once
		log.Print("stopping: taking no more jobs, finishing the ones in hand")
	}()

	w := newWorker(s)
	queues := make([]*queue, s.concurrency)
	for slot := range queues {
		queues[slot] = newQueue(s.redisURL, s.queue, s.workerID, slot)
	}
	// The heartbeat goes up before anything else: from then on no other worker
	// reaps our lists. With it, the first reap of the lists of workers that
	// went away while none was running; then our own lists (a previous run
	// under this WORKER_ID). The reaper's queue takes no job (slot -1): only
	// its connection is used.
	reaper := newQueue(s.redisURL, s.queue, s.workerID, -1)
	for !w.beatAndReap(reaper, true) {
		if !sleep(ctx, time.Second) {
			return
		}
	}
	w.recoverAll(ctx, queues)
	go w.runReaper(ctx, reaper)

	var wg sync.WaitGroup
	for slot, q := range queues {
		wg.Add(1)
		go func(slot int, q *queue) {
			defer wg.Done()
			defer q.close()
			w.runSlot(ctx, slot, q)
		}(slot, q)
	}
	wg.Wait()
	log.Print("stopped")
}

// recoverAll puts back on the ready list the jobs a previous run of this
// worker (same WORKER_ID) held when it died. Sluice's idempotency record
// makes running them again safe: it replays the result or answers lease_held.
func (w *worker) recoverAll(ctx context.Context, queues []*queue) {
	for _, q := range queues {
		for {
			n, err := q.recover()
			if n > 0 {
				log.Printf("recovered %d job(s) from %s", n, q.processing)
			}
			if err == nil {
				break
			}
			log.Printf("recovering %s: %v (retrying)", q.processing, err)
			if !sleep(ctx, time.Second) {
				return
			}
		}
	}
}

// runReaper refreshes the heartbeat every HEARTBEAT_MS and reaps every 3x that
// (a dead worker's heartbeat, alive for 3x HEARTBEAT_MS, takes that long to
// expire anyway). It stops with ctx; the key then expires by itself.
func (w *worker) runReaper(ctx context.Context, q *queue) {
	defer q.close()
	lastReap := time.Now()
	for sleep(ctx, w.heartbeat) {
		due := time.Since(lastReap) >= 3*w.heartbeat
		if w.beatAndReap(q, due) && due {
			lastReap = time.Now()
		}
	}
}

// beatAndReap refreshes the heartbeat (alive for 3x HEARTBEAT_MS: one or two
// late refreshes do not make a live worker look dead) and, if reapNow, hands
// back the jobs of workers whose heartbeat is gone. It reports success.
func (w *worker) beatAndReap(q *queue, reapNow bool) bool {
	c, err := q.c()
	if err == nil {
		err = heartbeat(c, w.queue, w.workerID, 3*w.heartbeat)
	}
	if err == nil && reapNow {
		_, err = reap(c, w.queue, w.workerID, log.Printf)
	}
	q.check()
	if err != nil {
		log.Printf("heartbeat: redis: %v", err)
	}
	return err == nil
}

// redactURL hides the password of a redis:// URL in the start-up log line.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable)"
	}
	return u.Redacted()
}

// runSlot takes and handles jobs one at a time until ctx is cancelled. A
// waiting job never holds the slot: delays go back to Redis.
func (w *worker) runSlot(ctx context.Context, slot int, q *queue) {
	for ctx.Err() == nil {
		raw, ok, err := q.take()
		if err != nil {
			log.Printf("slot %d: redis: %v", slot, err)
			sleep(ctx, time.Second)
			continue
		}
		if ok && w.handle(ctx, slot, q, raw) == "unreachable" {
			// Every job would meet the same closed port: pause rather than churn the
			// whole queue into the delayed set while sluice restarts.
			sleep(ctx, 500*time.Millisecond)
		}
	}
}

// handle runs one job to its end and returns its outcome. It does not watch ctx
// for the call itself: a job in hand is finished even during shutdown.
func (w *worker) handle(ctx context.Context, slot int, q *queue, raw string) string {
	start := time.Now()
	id := "?"
	var v verdict
	j, err := parseJob(raw)
	if err == nil {
		id = j.ID
		var req *http.Request
		if req, err = j.request(w.sluiceURL); err == nil {
			v = call(w.client, req)
			w.noteReachability(v)
		}
	}
	if err != nil {
		v = verdict{action: deadLetter, outcome: "invalid_job", reason: err.Error()}
	}
	if v.action == ack && w.afterCall > 0 {
		time.Sleep(w.afterCall)
	}
	w.finish(ctx, slot, q, raw, id, v)
	w.logOutcome(slot, id, v, time.Since(start))
	return v.outcome
}

// logOutcome writes the job's line: always for the anomalies, else with LOG=1.
func (w *worker) logOutcome(slot int, id string, v verdict, took time.Duration) {
	switch {
	case v.outcome == "no_outcome" || v.outcome == "invalid_job":
		log.Printf("slot %d: %s: %s %d: %s", slot, id, v.outcome, v.status, v.reason)
	case !w.logJobs:
	case v.action == delay:
		log.Printf("slot %d: %s %s %d %s, delayed %dms (%.3fs)", slot, id, v.outcome, v.status, v.reason, v.delay.Milliseconds(), took.Seconds())
	case v.action == deadLetter:
		log.Printf("slot %d: %s %s %d %s, dead-lettered (%.3fs)", slot, id, v.outcome, v.status, v.reason, took.Seconds())
	default:
		log.Printf("slot %d: %s %s %d (%.3fs)", slot, id, v.outcome, v.status, took.Seconds())
	}
}

// noteReachability logs when sluice stops answering and when it is back.
func (w *worker) noteReachability(v verdict) {
	down := v.outcome == "unreachable"
	if w.sluiceDown.CompareAndSwap(!down, down) {
		if down {
			log.Printf("sluice unreachable, delaying jobs by 2-3 s: %s", v.reason)
		} else {
			log.Print("sluice answers again")
		}
	}
}

// finish moves the job out of the processing list as the verdict says,
// retrying while Redis is unreachable. If we are shutting down and Redis is
// still away, the job stays in the processing list: the next start of this
// worker puts it back on the ready list.
func (w *worker) finish(ctx context.Context, slot int, q *queue, raw, id string, v verdict) {
	for {
		var err error
		switch v.action {
		case ack:
			err = q.ack(raw, id)
		case delay:
			err = q.requeue(raw, v.delay)
		case deadLetter:
			err = q.deadLetter(raw, dlqRecord(raw, v))
		}
		if err == nil {
			return
		}
		log.Printf("slot %d: %s: finishing (%s): %v", slot, id, v.outcome, err)
		if !sleep(ctx, time.Second) {
			log.Printf("slot %d: %s: left in %s for the next start", slot, id, q.processing)
			return
		}
	}
}

// sleep waits d or until ctx is cancelled; it reports whether it slept in full.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
