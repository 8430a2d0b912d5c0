-- claim.lua: ack what the consumer has finished, then hand it up to `count` ready messages,
-- each under a visibility deadline (at-least-once: a claim that is not acked in time is
-- redelivered), as far as the queue's controls allow. Acking here saves a consumer pool one
-- round trip per message.
--
-- KEYS[1]  redwheel:{N}:ready        LIST  ids that are due, in due order
-- KEYS[2]  redwheel:{N}:msg          HASH  id -> "<due ms>:<payload>"
-- KEYS[3]  redwheel:{N}:inflight     ZSET  id -> visibility deadline (ms)
-- KEYS[4]  redwheel:{N}:lease        HASH  id -> token of its current claim
-- KEYS[5]  redwheel:{N}:attempts     HASH  id -> deliveries so far
-- KEYS[6]  redwheel:{N}:counts       HASH  'delivered' -> messages handed out so far (take and
--                                          claim); 'expired' -> messages that expired
-- KEYS[7]  redwheel:{N}:stale        HASH  id -> entries of `ready` left by removed messages
-- KEYS[8]  redwheel:{N}:controls     HASH  paused, rate_max, rate_per (ms), max_in_flight,
--                                          priorities, ttls, release_waiters
-- KEYS[9]  redwheel:{N}:prioritized  ZSET  due messages of priority 1..9
-- KEYS[10] redwheel:{N}:priority     HASH  id -> priority (1..9)
-- KEYS[11] redwheel:{N}:expires      ZSET  id -> the time it must be handed out by (ms)
-- KEYS[12] redwheel:{N}:rate         ZSET  the rate window's deliveries (µs)
-- KEYS[13] redwheel:{N}:dead         ZSET  id -> when it died
-- KEYS[14] redwheel:{N}:reason       HASH  id -> why it died
-- KEYS[15] redwheel:{N}:wake         shard channel ('0' when an in-flight slot frees for a
--                                    waiting claim)
-- ARGV[1]  visibility in ms (>= 1), counted from the server's TIME
-- ARGV[2]  a token prefix, unique to this call (the client's random bytes)
-- ARGV[3]  count: the most messages to claim (0..1000; 0 only acks)
-- ARGV[4]  acks: how many (id, token) pairs follow, to ack first, as ack.lua does
-- ARGV[5..] those pairs
--
-- Reply: { gate, expired, deadline, refused, id, value, attempt, token, id, value, … }:
--   gate      0 (open), -1 (paused), -2 (every in-flight slot is taken: max_in_flight), or
--             > 0: µs until the rate limit lets the next delivery through (from this call's
--             TIME). Not 0 only when nothing was claimed.
--   expired   messages this call found past their ttl and made dead letters
--   deadline  the claims' visibility deadline (epoch ms, server clock)
--   refused   how many of the acks were refused (their claim was no longer current)
--   then per message claimed: its id, its stored "<due ms>:<payload>", its attempt number (1
--   on the first delivery), and the token of this claim (ARGV[2] .. ":" .. its index)
--   Nothing claimed gives the first four alone.
--
-- Invariant: an id leaves `ready` (or `prioritized`) and enters `inflight` (with its lease and
-- raised attempt count) in one atomic step, so a consumer that dies at any instant cannot lose
-- it: the transfer script redelivers it when the deadline passes. The message stays in `msg`
-- until it is acked. Higher priorities first, then due order. A paused queue hands out
-- nothing; `inflight` never grows past max_in_flight; no window of rate_per sees more than
-- rate_max deliveries (each is logged in `rate` in the same step); a message past its ttl is
-- never handed out. Entries left by messages removed after their transfer (counted in `stale`
-- by remove.lua; looked up only while `stale` is not empty) and ids whose message is gone are
-- dropped here, at most 100 per call beyond `count`, so the call stays O(count). A call that
-- claims k > 0 messages raises `delivered` in `counts` by k, with one HINCRBY (what
-- `redwheel watch` reads). (pop_ready, gate, now_us, log_deliveries and expired come from
-- ready_pop.lua, expire and release from lifecycle.lua, put in front of this script by
-- scripts.rs.)
local now = now_us()
local now_ms = math.floor(now / 1000)
local deadline = now_ms + tonumber(ARGV[1])
local count = tonumber(ARGV[3])
local refused = 0
local acked = 0
for i = 0, tonumber(ARGV[4]) - 1 do
  local id = ARGV[5 + 2 * i]
  local cur = redis.call('HGET', KEYS[4], id)
  if cur == ARGV[6 + 2 * i] then
    redis.call('ZREM', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[5], id)
    redis.call('HDEL', KEYS[10], id)
    acked = acked + 1
  elseif redis.call('HEXISTS', KEYS[2], id) == 1 then
    refused = refused + 1
  end
end
if acked > 0 then
  release(KEYS[8], KEYS[15])
end
if count == 0 then
  return { 0, 0, deadline, refused }
end
-- One call when the queue has neither stale entries nor controls (the common case).
local c = NO_CONTROLS
local any_stale = false
if redis.call('EXISTS', KEYS[7], KEYS[8]) > 0 then
  c = redis.call('HMGET', KEYS[8], 'paused', 'rate_max', 'rate_per', 'max_in_flight',
    'priorities', 'ttls')
  any_stale = redis.call('EXISTS', KEYS[7]) == 1
end
local slots
if c[4] then
  slots = tonumber(c[4]) - redis.call('ZCARD', KEYS[3])
end
local g, budget = gate(c, KEYS[12], now, slots)
if g ~= 0 then
  if g == -2 then
    redis.call('HSET', KEYS[8], 'release_waiters', '1')
  end
  return { g, 0, deadline, refused }
end
if budget and budget < count then
  count = budget
end
local out = { 0, 0, deadline, refused }
local claimed = 0
local skipped = 0
local died = 0
local prioritized = c[5] and KEYS[9] or nil
while claimed < count and skipped < 100 do
  local id, v, pri_empty = pop_ready(KEYS[1], KEYS[2], KEYS[7], any_stale, prioritized)
  if pri_empty then
    prioritized = nil
  end
  if not id then
    break
  end
  if not v then
    skipped = skipped + 1
  elseif c[6] and expired(KEYS[11], id, now_ms) then
    expire(id, now_ms, KEYS[11], KEYS[13], KEYS[14])
    died = died + 1
    skipped = skipped + 1
  else
    claimed = claimed + 1
    local token = ARGV[2] .. ':' .. claimed
    local attempt = redis.call('HINCRBY', KEYS[5], id, 1)
    redis.call('ZADD', KEYS[3], deadline, id)
    redis.call('HSET', KEYS[4], id, token)
    out[#out + 1] = id
    out[#out + 1] = v
    out[#out + 1] = attempt
    out[#out + 1] = token
  end
end
if claimed > 0 then
  redis.call('HINCRBY', KEYS[6], 'delivered', claimed)
  if c[2] then
    log_deliveries(KEYS[12], now, ARGV[2], claimed)
  end
end
if died > 0 then
  redis.call('HINCRBY', KEYS[6], 'expired', died)
  out[2] = died
end
return out
