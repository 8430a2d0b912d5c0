-- claim.lua: ack what the consumer has finished, then hand it up to `count` ready messages,
-- each under a visibility deadline (at-least-once: a claim that is not acked in time is
-- redelivered). Acking here saves a consumer pool one round trip per message.
--
-- KEYS[1]  redwheel:{N}:ready     LIST  ids that are due, in due order
-- KEYS[2]  redwheel:{N}:msg       HASH  id -> "<due ms>:<payload>"
-- KEYS[3]  redwheel:{N}:inflight  ZSET  id -> visibility deadline (ms)
-- KEYS[4]  redwheel:{N}:lease     HASH  id -> token of its current claim
-- KEYS[5]  redwheel:{N}:attempts  HASH  id -> deliveries so far
-- KEYS[6]  redwheel:{N}:counts    HASH  'delivered' -> messages handed out so far (take and claim)
-- KEYS[7]  redwheel:{N}:stale     HASH  id -> entries of `ready` left by removed messages
-- KEYS[8]  redwheel:{N}:head      HASH  field `due`: lower bound of every due and deadline (head.lua)
-- ARGV[1]  visibility in ms (>= 1), counted from the server's TIME
-- ARGV[2]  a token prefix, unique to this call (the client's random bytes)
-- ARGV[3]  count: the most messages to claim (0..1000; 0 only acks)
-- ARGV[4]  acks: how many (id, token) pairs follow, to ack first, as ack.lua does
-- ARGV[5..] those pairs
--
-- Reply: { deadline, refused, id, value, attempt, token, id, value, attempt, token, … }:
--   deadline  the claims' visibility deadline (epoch ms, server clock)
--   refused   how many of the acks were refused (their claim was no longer current)
--   then per message claimed: its id, its stored "<due ms>:<payload>", its attempt number (1
--   on the first delivery), and the token of this claim (ARGV[2] .. ":" .. its index)
--   Nothing claimed gives { deadline, refused } alone.
--
-- Invariant: an id leaves `ready` and enters `inflight` (with its lease and raised attempt
-- count) in one atomic step, so a consumer that dies at any instant cannot lose it: the
-- transfer script redelivers it when the deadline passes. The message stays in `msg` until
-- it is acked. Entries left by messages removed after their transfer (counted in `stale` by
-- remove.lua; looked up only while `stale` is not empty) and ids whose message is gone are
-- dropped here, at most 100 per call beyond `count`, so the call stays O(count). A call that claims k > 0 messages
-- raises `delivered` in `counts` by k, with one HINCRBY (what `redwheel watch` reads).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[1])
local count = tonumber(ARGV[3])
local refused = 0
for i = 0, tonumber(ARGV[4]) - 1 do
  local id = ARGV[5 + 2 * i]
  local cur = redis.call('HGET', KEYS[4], id)
  if cur == ARGV[6 + 2 * i] then
    redis.call('ZREM', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[5], id)
  elseif redis.call('HEXISTS', KEYS[2], id) == 1 then
    refused = refused + 1
  end
end
local out = { deadline, refused }
local claimed = 0
local skipped = 0
local any_stale = count > 0 and redis.call('EXISTS', KEYS[7]) == 1
while claimed < count and skipped < 100 do
  -- (pop_ready comes from ready_pop.lua, put in front of this script by scripts.rs.)
  local id, v = pop_ready(KEYS[1], KEYS[2], KEYS[7], any_stale)
  if not id then
    break
  end
  if v then
    claimed = claimed + 1
    local token = ARGV[2] .. ':' .. claimed
    local attempt = redis.call('HINCRBY', KEYS[5], id, 1)
    redis.call('ZADD', KEYS[3], deadline, id)
    redis.call('HSET', KEYS[4], id, token)
    out[#out + 1] = id
    out[#out + 1] = v
    out[#out + 1] = attempt
    out[#out + 1] = token
  else
    skipped = skipped + 1
  end
end
if claimed > 0 then
  redis.call('HINCRBY', KEYS[6], 'delivered', claimed)
  lower_head(KEYS[8], deadline)
end
return out
