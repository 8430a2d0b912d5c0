-- remove.lua: cancel one message by id, wherever it is: delayed, ready, claimed (in
-- flight), or a dead letter.
--
-- KEYS[1]  redwheel:{N}:delayed   ZSET  id -> due
-- KEYS[2]  redwheel:{N}:msg       HASH  id -> "<due ms>:<payload>"
-- KEYS[3]  redwheel:{N}:dead      ZSET  id -> when it died
-- KEYS[4]  redwheel:{N}:inflight  ZSET  id -> visibility deadline
-- KEYS[5]  redwheel:{N}:lease     HASH  id -> token of its current claim
-- KEYS[6]  redwheel:{N}:attempts  HASH  id -> deliveries so far
-- KEYS[7]  redwheel:{N}:reason    HASH  id -> why it died
-- KEYS[8]  redwheel:{N}:stale     HASH  id -> entries of `ready` left by removed messages
-- KEYS[9]  redwheel:{N}:prioritized  ZSET  due messages of priority 1..9
-- KEYS[10] redwheel:{N}:priority     HASH  id -> priority (1..9)
-- KEYS[11] redwheel:{N}:expires      ZSET  id -> the time it must be handed out by (ms)
-- ARGV[1]  the message id
--
-- Reply: 1 if the message was known (it will never be delivered again, and every trace of
--        it is gone), 0 if it was unknown, already taken or acked, or already removed.
--
-- Invariant: a message is deliverable iff it has a `msg` entry, and `dead`, `inflight` and
-- `prioritized` hold only ids with a `msg` entry, so len.lua's count stays exact. An id already moved to
-- `ready` is not searched for in the list (no list scan): its entry there is counted in
-- `stale`, and take.lua and claim.lua skip that many entries of the id (the oldest: every
-- push is an RPUSH and every pop an LPOP, so an entry left by a removed message comes
-- before any entry of the same id offered again), so an id offered again after its removal
-- is neither delivered early nor twice. A claim in flight loses its lease, so its ack finds
-- the message gone. O(log n).
local z = redis.call('ZREM', KEYS[1], ARGV[1])
local h = redis.call('HDEL', KEYS[2], ARGV[1])
local d = redis.call('ZREM', KEYS[3], ARGV[1])
local f = redis.call('ZREM', KEYS[4], ARGV[1])
local p = redis.call('ZREM', KEYS[9], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
redis.call('HDEL', KEYS[7], ARGV[1])
redis.call('HDEL', KEYS[10], ARGV[1])
redis.call('ZREM', KEYS[11], ARGV[1])
if h == 1 and z == 0 and d == 0 and f == 0 and p == 0 then
  -- It was in `ready`: that entry is stale from now on.
  redis.call('HINCRBY', KEYS[8], ARGV[1], 1)
end
if z == 1 or h == 1 or d == 1 or f == 1 then
  return 1
end
return 0
