package main

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"
)

func TestDecide(t *testing.T) {
	h := func(kv ...string) http.Header {
		hd := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			hd.Set(kv[i], kv[i+1])
		}
		return hd
	}
	cases := []struct {
		name    string
		status  int
		header  http.Header
		body    string
		action  action
		delay   time.Duration
		reason  string
		attempt int
	}{
		{"ok", 200, h("Sluice-Outcome", "ok"), `{"score":1}`, ack, 0, "", 0},
		{"replayed", 201, h("Sluice-Outcome", "replayed"), ``, ack, 0, "", 0},
		{"requeue delay_ms", 429, h("Sluice-Outcome", "requeue", "Retry-After", "17"),
			`{"action":"requeue","reason":"upstream_429","delay_seconds":17,"delay_ms":16250,"attempt":3}`,
			delay, 16250 * time.Millisecond, "upstream_429", 3},
		{"requeue retry-after", 503, h("Sluice-Outcome", "requeue", "Retry-After", "2"), `not json`,
			delay, 2 * time.Second, "", 0},
		{"requeue bare", 409, h("Sluice-Outcome", "requeue"), ``, delay, time.Second, "", 0},
		{"dead_letter", 429, h("Sluice-Outcome", "dead_letter"),
			`{"action":"dead_letter","reason":"upstream_429","attempt":5}`, deadLetter, 0, "upstream_429", 5},
		{"rejected", 400, h("Sluice-Outcome", "rejected"),
			`{"type":"about:blank","title":"Bad Request","status":400,"detail":"no key"}`, deadLetter, 0, "no key", 0},
		{"permanent upstream body", 400, h("Sluice-Outcome", "permanent_error"), `[1,2]`,
			deadLetter, 0, "permanent_error", 0},
		{"no outcome", 502, h(), `<html>`, delay, noOutcomeDelay, "", 0},
	}
	for _, c := range cases {
		v := decide(c.status, c.header, []byte(c.body))
		if v.action != c.action || v.delay != c.delay || v.attempt != c.attempt ||
			(c.reason != "" && v.reason != c.reason) {
			t.Errorf("%s: got %+v", c.name, v)
		}
	}
}

func TestDLQRecord(t *testing.T) {
	raw := `{"id":"j1","key":"k1","method":"POST","path":"/v1/x","body":{"a":1},"enqueued_at":1.5}`
	var got map[string]interface{}
	if err := json.Unmarshal([]byte(dlqRecord(raw, verdict{outcome: "rejected", status: 400, reason: "r"})), &got); err != nil {
		t.Fatal(err)
	}
	if job, ok := got["job"].(map[string]interface{}); !ok || job["id"] != "j1" {
		t.Errorf("job not embedded as an object: %v", got)
	}
	if got["status"] != 400.0 || got["outcome"] != "rejected" || got["reason"] != "r" {
		t.Errorf("got %v", got)
	}
}
