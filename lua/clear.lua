-- clear.lua: delete every message of queue N, in every state.
--
-- KEYS[1..9] redwheel:{N}:delayed, msg, ready, dead, inflight, lease, attempts, reason, stale
-- ARGV     none
--
-- Reply: the number of messages deleted (entries of `msg`).
--
-- Invariant: afterwards the queue holds nothing; the keys go in one atomic step, so no
-- transfer, take or claim sees half a queue. A claim in flight loses its lease: its ack finds
-- the message gone. (DEL of large keys is O(n); use lazy freeing on the server,
-- `lazyfree-lazy-user-del yes`, for huge queues.)
local n = redis.call('HLEN', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9])
return n
