-- clear.lua: delete every message of queue N, delayed, ready or parked as undecodable.
--
-- KEYS[1]  redwheel:{N}:delayed   ZSET
-- KEYS[2]  redwheel:{N}:msg       HASH
-- KEYS[3]  redwheel:{N}:ready     LIST
-- KEYS[4]  redwheel:{N}:dead      ZSET
-- ARGV     none
--
-- Reply: the number of messages deleted (entries of `msg`).
--
-- Invariant: afterwards the queue holds nothing; the four keys go in one atomic step,
-- so no transfer or take sees half a queue. (DEL of large keys is O(n); use UNLINK-like
-- lazy freeing on the server, `lazyfree-lazy-user-del yes`, for huge queues.)
local n = redis.call('HLEN', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
return n
