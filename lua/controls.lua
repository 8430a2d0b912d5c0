-- controls.lua: set or lift the controls of queue N (pause, rate limit, max in flight, max
-- length), which every process's scripts read from Redis.
--
-- KEYS[1]  redwheel:{N}:controls  HASH  paused ('1'), rate_max, rate_per (ms), max_in_flight,
--                                       max_len; besides the scripts' flags (priorities,
--                                       ttls, release_waiters), left alone here
-- KEYS[2]  redwheel:{N}:wake      shard channel ('0': every process looks at the queue again)
-- ARGV     pairs: a field, then its new value, or '' to lift it (delete the field)
--
-- Reply: the number of fields set or lifted.
--
-- Invariant: the fields change in one atomic step (a rate limit's max and window never
-- apart). Every change is announced on `wake`, so consumers that a pause or a limit held
-- back look again at once (a resume, a limit raised or lifted); a lost announcement is
-- made up by each process's guard sweep.
local n = 0
for i = 1, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
  n = n + 1
end
redis.call('SPUBLISH', KEYS[2], '0')
return n
