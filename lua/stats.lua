-- stats.lua: the state of queue N in one atomic read.
--
-- KEYS[1]  redwheel:{N}:delayed   ZSET  id -> due
-- KEYS[2]  redwheel:{N}:ready     LIST  ids that are due
-- KEYS[3]  redwheel:{N}:inflight  ZSET  id -> visibility deadline
-- KEYS[4]  redwheel:{N}:dead      ZSET  id -> when it died
-- KEYS[5]  redwheel:{N}:msg       HASH  id -> "<due ms>:<payload>"
-- KEYS[6]  redwheel:{N}:prioritized  ZSET  due messages of priority 1..9 (ready too)
-- KEYS[7]  redwheel:{N}:counts    HASH  'expired' -> messages whose ttl ran out so far
-- ARGV     none
--
-- Reply: { delayed, ready, inflight, dead, oldest_overdue_ms, next_due_ms, now_ms, expired }:
--   counts of each state; `ready` counts messages, not the entries of the ready list (which
--   may still hold entries of messages removed after they fell due, and the wake marker ''
--   transfer.lua may leave at its head): every message (`msg` entry) is in exactly one of
--   `delayed`, ready (the list or `prioritized`), `inflight` and `dead`, so the ready ones
--   are HLEN(msg) minus the other three, in O(1);
--   oldest_overdue_ms: how long the oldest message that is due but not delivered has been
--   due (the first ready id, or the head of `delayed` if the transfer lags), -1 if none;
--   next_due_ms: the head of `delayed` (epoch ms), -1 if empty; now_ms: the server's clock;
--   expired: messages whose ttl ran out before they were handed out, so far.
--
-- Invariant: read-only. (lifecycle.lua is put in front of this script by scripts.rs.)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local oldest = -1
local first = redis.call('LINDEX', KEYS[2], 0)
if first then
  local v = redis.call('HGET', KEYS[5], first)
  if v then
    local colon = string.find(v, ':', 1, true)
    local due = colon and tonumber(string.sub(v, 1, colon - 1))
    if due then
      oldest = math.max(0, now - due)
    end
  end
end
local pri = redis.call('ZCARD', KEYS[6])
if pri > 0 then
  -- The oldest due of each priority band (PRIORITY_BAND, from lifecycle.lua: scores are
  -- band * 2^49 + due).
  for b = 0, 8 do
    local h = redis.call('ZRANGEBYSCORE', KEYS[6], string.format('%d', b * PRIORITY_BAND),
      '(' .. string.format('%d', (b + 1) * PRIORITY_BAND), 'WITHSCORES', 'LIMIT', 0, 1)
    if h[2] then
      oldest = math.max(oldest, now - (tonumber(h[2]) - b * PRIORITY_BAND))
    end
  end
end
local next_due = -1
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if head[2] then
  next_due = tonumber(head[2])
  if next_due <= now then
    oldest = math.max(oldest, now - next_due)
  end
end
local delayed = redis.call('ZCARD', KEYS[1])
local inflight = redis.call('ZCARD', KEYS[3])
local dead = redis.call('ZCARD', KEYS[4])
local ready = math.max(0, redis.call('HLEN', KEYS[5]) - delayed - inflight - dead)
return { delayed, ready, inflight, dead, oldest, next_due, now,
  tonumber(redis.call('HGET', KEYS[7], 'expired') or '0') }
