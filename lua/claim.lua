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
-- KEYS[8]  redwheel:{N}:reply:<process>.<slot>  HASH  this request's reply record (TTL)
-- ARGV[1]  visibility in ms (>= 1), counted from the server's TIME
-- ARGV[2]  a token prefix, unique to this request (the client's)
-- ARGV[3]  count: the most messages to claim (0..1000; 0 only acks)
-- ARGV[4]  the request number (grows within the slot)
-- ARGV[5]  how long to keep the reply record, in ms
-- ARGV[6]  acks: how many (id, token) pairs follow, to ack first, as ack.lua does
-- ARGV[7..] those pairs
--
-- Reply: { deadline, refused, acked, id, value, attempt, token, id, value, attempt, token, … }:
--   deadline  the claims' visibility deadline (epoch ms, server clock)
--   refused   how many of the acks were refused (their claim was no longer current)
--   acked     how many of the acks deleted their message now (the others found it gone)
--   then per message claimed: its id, its stored "<due ms>:<payload>", its attempt number (1
--   on the first delivery), and the token of this claim (ARGV[2] .. ":" .. its index)
--   Nothing claimed gives { deadline, refused, acked } alone.
--   The same request sent again (its reply was lost) gets the same answer, from the reply
--   record: the same counts and the same claims (those still current), visible until a
--   deadline counted from now; it acks and claims nothing more and counts no attempt. An old
--   attempt of an earlier request of the slot gets { deadline, 0, 0 } and does nothing.
--
-- Invariant: an id leaves `ready` and enters `inflight` (with its lease and raised attempt
-- count) in one atomic step, so a consumer that dies at any instant cannot lose it: the
-- transfer script redelivers it when the deadline passes. The message stays in `msg` until
-- it is acked. Entries left by messages removed after their transfer (counted in `stale` by
-- remove.lua; looked up only while `stale` is not empty) and ids whose message is gone are
-- dropped here, at most 100 per call beyond `count`, so the call stays O(count). A call that
-- claims k > 0 messages raises `delivered` in `counts` by k, with one HINCRBY (what
-- `redwheel watch` reads). A call that acked, refused or claimed anything records it in the
-- request's reply record (ids only: the claimed messages stay in `msg`), so a resend after
-- a lost reply neither claims a message for nobody nor counts an attempt twice. (pop_ready,
-- replay and remember come from ready_pop.lua, put in front of this script by scripts.rs.)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[1])
local count = tonumber(ARGV[3])
local seq = tonumber(ARGV[4])
local done = replay(KEYS[8], seq)
if done == false then
  return { deadline, 0, 0 }
end
if done then
  local again = { deadline, done[2], done[3] }
  for k = 4, #done do
    local id = done[k]
    local token = ARGV[2] .. ':' .. (k - 3)
    local v = redis.call('HGET', KEYS[2], id)
    if v and redis.call('HGET', KEYS[4], id) == token then
      redis.call('ZADD', KEYS[3], 'XX', deadline, id)
      again[#again + 1] = id
      again[#again + 1] = v
      again[#again + 1] = tonumber(redis.call('HGET', KEYS[5], id) or '1')
      again[#again + 1] = token
    end
  end
  return again
end
local refused = 0
local acked = 0
for i = 0, tonumber(ARGV[6]) - 1 do
  local id = ARGV[7 + 2 * i]
  local cur = redis.call('HGET', KEYS[4], id)
  if cur == ARGV[8 + 2 * i] then
    redis.call('ZREM', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[5], id)
    acked = acked + 1
  elseif redis.call('HEXISTS', KEYS[2], id) == 1 then
    refused = refused + 1
  end
end
local out = { deadline, refused, acked }
local record = { seq, refused, acked }
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
    record[#record + 1] = id
  else
    skipped = skipped + 1
  end
end
if claimed > 0 then
  redis.call('HINCRBY', KEYS[6], 'delivered', claimed)
end
if claimed > 0 or acked > 0 or refused > 0 then
  remember(KEYS[8], record, ARGV[5])
end
return out
