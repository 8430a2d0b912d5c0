-- offer_with.lua: add one delayed message to queue N with options (priority, ttl) and, under a
-- dedup key, one of three dedup modes: keep, throttle or debounce.
--
-- KEYS[1]  redwheel:{N}:delayed      ZSET  id -> due (ms, Redis server clock)
-- KEYS[2]  redwheel:{N}:msg          HASH  id -> "<due ms>:<payload>"
-- KEYS[3]  redwheel:{N}:wake         shard channel (SPUBLISHed to when the message is the
--                                    new head)
-- KEYS[4]  redwheel:{N}:controls     HASH  max_len; the flags priorities and ttls (set here)
-- KEYS[5]  redwheel:{N}:dead         ZSET  id -> when it died
-- KEYS[6]  redwheel:{N}:inflight     ZSET  id -> visibility deadline
-- KEYS[7]  redwheel:{N}:prioritized  ZSET  due messages of priority 1..9
-- KEYS[8]  redwheel:{N}:priority     HASH  id -> priority (1..9)
-- KEYS[9]  redwheel:{N}:expires      ZSET  id -> the time it must be handed out by (ms)
-- KEYS[10] redwheel:{N}:dedup        HASH  key -> id of the message offered under it, when
--                                          that id is not the key (a debounce successor)
-- KEYS[11] redwheel:{N}:stale        HASH  id -> entries of `ready` left by removed messages
-- KEYS[12] redwheel:{N}:attempts     HASH  id -> deliveries so far
-- KEYS[13] redwheel:{N}:throttle:<key>  STRING, TTL = the throttle window
-- KEYS[14] redwheel:{N}:head         HASH  field `due`: lower bound of every due and deadline
--                                    (head.lua)
-- ARGV[1]  'r' (ARGV[2] is a delay in ms, added to the server's TIME) or 'a' (ARGV[2] is an
--          absolute due in epoch ms; a past one is clamped to now)
-- ARGV[2]  the delay or the due time, a non-negative integer in decimal
-- ARGV[3]  the dedup key (the message's id, unless a successor is written), or with mode 'n'
--          a fresh id made by redwheel
-- ARGV[4]  the encoded payload (bytes)
-- ARGV[5]  priority, 0..9 (9 first)
-- ARGV[6]  ttl in ms (0: none): not handed out by due + ttl, the message dies 'expired'
-- ARGV[7]  dedup mode: 'n' (none: a fresh id), 'k' keep, 't' throttle, 'd' debounce
-- ARGV[8]  the throttle window in ms (mode 't')
-- ARGV[9]  a fresh id, for a debounce successor (mode 'd')
--
-- Reply: { code, id, due } (due: epoch ms, server clock), code:
--   0  the fresh id of mode 'n' is known to the queue already (two processes share an id
--      prefix): nothing written (due: 0)
--   1  written under id (the key, or the fresh id of mode 'n')
--   2  written under a fresh id (ARGV[9]), the successor of the message under the key, which
--      was delivered already (in flight, waiting for a retry, or a dead letter); a 4th
--      element names that message; the key now leads to the successor
--   3  replaced: the message under the key had never been handed out; it now has this
--      payload, due time, priority and ttl
--   4  kept: a message under the key is known to the queue (waiting, in flight or a dead
--      letter); nothing changed (due: 0)
--   5  throttled: an offer under the key was written less than the window ago; nothing
--      changed, whether or not that message was delivered since (due: 0)
--   Errors as offer.lua ('ERR redwheel: due overflows', 'ERR redwheel: queue full …'; the
--   length bound applies to codes 1 and 2, which add a message), nothing written.
--
-- Invariant: as offer.lua. A key leads to at most one message at a time (the key itself as
-- id, or the successor `dedup` names), so concurrent offers under one key, from any number of
-- processes, write it at most once while it is known (keep), at most once per window
-- (throttle), or replace the one waiting (debounce): each offer is one atomic step. A
-- replaced message that was ready leaves its old entry counted in `stale` (skipped, never
-- delivered), exactly as remove.lua does. `head` is lowered with every new head of `delayed`.
-- O(log n). (lower_head comes from head.lua, full and due_at from offer_lib.lua, put in
-- front of this script by scripts.rs.)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = due_at(ARGV[1], ARGV[2], now)
local ttl = tonumber(ARGV[6])
if due > 9007199254740992 or due + ttl > 9007199254740992 then
  return redis.error_reply('ERR redwheel: due overflows')
end
local mode = ARGV[7]
local key = ARGV[3]
local id = key
local code = 1
local before
if mode == 'n' and redis.call('HEXISTS', KEYS[2], id) == 1 then
  return { 0, id, 0 }
end
if mode ~= 'n' then
  local mapped = redis.call('HGET', KEYS[10], key)
  if mapped then
    if redis.call('HEXISTS', KEYS[2], mapped) == 1 then
      id = mapped
    else
      redis.call('HDEL', KEYS[10], key)
    end
  end
  if mode == 't' and redis.call('EXISTS', KEYS[13]) == 1 then
    return { 5, id, 0 }
  end
  if redis.call('HEXISTS', KEYS[2], id) == 1 then
    if mode ~= 'd' then
      return { 4, id, 0 }
    end
    if redis.call('HEXISTS', KEYS[12], id) == 1 or redis.call('ZSCORE', KEYS[5], id) then
      -- Delivered at least once (in flight, waiting for a retry) or dead: a successor.
      before = id
      id = ARGV[9]
      code = 2
    else
      -- Never handed out: waiting in `delayed`, `prioritized` or `ready`. Take it out.
      if redis.call('ZREM', KEYS[1], id) == 0 and redis.call('ZREM', KEYS[7], id) == 0 then
        redis.call('HINCRBY', KEYS[11], id, 1)
      end
      code = 3
    end
  end
end
if code ~= 3 then
  local refused = full(KEYS[4], KEYS[2], KEYS[5], 1)
  if refused then
    return refused
  end
end
local dues = string.format('%d', due)
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
redis.call('ZADD', KEYS[1], dues, id)
redis.call('HSET', KEYS[2], id, dues .. ':' .. ARGV[4])
local priority = tonumber(ARGV[5])
if priority > 0 then
  redis.call('HSET', KEYS[8], id, priority)
  redis.call('HSET', KEYS[4], 'priorities', '1')
elseif mode ~= 'n' then
  redis.call('HDEL', KEYS[8], id)
end
if ttl > 0 then
  redis.call('ZADD', KEYS[9], string.format('%d', due + ttl), id)
  redis.call('HSET', KEYS[4], 'ttls', '1')
elseif mode ~= 'n' then
  redis.call('ZREM', KEYS[9], id)
end
if code == 2 then
  redis.call('HSET', KEYS[10], key, id)
end
if mode == 't' then
  redis.call('SET', KEYS[13], '1', 'PX', ARGV[8])
end
if head[2] == nil or due < tonumber(head[2]) then
  lower_head(KEYS[14], due)
  redis.call('SPUBLISH', KEYS[3], dues)
end
if code == 2 then
  return { 2, id, due, before }
end
return { code, id, due }
