package main

// One job: its JSON payload, the call through sluice, and what the answer
// tells the worker to do (../README.md, "What a worker does with each answer").

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"strconv"
	"strings"
	"time"
)

const (
	// noOutcomeDelay: something other than sluice answered (a wrong
	// SLUICE_URL, a proxy in between). Not the job's fault, not safe to ack.
	noOutcomeDelay = 5 * time.Second
	// unreachableDelay (+ up to unreachableJitter): sluice is restarting.
	// The jitter keeps the delayed jobs from all coming back at once.
	unreachableDelay  = 2 * time.Second
	unreachableJitter = time.Second
	// defaultRequeueDelay: a requeue instruction that names no delay.
	defaultRequeueDelay = time.Second
	maxAnswerBody       = 1 << 20
)

type job struct {
	ID         string          `json:"id"`
	Key        string          `json:"key"`
	Method     string          `json:"method"`
	Path       string          `json:"path"`
	Body       json.RawMessage `json:"body"`
	EnqueuedAt json.Number     `json:"enqueued_at"` // kept as written: the header repeats it
}

func parseJob(raw string) (*job, error) {
	var j job
	if err := json.Unmarshal([]byte(raw), &j); err != nil {
		return nil, err
	}
	if j.ID == "" || j.Method == "" || !strings.HasPrefix(j.Path, "/") {
		return nil, errors.New("id, method and path (starting with /) are required")
	}
	return &j, nil
}

// request builds the HTTP request for a job. The body is the payload's "body"
// value in compact JSON: the same bytes on every delivery, since sluice
// fingerprints the body with the idempotency key.
func (j *job) request(sluiceURL string) (*http.Request, error) {
	var body io.Reader
	if len(j.Body) > 0 && string(j.Body) != "null" {
		var buf bytes.Buffer
		if err := json.Compact(&buf, j.Body); err != nil {
			return nil, err
		}
		body = &buf
	}
	req, err := http.NewRequest(j.Method, sluiceURL+j.Path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if j.Key != "" {
		req.Header.Set("Idempotency-Key", j.Key)
	}
	if j.EnqueuedAt != "" {
		req.Header.Set("Sluice-Enqueued-At", j.EnqueuedAt.String())
	}
	return req, nil
}

type action int

const (
	ack action = iota
	delay
	deadLetter
)

// verdict is what to do with a job after its call.
type verdict struct {
	action  action
	delay   time.Duration // action == delay
	outcome string        // Sluice-Outcome, or "unreachable", "no_outcome", "invalid_job"
	status  int           // HTTP status, 0 without an answer
	reason  string
	attempt int // sluice's attempt count, 0 when it did not say
}

// answerBody holds the fields the worker reads from an answer's JSON body.
// Instructions (requeue, dead_letter) carry reason, delay_ms and attempt;
// sluice's problem+json answers carry reason, title and detail.
type answerBody struct {
	Reason  string  `json:"reason"`
	Title   string  `json:"title"`
	Detail  string  `json:"detail"`
	DelayMS float64 `json:"delay_ms"`
	Attempt int     `json:"attempt"`
}

// call sends the job through sluice and decides what its answer means.
func call(client *http.Client, req *http.Request) verdict {
	resp, err := client.Do(req)
	if err != nil {
		return unreachable(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBody))
	if err != nil {
		// The answer broke off: we cannot know what it said. Try again later;
		// sluice replays a result it already stored.
		return unreachable(err)
	}
	return decide(resp.StatusCode, resp.Header, body)
}

// unreachable: no HTTP answer at all (refused, reset, EOF, timeout). Delay the
// job a little and spend no attempt: sluice is most likely restarting.
func unreachable(err error) verdict {
	jitter := time.Duration(rand.Int63n(int64(unreachableJitter)))
	return verdict{action: delay, delay: unreachableDelay + jitter, outcome: "unreachable", reason: err.Error()}
}

// decide maps an answer to a verdict, per the outcome table.
func decide(status int, header http.Header, body []byte) verdict {
	outcome := header.Get("Sluice-Outcome")
	v := verdict{outcome: outcome, status: status}
	var b answerBody
	// Best effort: a body that is not a JSON object (an upstream's own 400
	// page, say) just leaves the fields empty.
	_ = json.Unmarshal(body, &b)
	switch outcome {
	case "ok", "replayed":
		v.action = ack
	case "requeue":
		v.action, v.reason, v.attempt = delay, b.Reason, b.Attempt
		v.delay = requeueDelay(b.DelayMS, header.Get("Retry-After"))
	case "dead_letter", "permanent_error", "rejected":
		// A human must look: the budget is spent or the request is wrong.
		v.action, v.attempt = deadLetter, b.Attempt
		v.reason = firstNonEmpty(b.Reason, b.Detail, b.Title, outcome)
	default:
		v.action, v.delay, v.outcome = delay, noOutcomeDelay, "no_outcome"
		v.reason = fmt.Sprintf("answer without a known Sluice-Outcome (%q)", outcome)
	}
	return v
}

// requeueDelay: the body's delay_ms, else Retry-After (seconds), else 1 s.
func requeueDelay(delayMS float64, retryAfter string) time.Duration {
	if delayMS >= 1 {
		return time.Duration(delayMS * float64(time.Millisecond))
	}
	if s, err := strconv.Atoi(strings.TrimSpace(retryAfter)); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return defaultRequeueDelay
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// dlqEntry is the dead-letter record of ../README.md.
type dlqEntry struct {
	Job     json.RawMessage `json:"job"`
	Reason  string          `json:"reason"`
	Outcome string          `json:"outcome"`
	Status  int             `json:"status"`
	Attempt int             `json:"attempt"`
}

func dlqRecord(raw string, v verdict) string {
	jobJSON := json.RawMessage(raw)
	if !json.Valid(jobJSON) {
		jobJSON, _ = json.Marshal(raw) // not JSON: keep it as a string
	}
	b, _ := json.Marshal(dlqEntry{Job: jobJSON, Reason: v.reason, Outcome: v.outcome, Status: v.status, Attempt: v.attempt})
	return string(b)
}
