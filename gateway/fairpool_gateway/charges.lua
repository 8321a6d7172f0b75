-- What the replicas charged on a pool's workers (fairpool_gateway.shared_fronts): one
-- stream per pool, written and read through this script, so that what no replica writes
-- can neither fail the replicas' calls nor fill their memory.
--   KEYS[1] charges: STREAM of entries {replica, tenant, worker, service}
--   ARGV 'tell', most entries kept, field, value, ...: add one (older ones trimmed)
--   ARGV 'read', last id read, most entries, most bytes of one: the entries after it, as
--        {id, {field, value, ...}}; one over the byte bound comes with no fields (it is
--        not one a replica writes, and the reader skips it)
--   ARGV 'last': the id of the stream's last entry ('0-0' if none)
-- Replicas add entries with ids of the server's clock, so a stream that is not a stream,
-- or whose last id lies ahead of the clock (an entry added with an id of its own: at the
-- largest id, no replica could add any more), is forged: deleted.

local SLACK_MS = 60000  -- how far ahead of the clock an id may lie: the clock stepping back

local function parts(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms) or 0, tonumber(seq) or 0
end

-- Whether stream id `a` comes after id `b`.
local function after(a, b)
  local a_ms, a_seq = parts(a)
  local b_ms, b_seq = parts(b)
  return a_ms > b_ms or (a_ms == b_ms and a_seq > b_seq)
end

local function top()
  local entries = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
  return entries[1] and entries[1][1] or nil
end

local found = redis.call('TYPE', KEYS[1])['ok']
if found ~= 'none' and found ~= 'stream' then
  redis.call('DEL', KEYS[1])
elseif found == 'stream' then
  local time = redis.call('TIME')
  local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  if (parts(top() or '0-0')) > now_ms + SLACK_MS then redis.call('DEL', KEYS[1]) end
end

local function tell()
  local fields = {}
  for index = 3, #ARGV do fields[#fields + 1] = ARGV[index] end
  return redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(fields))
end

local function read()
  local most_bytes = tonumber(ARGV[4])
  local last, start = top(), '(' .. ARGV[2]
  if last and after(ARGV[2], last) then start = '-' end  -- the stream was replaced under it
  local entries = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', ARGV[3])
  for _, entry in ipairs(entries) do
    local bytes = 0
    for _, text in ipairs(entry[2]) do bytes = bytes + #text end
    if bytes > most_bytes then entry[2] = {} end
  end
  return entries
end

local phases = {tell = tell, read = read, last = function() return top() or '0-0' end}
return phases[ARGV[1]]()
