-- extend.lua: a consumer still working on a claimed message moves its visibility deadline.
--
-- KEYS[1]  redwheel:{N}:inflight  ZSET  id -> visibility deadline
-- KEYS[2]  redwheel:{N}:lease     HASH  id -> token of its current claim
-- KEYS[3]  redwheel:{N}:head      HASH  field `due`: lower bound of every due and deadline (head.lua)
-- ARGV[1]  the message id
-- ARGV[2]  the token of the claim
-- ARGV[3]  the new visibility, in ms from the server's TIME (>= 1)
--
-- Reply: the new deadline (epoch ms, server clock), or -1 if the claim is no longer current
--        (it expired, or was acked or given back).
--
-- Invariant: only the current claim is extended; an expired claim is never revived.
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then
  return -1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], 'XX', deadline, ARGV[1])
-- A shorter visibility may move the deadline earlier than `head`.
lower_head(KEYS[3], deadline)
return deadline
