#!/bin/sh
# The demo's tour: numbered curl commands against the demo (scripts/demo.sh:
# sluice on 127.0.0.1:8080 with the default sidecar.yaml, admin on :9901, the
# stub on :9000), each with the answer to expect. One source, three readers:
#
#   sh scripts/tour.sh print     the tour as scripts/demo.sh prints it; the
#                                README holds the same text
#   sh scripts/tour.sh check WORKER_PORT ADMIN_PORT STUB_PORT
#                                runs every command against those ports instead
#                                and checks each answer; exit 1 at the first
#                                mismatch (tests/e2e/tour.sh, ctest e2e_tour)
#
# So the commands a reader pastes are the commands the test runs. The checks
# assume a fresh sluice and stub, as the test starts them.

# The commands are written in single quotes on purpose: $KEY is for the reader's
# shell (or eval in check mode) to expand, not for this one.
# shellcheck disable=SC2016
set -eu

usage() {
    echo "usage: sh scripts/tour.sh print | check WORKER_PORT ADMIN_PORT STUB_PORT" >&2
    exit 2
}
MODE=${1:-print}
case $MODE in
    print) ;;
    check)
        [ $# -eq 4 ] || usage
        WPORT=$2 APORT=$3 SPORT=$4
        TMP=$(mktemp -d)
        trap 'rm -rf "$TMP"' EXIT
        trap 'exit 1' INT TERM
        OUT=$TMP/out ERR=$TMP/err
        : >"$OUT"
        ;;
    *) usage ;;
esac
checking() { [ "$MODE" = check ]; }

# ---- the tour's vocabulary --------------------------------------------------

STEP="" STEPS=0 CMD=""

# step N TITLE: starts a numbered step (after checking the previous one).
step() {
    passed
    checking || { [ -z "$STEP" ] || echo; printf '# %s. %s\n' "$1" "$2"; }
    STEP="$1. $2"
}

# passed: the step before this point went through all its checks.
passed() {
    if checking && [ -n "$STEP" ]; then
        echo "ok    $STEP"
        STEPS=$((STEPS + 1))
    fi
}

# note TEXT: a comment under a command (what to expect).
note() { checking || printf '#    %s\n' "$1"; }

# assign 'NAME=VALUE': a shell variable later commands use; kept in this shell.
assign() {
    if checking; then eval "$1"; else printf '%s\n' "$1"; fi
}

# run COMMAND: prints it, or runs it on the test's ports with its stdout in
# $OUT. A subshell, so that a command's own `wait` or `exit` stays its own.
run() {
    if ! checking; then
        printf '%s\n' "$1"
        return 0
    fi
    CMD=$(printf '%s\n' "$1" | sed -e "s/127\.0\.0\.1:8080/127.0.0.1:$WPORT/g" \
        -e "s/127\.0\.0\.1:9901/127.0.0.1:$APORT/g" -e "s/127\.0\.0\.1:9000/127.0.0.1:$SPORT/g")
    rc=0
    (eval "$CMD") >"$OUT" 2>"$ERR" || rc=$?
    [ "$rc" -eq 0 ] || fail "the command exited $rc"
}

fail() {
    {
        echo "FAIL  $STEP"
        echo "      command: $CMD"
        echo "      $1"
        echo "      --- its output:"
        awk '{ print "      " $0 }' "$OUT"
        [ -s "${ERR:-/dev/null}" ] && { echo "      --- stderr:"; awk '{ print "      " $0 }' "$ERR"; }
    } >&2
    exit 1
}

# ---- checks (check mode only) -------------------------------------------------
# $OUT holds `curl -i` output (head, blank line, body) or a bare body (curl -s).

status() { sed -n '1s/^HTTP\/[0-9.]* \([0-9][0-9]*\).*/\1/p' "$OUT"; }
header() { # the value of the first header field NAME in the head, or nothing
    awk -v n="$1" '{ sub(/\r$/, "") } $0 == "" { exit }
        NR > 1 && tolower(substr($0, 1, index($0, ":") - 1)) == tolower(n) {
            v = substr($0, index($0, ":") + 1); sub(/^[ \t]+/, "", v); print v; exit }' "$OUT"
}
body() { # after the head's blank line, or all of it without a head (curl -s)
    awk 'NR == 1 && !/^HTTP\// { b = 1 } b { print; next } /^\r?$/ { b = 1 }' "$OUT"
}
# JSON fields of a flat object (sluice's instructions, the stub's and admin's answers)
jnum() { printf '%s\n' "$2" | sed -n "s/.*\"$1\":\([0-9][0-9]*\).*/\1/p"; }
jstr() { printf '%s\n' "$2" | sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p"; }

is() { # WHAT GOT WANT
    [ "$2" = "$3" ] || fail "$1: got '$2', expected '$3'"
}
expect_status() { checking || return 0; is "status" "$(status)" "$1"; }
expect_header() { checking || return 0; is "header $1" "$(header "$1")" "$2"; }
expect_no_header() {
    checking || return 0
    [ -z "$(header "$1")" ] || fail "header $1 present ('$(header "$1")'), expected none"
}
expect_body() { checking || return 0; is "body" "$(body)" "$1"; }
expect_field() { # NAME VALUE: a field of the JSON body
    checking || return 0
    b=$(body)
    case $2 in
        *[!0-9]*) got=$(jstr "$1" "$b") ;;
        *) got=$(jnum "$1" "$b") ;;
    esac
    is "body field $1" "$got" "$2"
}
expect_no_field() {
    checking || return 0
    case $(body) in *"\"$1\""*) fail "body field $1 present, expected none" ;; esac
}
expect_between() { # WHAT VALUE LOW HIGH
    checking || return 0
    case $2 in '' | *[!0-9]*) fail "$1: got '$2', expected a number" ;; esac
    if [ "$2" -lt "$3" ] || [ "$2" -gt "$4" ]; then fail "$1: got $2, expected $3 to $4"; fi
}

# What reached the demo upstream: the stub's count of requests received.
stub_requests() { jnum requests "$(curl -s "http://127.0.0.1:$SPORT/_stub/stats")"; }
SEEN=0
# expect_upstream_calls N: the stub received N requests since the last call.
expect_upstream_calls() {
    checking || return 0
    now=$(stub_requests)
    is "requests the stub received in this step" "$((now - SEEN))" "$1"
    SEEN=$now
}

# settle: wait until the policy's bucket is full again (its burst, 2 permits),
# as it is by the time a person types the next command. Only the test needs it.
settle() {
    checking || return 0
    i=0
    until curl -s "http://127.0.0.1:$APORT/metrics" |
        grep -q '^sluice_bucket_tokens{policy="demo"} 2$'; do
        i=$((i + 1))
        [ "$i" -le 50 ] ||
            fail "the demo policy's bucket did not come back to its burst of 2 within 5 s"
        sleep 0.1
    done
}

# metric SERIES: the value of one line of /metrics (0 when absent: counters
# at zero are not listed).
metric() {
    v=$(curl -s "http://127.0.0.1:$APORT/metrics" | awk -v s="$1" '$1 == s { print $2 }')
    echo "${v:-0}"
}
requests_total() { # OUTCOME REASON
    metric "sluice_requests_total{route=\"demo\",outcome=\"$1\",reason=\"$2\"}"
}

# ---- the tour -------------------------------------------------------------------

step 1 "Forwarded: the demo upstream echoes the body; sluice adds Sluice-Outcome"
settle
run "curl -i -X POST http://127.0.0.1:8080/demo/hello -H 'Content-Type: text/plain' --data 'hi sluice'"
note "expect: 200, Sluice-Outcome: ok, the body 'hi sluice'"
expect_status 200
expect_header Sluice-Outcome ok
expect_header X-Stub-Target /demo/hello
expect_body "hi sluice"
expect_upstream_calls 1

step 2 "A burst of 8 at once (the demo policy: 2 at once, then 2/s; a wait of 1 s at most)"
note "step 1 spent one of the bucket's 2 permits; it refills at 2/s, so it is full again 0.5 s"
note "later: by the time this is pasted, the burst meets a full bucket (the test waits for it)"
settle
START=$(date +%s%N)
# One echo per answer: curl writes a body and its -w text separately, and
# eight of them would interleave.
run "(for i in 1 2 3 4 5 6 7 8; do echo \"\$(curl -s -X POST http://127.0.0.1:8080/demo/burst --data \"job \$i\" -w ' <- %{http_code} %header{sluice-outcome} after %{time_total}s')\" & done; wait)"
note "expect: about 4 lines 'job N <- 200 ok': 2 at once, then one every 0.5 s (they waited in"
note "        sluice for a permit); the rest at once, each a requeue instruction for the worker:"
note "        {\"action\":\"requeue\",\"reason\":\"rate_limited\",\"delay_ms\":...} <- 429 requeue"
if checking; then
    ELAPSED_MS=$((($(date +%s%N) - START) / 1000000))
    is "lines" "$(wc -l <"$OUT" | tr -d ' ')" 8
    BURST_OK=$(grep -c '^job [1-8] <- 200 ok after ' "$OUT" || true)
    BURST_LIMITED=$(grep -c '^{"action":"requeue","reason":"rate_limited","delay_seconds":[1-9][0-9]*,"delay_ms":[1-9][0-9]*,.*} <- 429 requeue after ' "$OUT" || true)
    is "answers that are 200 ok or 429 rate_limited" "$((BURST_OK + BURST_LIMITED))" 8
    # The bucket's promise: at most burst + rate x t requests start in any t.
    expect_between "forwarded (at most 2 + 2/s x ${ELAPSED_MS} ms)" "$BURST_OK" 2 \
        $((2 + 2 * ELAPSED_MS / 1000))
    expect_between "rate_limited" "$BURST_LIMITED" 1 6
    expect_upstream_calls "$BURST_OK"
fi

step 3 "The partner answers 429 with Retry-After: 30 (the stub does when asked to)"
settle
run "curl -i -X POST http://127.0.0.1:8080/demo/report -H 'X-Stub-Status: 429' -H 'X-Stub-Retry-After: 30'"
note "expect: 429, Sluice-Outcome: requeue, {\"reason\":\"upstream_429\",\"delay_ms\":30000 and a"
note "        jitter,\"attempt\":1,...}: the job goes back to the queue instead of sleeping in"
note "        the worker; the demo policy now pauses for 30 s"
expect_status 429
expect_header Sluice-Outcome requeue
expect_field reason upstream_429
expect_field upstream_status 429
expect_field attempt 1
if checking; then
    # Retry-After plus a jitter of up to max(1 s, 10 %) (docs/contract.md §4)
    expect_between "delay_ms" "$(jnum delay_ms "$(body)")" 30000 33000
    expect_header Retry-After "$(jnum delay_seconds "$(body)")"
fi
expect_upstream_calls 1

step 4 "Within those 30 s: the policy is cooling down, sluice sends nothing"
run "curl -i -X POST http://127.0.0.1:8080/demo/report"
note "expect: 429 at once, Sluice-Outcome: requeue, {\"reason\":\"upstream_cooldown\",...},"
note "        RateLimit-Policy and RateLimit headers describing the policy's bucket"
expect_status 429
expect_header Sluice-Outcome requeue
expect_field reason upstream_cooldown
expect_no_field upstream_status
expect_header RateLimit-Policy '"demo";q=4;w=1'
if checking; then
    # What is left of the pause, then the first permit (granted permits, as a
    # policy that follows its quota has, resume empty: 1 / rate = 0.5 s later).
    expect_between "delay_ms" "$(jnum delay_ms "$(body)")" 20000 30500
fi
expect_upstream_calls 0
run "curl -s http://127.0.0.1:9901/cooldowns"
note "expect: {\"cooldowns\":[{\"policy\":\"demo\",...,\"why\":\"upstream_429\"}]}"
expect_field policy demo
expect_field why upstream_429
run "curl -s -X DELETE http://127.0.0.1:9901/cooldowns/demo"
note "expect: {\"policy\":\"demo\",\"ended\":1}: an operator ended the pause (or wait 30 s)"
expect_body '{"policy":"demo","ended":1}'

step 5 "Idempotency: the same job sent twice reaches the partner once"
settle
assign 'KEY=order-$(date +%s)    # a new key per run: ./data keeps results for 24 h'
run 'curl -i -X POST http://127.0.0.1:8080/demo/orders -H "Idempotency-Key: $KEY" --data "one widget"'
note "expect: 200, Sluice-Outcome: ok; the answer is stored under the key"
expect_status 200
expect_header Sluice-Outcome ok
expect_body "one widget"
expect_upstream_calls 1
if checking; then FIRST_SEQ=$(header X-Stub-Seq); fi
run 'curl -i -X POST http://127.0.0.1:8080/demo/orders -H "Idempotency-Key: $KEY" --data "one widget"'
note "expect: 200, Sluice-Outcome: replayed, Idempotent-Replayed: true, the same body and"
note "        X-Stub-Seq as the first: the stored answer"
expect_status 200
expect_header Sluice-Outcome replayed
expect_header Idempotent-Replayed true
expect_body "one widget"
if checking; then expect_header X-Stub-Seq "$FIRST_SEQ"; fi
expect_upstream_calls 0
run 'curl -s http://127.0.0.1:9000/_stub/keys/$KEY'
note "expect: {...,\"side_effects\":1,\"calls\":1,...}: the demo upstream saw the order once"
expect_field side_effects 1
expect_field calls 1

step 6 "The same key with another body"
run 'curl -i -X POST http://127.0.0.1:8080/demo/orders -H "Idempotency-Key: $KEY" --data "two widgets"'
note "expect: 422, Sluice-Outcome: rejected, a problem+json body with reason key_reused:"
note "        this key was used for another request (a bug in the worker, not a transient failure)"
expect_status 422
expect_header Sluice-Outcome rejected
expect_header Content-Type application/problem+json
expect_field status 422
expect_field reason key_reused
expect_upstream_calls 0

step 7 "A job's last attempt fails: without a key the worker says which attempt this is"
settle
run "curl -i -X POST http://127.0.0.1:8080/demo/report -H 'Sluice-Attempt: 8' -H 'X-Stub-Status: 503'"
note "expect: 503, Sluice-Outcome: dead_letter, {\"reason\":\"upstream_5xx\",\"attempt\":8,"
note "        \"max_attempts\":8,...}, no delay and no Retry-After: send the job to the DLQ"
expect_status 503
expect_header Sluice-Outcome dead_letter
expect_field reason upstream_5xx
expect_field attempt 8
expect_field max_attempts 8
expect_field upstream_status 503
expect_no_field delay_ms
expect_no_header Retry-After
expect_upstream_calls 1

step 8 "The admin port: metrics and the idempotency record"
run "curl -s http://127.0.0.1:9901/metrics | grep '^sluice_requests_total'"
note "expect: one counter per outcome and reason of the steps above, e.g."
note "        sluice_requests_total{route=\"demo\",outcome=\"replayed\",reason=\"none\"} 1"
if checking; then
    is "ok" "$(requests_total ok none)" $((1 + BURST_OK + 1))
    is "requeue, rate_limited" "$(requests_total requeue rate_limited)" "$BURST_LIMITED"
    is "requeue, upstream_429" "$(requests_total requeue upstream_429)" 1
    is "requeue, upstream_cooldown" "$(requests_total requeue upstream_cooldown)" 1
    is "replayed" "$(requests_total replayed none)" 1
    is "dead_letter, upstream_5xx" "$(requests_total dead_letter upstream_5xx)" 1
    # Every request of the tour counted once, whatever its reason: 1 + 8 + 2 + 2 + 1 + 1
    is "all requests" "$(awk '{ n += $2 } END { print n }' "$OUT")" 15
    is "rejected, any reason" "$(awk '/outcome="rejected"/ { n += $2 } END { print n + 0 }' "$OUT")" 1
fi
run 'curl -s http://127.0.0.1:9901/idempotency/demo/$KEY'
note "expect: {\"state\":\"completed\",\"attempt\":1,\"status\":200,...}: the record behind the replay"
expect_field state completed
expect_field attempt 1
expect_field status 200

step 9 "The partner advertises its quota: the demo policy follows it (quota: {follow: true})"
run "curl -s http://127.0.0.1:9901/policies"
note "expect: {\"policies\":{\"demo\":{\"rate\":2,\"effective_rate\":2,...,\"source\":\"config\",...}}}"
expect_field source config
run "curl -s -o /dev/null -X POST http://127.0.0.1:8080/demo/sync -H 'X-Stub-Set-Header: RateLimit-Policy: \"demo\";q=120;w=60' -H 'X-Stub-Set-Header: RateLimit: \"demo\";r=30;t=61'"
note "expect: nothing printed; the demo upstream's answer said: 30 requests left in the next"
note "        61 s, then 120 a minute (the stub sets those headers when asked to)"
expect_upstream_calls 1
run "curl -s http://127.0.0.1:9901/policies"
note "expect: {...\"effective_rate\":0.5,...,\"source\":\"partner\",...,\"advertised\":{...\"remaining\":30,...}}:"
note "        30 spread over the 60 s before the reset's last second (resets come in whole"
note "        seconds); at the reset the rate comes back to 2/s (120 a minute)"
expect_field source partner
if checking; then
    is "effective_rate" "$(body | sed -n 's/.*"effective_rate":\([0-9.]*\).*/\1/p')" 0.5
fi
expect_field remaining 30
passed

if checking; then
    echo "tour: $STEPS passed, 0 failed"
fi
