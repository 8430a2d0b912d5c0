-- offer_batch.lua: add many delayed messages to queue N in one atomic step; with ARGV[2]
-- 'k', skipping ids already known there.
--
-- KEYS[1]  redwheel:{N}:delayed   ZSET  id -> due (ms, Redis server clock)
-- KEYS[2]  redwheel:{N}:msg       HASH  id -> "<due ms>:<payload>"
-- KEYS[3]  redwheel:{N}:wake      shard channel (only SPUBLISHed to; named in KEYS so a
--                                 cluster knows the script's slot)
-- KEYS[4]  redwheel:{N}:head      HASH  field `due`: lower bound of every due and deadline (head.lua)
-- KEYS[5]  redwheel:{N}:controls  HASH  max_len (absent: no bound)
-- KEYS[6]  redwheel:{N}:dead      ZSET  the dead letters (not counted in the length)
-- KEYS[7]  redwheel:{N}:ready     LIST  ids that are due, in due order
-- ARGV[1]  'r' (each time below is a delay in ms, added to the server's TIME) or 'a' (each
--          is an absolute due in epoch ms; past ones are clamped to now)
-- ARGV[2]  'k' (ids are the caller's: keep a known id as it is, and reply per message) or
--          'n' (ids are fresh, made by redwheel: all or nothing, reply with a count)
-- ARGV[3..] triples: delay or due time, id, encoded payload.
--          The client sends at most 1,000 triples per call (Lua's unpack limit is 8,000).
--
-- Reply: with 'k', one integer per message, in order: 1 if it was added, 0 if its id was
--        already known to the queue (waiting, due, or a dead letter; nothing written for
--        it). With 'n', the number of messages written, or -1 when one of the ids is already
--        known (a fresh id that is not: two processes share an id prefix), and then nothing
--        is written.
--        Error 'ERR redwheel: due overflows' (nothing written) when a due exceeds 2^53 ms;
--        'ERR redwheel: queue full (<len> of max_len <n>, <k> to add)' (nothing written) when
--        the messages it would add do not all fit under max_len.
--
-- Invariant: as offer.lua, for every message of the batch (with 'k', an id repeated within
-- the batch is added once); one SPUBLISH at most, of the earliest due added, and only when
-- it is earlier than every due already waiting (`head` is lowered to it likewise). Fresh ids
-- are looked up too, before anything is written (one HMGET for the batch): a message is never
-- overwritten. All or nothing under max_len: the length never passes it. When nothing in
-- `delayed` is due, the messages due now (due <= the server's now) go straight to the tail of
-- `ready`, in batch order, with one RPUSH, as transfer.lua would move them (see offer.lua),
-- and the one SPUBLISH is of now when `ready` was empty; the others go to `delayed`. (lower_head comes from head.lua, full
-- and due_at from offer_lib.lua, put in front of this script by scripts.rs.)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local check = ARGV[2] == 'k'
local n = (#ARGV - 2) / 3
local ids = {}
for i = 1, n do
  ids[i] = ARGV[3 * i + 1]
end
local known = redis.call('HMGET', KEYS[2], unpack(ids))
if not check then
  for i = 1, n do
    if known[i] then
      return -1
    end
  end
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
-- Due-now messages may skip `delayed` only while nothing there is due.
local direct = head[2] == nil or tonumber(head[2]) > now
local zargs = {}
local hargs = {}
local rargs = {}
local added = {}
local seen = {}
local min_due
-- The previous message's time and due (a batch usually repeats one delay).
local last_value, due, dues
for i = 0, n - 1 do
  local value = ARGV[3 * i + 3]
  if value ~= last_value then
    due = due_at(ARGV[1], value, now)
    if due > 9007199254740992 then
      return redis.error_reply('ERR redwheel: due overflows')
    end
    dues = string.format('%d', due)
    last_value = value
  end
  local id = ids[i + 1]
  if check and (seen[id] or known[i + 1]) then
    added[i + 1] = 0
  else
    seen[id] = true
    added[i + 1] = 1
    hargs[#hargs + 1] = id
    hargs[#hargs + 1] = dues .. ':' .. ARGV[3 * i + 5]
    if direct and due <= now then
      rargs[#rargs + 1] = id
    else
      zargs[#zargs + 1] = dues
      zargs[#zargs + 1] = id
      if min_due == nil or due < min_due then
        min_due = due
      end
    end
  end
end
local reply = added
if not check then
  reply = #hargs / 2
end
if #hargs == 0 then
  return reply
end
local refused = full(KEYS[5], KEYS[2], KEYS[6], #hargs / 2)
if refused then
  return refused
end
redis.call('HSET', KEYS[2], unpack(hargs))
if #zargs > 0 then
  redis.call('ZADD', KEYS[1], unpack(zargs))
  if head[2] == nil or min_due < tonumber(head[2]) then
    lower_head(KEYS[4], min_due)
  else
    min_due = nil
  end
end
if #rargs > 0 and redis.call('RPUSH', KEYS[7], unpack(rargs)) == #rargs then
  -- Onto an empty `ready`: announced as a new head is (see offer.lua), so the transfer jobs
  -- wake the waiting takes.
  min_due = now
end
if min_due then
  redis.call('SPUBLISH', KEYS[3], string.format('%d', min_due))
end
return reply
