-- clear.lua: delete every message of queue N, in every state.
--
-- KEYS[1..14] redwheel:{N}:delayed, msg, ready, dead, inflight, lease, attempts, reason, stale,
--            prioritized, priority, expires, dedup, and controls (only its flags go: the
--            controls themselves, pause and limits, stay)
-- ARGV     none
--
-- Reply: the number of messages deleted (entries of `msg`).
--
-- Invariant: afterwards the queue holds nothing; the keys go in one atomic step, so no
-- transfer, take or claim sees half a queue. A claim in flight loses its lease: its ack finds
-- the message gone. The rate limit's log and throttle markers stay (they are about
-- deliveries and offers made, not messages held). (DEL of large keys is O(n); use lazy
-- freeing on the server, `lazyfree-lazy-user-del yes`, for huge queues.)
local n = redis.call('HLEN', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9],
  KEYS[10], KEYS[11], KEYS[12], KEYS[13])
redis.call('HDEL', KEYS[14], 'priorities', 'ttls')
return n
