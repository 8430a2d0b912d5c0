-- lock_force_release.lua: release lock L whoever holds it (an operator's tool).
--
-- KEYS[1]  redwheel:lock:{L}          HASH  <owner> -> hold count, 'token' -> fencing token
-- KEYS[2]  redwheel:lock:{L}:unlock   sharded channel (only SPUBLISHed to)
--
-- Reply: 1 when a held lock was deleted (its token is published on the channel, waking one
--        waiter per process), 0 when it was not held.
--
-- Invariant: the fence key is kept, so the next acquisition still gets a greater token.
-- The former holder learns of it at its next renewal (or unlock): its hold is lost.
local token = redis.call('HGET', KEYS[1], 'token')
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('SPUBLISH', KEYS[2], token or '0')
  return 1
end
return 0
