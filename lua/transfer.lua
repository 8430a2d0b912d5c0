-- transfer.lua: move up to a batch of due message ids from `delayed` to `ready`.
--
-- KEYS[1]  redwheel:{N}:delayed   ZSET  id -> due (ms, Redis server clock)
-- KEYS[2]  redwheel:{N}:ready     LIST  ids that are due, in due order
-- ARGV[1]  batch: the most ids to move (1..4000; Lua's unpack limit is 8,000)
--
-- Reply: one string, "<moved> <next_due> <now_us>" (integers in decimal, one space apart;
--        a single bulk reply is much cheaper for the client to parse than an array when
--        thousands of queues are swept in one round trip):
--   moved     number of ids moved by this call
--   next_due  due time (epoch ms) of the earliest id left in `delayed`, or -1 if none
--   now_us    the server's TIME in epoch µs, the instant `due <= now` was judged (with
--             `now` = floor(now_us / 1000) ms), so the client can schedule the next run
--             at next_due * 1000 - now_us µs after the reply arrives, never early
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
local next_due = -1
if head[2] then
  next_due = tonumber(head[2])
end
return string.format('%d %d %d', #ids, next_due, tonumber(t[1]) * 1000000 + tonumber(t[2]))
