package pinstore

import "github.com/redis/go-redis/v9"

// The scripts run atomically in Redis, so a read and the write it decides
// cost one round trip and no other instance can slip in between.
//
// Common arguments: KEYS[1] the pin key, KEYS[2] the model's index (sorted
// set); ARGV[1] the key's 16 hex digits (index member), ARGV[2] the TTL in
// ms, ARGV[3] MaxPins, ARGV[4] the pin key prefix ("<prefix>:<model>:pin:").
// Each returns {code, replica in force}.

// touch records a use in the index with the server's clock (TIME, so
// instances with skewed clocks agree), then trims it: members idle past the
// TTL (their pins expired by themselves), then the oldest beyond MaxPins,
// deleting their pins. At most trimBatch of each per call keeps a script
// short even after MaxPins is lowered; every call trims again.
const touch = `
local function touch()
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local ttl = tonumber(ARGV[2])
  redis.call('ZADD', KEYS[2], now, ARGV[1])
  local idle = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - ttl, 'LIMIT', 0, 128)
  if #idle > 0 then redis.call('ZREM', KEYS[2], unpack(idle)) end
  local extra = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[3])
  if extra > 0 then
    local old = redis.call('ZPOPMIN', KEYS[2], math.min(extra, 128))
    for i = 1, #old, 2 do redis.call('DEL', ARGV[4] .. old[i]) end
  end
  redis.call('PEXPIRE', KEYS[2], ttl)
end
`

// claimScript: SET NX semantics. ARGV[5] = replica, ARGV[6] = channel.
// {1, replica} when the claim won, {0, current} when a pin existed. A won
// claim is published like a move, so that the other instances count the
// new conversation's load on its replica at once, not when its next turn
// reaches them: several instances placing conversations within one scrape
// interval then spread them as one instance would.
var claimScript = redis.NewScript(touch + `
local cur = redis.call('GET', KEYS[1])
if cur then return {0, cur} end
redis.call('SET', KEYS[1], ARGV[5], 'PX', ARGV[2])
touch()
redis.call('PUBLISH', ARGV[6], ARGV[1] .. ' ' .. ARGV[5])
return {1, ARGV[5]}
`)

// repinScript: compare-and-set from → to, then publish the move.
// ARGV[5] = from, ARGV[6] = to, ARGV[7] = channel. The pin moves if it is
// still from, absent, or already to; otherwise {0, current}. Checking the
// value first is what keeps a late re-pin from undoing a newer one.
var repinScript = redis.NewScript(touch + `
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[5] and cur ~= ARGV[6] then return {0, cur} end
redis.call('SET', KEYS[1], ARGV[6], 'PX', ARGV[2])
touch()
redis.call('PUBLISH', ARGV[7], ARGV[1] .. ' ' .. ARGV[6])
return {1, ARGV[6]}
`)

// syncScript: the background refresh of one local pin. ARGV[5] = the local
// replica. {0, same}: refreshed; {1, other}: Redis holds another replica
// (the caller adopts it); {2, local}: the pin was missing and is claimed
// again (never overwriting: an existing pin always wins).
const syncSource = touch + `
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[5] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  touch()
  return {0, cur}
end
if cur then return {1, cur} end
redis.call('SET', KEYS[1], ARGV[5], 'PX', ARGV[2])
touch()
return {2, ARGV[5]}
`

var syncScript = redis.NewScript(syncSource)

// Codes returned by syncScript.
const (
	syncRefreshed = 0
	syncDiffers   = 1
	syncReclaimed = 2
)
