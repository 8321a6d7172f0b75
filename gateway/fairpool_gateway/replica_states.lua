-- A replica's report of what it holds for one pool, and every live replica's reports
-- (fairpool_gateway.shared_fronts): one call per pool per poll, atomic on the server.
--   KEYS[1] replicas:  ZSET replica id -> expiry of its report
--   KEYS[2] holdings:  HASH replica id -> its report (JSON)
--   ARGV: replica id, report, seconds a report lives, most bytes of one report, most bytes
--         of all the reports returned
-- Returns {live reports as [id, report, ...] (this replica's included), entries ignored}.
--
-- Only replicas write these keys, so what no replica writes is forged and removed (and
-- counted in the second answer): a key of another type, an expiry further ahead than a
-- report lives (a replica sets now + lives), a report whose replica is not live (none of
-- its own renews it, and the others' renewals of the keys would keep it for ever), a
-- report over the byte bound. Reports past the bound on all of them are left out.

local SLACK = 1  -- seconds an expiry may lie beyond now + lives: rounding, not clocks

local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local lives = tonumber(ARGV[3])
local most_bytes, most_in_all = tonumber(ARGV[4]), tonumber(ARGV[5])
local ignored = 0

local function of_type(key, kind)
  local found = redis.call('TYPE', key)['ok']
  if found ~= 'none' and found ~= kind then
    redis.call('DEL', key)
    ignored = ignored + 1
  end
end

of_type(KEYS[1], 'zset')
of_type(KEYS[2], 'hash')
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  redis.call('HDEL', KEYS[2], gone)  -- a replica that died: its report goes with it
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
ignored = ignored
  + redis.call('ZREMRANGEBYSCORE', KEYS[1], '(' .. (now + lives + SLACK), '+inf')
redis.call('ZADD', KEYS[1], now + lives, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])

local live, in_all = {}, 0
local fields = redis.call('HGETALL', KEYS[2])
for index = 1, #fields, 2 do
  local replica, report = fields[index], fields[index + 1]
  if #report > most_bytes or not redis.call('ZSCORE', KEYS[1], replica) then
    redis.call('HDEL', KEYS[2], replica)
    ignored = ignored + 1
  elseif in_all + #report > most_in_all then
    ignored = ignored + 1
  else
    in_all = in_all + #report
    live[#live + 1] = replica
    live[#live + 1] = report
  end
end

-- Keys of a pool nobody serves any more go away by themselves.
local idle_ms = math.ceil(lives * 10000)
redis.call('PEXPIRE', KEYS[1], idle_ms)
redis.call('PEXPIRE', KEYS[2], idle_ms)
return {live, ignored}
