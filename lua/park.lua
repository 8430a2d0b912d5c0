-- park.lua: put back a taken message whose payload could not be decoded, as a dead letter.
--
-- KEYS[1]  redwheel:{N}:msg       HASH  id -> "<due ms>:<payload>"
-- KEYS[2]  redwheel:{N}:dead      ZSET  id -> when it was parked (epoch ms, server clock)
-- ARGV[1]  the message id
-- ARGV[2]  the stored value exactly as take.lua returned it
--
-- Reply: 1.
--
-- Invariant: a message a consumer could not decode is not lost: its `msg` entry comes
-- back unchanged and its id goes to `dead`, never to `ready`, so it cannot poison every
-- later take. It no longer counts in the queue's length (len.lua subtracts `dead`).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now, ARGV[1])
return 1
