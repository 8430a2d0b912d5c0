-- claim_ahead.lua: a consumer pool with `claim_ahead` claims delayed messages shortly before
-- they fall due, so that at their due time nothing stands between them and its handlers
-- (the pool's wheel starts each handler then, once a check of the server's clock and the
-- queue's controls allows it); or it gives back, unstarted, messages it claimed so.
--
-- KEYS[1]  redwheel:{N}:delayed      ZSET  id -> due (ms)
-- KEYS[2]  redwheel:{N}:msg          HASH  id -> "<due ms>:<payload>"
-- KEYS[3]  redwheel:{N}:inflight     ZSET  id -> visibility deadline (ms)
-- KEYS[4]  redwheel:{N}:lease        HASH  id -> token of its current claim
-- KEYS[5]  redwheel:{N}:attempts     HASH  id -> deliveries so far
-- KEYS[6]  redwheel:{N}:counts       HASH  'delivered' -> messages handed out so far
-- KEYS[7]  redwheel:{N}:reply:<process>.<slot>  STRING  this request's reply record (TTL)
-- KEYS[8]  redwheel:{N}:head         HASH  field `due`: lower bound of every due and deadline
-- KEYS[9]  redwheel:{N}:controls     HASH  its presence alone matters here, and the flag
--                                    release_waiters (a claim waits for an in-flight slot)
-- KEYS[10] redwheel:{N}:wake         shard channel (SPUBLISHed a given-back message's due
--                                    time when it is the new head; '0' when a given-back
--                                    claim frees an in-flight slot a claim waits for)
-- ARGV[1]  'c' (claim), 'h' (the check before a hand-out) or 'r' (give back)
-- Claim:
-- ARGV[2]  visibility in ms (>= 1), counted from each message's due time (or from the
--          server's TIME if that is later)
-- ARGV[3]  a token prefix, unique to this request (the client's)
-- ARGV[4]  count: the most messages to claim (1..1000)
-- ARGV[5]  the request number (grows within the slot)
-- ARGV[6]  how long to keep the reply record, in ms
-- ARGV[7]  the window in ms: messages due after TIME and at most this long after it are
--          claimed (a message already due is left to the transfer and the claims of free
--          workers)
-- Check: no more arguments. Reads only.
-- Give back:
-- ARGV[2..] triples (id, token of its claim, due ms): each message still under that claim
--          goes back to `delayed` at that due time, as if never claimed
--
-- Reply to a claim: { gate, now, next, id, value, attempt, token, due, id, … }:
--   gate   0, or -1: the queue has controls (pause, rate limit, max in flight, priorities,
--          ttls decide at hand-out time, so nothing is claimed ahead: nothing done)
--   now    the server's TIME in ms
--   next   the due time of the earliest message left in `delayed` that falls due after
--          `now` (ms), or -1 for none
--   then per message claimed: its id, its stored "<due ms>:<payload>", its attempt number,
--   the token of this claim (ARGV[3] .. ":" .. its index) and its due time (its score in
--   `delayed`, the instant to start its handler); its visibility deadline is
--   max(due, now) + ARGV[2].
--   The same request sent again (its reply was lost) gets the same claims (those still
--   current), their deadlines counted again from now if that is later; an old attempt of an
--   earlier request of the slot gets { 0, now, next } and does nothing.
-- Reply to a check: { now, controls }: the server's TIME in µs, and 1 if the queue has
--   controls (its held messages go back, for the claims of free workers to apply them), else
--   0. The pool hands out a due time's messages only after a check that found no controls,
--   and not before `due − now` has passed since its reply came (so by the server's clock,
--   whatever this process's estimate of it).
-- Reply to a give-back: how many messages went back.
--
-- Invariant: an id leaves `delayed` and enters `inflight` (with its lease and raised attempt
-- count) in one atomic step, under a deadline no earlier than its due time plus the
-- visibility, so a consumer that dies while holding it (or after starting it) cannot lose
-- it: the transfer redelivers it then, as it does any claim. Only messages due within the
-- window and not yet due are claimed, never from a queue with controls; a claimed message
-- is never handed to a handler before its due time by TIME (the check), nor once its claim
-- is near its end (the client gives it back instead). A message given back is in `delayed`
-- again at its due time, its attempt and delivery uncounted, and the in-flight slot it
-- freed wakes the claims waiting for one (as ack.lua does). The call is O(count + log n).
-- (lower_head comes from head.lua; controls_lib, which defines release, from lifecycle.lua;
-- now_us, replay and remember from ready_pop.lua: put in front of this script by scripts.rs.)
local now = math.floor(now_us() / 1000)

-- The due time of the earliest message left in `delayed` (after `now` with `after`), or -1.
local function next_due(after)
  local h
  if after then
    h = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('(%d', now), '+inf', 'WITHSCORES',
      'LIMIT', 0, 1)
  else
    h = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  end
  if h[2] then
    return tonumber(h[2])
  end
  return -1
end

if ARGV[1] == 'h' then
  return { now_us(), redis.call('EXISTS', KEYS[9]) }
end

if ARGV[1] == 'r' then
  local back, earliest = 0, nil
  for i = 2, #ARGV, 3 do
    local id, token, due = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
    if redis.call('HGET', KEYS[4], id) == token then
      redis.call('ZREM', KEYS[3], id)
      redis.call('HDEL', KEYS[4], id)
      if redis.call('HINCRBY', KEYS[5], id, -1) <= 0 then
        redis.call('HDEL', KEYS[5], id)
      end
      redis.call('ZADD', KEYS[1], due, id)
      back = back + 1
      if not earliest or due < earliest then
        earliest = due
      end
    end
  end
  if back > 0 then
    redis.call('HINCRBY', KEYS[6], 'delivered', -back)
    lower_head(KEYS[8], earliest)
    if next_due(false) == earliest then
      redis.call('SPUBLISH', KEYS[10], string.format('%d', earliest))
    end
    if redis.call('EXISTS', KEYS[9]) == 1 then
      controls_lib()
      release(KEYS[9], KEYS[10])
    end
  end
  return back
end

local vis = tonumber(ARGV[2])
local prefix = ARGV[3]
local seq = tonumber(ARGV[5])
local done = replay(KEYS[7], seq)
if done == false then
  return { 0, now, next_due(true) }
end
if done then
  -- The record: { seq, id, due, id, due, … }.
  local again = { 0, now, next_due(true) }
  for k = 2, #done, 2 do
    local id, due = done[k], done[k + 1]
    local token = prefix .. ':' .. (k / 2)
    local v = redis.call('HGET', KEYS[2], id)
    if v and redis.call('HGET', KEYS[4], id) == token then
      local at = redis.call('ZSCORE', KEYS[3], id)
      local deadline = math.max(due, now) + vis
      if at and tonumber(at) < deadline then
        redis.call('ZADD', KEYS[3], 'XX', deadline, id)
      end
      again[#again + 1] = id
      again[#again + 1] = v
      again[#again + 1] = tonumber(redis.call('HGET', KEYS[5], id) or '1')
      again[#again + 1] = token
      again[#again + 1] = due
    end
  end
  return again
end
if redis.call('EXISTS', KEYS[9]) == 1 then
  return { -1, now, next_due(true) }
end
local found = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('(%d', now), now + tonumber(ARGV[7]),
  'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[4]))
if #found == 0 then
  return { 0, now, next_due(true) }
end
local ids, dues = {}, {}
for i = 1, #found, 2 do
  ids[#ids + 1] = found[i]
  dues[#dues + 1] = tonumber(found[i + 1])
end
redis.call('ZREM', KEYS[1], unpack(ids))
local vals = redis.call('HMGET', KEYS[2], unpack(ids))
local before = redis.call('HMGET', KEYS[5], unpack(ids))
local out = { 0, now, next_due(true) }
local record = { seq }
local attempts, deadlines, leases = {}, {}, {}
local claimed, earliest = 0, nil
for j = 1, #ids do
  -- An id without a message (removed meanwhile) only leaves `delayed`.
  local id, v = ids[j], vals[j]
  if v then
    claimed = claimed + 1
    local token = prefix .. ':' .. claimed
    local attempt = tonumber(before[j] or '0') + 1
    local deadline = math.max(dues[j], now) + vis
    if not earliest or deadline < earliest then
      earliest = deadline
    end
    attempts[#attempts + 1] = id
    attempts[#attempts + 1] = attempt
    deadlines[#deadlines + 1] = string.format('%d', deadline)
    deadlines[#deadlines + 1] = id
    leases[#leases + 1] = id
    leases[#leases + 1] = token
    out[#out + 1] = id
    out[#out + 1] = v
    out[#out + 1] = attempt
    out[#out + 1] = token
    out[#out + 1] = dues[j]
    record[#record + 1] = id
    record[#record + 1] = dues[j]
  end
end
if claimed > 0 then
  redis.call('HSET', KEYS[5], unpack(attempts))
  redis.call('ZADD', KEYS[3], unpack(deadlines))
  redis.call('HSET', KEYS[4], unpack(leases))
  redis.call('HINCRBY', KEYS[6], 'delivered', claimed)
  lower_head(KEYS[8], earliest)
  remember(KEYS[7], record, ARGV[6])
end
return out
