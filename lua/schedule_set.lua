-- schedule_set.lua: creates schedule `name` of queue N, or replaces its definition and
-- payload (the idempotent upsert behind Queue::schedule). After schedule_lib.lua.
--
-- KEYS[1]  redwheel:{N}:schedules          HASH    name -> "<rev>:<paused>:<definition>"
-- KEYS[2]  redwheel:{N}:schedules:payload  HASH    name -> payload
-- KEYS[3]  redwheel:{N}:schedules:next     ZSET    name -> next occurrence (ms)
-- KEYS[4]  redwheel:{N}:schedules:last     HASH    name -> last occurrence fired (ms)
-- KEYS[5]  redwheel:{N}:schedules:changes  ZSET    name -> version of its last change
-- KEYS[6]  redwheel:{N}:head               HASH    `schedules`: "<version>:<earliest next>"
-- KEYS[7]  redwheel:{N}:wake               shard channel (SPUBLISHed 's': the set changed)
-- KEYS[8]  redwheel:{N}:schedules:ahead    HASH    name -> occurrences offered ahead
-- KEYS[9]  redwheel:{N}:delayed            ZSET    id -> due (ms)
-- KEYS[10] redwheel:{N}:msg                HASH    id -> "<due ms>:<payload>"
-- ARGV[1]  the schedule's name
-- ARGV[2]  its canonical definition (Schedule::definition)
-- ARGV[3]  the payload of its occurrences
-- ARGV[4]  "settled": the instant it starts from (epoch ms; the client's estimate of the
--          server's now); no occurrence at or before it is owed
-- ARGV[5]  its first occurrence after ARGV[4] (epoch ms), or '' when it has none
--
-- Reply: { code, at }:
--   0   unchanged: the same definition and payload were stored already (nothing written,
--       whatever the schedule's state: paused, next, last fired)
--   1   created; 2 replaced (the paused flag and the last occurrence fired are kept; the
--       occurrences of the replaced definition offered ahead of the call's TIME, not yet
--       due, are taken back: removed from the queue, and `last` is what was fired before)
--   -1  nothing written: start from `at` instead (compute ARGV[5] again from it and retry).
--       Either ARGV[4] is earlier than the last occurrence fired or later than both it and
--       the server's now (`at` is the later of the two: an occurrence fired ahead that a
--       consumer pool claimed ahead is not taken back and counts as fired, so the new
--       definition goes on after it), or the schedule being replaced has an occurrence
--       due at or before ARGV[4] that was not fired yet (`at` is just before it: the new
--       definition takes over from there, so nothing the old one owed is dropped)
--   (`at` is the server's TIME in ms for codes 0, 1 and 2.)
--
-- Invariant: a running schedule's `next` is the first occurrence after an instant at or
-- before the later of the call's TIME and its last occurrence fired, at or after that last
-- occurrence, and before any occurrence the replaced definition still owed; so nothing the
-- call replaced fires again, nothing owed is dropped, and nothing after the call is skipped
-- but what falls before an occurrence fired ahead and claimed ahead (within the lead); no
-- occurrence the replaced definition offered ahead and that falls due after the call's
-- TIME stays in the queue, but those a consumer pool claimed ahead (they run, as fired).
-- Every refusal is decided before anything is written. Every change bumps the version
-- once, records itself in `changes` and is announced on `wake`.
local now = now_ms()
local name = ARGV[1]
local cur = redis.call('HGET', KEYS[1], name)
local paused = '0'
local back
if cur then
  local _, p, def = sched_parse(cur)
  if def == ARGV[2] and redis.call('HGET', KEYS[2], name) == ARGV[3] then
    return { 0, now }
  end
  paused = p
  local due = redis.call('ZSCORE', KEYS[3], name)
  if due and tonumber(due) <= tonumber(ARGV[4]) then
    return { -1, tonumber(due) - 1 }
  end
  back = sched_ahead_read(KEYS[8], KEYS[9], name, now)
end
local ok, from = sched_may_start(KEYS[4], name, tonumber(ARGV[4]), now, back)
if not ok then
  return { -1, from }
end
if back then
  sched_take_back(back, KEYS[8], KEYS[9], KEYS[10], KEYS[4], name)
end
local version = sched_next_version(KEYS[6])
redis.call('HSET', KEYS[1], name, string.format('%d', version) .. ':' .. paused .. ':' .. ARGV[2])
redis.call('HSET', KEYS[2], name, ARGV[3])
if paused == '0' and ARGV[5] ~= '' then
  redis.call('ZADD', KEYS[3], ARGV[5], name)
else
  redis.call('ZREM', KEYS[3], name)
end
sched_changed(KEYS[5], name, version)
sched_set_head(KEYS[6], KEYS[3], version)
redis.call('SPUBLISH', KEYS[7], 's')
if cur then
  return { 2, now }
end
return { 1, now }
