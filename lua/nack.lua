-- nack.lua: a consumer gives a claimed message back: delivered again after a delay, or, if
-- it has been delivered max_deliveries times, moved to the dead letters.
--
-- KEYS[1]  redwheel:{N}:inflight  ZSET  id -> visibility deadline
-- KEYS[2]  redwheel:{N}:lease     HASH  id -> token of its current claim
-- KEYS[3]  redwheel:{N}:msg       HASH  id -> "<due ms>:<payload>"
-- KEYS[4]  redwheel:{N}:attempts  HASH  id -> deliveries so far
-- KEYS[5]  redwheel:{N}:delayed   ZSET  id -> due
-- KEYS[6]  redwheel:{N}:dead      ZSET  id -> when it died
-- KEYS[7]  redwheel:{N}:reason    HASH  id -> why it died
-- KEYS[8]  redwheel:{N}:wake      shard channel (SPUBLISHed to when it becomes the head, or
--                                 '0' when a claim waits for the in-flight slot it frees)
-- KEYS[9]  redwheel:{N}:head      HASH  field `due`: lower bound of every due and deadline (head.lua)
-- KEYS[10] redwheel:{N}:controls  HASH  the flag release_waiters (a claim waits for a slot)
-- ARGV[1]  the message id
-- ARGV[2]  the token of the claim being given back
-- ARGV[3]  the delay before the next delivery, in ms (>= 0)
-- ARGV[4]  max_deliveries (>= 1)
-- ARGV[5]  why it failed (recorded if it dies)
--
-- Reply: 1 scheduled again (due now + delay, server clock); 2 dead (delivery limit);
--        0 nothing to do (the message is gone); -1 refused: the claim is no longer current.
--
-- Invariant: only the current claim's token gives it back; the message leaves `inflight`
-- and enters `delayed` (or `dead`) in one atomic step. The in-flight slot it frees wakes
-- claims that max_in_flight holds back, in every process.
-- (lower_head comes from head.lua, controls_lib (release) from lifecycle.lua, put in front of
-- this script by scripts.rs.)
local cur = redis.call('HGET', KEYS[2], ARGV[1])
if cur ~= ARGV[2] then
  if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 then
    return 0
  end
  return -1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
controls_lib()
release(KEYS[10], KEYS[8])
local n = tonumber(redis.call('HGET', KEYS[4], ARGV[1]) or '0')
if n >= tonumber(ARGV[4]) then
  redis.call('ZADD', KEYS[6], now, ARGV[1])
  redis.call('HSET', KEYS[7], ARGV[1], 'delivered ' .. n .. ' times; last failure: ' .. ARGV[5])
  return 2
end
local due = now + tonumber(ARGV[3])
local head = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
redis.call('ZADD', KEYS[5], due, ARGV[1])
if head[2] == nil or due < tonumber(head[2]) then
  lower_head(KEYS[9], due)
  redis.call('SPUBLISH', KEYS[8], string.format('%d', due))
end
return 1
