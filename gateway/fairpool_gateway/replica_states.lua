-- A replica's report of what it holds for one pool, and every live replica's reports
-- (fairpool_gateway.shared_fronts): one call per pool per poll, atomic on the server.
--   KEYS[1] replicas:  ZSET replica id -> expiry of its report
--   KEYS[2] holdings:  HASH replica id -> its report (JSON)
--   ARGV: replica id, report, seconds the report lives
-- Returns HGETALL of the live reports, this replica's included.

local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local lives = tonumber(ARGV[3])
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  redis.call('HDEL', KEYS[2], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + lives, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
-- Keys of a pool nobody serves any more go away by themselves.
local idle_ms = math.ceil(lives * 10000)
redis.call('PEXPIRE', KEYS[1], idle_ms)
redis.call('PEXPIRE', KEYS[2], idle_ms)
return redis.call('HGETALL', KEYS[2])
