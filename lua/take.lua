-- take.lua: hand the first ready message to one consumer (at-most-once from here).
--
-- KEYS[1]  redwheel:{N}:ready     LIST  ids that are due, in due order
-- KEYS[2]  redwheel:{N}:msg       HASH  id -> "<due ms>:<payload>"
-- KEYS[3]  redwheel:{N}:attempts  HASH  id -> deliveries so far (dropped with the message)
-- KEYS[4]  redwheel:{N}:counts    HASH  'delivered' -> messages handed out so far (take and claim)
-- ARGV     none
--
-- Reply: { id, "<due ms>:<payload>" } for the message taken, or nil when `ready` is
--        empty (another consumer won the race) or held only removed ids.
--
-- Invariant: the id leaves `ready` and its `msg` entry is deleted in one atomic step,
-- so each message goes to exactly one consumer and nothing is orphaned. Ids whose
-- `msg` entry is gone (removed by remove.lua after transfer) are dropped here, at most
-- 100 per call, so the call stays O(1) however many there are. A message taken raises
-- `delivered` in `counts` by one (what `redwheel watch` reads its delivery rate from).
for _ = 1, 100 do
  local id = redis.call('LPOP', KEYS[1])
  if not id then
    return nil
  end
  local v = redis.call('HGET', KEYS[2], id)
  if v then
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HINCRBY', KEYS[4], 'delivered', 1)
    return { id, v }
  end
end
return nil
