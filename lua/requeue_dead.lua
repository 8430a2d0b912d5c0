-- requeue_dead.lua: give the oldest dead letters of queue N a fresh start: back to `ready`
-- with their attempt count reset.
--
-- KEYS[1]  redwheel:{N}:dead      ZSET  id -> when it died
-- KEYS[2]  redwheel:{N}:msg       HASH  id -> "<due ms>:<payload>"
-- KEYS[3]  redwheel:{N}:reason    HASH  id -> why it died
-- KEYS[4]  redwheel:{N}:attempts  HASH  id -> deliveries so far
-- KEYS[5]  redwheel:{N}:ready     LIST  ids that are due
-- ARGV[1]  the most to requeue (>= 1)
--
-- Reply: the number requeued.
--
-- Invariant: an id leaves `dead` and enters `ready` in one atomic step; a consumer blocked on
-- `ready` wakes at once.
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
local n = 0
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[3], id)
  redis.call('HDEL', KEYS[4], id)
  if redis.call('HEXISTS', KEYS[2], id) == 1 then
    redis.call('RPUSH', KEYS[5], id)
    n = n + 1
  end
end
return n
