-- take.lua: hand the first ready message to one consumer (at-most-once from here), unless
-- the queue's controls say wait.
--
-- KEYS[1]  redwheel:{N}:ready        LIST  ids that are due, in due order
-- KEYS[2]  redwheel:{N}:msg          HASH  id -> "<due ms>:<payload>"
-- KEYS[3]  redwheel:{N}:attempts     HASH  id -> deliveries so far (dropped with the message)
-- KEYS[4]  redwheel:{N}:counts       HASH  'delivered' -> messages handed out so far (take and
--                                          claim); 'expired' -> messages that expired
-- KEYS[5]  redwheel:{N}:stale        HASH  id -> entries of `ready` left by removed messages
-- KEYS[6]  redwheel:{N}:reply:<process>.<slot>  STRING  this request's reply record (TTL)
-- KEYS[7]  redwheel:{N}:controls     HASH  paused, rate_max, rate_per (ms), priorities, ttls
-- KEYS[8]  redwheel:{N}:prioritized  ZSET  due messages of priority 1..9
-- KEYS[9]  redwheel:{N}:priority     HASH  id -> priority (1..9)
-- KEYS[10] redwheel:{N}:expires      ZSET  id -> the time it must be handed out by (ms)
-- KEYS[11] redwheel:{N}:rate         ZSET  the rate window's deliveries (µs)
-- KEYS[12] redwheel:{N}:dead         ZSET  id -> when it died
-- KEYS[13] redwheel:{N}:reason       HASH  id -> why it died
--          (A client that has not seen this queue's controls sends KEYS[1..7] only: a queue
--          without the controls hash needs no more. If the hash is there, the script does
--          nothing and replies { -3, 0 }, and the client sends the request again with all
--          13: Redis builds seven key strings fewer per call in the common case.)
-- ARGV[1]  the request number (grows within the slot)
-- ARGV[2]  how long to keep the reply record, in ms
-- ARGV[3]  a prefix unique to this call (its entry in the rate log)
--
-- Reply: { gate, expired, id, "<due ms>:<payload>" } for the message taken, or
--        { gate, expired } when none was: `ready` and `prioritized` were empty (another
--        consumer won the race) or held only removed ids, or the controls say wait:
--   gate     0 (open), -1 (the queue is paused), -3 (sent with 7 keys to a queue with
--            controls: nothing done, send all 13), or > 0: µs until the rate limit lets the
--            next delivery through (measured from this call's TIME)
--   expired  messages this call found past their ttl and made dead letters
--        The same request sent again (its reply was lost) gets the same message again,
--        from the reply record, and takes nothing more; an old attempt of an earlier
--        request of the slot gets { 0, 0 } and does nothing.
--
-- Invariant: the id leaves `ready` (or `prioritized`) and its `msg` entry is deleted in one
-- atomic step, so each message goes to exactly one consumer and nothing is orphaned. Higher
-- priorities first, then due order. A paused queue hands out nothing; a rate-limited one
-- no more than rate_max in any window of rate_per (the delivery is logged in the same step).
-- A message past its ttl is never handed out. Entries left by messages removed after their
-- transfer (counted in `stale` by remove.lua; looked up only while `stale` is not empty) and
-- ids whose `msg` entry is gone are dropped here, at most 100 per call, so the call stays
-- O(1) however many there are. A message taken raises `delivered` in `counts` by one (what
-- `redwheel watch` reads its delivery rate from), and is recorded, payload included, in the
-- request's reply record: a take whose reply is lost is resent by the client and answered
-- from the record, so no message is lost with a reply.
-- (pop_ready, NO_CONTROLS, now_us, replay and remember come from ready_pop.lua;
-- controls_lib, which defines gate, expired, expire and log_deliveries, from lifecycle.lua:
-- put in front of this script by scripts.rs.)
local seq = tonumber(ARGV[1])
local done = replay(KEYS[6], seq)
if done then
  return { 0, 0, done[2], done[3] }
end
if done == false then
  return { 0, 0 }
end
-- One call when the queue has neither stale entries nor controls (the common case).
local c = NO_CONTROLS
local any_stale = false
local present = redis.call('EXISTS', KEYS[5], KEYS[7])
if present > 0 then
  any_stale = redis.call('EXISTS', KEYS[5]) == 1
  if present > (any_stale and 1 or 0) then
    -- The controls hash is there.
    if #KEYS < 13 then
      -- Sent with the first 7 keys only (the client has not seen controls on this queue):
      -- nothing done, and the client sends the same request again with all 13.
      return { -3, 0 }
    end
    c = redis.call('HMGET', KEYS[7], 'paused', 'rate_max', 'rate_per', 'priorities', 'ttls')
    controls_lib()
  end
end
local now
if c[1] == false and (c[2] or c[5]) then
  now = now_us()
end
if c[1] or c[2] then
  local g = gate(c, KEYS[11], now, nil)
  if g ~= 0 then
    return { g, 0 }
  end
end
local prioritized = c[4] and KEYS[8] or nil
local died = 0
for _ = 1, 100 do
  local id, v, pri_empty = pop_ready(KEYS[1], KEYS[2], KEYS[5], any_stale, prioritized)
  if pri_empty then
    prioritized = nil
  end
  if not id then
    break
  end
  if v then
    if c[5] and expired(KEYS[10], id, math.floor(now / 1000)) then
      expire(id, math.floor(now / 1000), KEYS[10], KEYS[12], KEYS[13])
      died = died + 1
    else
      redis.call('HDEL', KEYS[2], id)
      redis.call('HDEL', KEYS[3], id)
      if c[4] then
        redis.call('HDEL', KEYS[9], id)
      end
      if c[2] then
        log_deliveries(KEYS[11], now, ARGV[3], 1)
      end
      redis.call('HINCRBY', KEYS[4], 'delivered', 1)
      if died > 0 then
        redis.call('HINCRBY', KEYS[4], 'expired', died)
      end
      remember(KEYS[6], { seq, id, v }, ARGV[2])
      return { 0, died, id, v }
    end
  end
end
if died > 0 then
  redis.call('HINCRBY', KEYS[4], 'expired', died)
end
return { 0, died }
