-- lock_force_release.lua: release lock L whoever holds it (an operator's tool), or only the
-- acquisition an operator saw.
--
-- KEYS[1]  redwheel:lock:{L}          HASH  <owner> -> hold count, 'token' -> fencing token
-- KEYS[2]  redwheel:lock:{L}:unlock   sharded channel (only SPUBLISHed to)
-- ARGV     none: release whoever holds it; or [1] a fencing token and [2] a holder (owner):
--          release only while that holder holds the acquisition with that token
--
-- Reply: 1 when a held lock was deleted (its token is published on the channel, waking one
--        waiter per process), 0 when it was not held, -1 when it is held, but not by the
--        given holder with the given token (nothing is changed).
--
-- Invariant: the fence key is kept, so the next acquisition still gets a greater token.
-- The former holder learns of it at its next renewal (or unlock): its hold is lost.
local token = redis.call('HGET', KEYS[1], 'token')
if ARGV[1] then
  if redis.call('EXISTS', KEYS[1]) == 0 then
    return 0
  end
  if token ~= ARGV[1] or ARGV[2] == 'token' or redis.call('HEXISTS', KEYS[1], ARGV[2]) == 0 then
    return -1
  end
end
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('SPUBLISH', KEYS[2], token or '0')
  return 1
end
return 0
