/* The Lua scripts of the Redis backend. A record is stored as record.h's
 * binary value (the same bytes as in RocksDB), so the scripts work on its
 * fixed fields by offset (1-based, version 5; version 2 lacks the lease,
 * its status starting at 72; version 3 ends its fixed part with the
 * lease, version 4 with the verification mark):
 *
 *   1 version   2 state   3 flags   4..7 attempt   8..15 expires_ms
 *   16..23 created_ms   24..31 lease_expires_ms   32..39 completed_ms
 *   40..71 fingerprint   72..79 lease (the fence)   80.. status, headers,
 *   body (v3); v4, v5: 80 the mark (enum verify_state), 81..88 its
 *   deadline, then (v4) 89.. status, headers, body; v5: 89..120 the
 *   holder's id (NUL-padded; all NUL: not known), 121.. status, headers,
 *   body
 *
 * A record of any of them is read. A lease is written as v5 (C encodes it
 * with this process as its holder, and a verification's claim names its
 * verifier there), so a lease is one key and one write; a completed record
 * as C encodes it (v3, or v4 when a lookup completed it), so earlier
 * releases read every replay.
 *
 * Records of version 2 (written by an earlier release) are read, taken
 * over and replayed; they have no fence, so no lease of this release
 * matches one: a holder of this release never holds a version 2 lease.
 *
 * Every write sets the key's expiry in the same command (SET's PXAT and
 * PX, KEEPTTL: Redis 6.2 or later), and a record's expiry is always its
 * expires_ms, so a script that must put a value back knows the expiry it
 * had from the value itself.
 *
 * Times travel as 8 little-endian bytes and are compared as the numbers
 * struct.unpack reads (ms), one C call each, never with Lua's string '<'
 * (strcoll: Redis sets the locale). A double holds every time below 2^53 ms
 * (year 287,000) exactly and rounds the larger (a saturated expiry) in
 * order, so a comparison with now, the only kind the scripts make, is
 * exact. What needs arithmetic or a message (remaining lease, decoding
 * a replay) is left to C: a script answers a one-letter verdict and, where
 * the caller needs it, the record as it was or as written:
 *   A acquired (the new record)
 *   H held (the record)           D done (the record)
 *   M fingerprint mismatch        N no live record      E already completed
 *   S a later attempt holds it (the record)             O written
 *   X a value this script cannot read (the value: C decodes it for the
 *     error)
 *   R the permit refused (PERMIT_LEASE; the record or '', wait, paused)
 * and PERMIT_LEASE answers a fresh key's lease with the permit's wait
 * alone, no letter. */
#include "store/redis_scripts.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>

/* Functions of every record script. KEYS[1] is the record (of a script
 * that serves several, each function is given its own). */
#define RECORD_FNS                                                           \
    /* The time at byte i of s (8 bytes, little-endian) as a number. */    \
    "local function ms(s, i)\n"                                              \
    "  return (struct.unpack('<I8', s, i))\n"                                \
    "end\n"                                                                  \
    /* One command: the value and its expiry (PXAT ms; '0': none), at k \
     * (KEYS[1] when not given). */                                         \
    "local function save(v, at, k)\n"                                        \
    "  k = k or KEYS[1]\n"                                                   \
    "  if at ~= '0' then redis.call('SET', k, v, 'PXAT', at)\n"              \
    "  else redis.call('SET', k, v) end\n"                                   \
    "end\n"                                                                  \
    "local function readable(r)\n"                                           \
    "  local v = r:byte(1)\n"                                                \
    "  return (v == 5 and #r >= 130) or (v == 4 and #r >= 98) or\n"         \
    "         (v == 3 and #r >= 89) or (v == 2 and #r >= 81)\n"              \
    "end\n"                                                                  \
    /* The fence of r's lease: '' for version 2, matching none. */         \
    "local function fence(r)\n"                                             \
    "  if r:byte(1) >= 3 then return r:sub(72, 79) end\n"                   \
    "  return ''\n"                                                          \
    "end\n"                                                                  \
    /* The live record at k at now (ms): its value, or false when absent  \
     * or expired; false and the value when this cannot read it. */        \
    "local function live_at(k, now)\n"                                       \
    "  local r = redis.call('GET', k)\n"                                     \
    "  if r and not readable(r) then return false, r end\n"                  \
    "  if r and ms(r, 8) <= now then return false end\n"                     \
    "  return r\n"                                                           \
    "end\n"

/* ARGV[1] is now (8 bytes), wall its time. cur: the live record; false
 * when absent or expired at now. */
#define PRELUDE                                                              \
    RECORD_FNS                                                               \
    "local wall = ms(ARGV[1], 1)\n"                                          \
    "local cur, bad = live_at(KEYS[1], wall)\n"                              \
    "if bad then return {'X', bad} end\n"

/* Waiting duplicates (contract §6, fleet mode): a script that ends the
 * lease of r, the record as it was (a completion, a release, a
 * verification's result), publishes the
 * key when a duplicate's WATCH marked the record (flags bits 2 and 3,
 * record.h), on its policy's channel <prefix>{<scope>}:done, sharded with
 * bit 3 (a Cluster: the channel's hash tag is the record's, so its slot
 * too). Unmarked, the common case, it costs one byte's test. k (KEYS[1]
 * when not given) is <prefix>{<scope>}:k:<key>, and a prefix holds no
 * brace. */
#define NOTIFY_DONE                                                          \
    "local function notify_done(r, k)\n"                                    \
    "  local f = r:byte(3)\n"                                               \
    "  if bit.band(f, 12) == 0 then return end\n"                           \
    "  k = k or KEYS[1]\n"                                                  \
    "  local p = k:find('}:k:', 1, true)\n"                                 \
    "  if not p then return end\n"                                          \
    "  local ch, key = k:sub(1, p) .. ':done', k:sub(p + 4)\n"              \
    "  if bit.band(f, 8) ~= 0 then redis.call('SPUBLISH', ch, key)\n"       \
    "  else redis.call('PUBLISH', ch, key) end\n"                           \
    "end\n"

/* A claim on a key and the lease it takes, as functions (the keyed
 * request's script runs them for each request it serves).
 *
 * Holders (contract §11). A v5 lease names the process responsible for it
 * (the one that took it, or the one verifying it); me is this process's id
 * and live the prefix of the scope's liveness keys
 * (<prefix>{<scope>}:live:<id>, refreshed by each live sidecar). A lease
 * that names none (taken by an earlier release) counts as held by a live
 * process: nothing is inferred from what is not known; nor is this
 * process ever gone to itself (its own key may lapse while Redis is
 * unreachable, but it knows its requests are still out).
 *
 * claim_check: r the live record (false: none), fp the request's
 * fingerprint, now (8 bytes): a different request, a result, or another's
 * live lease answers the claim (its reply); a held lease's answer says
 * whether its holder is gone (1) or not (0). nil: the key may be taken.
 *
 * take_lease: the lease to write over r, from `new`, the record a new key
 * gets (attempt 1, created now, its lease and expiry set, this process its
 * holder); a takeover keeps the record's created_ms and counts one more
 * attempt. The holder is in the record, so it lasts exactly as long as
 * the lease it names. */
#define CLAIM_FNS                                                            \
    "local function holder_gone(r, me, live)\n"                             \
    "  if r:byte(1) ~= 5 then return 0 end\n"                                \
    "  local h = (r:sub(89, 120):gsub('%z+$', ''))\n"                        \
    "  if h ~= '' and h ~= me and\n"                                         \
    "     redis.call('EXISTS', live .. h) == 0 then return 1 end\n"          \
    "  return 0\n"                                                           \
    "end\n"                                                                  \
    "local function claim_check(r, fp, now, me, live)\n"                    \
    "  if not r then return nil end\n"                                       \
    "  if r:sub(40, 71) ~= fp then return {'M'} end\n"                       \
    "  if r:byte(2) == 2 then return {'D', r} end\n"                         \
    "  if ms(r, 24) > now then\n"                                            \
    "    return {'H', r, holder_gone(r, me, live)}\n"                        \
    "  end\n"                                                                \
    "  return nil\n"                                                         \
    "end\n"                                                                  \
    "local function take_lease(r, new)\n"                                   \
    "  if not r then return new end\n"                                       \
    "  local n = struct.unpack('<I4', r, 4)\n"                               \
    "  if n < 4294967295 then n = n + 1 end\n"                               \
    "  return new:sub(1, 3) .. struct.pack('<I4', n) .. new:sub(8, 15) ..\n" \
    "         r:sub(16, 23) .. new:sub(24)\n"                                \
    "end\n"

/* The GCRA of a shared bucket (redis_bucket.c has its keys and its value):
 * the theoretical arrival time tat and the pause's end pu, and for a
 * policy that follows its partner's quota the newest advertised numbers
 * qt, qtau and when they were advertised qa, and when those numbers change
 * next (their reset qr, in Redis's clock) to which (qn, qntau, from the
 * news of Unix ms qra) after how long a quiet time qg (none: 0), as one
 * string "tat:pu[:qt:qtau:qa[:qr:qn:qntau:qra[:qg]]]" (decimals), read
 * with one GET and written with one
 * SET that sets its expiry too. An absent key is a full bucket. A hash
 * there is the form of an earlier release: read the same (its fields have
 * these names), and replaced by the string at the next write, so a fleet
 * that upgrades carries its buckets over instead of starting them full.
 * Times in microseconds of Redis's clock; the rules are policies/gcra.h's. */
#define BUCKET                                                               \
    "local function redis_now()\n"                                           \
    "  local t = redis.call('TIME')\n"                                       \
    "  return tonumber(t[1]) * 1000000 + tonumber(t[2])\n"                   \
    "end\n"                                                                  \
    "local function bucket_get(bk)\n"                                        \
    "  local s, f = redis.pcall('GET', bk), {}\n"                            \
    "  if type(s) == 'table' and s.err then\n"                               \
    "    f = redis.call('HMGET', bk, 'tat', 'pu', 'qt', 'qtau', 'qa')\n"     \
    "  elseif s then\n"                                                      \
    "    for x in s:gmatch('[^:]+') do f[#f + 1] = x end\n"                  \
    "  end\n"                                                                \
    "  local b = {tat = tonumber(f[1]) or 0, pu = tonumber(f[2]) or 0,\n"    \
    "             qt = tonumber(f[3]), qtau = tonumber(f[4]),\n"             \
    "             qa = tonumber(f[5]), qr = tonumber(f[6]),\n"               \
    "             qn = tonumber(f[7]), qntau = tonumber(f[8]),\n"            \
    "             qra = tonumber(f[9]), qg = tonumber(f[10]) or 0}\n"       \
    "  if not (b.qa and b.qn and b.qntau and b.qra) then b.qr = nil end\n"   \
    "  return b\n"                                                           \
    "end\n"                                                                  \
    /* Kept until the bucket would be full again and its pause over (1 s   \
     * more); what was advertised outlives a full bucket (10 min), so a    \
     * quiet fleet does not forget it. */                                    \
    "local function bucket_put(bk, b, now)\n"                                \
    "  local v = string.format('%.0f:%.0f', b.tat, b.pu)\n"                  \
    "  local keep = math.floor((math.max(b.tat, b.pu) - now) / 1000) + 1000\n" \
    "  if b.qa then\n"                                                       \
    "    v = v .. string.format(':%.0f:%.0f:%.0f', b.qt, b.qtau, b.qa)\n"    \
    "    if b.qr then\n"                                                     \
    "      v = v .. string.format(':%.0f:%.0f:%.0f:%.0f:%.0f', b.qr, b.qn,\n"  \
    "                             b.qntau, b.qra, b.qg)\n"                    \
    "    end\n"                                                              \
    "    keep = math.max(keep, 600000)\n"                                    \
    "  end\n"                                                                \
    "  redis.call('SET', bk, v, 'PX', math.max(keep, 1))\n"                  \
    "end\n"                                                                  \
    /* Reserves the start max(now, tat - tau) and moves tat to max(tat,    \
     * now) + T, or refuses without reserving when the start is beyond     \
     * maxw. Answers (reserved, wait, paused); the caller writes b. The    \
     * maxima are comparisons, not math.max: a joined call runs this once  \
     * per request, and each C call costs Redis more than the arithmetic. */ \
    "local function reserve(b, T, tau, maxw, now)\n"                         \
    "  local tat = b.tat\n"                                                  \
    "  local start = tat - tau\n"                                            \
    "  if start < now then start = now end\n"                                \
    "  local wait = start - now\n"                                           \
    "  if wait > maxw then\n"                                                \
    "    if b.pu > now then return false, wait, 1 end\n"                     \
    "    return false, wait, 0\n"                                            \
    "  end\n"                                                                \
    "  if tat < now then tat = now end\n"                                    \
    "  b.tat = tat + T\n"                                                    \
    "  return true, wait, 0\n"                                               \
    "end\n"

/* ARGV: now, fingerprint, the new key's record, PXAT ms, this process's
 * id, the liveness keys' prefix. */
static const char ACQUIRE[] =
    PRELUDE
    CLAIM_FNS
    "local na = #ARGV\n"
    "local r = claim_check(cur, ARGV[2], wall, ARGV[na - 1], ARGV[na])\n"
    "if r then return r end\n"
    "local new = take_lease(cur, ARGV[3])\n"
    "save(new, ARGV[4])\n"
    "return {'A', new}\n";

/* KEYS[1] a shared bucket; ARGV: T, tau, max_wait (µs), and for a policy
 * that follows its partner's quota, when T and tau were advertised (Unix
 * ms), when they change next (µs from now, 0: no change known), the T and
 * tau after that change and its Unix ms (redis_bucket.c). The bucket keeps
 * the newest numbers and their next change; an older caller paces to
 * those, and once that change has come, to the numbers after it: a
 * sidecar that read nothing yet (it joined late, or its traffic is
 * light) paces to the window after a reset, not to the end of the one
 * before, when little was left (min_rate at worst). New numbers re-time
 * the bucket as a local bucket's tokens follow a change of its rate and
 * capacity (policies/tbucket.h): the tokens it holds, (tau - (tat - now)) / T
 * + 1 at the old numbers (fewer than one: starts reserved ahead), stay as
 * many at the new ones, and above the new capacity are dropped. Kept as a
 * wait instead (tat alone scaled), a capacity that falls as a window runs
 * out (it is at most what remains) turned a burst at the window's start
 * into a hole at its end, where the permits left were lost; and starts
 * reserved at a low rate held the next window back as long as that rate
 * gave them. A pause keeps its end, the partner's word: the tokens are
 * counted from it, so the first start after it is still its end, and
 * only the starts reserved past it are re-timed (counted from now, a
 * pause's wait read as starts reserved at the old rate stretched by a
 * lower one: a quiet time of 1 s at 10/s became 3.4 s at 2.3/s). ARGV[9]
 * '1': the caller's answer (newer than the bucket's news) left one permit,
 * which goes at once: the bucket holds one token (policies/quota.h's
 * top-up; its f counts the fleet's requests in flight, so the partner
 * allows it), unless the set of requests in flight holds more than
 * ARGV[12], the count that answer was read with: a permit granted since
 * (another sidecar's) took the one left. KEYS[2], ARGV[10], ARGV[11]: the set of the bucket's
 * requests in flight, the caller's name there and how long after its start
 * it may stay (its sidecar gone): a granted permit puts it there
 * (FLIGHT_END takes it out); without KEYS[2] the three are empty. ARGV[13]
 * the quiet time the next change starts (µs; 0: none), ARGV[14] the
 * caller's own, from now: the window's remaining permits are spent (by a
 * second before a reset in whole seconds, policies/quota.h) and nothing
 * starts until its reset, when the numbers after it begin with one token,
 * never a burst: tat at least the quiet time's end + tau. A quiet time is
 * a pause, as an advertised r = 0 is (a refusal in it answers paused): a
 * sidecar of an earlier release reads it as one, and no rate of its GCRA
 * numbers says "none until then" (a rate of 0 has no T; min_rate would
 * start one more there, past what remains). An answer that comes within
 * it, newer, does not end it. Answers {granted, wait µs, paused}. */
static const char PERMIT[] =
    BUCKET
    "local now = redis_now()\n"
    "local b = bucket_get(KEYS[1])\n"
    "local T, tau, advertised = tonumber(ARGV[1]), tonumber(ARGV[2]), false\n"
    "local function retime(to, totau)\n"
    "  if not (b.qt and b.qt > 0 and b.qtau and to > 0) or\n"
    "     (b.qt == to and b.qtau == totau) then return end\n"
    "  local from = math.max(now, b.pu)\n"
    "  local n = math.min(b.qtau, b.qtau - (b.tat - from)) / b.qt\n"
    "  n = math.min(n, totau / to)\n"
    "  b.tat = math.ceil(from + totau - n * to)\n"
    "end\n"
    "local function quiet_until(t)\n"
    "  if t > now then b.pu = math.max(b.pu, t) end\n"
    "  b.tat = math.max(b.tat, t + b.qtau)\n"
    "end\n"
    "local up = ARGV[9] == '1' and tonumber(ARGV[4]) > (b.qa or 0) and KEYS[2] and\n"
    "           redis.call('ZCARD', KEYS[2]) <= tonumber(ARGV[12] or '-1')\n"
    "local quiet = 0\n"
    "if ARGV[4] then\n"
    "  if b.qr and now >= b.qr then\n"
    "    local from = b.qr + b.qg\n"
    "    retime(b.qn, b.qntau)\n"
    "    b.qt, b.qtau, b.qa, b.qr, advertised = b.qn, b.qntau, b.qra, nil, true\n"
    "    if b.qg > 0 then quiet_until(from) end\n"
    "  end\n"
    "  if tonumber(ARGV[4]) >= (b.qa or 0) then\n"
    "    local ri = tonumber(ARGV[5] or '0') or 0\n"
    "    retime(T, tau)\n"
    "    b.qt, b.qtau, b.qa, b.qr, advertised = T, tau, tonumber(ARGV[4]), nil, true\n"
    "    if ri > 0 then\n"
    "      b.qr, b.qn = now + ri, tonumber(ARGV[6])\n"
    "      b.qntau, b.qra = tonumber(ARGV[7]), tonumber(ARGV[8])\n"
    "      b.qg = tonumber(ARGV[13] or '0') or 0\n"
    "    end\n"
    "    quiet = tonumber(ARGV[14] or '0') or 0\n"
    "  elseif b.qt then\n"
    "    T, tau = b.qt, b.qtau\n"
    "  end\n"
    "end\n"
    "if up and b.pu <= now and b.tat - tau > now then b.tat = now + tau end\n"
    "if quiet > 0 then quiet_until(now + quiet) end\n"
    "local ok, wait, paused = reserve(b, T, tau, tonumber(ARGV[3]), now)\n"
    "if ok or advertised then bucket_put(KEYS[1], b, now) end\n"
    "if ok and KEYS[2] then\n"
    "  local keep = math.floor(wait / 1000) + tonumber(ARGV[11])\n"
    "  redis.call('ZADD', KEYS[2], math.floor(now / 1000) + keep, ARGV[10])\n"
    "  redis.call('PEXPIRE', KEYS[2], keep + 1000)\n"
    "end\n"
    "if ok then return {1, wait, 0} end\n"
    "return {0, wait, paused}\n";

/* Keyed requests' lookups, permits and leases, one round trip for each
 * (contract §10), and one script call for as many requests of one bucket
 * as a sidecar's loop has at once (store_redis_async.c joins them: what
 * a script call costs by itself is paid once). KEYS[1] the policy's bucket,
 * KEYS[1 + i] request i's record (one hash tag, one Cluster slot); ARGV:
 * T, tau, max_wait (µs), this process's id, the liveness keys' prefix,
 * then for each request: the new key's record (its created_ms is the
 * caller's now, its fingerprint the request's) and its PXAT ms.
 *
 * Answers each request's answer in order, one after another in one flat
 * array (redis_join.c splits it), each as if the request had come alone
 * right after those before it (their leases and permits): a replay, a
 * mismatch or a live lease answers without a permit (a duplicate spends
 * none); a refused permit writes nothing and answers 'R', the record or
 * '', wait, paused; otherwise the permit is reserved and the lease
 * written: for a key nothing held, the permit's wait alone (an integer,
 * µs: the lease is the record as sent), else 'A', the new record, wait.
 * No table per request: Redis reads every table of a reply for its
 * special fields, which cost it more than the fresh key's whole answer.
 * The caller's lease covers the wait (its record is made so). Redis's
 * clock is read once, the bucket read and written once for all of them.
 *
 * The common request is a fresh key, so it goes first: the permit is
 * reserved and the lease written with SET NX, which answers whether the
 * key was free; when it was not (or the permit was refused) the permit is
 * given back, nothing having been written, and the record read and
 * checked (held). A fresh key costs one command (SET NX), with the
 * bucket's TIME, GET and SET once per call. */
static const char PERMIT_LEASE[] =
    RECORD_FNS
    BUCKET
    CLAIM_FNS
    "local T, tau, maxw = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])\n"
    "local me, live = ARGV[4], ARGV[5]\n"
    "local now = redis_now()\n"
    "local b, taken = bucket_get(KEYS[1]), false\n"
    "local function held(k, new, pxat)\n"
    "  local wall = ms(new, 16)\n"
    "  local cur, bad = live_at(k, wall)\n"
    "  if bad then return {'X', bad} end\n"
    "  local r = claim_check(cur, new:sub(40, 71), wall, me, live)\n"
    "  if r then return r end\n"
    "  local ok, wait, paused = reserve(b, T, tau, maxw, now)\n"
    "  if not ok then return {'R', cur or '', wait, paused} end\n"
    "  taken = true\n"
    "  new = take_lease(cur, new)\n"
    "  save(new, pxat, k)\n"
    "  return {'A', new, wait}\n"
    "end\n"
    "local out, n = {}, 0\n"
    "for i = 2, #KEYS do\n"
    "  local k, o = KEYS[i], 2 * i + 2\n"
    "  local new, pxat = ARGV[o], ARGV[o + 1]\n"
    "  local tat = b.tat\n"
    "  local ok, wait = reserve(b, T, tau, maxw, now)\n"
    "  if ok then\n"
    "    if pxat ~= '0' then ok = redis.call('SET', k, new, 'NX', 'PXAT', pxat)\n"
    "    else ok = redis.call('SET', k, new, 'NX') end\n"
    "  end\n"
    "  if ok then\n"
    "    taken = true\n"
    "    n = n + 1\n"
    "    out[n] = wait\n"
    "  else\n"
    "    b.tat = tat\n"
    "    local r = held(k, new, pxat)\n"
    "    for j = 1, #r do n = n + 1 out[n] = r[j] end\n"
    "  end\n"
    "end\n"
    "if taken then bucket_put(KEYS[1], b, now) end\n"
    "return out\n";

/* Completions, as many as a loop has at once for one slot
 * (store_redis_async.c joins them, redis_join.h): KEYS[i] record i;
 * ARGV[2i - 1], ARGV[2i] its completed record (status, headers, body,
 * times, completed_ms the caller's now, and the completing lease's fence
 * set; attempt, created_ms and fingerprint as the caller knows them from
 * the lease it took, else 0) and PXAT ms. Answers each record's answer,
 * in order, in one flat array as PERMIT_LEASE does: 'O' (written), 'N',
 * 'E', or 'S' or 'X' and the value; each as if it had come alone after
 * those before it. The attempt,
 * created_ms and fingerprint are the stored record's; the first result
 * stays. Fenced: only the lease that holds the key completes it.
 *
 * One command on the common path: the result is written and the old value
 * read back by the same SET (its GET option), and then checked. Why that is
 * safe: the script runs atomically, so no client sees the result before
 * the checks; a check that fails puts the old value back exactly (DEL when
 * there was none; else the same bytes with the expiry they had, which is
 * their expires_ms: every write sets it so) before the script answers.
 * When the caller's attempt or fingerprint differ from the stored ones (it
 * did not know them, or a release under the same lease counted the
 * attempt back), one more SET writes the stored ones in. created_ms needs
 * no check of its own: no script rewrites it under one fence (a takeover
 * draws a new one), and a caller that knows the fingerprint knows it. */
static const char COMPLETE[] =
    NOTIFY_DONE
    RECORD_FNS
    "local function put_back(k, old)\n"
    "  if not old then redis.call('DEL', k) return end\n"
    "  local x = ms(old, 8)\n"
    /* As C's PEXPIREAT_MAX: a saturated expiry is kept without a TTL. */
    "  if x > 0 and x <= 4611686018427387904 then\n"
    "    redis.call('SET', k, old, 'PXAT', string.format('%.0f', x))\n"
    "  else redis.call('SET', k, old) end\n"
    "end\n"
    /* nil: written ('O'); else the answer. One unpack reads the old
     * record's state, flags, attempt and expiry. */
    "local function complete(k, d, at)\n"
    "  local old\n"
    "  if at ~= '0' then old = redis.call('SET', k, d, 'PXAT', at, 'GET')\n"
    "  else old = redis.call('SET', k, d, 'GET') end\n"
    "  if not old then put_back(k, old) return {'N'} end\n"
    "  if not readable(old) then put_back(k, old) return {'X', old} end\n"
    "  local state, flags, attempt, expires = struct.unpack('<BBI4I8', old, 2)\n"
    "  if expires <= ms(d, 32) then put_back(k, old) return {'N'} end\n"
    "  if state == 2 then put_back(k, old) return {'E'} end\n"
    "  if attempt ~= struct.unpack('<I4', d, 4) or old:sub(40, 79) ~= d:sub(40, 79) then\n"
    "    if fence(old) ~= d:sub(72, 79) then put_back(k, old) return {'S', old} end\n"
    "    save(d:sub(1, 3) .. old:sub(4, 7) .. d:sub(8, 15) .. old:sub(16, 23) ..\n"
    "         d:sub(24, 39) .. old:sub(40, 71) .. d:sub(72), at, k)\n"
    "  end\n"
    /* Unmarked, the common case: no call. */
    "  if bit.band(flags, 12) ~= 0 then notify_done(old, k) end\n"
    "end\n"
    "local out, n = {}, 0\n"
    "for i = 1, #KEYS do\n"
    "  local r = complete(KEYS[i], ARGV[2 * i - 1], ARGV[2 * i])\n"
    "  if r then\n"
    "    for j = 1, #r do n = n + 1 out[n] = r[j] end\n"
    "  else\n"
    "    n = n + 1\n"
    "    out[n] = 'O'\n"
    "  end\n"
    "end\n"
    "return out\n";

/* ARGV: now, the releasing lease's fence (8 bytes), the new expires_ms (8
 * bytes), PXAT ms, the attempt count to keep (4 bytes: the releasing
 * attempt, or one less when it never reached the upstream). Fenced: only
 * the lease that holds the key ends it. */
static const char RELEASE[] =
    PRELUDE
    "if not cur then return {'N'} end\n"
    "if cur:byte(2) == 2 then return {'E'} end\n"
    "if fence(cur) ~= ARGV[2] then return {'S', cur} end\n"
    NOTIFY_DONE
    "save(cur:sub(1, 3) .. ARGV[5] .. ARGV[3] .. cur:sub(16, 23) .. ARGV[1] ..\n"
    "     cur:sub(32), ARGV[4])\n"
    "notify_done(cur)\n"
    "return {'O'}\n";

/* KEYS[1] the pause; ARGV: now, until (decimal ms, as stored, so an operator
 * can read it with GET), PXAT ms. A later moment replaces an earlier
 * one, never the reverse. Decimals without leading zeros compare by length,
 * then digit by digit. */
static const char PAUSE_SET[] =
    "local function dec_cmp(a, b)\n"
    "  if #a ~= #b then if #a < #b then return -1 end return 1 end\n"
    "  for i = 1, #a do\n"
    "    local x, y = a:byte(i), b:byte(i)\n"
    "    if x ~= y then if x < y then return -1 end return 1 end\n"
    "  end\n"
    "  return 0\n"
    "end\n"
    "local cur = redis.call('GET', KEYS[1])\n"
    "if cur and dec_cmp(cur, ARGV[1]) > 0 and dec_cmp(cur, ARGV[2]) >= 0 then\n"
    "  return 0\n"
    "end\n"
    "if ARGV[3] ~= '0' then redis.call('SET', KEYS[1], ARGV[2], 'PXAT', ARGV[3])\n"
    "else redis.call('SET', KEYS[1], ARGV[2]) end\n"
    "return 1\n";

/* KEYS[1] the bucket; ARGV: T, tau, pause (µs). pause 0 empties it (the
 * next start no earlier than now + T: gcra_empty); more pauses it until
 * now + pause, then one start per T (gcra_pause_until). Never moves tat or
 * the pause's end back; a followed quota's numbers are kept, and are the
 * T and tau used: its permits are reserved with them (PERMIT), so tat set
 * by the caller's configured tolerance, smaller, let starts before the
 * pause's end (tat - the followed tau). */
static const char BUCKET_PAUSE[] =
    BUCKET
    "local now = redis_now()\n"
    "local b = bucket_get(KEYS[1])\n"
    "local T, tau, pause = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])\n"
    "if b.qa and b.qt and b.qt > 0 and b.qtau then T, tau = b.qt, b.qtau end\n"
    "local from = now + T\n"
    "if pause > 0 then\n"
    "  from = now + pause\n"
    "  b.pu = math.max(b.pu, from)\n"
    "end\n"
    "b.tat = math.max(b.tat, from + tau)\n"
    "bucket_put(KEYS[1], b, now)\n"
    "return 1\n";

/* KEYS[1] a followed quota's set of requests in flight (redis_bucket.c),
 * ARGV[1] one of them, answered or gone: out of the set, with those whose
 * hold ran out (their sidecar died); answers how many are left. */
static const char FLIGHT_END[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "redis.call('ZREM', KEYS[1], ARGV[1])\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"
    "return redis.call('ZCARD', KEYS[1])\n";

/* KEYS[1] the slots; ARGV: holder, limit, hold (ms). 1 when the holder has
 * (or now takes) a slot, 0 when all are held. */
static const char SLOT_TAKE[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local hold = tonumber(ARGV[3])\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"
    "if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 1 end\n"
    "if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end\n"
    "redis.call('ZADD', KEYS[1], string.format('%.0f', now + hold), ARGV[1])\n"
    "if redis.call('PTTL', KEYS[1]) < hold + 1000 then\n"
    "  redis.call('PEXPIRE', KEYS[1], hold + 1000)\n"
    "end\n"
    "return 1\n";

/* ---- verification marks (contract §11; store.h store_verify_*) ----
 * ARGV[1] now, ARGV[2] the lease's fence (8 bytes); each step acts only on
 * that lease while it is in progress: 'N' no live record, 'E' completed,
 * 'S' another lease holds the key (the record), 'L' the lease has ended,
 * 'K' its mark does not allow the step, 'O' written. */
#define VERIFY_CHECKS                                                        \
    "if not cur then return {'N'} end\n"                                     \
    "if cur:byte(2) == 2 then return {'E'} end\n"                            \
    "if fence(cur) ~= ARGV[2] then return {'S', cur} end\n"                  \
    "if ms(cur, 24) <= wall then return {'L'} end\n"                         \
    /* v3 has no mark: none (0). */                                          \
    "local function mark(r)\n"                                               \
    "  if r:byte(1) >= 4 then return r:byte(80) end\n"                       \
    "  return 0\n"                                                           \
    "end\n"                                                                  \
    /* r's holder field; none before v5. */                                  \
    "local function holder(r)\n"                                             \
    "  if r:byte(1) == 5 then return r:sub(89, 120) end\n"                   \
    "  return string.rep('\\0', 32)\n"                                       \
    "end\n"                                                                  \
    /* r (in progress, v3 to v5) as v5 with mark m, deadline dl and holder \
     * h (32 bytes). */                                                      \
    "local function as_v5(r, m, dl, h)\n"                                    \
    "  local v, rest = r:byte(1), r:sub(80)\n"                               \
    "  if v == 5 then rest = r:sub(121) elseif v == 4 then rest = r:sub(89) end\n" \
    "  return string.char(5) .. r:sub(2, 79) .. string.char(m) .. dl .. h ..\n" \
    "         rest\n"                                                        \
    "end\n"                                                                  \
    /* A write that leaves the record's expiry as it is. */                  \
    "local function save_keep(v)\n"                                          \
    "  redis.call('SET', KEYS[1], v, 'KEEPTTL')\n"                           \
    "end\n"

/* ARGV: now, fence, '1' to claim a PENDING mark again (its verifier ended)
 * or '0', the deadline (8 bytes), this process's id. NONE (or, again,
 * PENDING) -> PENDING: one verification of a lease at a time, fleet-wide;
 * the verifier is now the one the record names as responsible for the
 * lease (its liveness is what others look at), until the lease's end. */
static const char VERIFY_CLAIM[] =
    PRELUDE
    VERIFY_CHECKS
    "local m = mark(cur)\n"
    "if not (m == 0 or (ARGV[3] == '1' and m == 1)) then return {'K'} end\n"
    "local me = (ARGV[5] .. string.rep('\\0', 32)):sub(1, 32)\n"
    "save_keep(as_v5(cur, 1, ARGV[4], me))\n"
    "return {'O'}\n";

/* ARGV: now, fence, the completed record (v4: marked FOUND and verified,
 * times set), PXAT ms. As COMPLETE, from a PENDING mark. */
static const char VERIFY_FOUND[] =
    PRELUDE
    VERIFY_CHECKS
    NOTIFY_DONE
    "if mark(cur) ~= 1 then return {'K'} end\n"
    "local d = ARGV[3]\n"
    "save(d:sub(1, 3) .. cur:sub(4, 7) .. d:sub(8, 15) .. cur:sub(16, 23) ..\n"
    "     d:sub(24, 39) .. cur:sub(40, 71) .. d:sub(72), ARGV[4])\n"
    "notify_done(cur)\n"
    "return {'O'}\n";

/* ARGV: now, fence, the new expires_ms (8 bytes), PXAT ms. As
 * RELEASE (the attempt count kept), from a PENDING mark, marked ABSENT. */
static const char VERIFY_ABSENT[] =
    PRELUDE
    VERIFY_CHECKS
    "if mark(cur) ~= 1 then return {'K'} end\n"
    NOTIFY_DONE
    "local r = as_v5(cur, 3, cur:sub(81, 88), holder(cur))\n"
    "save(r:sub(1, 7) .. ARGV[3] .. r:sub(16, 23) .. ARGV[1] .. r:sub(32),\n"
    "     ARGV[4])\n"
    "notify_done(cur)\n"
    "return {'O'}\n";

/* ARGV: now, fence. PENDING -> FAILED; the lease and its expiry kept. */
static const char VERIFY_FAILED[] =
    PRELUDE
    VERIFY_CHECKS
    "if mark(cur) ~= 1 then return {'K'} end\n"
    "save_keep(as_v5(cur, 4, cur:sub(81, 88), holder(cur)))\n"
    "return {'O'}\n";

/* A waiting duplicate's look at its key (contract §6, fleet mode):
 * KEYS[1] the record; ARGV: now, the mark (4, or 12 for the sharded
 * channel: record.h). Answers the value as GET does (nil: none); while the
 * record's lease is live its flags byte gets the mark first, by SETRANGE,
 * which keeps the TTL, so that the script ending the lease publishes the
 * key (NOTIFY_DONE). A takeover's new record carries no mark. */
static const char WATCH[] =
    "local cur = redis.call('GET', KEYS[1])\n"
    "if not cur or #cur < 31 or cur:byte(1) < 2 or cur:byte(2) ~= 1 then\n"
    "  return cur\n"
    "end\n"
    "local live = false\n"
    "for i = 31, 24, -1 do\n"
    "  local x, y = cur:byte(i), ARGV[1]:byte(i - 23)\n"
    "  if x ~= y then live = x > y break end\n"
    "end\n"
    "if not live then return cur end\n"
    "local f = cur:byte(3)\n"
    "local m = bit.bor(f, tonumber(ARGV[2]))\n"
    "if m == f then return cur end\n"
    "redis.call('SETRANGE', KEYS[1], 2, string.char(m))\n"
    "return cur:sub(1, 2) .. string.char(m) .. cur:sub(4)\n";

static const char *const BODIES[SCRIPT_COUNT] = {
    [SCRIPT_ACQUIRE] = ACQUIRE,
    [SCRIPT_COMPLETE] = COMPLETE,
    [SCRIPT_RELEASE] = RELEASE,
    [SCRIPT_PAUSE_SET] = PAUSE_SET,
    [SCRIPT_PERMIT] = PERMIT,
    [SCRIPT_PERMIT_LEASE] = PERMIT_LEASE,
    [SCRIPT_BUCKET_PAUSE] = BUCKET_PAUSE,
    [SCRIPT_SLOT_TAKE] = SLOT_TAKE,
    [SCRIPT_FLIGHT_END] = FLIGHT_END,
    [SCRIPT_VERIFY_CLAIM] = VERIFY_CLAIM,
    [SCRIPT_VERIFY_FOUND] = VERIFY_FOUND,
    [SCRIPT_VERIFY_ABSENT] = VERIFY_ABSENT,
    [SCRIPT_VERIFY_FAILED] = VERIFY_FAILED,
    [SCRIPT_WATCH] = WATCH,
};

static char shas[SCRIPT_COUNT][SCRIPT_SHA_LEN + 1];
static pthread_once_t shas_once = PTHREAD_ONCE_INIT;

static void sha1_hex(const char *s, char out[SCRIPT_SHA_LEN + 1])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;

    EVP_Digest(s, strlen(s), md, &n, EVP_sha1(), NULL);
    for (unsigned int i = 0; i < n && i < SCRIPT_SHA_LEN / 2; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
}

static void compute_shas(void)
{
    for (int i = 0; i < SCRIPT_COUNT; i++)
        sha1_hex(BODIES[i], shas[i]);
}

const char *redis_script_body(enum redis_script s)
{
    return BODIES[s];
}

const char *redis_script_sha(enum redis_script s)
{
    pthread_once(&shas_once, compute_shas);
    return shas[s];
}
