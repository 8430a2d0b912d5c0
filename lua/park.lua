-- park.lua: keep a message whose payload could not be decoded as a dead letter, with the
-- reason.
--
-- KEYS[1]  redwheel:{N}:msg       HASH  id -> "<due ms>:<payload>"
-- KEYS[2]  redwheel:{N}:dead      ZSET  id -> when it died (epoch ms, server clock)
-- KEYS[3]  redwheel:{N}:reason    HASH  id -> why it died
-- KEYS[4]  redwheel:{N}:inflight  ZSET  id -> visibility deadline
-- KEYS[5]  redwheel:{N}:lease     HASH  id -> token of its current claim
-- ARGV[1]  the message id
-- ARGV[2]  the stored value exactly as take.lua or claim.lua returned it
-- ARGV[3]  why it could not be decoded
-- ARGV[4]  the token of the claim that handed it out, or '' after a take
--
-- Reply: 1 parked; 0 not ours to park: the claim is no longer current (its visibility ended
--        and it was delivered again, or it was acked, nacked or removed meanwhile), or,
--        after a take, the id was offered again meanwhile (that new message is left alone).
--
-- Invariant: a message a consumer could not decode is not lost: its `msg` entry is kept (put
-- back after a take), it leaves `inflight` (after a claim), and its id goes to `dead`, never
-- to `ready`, so it cannot poison every later take. It no longer counts in the queue's
-- length (len.lua subtracts `dead`). Only the current claim parks a claimed message, so a
-- consumer that decodes too late never takes it from the one that holds it now.
if ARGV[4] ~= '' then
  if redis.call('HGET', KEYS[5], ARGV[1]) ~= ARGV[4] then
    return 0
  end
elseif redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
return 1
