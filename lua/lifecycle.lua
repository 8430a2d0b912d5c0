-- lifecycle.lua: not a script of its own. scripts.rs puts these functions in front of the
-- scripts that move messages between states under the queue's controls (take.lua,
-- claim.lua, transfer.lua, ack.lua, nack.lua; stats.lua for PRIORITY_BAND), so each move
-- is made one way. (Every function defined here is created at each run of those scripts:
-- keep it to what they share.)

-- PRIORITY_BAND: the score distance between two priorities in `prioritized` (2^49 ms, about
-- 17,800 years of due times). A score is (9 - priority) * PRIORITY_BAND + due, at most
-- 9 * 2^49 < 2^53: an exact integer in a double, so order within a band is due order (ties
-- by id, as in `delayed`), and a higher priority always comes first. Ten bands is what fits
-- with room to spare (16 would); it is also Redisson's range, 0..9.
local PRIORITY_BAND = 562949953421312

-- ready_score(priority, due): the score of a message of `priority` (1..9) due at `due` (ms).
local function ready_score(priority, due)
  return string.format('%d', (9 - priority) * PRIORITY_BAND + math.min(due, PRIORITY_BAND - 1))
end

-- expire(id, now_ms, expires, dead, reason): a message whose ttl ran out before it was
-- handed out becomes a dead letter with reason 'expired'. Its `msg` entry stays (dead
-- letters keep theirs); the caller has taken it off `delayed`, `ready` or `prioritized`.
local function expire(id, now_ms, expires, dead, reason)
  redis.call('ZREM', expires, id)
  redis.call('ZADD', dead, now_ms, id)
  redis.call('HSET', reason, id, 'expired')
end

-- release(controls, wake): a claim in flight has ended (acked, given back, expired). If a
-- claim of any process waits for an in-flight slot (the `release_waiters` flag in
-- `controls`, set by claim.lua when max_in_flight stopped it), the flag goes and `wake`
-- tells every process to look again ('0': "now"). One HDEL when nobody waits.
local function release(controls, wake)
  if redis.call('HDEL', controls, 'release_waiters') == 1 then
    redis.call('SPUBLISH', wake, '0')
  end
end

