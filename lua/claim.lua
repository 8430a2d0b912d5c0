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
-- KEYS[8]  redwheel:{N}:reply:<process>.<slot>  HASH  this request's reply record (TTL)
-- KEYS[9]  redwheel:{N}:head         HASH  field `due`: lower bound of every due and deadline
--                                          (head.lua)
-- KEYS[10] redwheel:{N}:controls     HASH  paused, rate_max, rate_per (ms), max_in_flight,
--                                          priorities, ttls, release_waiters
-- KEYS[11] redwheel:{N}:prioritized  ZSET  due messages of priority 1..9
-- KEYS[12] redwheel:{N}:priority     HASH  id -> priority (1..9)
-- KEYS[13] redwheel:{N}:expires      ZSET  id -> the time it must be handed out by (ms)
-- KEYS[14] redwheel:{N}:rate         ZSET  the rate window's deliveries (µs)
-- KEYS[15] redwheel:{N}:dead         ZSET  id -> when it died
-- KEYS[16] redwheel:{N}:reason       HASH  id -> why it died
-- KEYS[17] redwheel:{N}:wake         shard channel ('0' when an in-flight slot frees for a
--                                    waiting claim)
-- ARGV[1]  visibility in ms (>= 1), counted from the server's TIME
-- ARGV[2]  a token prefix, unique to this request (the client's)
-- ARGV[3]  count: the most messages to claim (0..1000; 0 only acks)
-- ARGV[4]  the request number (grows within the slot)
-- ARGV[5]  how long to keep the reply record, in ms
-- ARGV[6]  acks: how many (id, token) pairs follow, to ack first, as ack.lua does
-- ARGV[7..] those pairs
--
-- Reply: { gate, expired, deadline, refused, acked, id, value, attempt, token, id, … }:
--   gate      0 (open), -1 (paused), -2 (every in-flight slot is taken: max_in_flight), or
--             > 0: µs until the rate limit lets the next delivery through (from this call's
--             TIME). Not 0 only when nothing was claimed.
--   expired   messages this call found past their ttl and made dead letters
--   deadline  the claims' visibility deadline (epoch ms, server clock)
--   refused   how many of the acks were refused (their claim was no longer current)
--   acked     how many of the acks deleted their message now (the others found it gone)
--   then per message claimed: its id, its stored "<due ms>:<payload>", its attempt number (1
--   on the first delivery), and the token of this claim (ARGV[2] .. ":" .. its index)
--   Nothing claimed gives the first five alone.
--   The same request sent again (its reply was lost) gets the same answer, from the reply
--   record: the same counts and the same claims (those still current), visible until a
--   deadline counted from now; it acks and claims nothing more and counts no attempt. An old
--   attempt of an earlier request of the slot gets { 0, 0, deadline, 0, 0 } and does nothing.
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
-- `redwheel watch` reads). A call that acked, refused or claimed anything records it in the
-- request's reply record (ids only: the claimed messages stay in `msg`), so a resend after
-- a lost reply neither claims a message for nobody nor counts an attempt twice.
-- (lower_head comes from head.lua; expire and release from lifecycle.lua; pop_ready, gate,
-- now_us, log_deliveries, expired, replay and remember from ready_pop.lua: all put in front
-- of this script by scripts.rs.)
local now = now_us()
local now_ms = math.floor(now / 1000)
local deadline = now_ms + tonumber(ARGV[1])
local count = tonumber(ARGV[3])
local seq = tonumber(ARGV[4])
local done = replay(KEYS[8], seq)
if done == false then
  return { 0, 0, deadline, 0, 0 }
end
if done then
  local again = { 0, 0, deadline, done[2], done[3] }
  for k = 4, #done do
    local id = done[k]
    local token = ARGV[2] .. ':' .. (k - 3)
    local v = redis.call('HGET', KEYS[2], id)
    if v and redis.call('HGET', KEYS[4], id) == token then
      redis.call('ZADD', KEYS[3], 'XX', deadline, id)
      again[#again + 1] = id
      again[#again + 1] = v
      again[#again + 1] = tonumber(redis.call('HGET', KEYS[5], id) or '1')
      again[#again + 1] = token
    end
  end
  return again
end
local refused = 0
local acked = 0
local n_acks = tonumber(ARGV[6])
-- Priorities and waiting claims both live under the controls hash: without it (the common
-- case) an ack has neither a priority entry to delete nor a waiter to wake.
local controlled = n_acks > 0 and redis.call('EXISTS', KEYS[10]) == 1
for i = 0, n_acks - 1 do
  local id = ARGV[7 + 2 * i]
  local cur = redis.call('HGET', KEYS[4], id)
  if cur == ARGV[8 + 2 * i] then
    redis.call('ZREM', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[5], id)
    if controlled then
      redis.call('HDEL', KEYS[12], id)
    end
    acked = acked + 1
  elseif redis.call('HEXISTS', KEYS[2], id) == 1 then
    refused = refused + 1
  end
end
if acked > 0 and controlled then
  release(KEYS[10], KEYS[17])
end
local record = { seq, refused, acked }
-- finish(out): records what this call did (if anything) and returns its reply.
local function finish(out)
  if #record > 3 or acked > 0 or refused > 0 then
    remember(KEYS[8], record, ARGV[5])
  end
  return out
end
if count == 0 then
  return finish({ 0, 0, deadline, refused, acked })
end
-- One call when the queue has neither stale entries nor controls (the common case).
local c = NO_CONTROLS
local any_stale = false
if redis.call('EXISTS', KEYS[7], KEYS[10]) > 0 then
  c = redis.call('HMGET', KEYS[10], 'paused', 'rate_max', 'rate_per', 'max_in_flight',
    'priorities', 'ttls')
  any_stale = redis.call('EXISTS', KEYS[7]) == 1
end
local slots
if c[4] then
  slots = tonumber(c[4]) - redis.call('ZCARD', KEYS[3])
end
local g, budget = gate(c, KEYS[14], now, slots)
if g ~= 0 then
  if g == -2 then
    redis.call('HSET', KEYS[10], 'release_waiters', '1')
  end
  return finish({ g, 0, deadline, refused, acked })
end
if budget and budget < count then
  count = budget
end
local out = { 0, 0, deadline, refused, acked }
local claimed = 0
local skipped = 0
local died = 0
local prioritized = c[5] and KEYS[11] or nil
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
  elseif c[6] and expired(KEYS[13], id, now_ms) then
    expire(id, now_ms, KEYS[13], KEYS[15], KEYS[16])
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
    record[#record + 1] = id
  end
end
if claimed > 0 then
  redis.call('HINCRBY', KEYS[6], 'delivered', claimed)
  lower_head(KEYS[9], deadline)
  if c[2] then
    log_deliveries(KEYS[14], now, ARGV[2], claimed)
  end
end
if died > 0 then
  redis.call('HINCRBY', KEYS[6], 'expired', died)
  out[2] = died
end
return finish(out)
