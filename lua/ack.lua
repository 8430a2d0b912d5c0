-- ack.lua: a consumer is done with a claimed message: delete every trace of it.
--
-- KEYS[1]  redwheel:{N}:inflight  ZSET  id -> visibility deadline
-- KEYS[2]  redwheel:{N}:lease     HASH  id -> token of its current claim
-- KEYS[3]  redwheel:{N}:msg       HASH  id -> "<due ms>:<payload>"
-- KEYS[4]  redwheel:{N}:attempts  HASH  id -> deliveries so far
-- KEYS[5]  redwheel:{N}:priority  HASH  id -> priority (1..9)
-- KEYS[6]  redwheel:{N}:controls  HASH  the flag release_waiters (a claim waits for a slot)
-- KEYS[7]  redwheel:{N}:wake      shard channel ('0' when a waiting claim may go on)
-- ARGV[1]  the message id
-- ARGV[2]  the token of the claim being acked
--
-- Reply: 1 acked now; 0 nothing to do (the message is gone: acked before, by a retry of this
--        very ack or otherwise, or removed); -1 refused: the claim is no longer current
--        (its visibility expired and the message waits for, or is with, another consumer).
--
-- Invariant: only the current claim's token acks, so an ack that arrives after its claim
-- expired never touches a later delivery; an ack is idempotent. The in-flight slot it frees
-- wakes claims that max_in_flight holds back, in every process.
-- (controls_lib, which defines release, comes from lifecycle.lua, put in front of this script by scripts.rs.)
local cur = redis.call('HGET', KEYS[2], ARGV[1])
if cur == ARGV[2] then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
  redis.call('HDEL', KEYS[4], ARGV[1])
  -- Priorities and waiting claims both live under the controls hash.
  if redis.call('EXISTS', KEYS[6]) == 1 then
    redis.call('HDEL', KEYS[5], ARGV[1])
    controls_lib()
    release(KEYS[6], KEYS[7])
  end
  return 1
end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 then
  return 0
end
return -1
