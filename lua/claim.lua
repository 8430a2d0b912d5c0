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
-- KEYS[8]  redwheel:{N}:reply:<process>.<slot>  STRING  this request's reply record (TTL)
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
--          (A client that has not seen this queue's controls sends KEYS[1..10] only: a queue
--          without the controls hash needs no more. If the hash is there, the script does
--          nothing, acks included, and replies { -3, 0, deadline, 0, 0 }; the client sends
--          the same request again with all 17.)
-- ARGV[1]  visibility in ms (>= 1), counted from the server's TIME
-- ARGV[2]  a token prefix, unique to this request (the client's)
-- ARGV[3]  count: the most messages to claim (0..1000; 0 only acks)
-- ARGV[4]  the request number (grows within the slot)
-- ARGV[5]  how long to keep the reply record, in ms
-- ARGV[6]  acks: how many (id, token) pairs follow, to ack first, as ack.lua does
-- ARGV[7..] those pairs
--
-- Reply: { gate, expired, deadline, refused, acked, id, value, attempt, token, id, … }:
--   gate      0 (open), -1 (paused), -2 (every in-flight slot is taken: max_in_flight), -3
--             (sent with 10 keys to a queue with controls: nothing done), or > 0: µs until
--             the rate limit lets the next delivery through (from this call's TIME). Not 0
--             only when nothing was claimed.
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
-- Several acks, and several claims from a queue with no removed entries, priorities or
-- ttls, touch each key once per call (bulk, bulk_hmget below), not once per message: one
-- HMGET of the leases for the acks, one LPOP of `ready` and one HMGET of `msg` for the
-- claims. One ack or one claim goes the direct way (fewer calls and tables for one).
-- (lower_head comes from head.lua; controls_lib and what it defines (gate, expire, expired,
-- release, log_deliveries) from lifecycle.lua; pop_ready, NO_CONTROLS, now_us, replay and
-- remember from ready_pop.lua: all put in front of this script by scripts.rs.)
-- bulk(cmd, key, list, per) sends `cmd key` over every element of `list` (fields, members,
-- or pairs of them: `per` elements each), in calls of at most BULK items, since unpack() of a
-- long table overflows Lua's C stack. bulk_hmget(key, fields) is HMGET over any number of
-- fields, its reply in their order (false for each missing one).
local BULK = 1000
local function bulk(cmd, key, list, per)
  local n = #list
  local step = BULK * per
  for i = 1, n, step do
    redis.call(cmd, key, unpack(list, i, math.min(n, i + step - 1)))
  end
end
local function bulk_hmget(key, fields)
  local n = #fields
  if n <= BULK then
    return redis.call('HMGET', key, unpack(fields))
  end
  local out = {}
  for i = 1, n, BULK do
    local part = redis.call('HMGET', key, unpack(fields, i, math.min(n, i + BULK - 1)))
    for j = 1, #part do
      out[i + j - 1] = part[j]
    end
  end
  return out
end

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
-- One call when the queue has neither stale entries nor controls (the common case).
local present = redis.call('EXISTS', KEYS[7], KEYS[10])
local has_controls = present > 0 and redis.call('EXISTS', KEYS[10]) == 1
if has_controls and #KEYS < 17 then
  return { -3, 0, deadline, 0, 0 }
end
local any_stale = present > (has_controls and 1 or 0)
local refused = 0
local acked = 0
local n_acks = tonumber(ARGV[6])
-- Priorities and waiting claims both live under the controls hash: without it (the common
-- case) an ack has neither a priority entry to delete nor a waiter to wake.
local controlled = n_acks > 0 and has_controls
if n_acks == 1 then
  -- One ack (a pool of one worker per claimer): the calls of a bulk ack cost more than it.
  local id = ARGV[7]
  if redis.call('HGET', KEYS[4], id) == ARGV[8] then
    redis.call('ZREM', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[5], id)
    if controlled then
      redis.call('HDEL', KEYS[12], id)
    end
    acked = 1
  elseif redis.call('HEXISTS', KEYS[2], id) == 1 then
    refused = 1
  end
elseif n_acks > 1 then
  -- One HMGET of the leases, then one call per key for every ack that matched.
  local ids = {}
  for i = 1, n_acks do
    ids[i] = ARGV[5 + 2 * i]
  end
  local cur = bulk_hmget(KEYS[4], ids)
  local gone, seen = {}, {}
  for i = 1, n_acks do
    local id = ids[i]
    if not seen[id] then
      if cur[i] and cur[i] == ARGV[6 + 2 * i] then
        seen[id] = true
        gone[#gone + 1] = id
      elseif redis.call('HEXISTS', KEYS[2], id) == 1 then
        refused = refused + 1
      end
    end
  end
  acked = #gone
  if acked > 0 then
    bulk('ZREM', KEYS[3], gone, 1)
    bulk('HDEL', KEYS[4], gone, 1)
    bulk('HDEL', KEYS[2], gone, 1)
    bulk('HDEL', KEYS[5], gone, 1)
    if controlled then
      bulk('HDEL', KEYS[12], gone, 1)
    end
  end
end
if acked > 0 and controlled then
  controls_lib()
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
local c = NO_CONTROLS
if has_controls then
  c = redis.call('HMGET', KEYS[10], 'paused', 'rate_max', 'rate_per', 'max_in_flight',
    'priorities', 'ttls')
end
local g, budget = 0, nil
if c ~= NO_CONTROLS then
  controls_lib()
  local slots
  if c[4] then
    slots = tonumber(c[4]) - redis.call('ZCARD', KEYS[3])
  end
  g, budget = gate(c, KEYS[14], now, slots)
end
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
if count > 1 and not any_stale and not prioritized and not c[6] then
  -- Several wanted, and no removed entries to skip, no priorities, no ttls (a pool's claim
  -- in the common case): pop them from `ready` at once, read them with one HMGET, and
  -- register them with one call per key.
  local got, vals, seen = {}, {}, {}
  while #got < count and skipped < 100 do
    local want = count - #got
    local ids = redis.call('LPOP', KEYS[1], want)
    if not ids then
      break
    end
    local vs = bulk_hmget(KEYS[2], ids)
    for j = 1, #ids do
      local id, v = ids[j], vs[j]
      if v and not seen[id] then
        seen[id] = true
        got[#got + 1] = id
        vals[#got] = v
      else
        skipped = skipped + 1
      end
    end
    if #ids < want then
      break
    end
  end
  claimed = #got
  if claimed > 0 then
    local before = bulk_hmget(KEYS[5], got)
    local attempts, deadlines, leases = {}, {}, {}
    local at = string.format('%d', deadline)
    for j = 1, claimed do
      local id = got[j]
      -- (A first delivery stores the string '1': no number to format.)
      local attempt, stored = 1, '1'
      if before[j] then
        attempt = tonumber(before[j]) + 1
        stored = attempt
      end
      local token = ARGV[2] .. ':' .. j
      attempts[2 * j - 1] = id
      attempts[2 * j] = stored
      deadlines[2 * j - 1] = at
      deadlines[2 * j] = id
      leases[2 * j - 1] = id
      leases[2 * j] = token
      out[#out + 1] = id
      out[#out + 1] = vals[j]
      out[#out + 1] = attempt
      out[#out + 1] = token
      record[#record + 1] = id
    end
    bulk('HSET', KEYS[5], attempts, 2)
    bulk('ZADD', KEYS[3], deadlines, 2)
    bulk('HSET', KEYS[4], leases, 2)
  end
else
  -- One message at a time: one wanted (where the bulk calls cost more than they save), or
  -- entries to look at one by one.
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
