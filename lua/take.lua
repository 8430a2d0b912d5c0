-- take.lua: hand the first ready message to one consumer (at-most-once from here).
--
-- KEYS[1]  redwheel:{N}:ready     LIST  ids that are due, in due order
-- KEYS[2]  redwheel:{N}:msg       HASH  id -> "<due ms>:<payload>"
-- KEYS[3]  redwheel:{N}:attempts  HASH  id -> deliveries so far (dropped with the message)
-- KEYS[4]  redwheel:{N}:counts    HASH  'delivered' -> messages handed out so far (take and claim)
-- KEYS[5]  redwheel:{N}:stale     HASH  id -> entries of `ready` left by removed messages
-- KEYS[6]  redwheel:{N}:reply:<process>.<slot>  HASH  this request's reply record (TTL)
-- ARGV[1]  the request number (grows within the slot)
-- ARGV[2]  how long to keep the reply record, in ms
--
-- Reply: { id, "<due ms>:<payload>" } for the message taken, or nil when `ready` is
--        empty (another consumer won the race) or held only removed ids. The same request
--        sent again (its reply was lost) gets the same message again, from the reply
--        record, and takes nothing more; an old attempt of an earlier request of the slot
--        gets nil and does nothing.
--
-- Invariant: the id leaves `ready` and its `msg` entry is deleted in one atomic step,
-- so each message goes to exactly one consumer and nothing is orphaned. Entries left by
-- messages removed after their transfer (counted in `stale` by remove.lua; looked up only
-- while `stale` is not empty) and ids whose `msg` entry is gone are dropped here, at most
-- 100 per call, so the call stays O(1) however many there are. A message taken raises
-- `delivered` in `counts` by one (what `redwheel watch` reads its delivery rate from), and
-- is recorded, payload included, in the request's reply record: a take whose reply is
-- lost is resent by the client and answered from the record, so no message is lost with a
-- reply. (pop_ready, replay and remember come from ready_pop.lua, put in front of this
-- script by scripts.rs.)
local seq = tonumber(ARGV[1])
local done = replay(KEYS[6], seq)
if done then
  return { done[2], done[3] }
end
if done == false then
  return nil
end
local any_stale = redis.call('EXISTS', KEYS[5]) == 1
for _ = 1, 100 do
  local id, v = pop_ready(KEYS[1], KEYS[2], KEYS[5], any_stale)
  if not id then
    return nil
  end
  if v then
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HINCRBY', KEYS[4], 'delivered', 1)
    remember(KEYS[6], { seq, id, v }, ARGV[2])
    return { id, v }
  end
end
return nil
