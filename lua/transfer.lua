-- transfer.lua: the due work of queue N. Moves up to a batch of due ids from `delayed` to
-- `ready` (or, with a priority, to `prioritized`), handles up to a batch of claims whose
-- visibility expired: back to ready (redelivered, its attempt count rises at the next claim),
-- or, once it has been delivered `max_deliveries` times, to the dead letters; and makes up to
-- a batch of messages whose ttl ran out before they were handed out dead letters ('expired').
--
-- KEYS[1]  redwheel:{N}:delayed      ZSET  id -> due (ms, Redis server clock)
-- KEYS[2]  redwheel:{N}:ready        LIST  ids that are due, in due order
-- KEYS[3]  redwheel:{N}:inflight     ZSET  id -> visibility deadline (ms) of its claim
-- KEYS[4]  redwheel:{N}:lease        HASH  id -> token of its current claim
-- KEYS[5]  redwheel:{N}:msg          HASH  id -> "<due ms>:<payload>"
-- KEYS[6]  redwheel:{N}:attempts     HASH  id -> deliveries so far
-- KEYS[7]  redwheel:{N}:dead         ZSET  id -> when it died (ms)
-- KEYS[8]  redwheel:{N}:reason       HASH  id -> why it died
-- KEYS[9]  redwheel:{N}:controls     HASH  flags: priorities, ttls, release_waiters
-- KEYS[10] redwheel:{N}:prioritized  ZSET  due messages of priority 1..9
-- KEYS[11] redwheel:{N}:priority     HASH  id -> priority (1..9)
-- KEYS[12] redwheel:{N}:expires      ZSET  id -> the time it must be handed out by (ms)
-- KEYS[13] redwheel:{N}:stale        HASH  id -> entries of `ready` left by removed messages
-- KEYS[14] redwheel:{N}:counts       HASH  'expired' -> messages that expired so far
-- KEYS[15] redwheel:{N}:wake         shard channel ('0' when an in-flight slot frees for a
--                                    waiting claim)
-- KEYS[16] redwheel:{N}:head         HASH  field `due`: lower bound of every due and deadline
--                                    (head.lua), set here to the exact earliest one left
--                                    (ttl ends included), or deleted
-- ARGV[1]  batch: the most ids to move, to expire, and to kill by ttl (1..4000; Lua's unpack
--          limit is 8,000)
-- ARGV[2]  max_deliveries (>= 1)
--
-- Reply: one integer (an integer reply is the cheapest the client can read, which matters
--        when thousands of queues are swept in one round trip), packing two numbers:
--          moved + 8192 * wait_us   when a due, a visibility deadline or a ttl is still ahead
--          -(moved + 1)             when nothing is ahead
--        or, only when this call sent messages to the dead letters (rare), the array
--        [that integer, died, expired] so the client can count them.
--   moved     ids moved to ready plus claims expired, at most 2 * batch (< 8192); when either,
--             or the messages expired by ttl, reaches the batch, the reply's wait is 1 µs and
--             the client runs the script again at once
--   wait_us   µs from the server's TIME read by this call (the instant "due <= now" was
--             judged) until the earliest due, visibility deadline or ttl left: at least 1, at
--             most 3.6e9 (an hour; a farther one is looked at again then). The client waits
--             that long from the reply's arrival, which comes after that instant, so it never
--             runs early and needs no clock offset. The product stays below 2^53.
--   died      expired claims that reached max_deliveries
--   expired   messages whose ttl ran out (reason 'expired'; also counted in `counts`)
--
-- Invariant: an id is moved only when due <= server now, in due order (ties by id), and
-- exactly once: it leaves `delayed` in the same atomic step that appends it to `ready` (or
-- adds it to `prioritized`, by priority band then due time), so any number of processes may
-- run this at once without duplicates. When `ready` is empty after a move to `prioritized`, a
-- wake marker ('' , never an id) goes on `ready`, so consumers blocked on it look again. A claim
-- expires only when its deadline <= now; its lease goes with it, so a late ack or nack of that
-- claim is refused. An expired claim whose message is gone (acked or removed meanwhile) leaves
-- no trace. A message not handed out by its ttl's end leaves `delayed`, `prioritized` or (an
-- entry counted in `stale`, skipped later) `ready` for the dead letters. Without priorities
-- and ttls in use (the flags in `controls`), the cost is what it was without them plus one
-- HMGET: O(log n + batch); nothing is scanned. `head`'s `due` is exact after a call that
-- leaves less than a batch due (with a full batch it stays as it was, at or before now, and
-- the client runs again at once).
-- (controls_lib, which defines ready_score, expire and release, comes from lifecycle.lua, put in front by scripts.rs.)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local batch = tonumber(ARGV[1])
local max = tonumber(ARGV[2])
local c = redis.call('HMGET', KEYS[9], 'priorities', 'ttls')
if c[1] or c[2] then
  controls_lib()
end
local to_pri = 0
local moved = 0
if c[1] then
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, batch)
  local n = #due / 2
  if n > 0 then
    local ids = {}
    for i = 1, n do
      ids[i] = due[2 * i - 1]
    end
    local ps = redis.call('HMGET', KEYS[11], unpack(ids))
    local plain = {}
    local zargs = {}
    for i = 1, n do
      if ps[i] then
        zargs[#zargs + 1] = ready_score(tonumber(ps[i]), tonumber(due[2 * i]))
        zargs[#zargs + 1] = ids[i]
      else
        plain[#plain + 1] = ids[i]
      end
    end
    if #plain > 0 then
      redis.call('RPUSH', KEYS[2], unpack(plain))
    end
    if #zargs > 0 then
      redis.call('ZADD', KEYS[10], unpack(zargs))
      to_pri = to_pri + #zargs / 2
    end
    redis.call('ZREM', KEYS[1], unpack(ids))
  end
  moved = n
else
  local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, batch)
  if #ids > 0 then
    redis.call('RPUSH', KEYS[2], unpack(ids))
    redis.call('ZREM', KEYS[1], unpack(ids))
  end
  moved = #ids
end
local full = moved >= batch
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, batch)
local died = 0
for _, id in ipairs(expired) do
  redis.call('ZREM', KEYS[3], id)
  redis.call('HDEL', KEYS[4], id)
  if redis.call('HEXISTS', KEYS[5], id) == 1 then
    local n = tonumber(redis.call('HGET', KEYS[6], id) or '0')
    if n >= max then
      redis.call('ZADD', KEYS[7], now, id)
      redis.call('HSET', KEYS[8], id, 'delivered ' .. n .. ' times without an ack')
      died = died + 1
    else
      local p = c[1] and redis.call('HGET', KEYS[11], id)
      if p then
        redis.call('ZADD', KEYS[10], ready_score(tonumber(p), now), id)
        to_pri = to_pri + 1
      else
        redis.call('RPUSH', KEYS[2], id)
      end
    end
  else
    redis.call('HDEL', KEYS[6], id)
  end
end
if #expired > 0 then
  controls_lib()
  release(KEYS[9], KEYS[15])
end
moved = moved + #expired
full = full or #expired >= batch
if to_pri > 0 and redis.call('LLEN', KEYS[2]) == 0 then
  redis.call('RPUSH', KEYS[2], '')
end
local killed = 0
if c[2] then
  local ids = redis.call('ZRANGEBYSCORE', KEYS[12], '-inf', '(' .. now, 'LIMIT', 0, batch)
  for _, id in ipairs(ids) do
    if redis.call('HEXISTS', KEYS[5], id) == 0 or redis.call('ZSCORE', KEYS[3], id) then
      -- Gone, or (never, kept for safety) handed out already: no dead letter.
      redis.call('ZREM', KEYS[12], id)
    else
      if redis.call('ZREM', KEYS[1], id) == 0 and redis.call('ZREM', KEYS[10], id) == 0 then
        -- On `ready`: that entry is skipped from now on.
        redis.call('HINCRBY', KEYS[13], id, 1)
      end
      expire(id, now, KEYS[12], KEYS[7], KEYS[8])
      killed = killed + 1
    end
  end
  if killed > 0 then
    redis.call('HINCRBY', KEYS[14], 'expired', killed)
  end
  full = full or #ids >= batch
end
local function reply(packed)
  if died > 0 or killed > 0 then
    return { packed, died, killed }
  end
  return packed
end
if full then
  -- More may be due: the client runs again at once, whatever the wait says.
  return reply(moved + 8192)
end
local next_at
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if head[2] then
  next_at = tonumber(head[2])
end
local lhead = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if lhead[2] and (not next_at or tonumber(lhead[2]) < next_at) then
  next_at = tonumber(lhead[2])
end
if c[2] then
  -- A ttl runs out when its deadline < now: look again 1 ms after it.
  local ehead = redis.call('ZRANGE', KEYS[12], 0, 0, 'WITHSCORES')
  if ehead[2] and (not next_at or tonumber(ehead[2]) + 1 < next_at) then
    next_at = tonumber(ehead[2]) + 1
  end
end
if not next_at then
  redis.call('HDEL', KEYS[16], 'due')
  return reply(-(moved + 1))
end
redis.call('HSET', KEYS[16], 'due', string.format('%d', next_at))
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local wait_us = math.min(3600000000, math.max(1, next_at * 1000 - now_us))
return reply(moved + 8192 * wait_us)
