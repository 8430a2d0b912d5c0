-- schedule_remove.lua: deletes schedule `name` of queue N (Queue::unschedule). Its
-- occurrences already offered stay in the queue, but those offered ahead of the call's TIME
-- (not yet due) are taken back. After schedule_lib.lua.
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
--
-- Reply: 1 removed, 0 there was no such schedule (nothing written).
--
-- Invariant: the schedule's keys go together, in one step, so no process fires it after
-- this, and no occurrence of it due after the call's TIME stays in the queue; the removal is
-- a change (a new version, recorded in `changes`) like any other.
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  return 0
end
local back = sched_ahead_read(KEYS[8], KEYS[9], ARGV[1], now_ms())
if back then
  sched_take_back(back, KEYS[8], KEYS[9], KEYS[10], KEYS[4], ARGV[1])
  -- Those a consumer pool claimed ahead run: nothing is left to take back later.
  redis.call('HDEL', KEYS[8], ARGV[1])
end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
local version = sched_next_version(KEYS[6])
sched_changed(KEYS[5], ARGV[1], version)
sched_set_head(KEYS[6], KEYS[3], version)
redis.call('SPUBLISH', KEYS[7], 's')
return 1
