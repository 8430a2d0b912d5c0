-- transfer.lua: the due work of queue N. Moves up to a batch of due ids from `delayed` to
-- `ready`, and handles up to a batch of claims whose visibility expired: back to `ready`
-- (redelivered, its attempt count rises at the next claim), or, once it has been delivered
-- `max_deliveries` times, to the dead letters.
--
-- KEYS[1]  redwheel:{N}:delayed   ZSET  id -> due (ms, Redis server clock)
-- KEYS[2]  redwheel:{N}:ready     LIST  ids that are due, in due order
-- KEYS[3]  redwheel:{N}:inflight  ZSET  id -> visibility deadline (ms) of its claim
-- KEYS[4]  redwheel:{N}:lease     HASH  id -> token of its current claim
-- KEYS[5]  redwheel:{N}:msg       HASH  id -> "<due ms>:<payload>"
-- KEYS[6]  redwheel:{N}:attempts  HASH  id -> deliveries so far
-- KEYS[7]  redwheel:{N}:dead      ZSET  id -> when it died (ms)
-- KEYS[8]  redwheel:{N}:reason    HASH  id -> why it died
-- KEYS[9]  redwheel:{N}:head      HASH  field `due`: lower bound of every due and deadline
--                                 (head.lua), set here to the exact earliest one left, or
--                                 deleted
-- ARGV[1]  batch: the most ids to move, and to expire (1..4000; Lua's unpack limit is 8,000)
-- ARGV[2]  max_deliveries (>= 1)
--
-- Reply: one integer (an integer reply is the cheapest the client can read, which matters
--        when thousands of queues are swept in one round trip), packing two numbers:
--          moved + 8192 * wait_us   when a due or a visibility deadline is still ahead
--          -(moved + 1)             when nothing is ahead (both sets empty)
--        or, only when this call sent expired claims to the dead letters (rare), the
--        array [that integer, died] so the client can count them.
--   moved     ids moved to `ready` plus claims expired, at most 2 * batch (< 8192); when it
--             reaches the batch the client runs the script again at once
--   wait_us   µs from the server's TIME read by this call (the instant "due <= now" was
--             judged) until the earliest due or visibility deadline left: at least 1, at
--             most 3.6e9 (an hour; a farther one is looked at again then). The client waits
--             that long from the reply's arrival, which comes after that instant, so it never
--             runs early and needs no clock offset. The product stays below 2^53.
--
-- Invariant: an id is moved only when due <= server now, in due order (ties by id), and
-- exactly once: it leaves `delayed` in the same atomic step that appends it to `ready`, so
-- any number of processes may run this at once without duplicates. A claim expires only
-- when its deadline <= now; its lease goes with it, so a late ack or nack of that claim is
-- refused. An expired claim whose message is gone (acked or removed meanwhile) leaves no
-- trace. `head`'s `due` is exact after a call that leaves less than a batch due (with a full batch
-- it stays as it was, at or before now, and the client runs again at once). Cost:
-- O(log n + batch); nothing is scanned.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local batch = tonumber(ARGV[1])
local max = tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, batch)
if #ids > 0 then
  redis.call('RPUSH', KEYS[2], unpack(ids))
  redis.call('ZREM', KEYS[1], unpack(ids))
end
local moved = #ids
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
      redis.call('RPUSH', KEYS[2], id)
    end
  else
    redis.call('HDEL', KEYS[6], id)
  end
end
moved = moved + #expired
local function reply(packed)
  if died > 0 then
    return { packed, died }
  end
  return packed
end
if #ids >= batch or #expired >= batch then
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
if not next_at then
  redis.call('HDEL', KEYS[9], 'due')
  return reply(-(moved + 1))
end
redis.call('HSET', KEYS[9], 'due', string.format('%d', next_at))
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local wait_us = math.min(3600000000, math.max(1, next_at * 1000 - now_us))
return reply(moved + 8192 * wait_us)
