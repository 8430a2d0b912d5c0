-- schedule_remove.lua: deletes schedule `name` of queue N (Queue::unschedule). Its
-- occurrences already offered stay in the queue. After schedule_lib.lua.
--
-- KEYS[1]  redwheel:{N}:schedules          HASH    name -> "<rev>:<paused>:<definition>"
-- KEYS[2]  redwheel:{N}:schedules:payload  HASH    name -> payload
-- KEYS[3]  redwheel:{N}:schedules:next     ZSET    name -> next occurrence (ms)
-- KEYS[4]  redwheel:{N}:schedules:last     HASH    name -> last occurrence fired (ms)
-- KEYS[5]  redwheel:{N}:schedules:changes  ZSET    name -> version of its last change
-- KEYS[6]  redwheel:{N}:head               HASH    `schedules`: "<version>:<earliest next>"
-- KEYS[7]  redwheel:{N}:wake               shard channel (SPUBLISHed 's': the set changed)
-- ARGV[1]  the schedule's name
--
-- Reply: 1 removed, 0 there was no such schedule (nothing written).
--
-- Invariant: the schedule's keys go together, in one step, so no process fires it after
-- this; the removal is a change (a new version, recorded in `changes`) like any other.
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
local version = sched_next_version(KEYS[6])
sched_changed(KEYS[5], ARGV[1], version)
sched_set_head(KEYS[6], KEYS[3], version)
redis.call('SPUBLISH', KEYS[7], 's')
return 1
