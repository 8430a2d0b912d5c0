-- lock_release.lua: one unlock by the owner of one hold of lock L.
--
-- KEYS[1]  redwheel:lock:{L}                             HASH  <owner> -> hold count, 'token' -> fencing token
-- KEYS[2]  redwheel:lock:{L}:unlock                      sharded channel (only SPUBLISHed to)
-- KEYS[3]  redwheel:lock:{L}:released:<owner>:<token>    STRING '1', for ARGV[4] ms: the record that
--                                                        this owner released its hold <token>
-- ARGV[1]  owner: "<instance id>:<thread>"
-- ARGV[2]  the fencing token of the hold being unlocked
-- ARGV[3]  the hold count left after this unlock (the caller's own count - 1)
-- ARGV[4]  how long the release record lives, in ms (an integer >= 1): longer than the caller
--          may send this unlock again
--
-- Reply: ARGV[3] (>= 1) when the hold is still held (a reentrant unlock); 0 when this unlock
--        released the lock (the hash is deleted, the token is published on the channel, waking
--        one waiter per process, and the release is recorded in KEYS[3]); -2 when the hold is
--        not there because an earlier attempt of this very unlock released it (KEYS[3] is
--        there); -1 when the hold is not there otherwise: its lease lapsed, it was
--        force-unlocked, the lock is another owner's, or Redis lost it (a restart without
--        persistence, a failover).
--
-- Invariant: only the owner of this very hold (owner field and token both match) changes
-- the lock; another owner's lock is never touched, even by a retry that comes after the
-- lock changed hands. The count is set to an absolute value, so a retried unlock never
-- counts twice. The TTL is left as it is. A resent release answers 0 or -2 only if this
-- owner's hold was there and released by it: "gone or another's" is never taken for "done".
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[2] or redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  if redis.call('EXISTS', KEYS[3]) == 1 then
    return -2
  end
  return -1
end
local left = tonumber(ARGV[3])
if left > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
  return left
end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[3], '1', 'PX', ARGV[4])
redis.call('SPUBLISH', KEYS[2], ARGV[2])
return 0
