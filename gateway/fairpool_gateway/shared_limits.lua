-- Hard limits shared by the gateway's replicas: one script per request phase, each atomic
-- on the server (fairpool_gateway.shared_limits explains the design).
--
-- Keys, all of one tenant (one hash tag, so a cluster keeps them on one shard); `serve`
-- has its own, below:
--   KEYS[1] requests per second of the window: HASH second -> count
--   KEYS[2] tokens per second of the window:   HASH second -> tokens
--   KEYS[3] requests in progress:               ZSET request id -> lease expiry
-- Time is the server's (TIME), the one clock every replica shares.
--
-- Only replicas write these keys, so what no replica writes is forged and removed before
-- it counts (`reserve` says how many it removed): a key of another type, a bucket of a
-- second still to come or whose count is not a whole number in [0, MOST], a lease that
-- expires later than a lease lasts. Otherwise one forged entry would refuse a tenant for
-- ever, or fail the script and send every replica to its local fallback.

local MOST = 2 ^ 53  -- the largest count a bucket holds exactly, far above any limit
local SLACK = 1  -- seconds a lease's expiry may lie beyond now + lease: rounding
local forged = 0

local function now()
  local time = redis.call('TIME')
  return tonumber(time[1]) + tonumber(time[2]) / 1000000
end

-- Delete `key` if it is not of `kind` (or absent).
local function of_type(key, kind)
  local found = redis.call('TYPE', key)['ok']
  if found ~= 'none' and found ~= kind then
    redis.call('DEL', key)
    forged = forged + 1
  end
end

-- Whether `text` (a field or value read) is a number as replicas write them: in [0, MOST],
-- digits alone (`whole`: what HINCRBY takes) or a decimal (what HINCRBYFLOAT takes). Lua
-- would read more (' 5', '0x10', '1e3' as counts) that the server's increments refuse.
local function sane(text, whole)
  if type(text) ~= 'string' or not string.match(text, whole and '^%d+$' or '^[%d.eE+-]+$') then
    return false
  end
  local value = tonumber(text)
  return value ~= nil and value == value and value >= 0 and value <= MOST
end

-- The buckets of `key` inside the window ending at `second` (older ones deleted, forged
-- ones too), sorted by second, and their sum. `whole`: counts (HINCRBY) rather than
-- service (HINCRBYFLOAT).
local function window(key, second, length, whole)
  local oldest = second - length + 1
  local fields = redis.call('HGETALL', key)
  local buckets, total = {}, 0
  for index = 1, #fields, 2 do
    local at, value = fields[index], fields[index + 1]
    if not (sane(at, true) and tonumber(at) <= second and sane(value, whole)) then
      redis.call('HDEL', key, at)
      forged = forged + 1
    elseif tonumber(at) < oldest then
      redis.call('HDEL', key, at)
    else
      buckets[#buckets + 1] = {tonumber(at), tonumber(value)}
      total = total + tonumber(value)
    end
  end
  table.sort(buckets, function(a, b) return a[1] < b[1] end)
  return buckets, total
end

-- Seconds until `adding` more fits under `limit` as buckets leave the window; -1 never.
local function wait_until_fits(buckets, total, adding, limit, clock, length)
  if adding > limit then return -1 end
  if total + adding <= limit then return 0 end
  for _, bucket in ipairs(buckets) do
    total = total - bucket[2]
    if total + adding <= limit then
      return math.max(bucket[1] + length - clock, 0.001)
    end
  end
  return length
end

-- Delete the leases of `key` that expired, and those that expire later than a lease of
-- `lease` seconds taken at `clock` can (forged).
local function live_leases(key, clock, lease)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', clock)
  forged = forged + redis.call('ZREMRANGEBYSCORE', key, '(' .. (clock + lease + SLACK), '+inf')
end

-- The tenant's keys, each of its type.
local function tenant_keys()
  of_type(KEYS[1], 'hash')
  of_type(KEYS[2], 'hash')
  of_type(KEYS[3], 'zset')
end

local function reserve()
  -- ARGV: phase, request id, tokens, rpm, tpm, concurrent (-1: none), lease s, window s
  local id, tokens = ARGV[2], tonumber(ARGV[3])
  local rpm, tpm, concurrent = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  local lease, length = tonumber(ARGV[7]), tonumber(ARGV[8])
  local clock = now()
  local second = math.floor(clock)
  local refusal, refusal_wait = nil, 0
  tenant_keys()
  local function refuse(reason, wait)
    if refusal == nil or wait > refusal_wait then refusal, refusal_wait = reason, wait end
  end
  -- both windows pruned whatever the limits: the buckets counted into below must be sane
  local requests, requested = window(KEYS[1], second, length, true)
  local tokens_in, tokens_total = window(KEYS[2], second, length, true)
  if rpm >= 0 then
    local wait = wait_until_fits(requests, requested, 1, rpm, clock, length)
    if wait ~= 0 then refuse('requests_per_minute', wait < 0 and length or wait) end
  end
  if tpm >= 0 then
    local wait = wait_until_fits(tokens_in, tokens_total, tokens, tpm, clock, length)
    if wait < 0 then
      refuse('tokens_alone', length)
    elseif wait > 0 then
      refuse('tokens_per_minute', wait)
    end
  end
  live_leases(KEYS[3], clock, lease)  -- and those of replicas that died
  if concurrent >= 0 and redis.call('ZCARD', KEYS[3]) >= concurrent then
    refuse('concurrent', 0)
  end
  if refusal ~= nil then
    return {0, refusal, tostring(refusal_wait), forged}
  end
  redis.call('HINCRBY', KEYS[1], second, 1)
  redis.call('HINCRBY', KEYS[2], second, tokens)
  redis.call('ZADD', KEYS[3], clock + lease, id)
  for _, key in ipairs(KEYS) do redis.call('EXPIRE', key, math.ceil(length + lease)) end
  return {1, second, forged}
end

local function settle()
  -- ARGV: phase, request id, second reserved, tokens reserved, tokens served (-1: unknown)
  local id, second = ARGV[2], ARGV[3]
  local reserved, served = tonumber(ARGV[4]), tonumber(ARGV[5])
  tenant_keys()
  redis.call('ZREM', KEYS[3], id)
  if served >= 0 and sane(redis.call('HGET', KEYS[2], second), true) then
    redis.call('HINCRBY', KEYS[2], second, served - reserved)
  end
  return 1
end

local function renew()
  -- ARGV: phase, lease s, request ids: their leases (those still held) run on
  local expiry = now() + tonumber(ARGV[2])
  tenant_keys()
  for index = 3, #ARGV do
    redis.call('ZADD', KEYS[3], 'XX', expiry, ARGV[index])
  end
  redis.call('EXPIRE', KEYS[3], math.ceil(tonumber(ARGV[2])) * 2)
  return 1
end

local function serve()
  -- The fleet's record of service, for the shares every replica reports (not a limit).
  -- KEYS[1] the tenant's service per pool: HASH pool -> total
  -- KEYS[2] its service in this pool per second of the window: HASH second -> service
  -- ARGV: phase, pool, service, window s
  local service, length = tonumber(ARGV[3]), tonumber(ARGV[4])
  local second = math.floor(now())
  of_type(KEYS[1], 'hash')
  of_type(KEYS[2], 'hash')
  window(KEYS[2], second, length, false)  -- drops the buckets that left it
  if not sane(redis.call('HGET', KEYS[1], ARGV[2]), false) then
    redis.call('HDEL', KEYS[1], ARGV[2])  -- forged: the record starts again
  end
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[2], service)
  redis.call('HINCRBYFLOAT', KEYS[2], second, service)
  redis.call('EXPIRE', KEYS[2], length * 2)
  return 1
end

local phases = {reserve = reserve, settle = settle, renew = renew, serve = serve}
return phases[ARGV[1]]()
