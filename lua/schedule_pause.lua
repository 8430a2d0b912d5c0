-- schedule_pause.lua: pauses or resumes schedule `name` of queue N
-- (Queue::pause_schedule, Queue::resume_schedule). After schedule_lib.lua.
--
-- KEYS[1]  redwheel:{N}:schedules          HASH    name -> "<rev>:<paused>:<definition>"
-- KEYS[2]  redwheel:{N}:schedules:next     ZSET    name -> next occurrence (ms)
-- KEYS[3]  redwheel:{N}:schedules:last     HASH    name -> last occurrence fired (ms)
-- KEYS[4]  redwheel:{N}:schedules:changes  ZSET    name -> version of its last change
-- KEYS[5]  redwheel:{N}:head               HASH    `schedules`: "<version>:<earliest next>"
-- KEYS[6]  redwheel:{N}:wake               shard channel (SPUBLISHed 's': the set changed)
-- KEYS[7]  redwheel:{N}:schedules:ahead    HASH    name -> occurrences offered ahead
-- KEYS[8]  redwheel:{N}:delayed            ZSET    id -> due (ms)
-- KEYS[9]  redwheel:{N}:msg                HASH    id -> "<due ms>:<payload>"
-- ARGV[1]  the schedule's name
-- ARGV[2]  'p' (pause) or 'r' (resume)
-- ARGV[3]  resume only: the rev of the record the client read the definition from
-- ARGV[4]  resume only: "settled", the instant it resumes from (the client's estimate of
--          the server's now); occurrences at or before it are not owed
-- ARGV[5]  resume only: its first occurrence after ARGV[4] (epoch ms), or ''
--
-- Reply: { code, now }, now being the server's TIME in ms:
--   1   paused, or resumed; 0 it was so already (nothing written); -1 no such schedule;
--   -2  resume only, nothing written: the record changed since the client read it (read
--       it again); -3 resume only, nothing written: ARGV[4] is earlier than the last
--       occurrence fired or later than both it and now; `now` is then the instant to resume
--       from instead (compute ARGV[5] again from it): the server's TIME, or the last
--       occurrence fired when that is later (fired ahead and claimed ahead by a consumer
--       pool, so not taken back by the pause: it counts as fired)
--
-- Invariant: a paused schedule has no `next`, so it never fires; occurrences that fall
-- while it is paused are not owed when it resumes (it starts again from ARGV[4], as a new
-- schedule does), and a pause takes back those offered ahead that fall due after its TIME
-- (and puts `last` back to what was fired before them; those a consumer pool claimed ahead
-- stay, count as fired, and stay listed in `ahead`). Each change bumps the version and is
-- announced on `wake`.
local now = now_ms()
local name = ARGV[1]
local cur = redis.call('HGET', KEYS[1], name)
if not cur then
  return { -1, now }
end
local rev, paused, def = sched_parse(cur)
local version
if ARGV[2] == 'p' then
  if paused == '1' then
    return { 0, now }
  end
  local back = sched_ahead_read(KEYS[7], KEYS[8], name, now)
  if back then
    sched_take_back(back, KEYS[7], KEYS[8], KEYS[9], KEYS[3], name)
  end
  version = sched_next_version(KEYS[5])
  redis.call('HSET', KEYS[1], name, string.format('%d', version) .. ':1:' .. def)
  redis.call('ZREM', KEYS[2], name)
else
  if paused == '0' then
    return { 0, now }
  end
  if rev ~= ARGV[3] then
    return { -2, now }
  end
  local ok, from = sched_may_start(KEYS[3], name, tonumber(ARGV[4]), now)
  if not ok then
    return { -3, from }
  end
  version = sched_next_version(KEYS[5])
  redis.call('HSET', KEYS[1], name, string.format('%d', version) .. ':0:' .. def)
  if ARGV[5] ~= '' then
    redis.call('ZADD', KEYS[2], ARGV[5], name)
  end
end
sched_changed(KEYS[4], name, version)
sched_set_head(KEYS[5], KEYS[2], version)
redis.call('SPUBLISH', KEYS[6], 's')
return { 1, now }
