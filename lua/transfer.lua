-- transfer.lua: move up to a batch of due message ids from `delayed` to `ready`.
--
-- KEYS[1]  redwheel:{N}:delayed   ZSET  id -> due (ms, Redis server clock)
-- KEYS[2]  redwheel:{N}:ready     LIST  ids that are due, in due order
-- ARGV[1]  batch: the most ids to move (1..4000; Lua's unpack limit is 8,000)
--
-- Reply: one integer (an integer reply is the cheapest the client can read, which matters
--        when thousands of queues are swept in one round trip), packing two numbers:
--          moved + 8192 * wait_us   when ids are left in `delayed`
--          -(moved + 1)             when `delayed` is empty
--   moved     number of ids moved by this call (at most 4,000 < 8192)
--   wait_us   µs from the server's TIME read by this call (the instant `due <= now` was
--             judged) until the earliest id left falls due: at least 1, at most 3.6e9 (an
--             hour; a farther head is looked at again then). The client waits that long
--             from the reply's arrival, which comes after that instant, so it never runs
--             early and needs no clock offset. The product stays below 2^53, exact in Lua.
--
-- Invariant: an id is moved only when due <= server now, in due order (ties by id),
-- and exactly once: it leaves `delayed` in the same atomic step that appends it to
-- `ready`, so any number of transfer tasks may run this at once without duplicates.
-- Cost: O(log n + batch); nothing is scanned.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
if #ids > 0 then
  redis.call('RPUSH', KEYS[2], unpack(ids))
  redis.call('ZREM', KEYS[1], unpack(ids))
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if not head[2] then
  return -(#ids + 1)
end
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local wait_us = math.min(3600000000, math.max(1, tonumber(head[2]) * 1000 - now_us))
return #ids + 8192 * wait_us
