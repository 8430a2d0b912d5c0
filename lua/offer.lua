-- offer.lua: add one delayed message to queue N, unless its id is already known there.
--
-- KEYS[1]  redwheel:{N}:delayed   ZSET  id -> due (ms, Redis server clock)
-- KEYS[2]  redwheel:{N}:msg       HASH  id -> "<due ms>:<payload>"
-- KEYS[3]  redwheel:{N}:wake      shard channel (only SPUBLISHed to; named in KEYS so a
--                                 cluster knows the script's slot)
-- KEYS[4]  redwheel:{N}:head      HASH  field `due`: lower bound of every due and deadline (head.lua)
-- KEYS[5]  redwheel:{N}:controls  HASH  max_len (absent: no bound)
-- KEYS[6]  redwheel:{N}:dead      ZSET  the dead letters (not counted in the length)
-- KEYS[7]  redwheel:{N}:ready     LIST  ids that are due, in due order
-- ARGV[1]  'r' (ARGV[2] is a delay in ms, added to the server's TIME)
--          or 'a' (ARGV[2] is an absolute due in epoch ms; a past one is clamped to now)
-- ARGV[2]  the delay or the due time, a non-negative integer in decimal
-- ARGV[3]  the message id (client-generated and unique, or chosen by the caller)
-- ARGV[4]  the encoded payload (bytes)
--
-- Reply: the message's due time in epoch ms (server clock), an integer >= 0, when it was
--        added; -1 when the id is already known to the queue (waiting, due, or parked as a
--        dead letter): nothing is written, so offering the same id twice is harmless.
--        Error 'ERR redwheel: due overflows' when the due time exceeds 2^53 ms (checked
--        before the id when the queue has no max_len), and
--        'ERR redwheel: queue full (<len> of max_len <n>, 1 to add)' when the queue holds max_len
--        messages already (delayed, ready or in flight: HLEN msg - ZCARD dead); nothing is
--        written then.
--
-- Invariant: a message is in `delayed` iff it has a `msg` entry and has not yet been
-- transferred; both are written together. A message due now (due <= the server's now) while
-- nothing in `delayed` is due goes straight to the tail of `ready` instead, as transfer.lua
-- would move it (in due order: everything before it on `ready` is due too, nothing due waits
-- in `delayed`), without the ZADD and the transfer's work: one RPUSH, and, when `ready` was
-- empty, the wake-up with its due time as for a new head. Due times never come from a client clock
-- for relative delays. `wake` carries the due time only when it is earlier than every
-- due already waiting (the message became the head), so transfer tasks learn about
-- earlier heads, never later ones; `head` is lowered to it likewise. The length never
-- passes max_len. O(log n). (lower_head comes from head.lua, full and due_at from
-- offer_lib.lua, put in front of this script by scripts.rs.)
-- With max_len set, the id and the length are checked before anything is written; without
-- it (the common case) HSETNX writes the message and checks the id in one call.
if redis.call('HEXISTS', KEYS[5], 'max_len') == 1 then
  if redis.call('HEXISTS', KEYS[2], ARGV[3]) == 1 then
    return -1
  end
  local refused = full(KEYS[5], KEYS[2], KEYS[6], 1)
  if refused then
    return refused
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = due_at(ARGV[1], ARGV[2], now)
if due > 9007199254740992 then
  return redis.error_reply('ERR redwheel: due overflows')
end
local dues = string.format('%d', due)
if redis.call('HSETNX', KEYS[2], ARGV[3], dues .. ':' .. ARGV[4]) == 0 then
  return -1
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if due <= now and (head[2] == nil or tonumber(head[2]) > now) then
  -- Onto an empty `ready`, announced as a new head of `delayed` is: every process's transfer
  -- job runs now and wakes the takes and claims waiting in it (async ones wait for that, not
  -- on the list). Onto a non-empty one, nobody waits for it: whoever takes what is there
  -- wakes the next waiter.
  if redis.call('RPUSH', KEYS[7], ARGV[3]) == 1 then
    redis.call('SPUBLISH', KEYS[3], dues)
  end
  return due
end
redis.call('ZADD', KEYS[1], dues, ARGV[3])
if head[2] == nil or due < tonumber(head[2]) then
  -- (A due later than the delayed head is above the lower bound already.)
  lower_head(KEYS[4], due)
  redis.call('SPUBLISH', KEYS[3], dues)
end
return due
