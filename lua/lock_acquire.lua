-- lock_acquire.lua: take lock L for one owner, or re-enter it, or say how long another owner keeps it.
--
-- KEYS[1]  redwheel:lock:{L}         HASH  <owner> -> hold count, 'token' -> fencing token; PEXPIRE = lease
-- KEYS[2]  redwheel:lock:{L}:fence   STRING  the last fencing token handed out (never expires)
-- ARGV[1]  owner: "<instance id>:<thread>" (one Redwheel instance, one thread)
-- ARGV[2]  lease in ms (an integer >= 1)
-- ARGV[3]  the fencing token of the hold the caller believes it has, or '0' for a new acquisition
-- ARGV[4]  the hold count the caller wants after a re-entry (its own count + 1)
--
-- Reply: {1, token, 1}  acquired afresh: a new fencing token, hold count 1;
--        {1, token, 0}  re-entered the hold `token` (ARGV[3]): its count is now ARGV[4];
--        {0, pttl}      held by another owner, for pttl more ms (-1: no expiry set).
--
-- Invariant: at most one owner field in the hash, and the hash exists only while held.
-- Every fresh acquisition gets a token strictly greater than every earlier one for L:
-- max(last + 1, server TIME in µs), so tokens keep increasing even if the fence key was
-- lost (a restart without persistence), as long as the server clock does not step back.
-- A re-entry sets the count to an absolute value (a retried call sets the same value, it
-- never counts twice) and never shortens the lease. Anything of ours that the caller does
-- not know about (an earlier attempt of this very call whose reply was lost, or a hold
-- whose unlock never reached Redis) is replaced by a fresh acquisition.
local lease = tonumber(ARGV[2])
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  if ARGV[3] ~= '0' and redis.call('HGET', KEYS[1], 'token') == ARGV[3] then
    redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
    if redis.call('PTTL', KEYS[1]) < lease then
      redis.call('PEXPIRE', KEYS[1], lease)
    end
    return {1, tonumber(ARGV[3]), 0}
  end
elseif redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, redis.call('PTTL', KEYS[1])}
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = redis.call('INCRBY', KEYS[2], 0)
local token = math.max(last + 1, now_us)
redis.call('INCRBY', KEYS[2], string.format('%d', token - last))
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], ARGV[1], 1, 'token', string.format('%d', token))
redis.call('PEXPIRE', KEYS[1], lease)
return {1, token, 1}
