-- lock_renew.lua: the watchdog's renewal of one hold of lock L.
--
-- KEYS[1]  redwheel:lock:{L}   HASH  <owner> -> hold count, 'token' -> fencing token
-- ARGV[1]  owner: "<instance id>:<thread>"
-- ARGV[2]  the fencing token of the hold
-- ARGV[3]  the watchdog lease in ms
--
-- Reply: 1 when the hold is still there (its TTL is now at least the lease); 0 when it is
--        gone or belongs to another acquisition (expired, force-unlocked, taken over, or the
--        key overwritten with another type): the holder has lost the lock.
--
-- Invariant: a renewal extends only the very hold it was made for (owner and token), never
-- a lock released meanwhile or taken by someone else, and never shortens a lease. It never
-- fails on a key of the wrong type (a failing command would fail the whole batch of
-- renewals it is pipelined with): that is a lost hold like any other.
local token = redis.pcall('HGET', KEYS[1], 'token')
if token ~= ARGV[2] or redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return 0
end
local lease = tonumber(ARGV[3])
if redis.call('PTTL', KEYS[1]) < lease then
  redis.call('PEXPIRE', KEYS[1], lease)
end
return 1
