package redisstore

import "github.com/redis/go-redis/v9"

// Every state change is one of these scripts: one atomic step, one round
// trip. Each takes, as its last argument (after those listed below), the
// run_id of the Redis the store checked (Store.run), and first answers {15,
// run_id}, writing nothing, when it runs on another (unchecked). Each then compares the tenant's horizon key with Redis's identity
// (run_id and master_replid, and evicted_keys once not 0, read with INFO
// inside the script): when the key is missing (flushed, deleted) or the
// identity differs (restart, restore, failover, eviction), the horizon moves
// to now before anything else happens.
//
// Times are Unix milliseconds from the caller's clock. A record is a hash;
// its logical expiry "exp" is checked as well as its Redis TTL, so that a
// record is gone at the same moment whichever clock looks.

// Reply kinds (first element of every script's reply).
const (
	kindStarted      = 0
	kindFinished     = 1
	kindInProgress   = 2
	kindAbandoned    = 3
	kindFenced       = 4
	kindMismatch     = 5
	kindDeadline     = 6
	kindUnverifiable = 7
	kindNotRunning   = 8
	kindRecord       = 9
	kindUnseen       = 10
	kindUnknown      = 11
	kindOK           = 12
	kindTenantFull   = 13
	kindStale        = 14 // the script ran too long after its call read the clock (stale): it wrote nothing
	kindOtherRedis   = 15 // {15, run_id}: the script runs on a Redis the store did not check (Store.run): it wrote nothing
)

const prelude = `
local FIELDS = {'st','fp','try','fen','code','msg','det','resp','ret','units','sa','fa','lease','dl','exp','tok','ftok'}
local IN_PROGRESS, FENCED, ABANDONED = 2, 5, 6

local function n(x) return string.format('%d', x) end

-- rtime is Redis's clock (TIME) in ms.
local function rtime()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- IDLE is WithIdleTenantExpiry in ms (0: none), which each script sets from
-- its last argument before it calls anything below, and LONGEST the longest
-- a record of the script's policy lives (its ttl, keep and skew, and
-- CLOCK_MARGIN: see expire), which it sets too.
local IDLE, LONGEST = 0, 0

-- CLOCK_MARGIN is clockMargin in ms: what New allows between Redis's clock
-- and a server's beyond the skew.
local CLOCK_MARGIN = 1000

-- identity names the running Redis: its run_id and master_replid, and,
-- once it has evicted keys (a maxmemory-policy changed from noeviction after
-- New), how many: each eviction may have removed a record, so it moves every
-- horizon as a restart does. Under noeviction the count stays 0 and is left
-- out (horizon keys written before it was counted stay this Redis's). It
-- reads INFO once per script, and sets RUN_ID.
local ID, RUN_ID
local function identity()
  if ID then return ID end
  local s = redis.call('INFO', 'server')
  local r = redis.call('INFO', 'replication')
  RUN_ID = string.match(s, 'run_id:(%x+)') or '?'
  local id = RUN_ID .. '/' .. (string.match(r, 'master_replid:(%x+)') or '?')
  local e = string.match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)')
  if e and e ~= '0' then id = id .. '/evicted:' .. e end
  ID = id
  return id
end

-- unchecked returns {15, run_id} when the running Redis is not the one
-- whose check vouches for the node the store sent the script to: its
-- run_id, the last argument of every script, is another (the address
-- reaches another Redis: a restart, a failover, a DNS name or VIP moved).
-- Every script calls it before anything else, and then writes nothing: the
-- store has that Redis checked (maxmemory-policy noeviction first) before
-- it relies on it.
local function unchecked()
  identity()
  if RUN_ID ~= ARGV[#ARGV] then return {15, RUN_ID} end
  return nil
end

-- horizon returns the tenant's horizon, moving it to now when its key is
-- missing or was written by another Redis (restart, restore, failover); or,
-- readonly, nil then, writing nothing. A call may run a while after it read
-- the clock (see DefaultKeep): its now may be older than records the lost
-- Redis held, so the horizon moves to Redis's own time when that is later
-- (from the next millisecond: an attempt of the very millisecond the
-- horizon moved in, whose record may have been lost, stays outside it). An
-- attempt lies inside only when created a skew after it, so one created
-- before the move by a client a skew ahead stays outside too.
--
-- A horizon key of this Redis whose time is not one this store writes (n()
-- writes digits only; Lua's tonumber also reads a sign, a fraction, a
-- space, "0x10" and "-inf") or lies outside MIN_AT .. MAX_AT is an error,
-- as a hash at a record key that is not a record is (see load): read as it
-- stands, a time before every attempt's would vouch for every absence, and
-- moving the horizon over it would hide that something other than this
-- store wrote there. The store writes Redis's TIME or later, which New
-- checks against the server's clock: MIN_AT, 2024-01-01 UTC, is before this
-- store existed, and no horizon it wrote lies before it (a Redis whose
-- clock reads earlier cannot pass New's check against a server's clock
-- that is right). MAX_AT is maxStampMs, the year 9999.
--
-- The key's field last (see hold), when there, is checked here too, before
-- the script writes anything, whichever the store's IDLE: digits, from
-- MIN_AT, 15 at most (a record's deadline is before the year 9000). A key
-- of another Redis keeps a last this store could have written (it noted
-- records of the horizon that moves, which need the key no more: keeping
-- it only keeps the key longer), and has one it could not have replaced by
-- the new horizon, as its at is.
local MIN_AT, MAX_AT = 1704067200000, 253402300799999
local function stamp(v, max)
  local x = #v <= 15 and string.match(v, '^[1-9]%d*$') and tonumber(v)
  return x and x >= MIN_AT and x <= max and x
end
local function horizon(hk, now, skew, readonly)
  local h = redis.call('HMGET', hk, 'at', 'id', 'last')
  local id = identity()
  local badlast = h[3] and not stamp(h[3], math.huge)
  if h[1] and h[2] == id then
    local at = stamp(h[1], MAX_AT)
    if not at then error('tollgate: the hash at ' .. hk .. ' is not a horizon: field at') end
    if badlast then error('tollgate: the hash at ' .. hk .. ' is not a horizon: field last') end
    return at
  end
  if readonly then return nil end
  local at = math.max(now, rtime() + 1)
  if badlast then
    redis.call('HSET', hk, 'at', n(at), 'id', id, 'last', n(at))
  else
    redis.call('HSET', hk, 'at', n(at), 'id', id)
  end
  if IDLE > 0 then redis.call('PEXPIRE', hk, n(IDLE)) end
  return at
end

-- hold keeps the tenant's horizon key hk (Redis's clock) at least ms more,
-- and, with IDLE set, IDLE more once it has less than 15/16 of IDLE left
-- (so that a busy tenant does not write its key at every call): the key
-- expires between 15/16 IDLE and IDLE after its tenant's last record write
-- or lookup, and never before a record of its tenant, whatever IDLE the
-- replica that wrote the record has. A key without an expiry, which a store
-- with IDLE 0 or an older version wrote, and whose records did not hold it,
-- gets at least LONGEST, and at least until its field last, Redis's time
-- (ms) when the longest-lived record a store with IDLE 0 wrote there is
-- gone, if that store found the record might outlive LONGEST (a try's
-- deadline further ahead than the policy's MaxAttemptDeadline, a writer's
-- clock ahead of Redis's: see expire). hold never shortens a key's life, nor
-- gives a key without an expiry one when IDLE is 0. A horizon key that
-- expired moves the horizon as a flush does. It runs after a script's record
-- write, never before: a script's first write is the one a full Redis
-- refuses (see load), and this one it would not.
local function hold(hk, ms)
  local left = redis.call('PTTL', hk)
  if left == -2 then return end
  if left == -1 then
    if IDLE <= 0 and ms <= LONGEST then return end
    local last = redis.call('HMGET', hk, 'last')[1]
    last = last and tonumber(last) -- horizon checked it
    local rnow = rtime()
    if IDLE <= 0 then
      if not last or last < rnow + ms then redis.call('HSET', hk, 'last', n(rnow + ms)) end
      return
    end
    local want = math.max(ms, IDLE, LONGEST)
    if last then want = math.max(want, last - rnow) end
    redis.call('PEXPIRE', hk, n(want))
    return
  end
  local want = ms
  if IDLE > 0 and left < IDLE - math.floor(IDLE / 16) then want = math.max(want, IDLE) end
  if left < want then redis.call('PEXPIRE', hk, n(want)) end
end

-- inside reports whether an attempt created at ts lies inside the horizon;
-- an attempt the server minted for the request (minted) skips ts - skew >= hz.
local function inside(ts, hz, now, skew, minted)
  return ts >= 0 and (minted or ts - skew >= hz) and ts <= now + skew
end

-- STORED are the states a record can hold (ABANDONED is only ever a view).
local STORED = {[2] = true, [3] = true, [4] = true, [5] = true, [7] = true}

-- load returns record rk's fields, or nil when it is absent or past its
-- expiry (Redis's TTL removes it at the same instant). floor is ts - skew +
-- ttl for the record's attempt, created at ts. It writes nothing: a
-- script's first write is the one Redis refuses when it is out of memory,
-- and that must be the record's own. A hash at rk that is not a record this
-- store wrote (a field missing, a number not written as n() writes it —
-- Lua's tonumber also reads "inf", "0x10" and "1e3", Go's reader none of
-- them —, a state no record holds) is an error: it must never read as an absent record or as
-- a refusal.
local function load(rk, now, floor)
  local v = redis.call('HMGET', rk, unpack(FIELDS))
  if not v[1] then
    if redis.call('EXISTS', rk) == 1 then
      error('tollgate: the hash at ' .. rk .. ' is not a record: field st')
    end
    return nil
  end
  for i = 1, 17 do
    local numeric = i ~= 2 and i ~= 6 and i ~= 7 and i ~= 8 and i < 16
    -- n() writes at most 16 digits (every number a record holds is below
    -- 2^53); a longer one Lua would read as a rounded double, or inf.
    if (i < 16 and not v[i]) or (numeric and (#v[i] > 17 or not string.match(v[i], '^%-?%d+$'))) then
      error('tollgate: the hash at ' .. rk .. ' is not a record: field ' .. FIELDS[i])
    end
  end
  local st = tonumber(v[1])
  if not STORED[st] then
    error('tollgate: the hash at ' .. rk .. ' is not a record: state ' .. v[1])
  end
  -- Every write sets exp at least ttl past its own time (sa or fa), and
  -- writes only when ts <= that time + skew, so exp >= ts - skew + ttl
  -- (floor): an exp at or before sa or fa, or before floor, would read the
  -- record as expired, that is as absent, while its absence is still
  -- evidence (until floor), and no script writes one. Nor a tombstone
  -- without a ballot, nor a running try without a start and a lease.
  if tonumber(v[15]) <= math.max(tonumber(v[11]), tonumber(v[12])) or tonumber(v[15]) < floor then
    error('tollgate: the hash at ' .. rk .. ' is not a record: field exp')
  end
  if st == FENCED and tonumber(v[4]) < 1 then
    error('tollgate: the hash at ' .. rk .. ' is not a record: field fen')
  end
  if st == IN_PROGRESS and (tonumber(v[11]) <= 0 or tonumber(v[13]) <= 0) then
    error('tollgate: the hash at ' .. rk .. ' is not a record: field lease')
  end
  if tonumber(v[15]) <= now then return nil end
  return v
end

local function view(v, now)
  local st = tonumber(v[1])
  if st == IN_PROGRESS and now >= tonumber(v[13]) then return ABANDONED end
  return st
end

local function reply(kind, v, now)
  return {kind, view(v, now), v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12], v[13], v[2]}
end

-- stale reports whether this script runs more than keep - skew - CLOCK_MARGIN after its
-- call read the clock (now), by Redis's own clock (TIME): Redis may have
-- removed, meanwhile, a record that now still counts as alive, and an
-- absence judged by now is no evidence (see DefaultKeep). Redis's clock is
-- assumed within the skew of the servers'.
local function stale(now, keep, skew)
  return rtime() - now > keep - skew - CLOCK_MARGIN
end

-- expire has Redis remove record rk keep ms after its expiry exp (see
-- DefaultKeep): load judges it by exp. exp is counted in the writer's clock
-- (now), while readers vouch for the record's absence until floor (ts -
-- skew + ttl) by theirs: Redis also keeps the record until floor by its own
-- clock, plus keep, so that a writer whose clock was stepped forward after
-- New (and wrote the record of an attempt created by such a clock) cannot
-- have it removed while a right clock still vouches for its absence. The
-- tenant's horizon key hk is kept a second longer than the record (hold).
-- It returns when, in the writer's clock, Redis removes the record.
local function expire(hk, rk, now, exp, keep, floor)
  local rnow = rtime()
  local life = math.max(exp - now, floor - rnow) + keep
  redis.call('PEXPIRE', rk, n(life))
  hold(hk, life + 1000)
  return now + life
end

-- room reports whether the tenant may hold one more record: with a bound
-- (cap > 0), whether its index ik (a sorted set of its record keys scored by
-- when Redis removes them: their expiry plus the keep) holds fewer than cap
-- records Redis still holds. It only reads (see load).
local function room(ik, now, cap)
  if cap <= 0 then return true end
  return redis.call('ZCOUNT', ik, '(' .. n(now), '+inf') < cap
end

-- track notes in the tenant's index ik, with a bound, that Redis removes
-- record rk at gone (its expiry plus the keep, or later: expire), rids the index of records
-- Redis removed, and keeps it at least as long as its longest-lived record.
-- It runs after the record's write.
local function track(ik, rk, now, gone, cap)
  if cap <= 0 then return end
  redis.call('ZADD', ik, n(gone), rk)
  redis.call('ZREMRANGEBYSCORE', ik, '-inf', n(now))
  if redis.call('PTTL', ik) < gone - now then redis.call('PEXPIRE', ik, n(gone - now)) end
end
`

// begin: KEYS horizon, record, index. ARGV now, skew, ttl, grace, ts, try,
// fp, dl, tok, minted, cap, keep, idle. keep is DefaultKeep (see expire); idle is IDLE; cap is WithMaxRecordsPerTenant's bound (0: none);
// a tenant at it is answered {13} for a try that would add a record. minted is 1 for an attempt the server minted for the request
// (idempotency.BeginRequest.Minted), which skips ts - skew >= horizon. An
// attempt refused only for lying before horizon + skew is answered {7,
// horizon + skew}. tok is random, one per Begin call: a record IN_PROGRESS for the same
// try with the same tok was started by this very call, whose script runs
// again when the client resends it after losing its reply, and answers
// "started" again. Any other Begin of the try (a duplicated delivery) finds
// another tok, or none in a record that older scripts wrote, and is refused.
var beginScript = redis.NewScript(prelude + `
local now, skew, ttl, grace = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local ts, try, fp, dl, tok = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8]), ARGV[9]
local minted, cap, keep = ARGV[10] == '1', tonumber(ARGV[11]), tonumber(ARGV[12])
IDLE, LONGEST = tonumber(ARGV[13]), ttl + keep + skew + CLOCK_MARGIN
local other = unchecked()
if other then return other end
if stale(now, keep, skew) then return {14} end
local hz = horizon(KEYS[1], now, skew)
if not inside(ts, hz, now, skew, minted) then
  if ts >= 0 and ts <= now + skew then return {7, hz + skew} end
  return {7}
end
local v = load(KEYS[2], now, ts - skew + ttl)
local units, fen = '0', '0'
if v then
  if v[2] ~= '' and v[2] ~= fp then return reply(5, v, now) end
  local st = view(v, now)
  if st == IN_PROGRESS then
    if v[16] == tok and tonumber(v[3]) == try then
      -- This call's own resend: rewrite a field as it is, so that the
      -- script propagates a write and the WAIT after it, on whatever
      -- connection go-redis resent it, covers the first run's (Redis 7.2
      -- and later count only a connection's propagated writes).
      -- A full Redis refuses the write, and the Begin fails: "started"
      -- without a write of its own would let WAIT count replicas of
      -- nothing.
      redis.call('HSET', KEYS[2], 'tok', tok)
      return {0}
    end
    return reply(2, v, now)
  end
  if st == ABANDONED then return reply(3, v, now) end
  if st ~= FENCED then return reply(1, v, now) end
  if try <= tonumber(v[4]) then return reply(4, v, now) end
  units, fen = v[10], v[4]
end
if now >= dl + skew then return {6} end
if not v and now >= ts - skew + ttl then return {7} end
if not v and not room(KEYS[3], now, cap) then return {13} end
local exp = math.max(now + ttl, dl + skew + grace)
redis.call('HSET', KEYS[2], 'st', IN_PROGRESS, 'fp', fp, 'try', n(try), 'fen', fen, 'code', '0', 'msg', '',
  'det', '', 'resp', '', 'ret', '0', 'units', units, 'sa', n(now), 'fa', '0', 'lease', n(dl + skew),
  'dl', n(dl), 'exp', n(exp), 'tok', tok, 'ftok', '')
track(KEYS[3], KEYS[2], now, expire(KEYS[1], KEYS[2], now, exp, keep, ts - skew + ttl), cap)
return {0}
`)

// finish: KEYS horizon, record, index. ARGV now, skew, ttl, grace, ts, try,
// fp, state, code, msg, det, resp, ret, units, ftok, btok, minted, cap,
// keep, idle. cap
// is WithMaxRecordsPerTenant's bound: a finish adds no record, and only
// moves the record's expiry in the index. minted is the
// try's Begin's, and skips ts - skew >= horizon as Begin did. ftok is random, one
// per Finish call, and stored with the finish: a record of the same try
// whose ftok is this one was finished by this very call, whose script runs
// again when the client resends it after losing its reply; it answers
// "finished" again and changes nothing (the units are not added twice). Any
// other Finish of the try is refused as before. btok, when not empty, is the
// tok of the Begin call whose try this finish may end (the fence Begin sends
// after a replica shortfall): a record another Begin call wrote is refused.
var finishScript = redis.NewScript(prelude + "local FULL = false\n" + finishBody)

// finishFullScript is finishScript allowed to run, and to write, while Redis
// is out of memory (the allow-oom flag of Redis 7 and later): a full Redis
// refuses new tries, never the end of one that runs. Store.finish sends it,
// without the response, only after Redis refused finishScript for want of
// memory, and does not load it ahead: Redis before 7 cannot read its flags.
// It writes only the running try's record and index entry, and what hold
// writes to keep the tenant's horizon key at least as long as the record
// (its expiry; or, from a store with IDLE 0, its field last): a horizon it
// would have to move means no such record, and it answers so, writing
// nothing (FULL).
var finishFullScript = redis.NewScript("#!lua flags=allow-oom\n" + prelude + "local FULL = true\n" + finishBody)

const finishBody = `
local now, skew, ttl, grace = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local ts, try, fp, st = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8])
IDLE, LONGEST = tonumber(ARGV[20]), ttl + tonumber(ARGV[19]) + skew + CLOCK_MARGIN
local other = unchecked()
if other then return other end
local hz = horizon(KEYS[1], now, skew, FULL)
if not hz or not inside(ts, hz, now, skew, ARGV[17] == '1') then return {8} end
local v = load(KEYS[2], now, ts - skew + ttl)
if not v then return {8} end
if v[17] == ARGV[15] and tonumber(v[3]) == try and v[2] == fp then
  redis.pcall('HSET', KEYS[2], 'ftok', ARGV[15]) -- a resend: a write for WAIT, as in begin
  return {12}
end
-- btok's Begin call ends the try it began even past its lease: no handler
-- ran it, and it must not read ABANDONED.
local own = ARGV[16] ~= '' and v[16] == ARGV[16]
if ARGV[16] ~= '' and not own then return reply(8, v, now) end
local running = view(v, now) == IN_PROGRESS or (own and tonumber(v[1]) == IN_PROGRESS)
if not running or tonumber(v[3]) ~= try or v[2] ~= fp then return reply(8, v, now) end
local fen = tonumber(v[4])
if st == FENCED and try > fen then fen = try end
local units = tonumber(v[10]) + tonumber(ARGV[14])
local exp = math.max(now + ttl, tonumber(v[14]) + skew + grace)
redis.call('HSET', KEYS[2], 'st', n(st), 'fen', n(fen), 'code', ARGV[9], 'msg', ARGV[10], 'det', ARGV[11],
  'resp', ARGV[12], 'ret', ARGV[13], 'units', n(units), 'fa', n(now), 'exp', n(exp), 'ftok', ARGV[15])
track(KEYS[3], KEYS[2], now, expire(KEYS[1], KEYS[2], now, exp, tonumber(ARGV[19]), ts - skew + ttl), tonumber(ARGV[18]))
return {12}
`

// get: KEYS horizon, record, index (unused). ARGV now, skew, ttl, ts, keep,
// idle.
// It vouches for absences as begin and fence do, so it refuses a stale
// reading as they do ({14}, writing nothing): a server clock stepped back
// after New, further than the keep, would judge a record that Redis removed
// a keep after its expiry as one that cannot have expired yet.
var getScript = redis.NewScript(prelude + `
local now, skew, ttl, ts, keep = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
IDLE, LONGEST = tonumber(ARGV[6]), ttl + keep + skew + CLOCK_MARGIN
local other = unchecked()
if other then return other end
if stale(now, keep, skew) then return {14} end
local hz = horizon(KEYS[1], now, skew)
-- A lookup keeps its tenant's horizon too (it writes nothing else); with
-- IDLE 0 hold would keep it no longer (ms 0), and its PTTL is spared.
if IDLE > 0 then hold(KEYS[1], 0) end
if not inside(ts, hz, now, skew) then return {11} end
local v = load(KEYS[2], now, ts - skew + ttl)
if v then return reply(9, v, now) end
if now < ts - skew + ttl then return {10} end
return {11}
`)

// fence: KEYS horizon, record, index. ARGV now, skew, ttl, grace, ts,
// through, cap, keep, idle. A tenant at cap (WithMaxRecordsPerTenant) is answered {13}
// for a tombstone that would add a record.
var fenceScript = redis.NewScript(prelude + `
local now, skew, ttl, grace = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local ts, through, cap, keep = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
IDLE, LONGEST = tonumber(ARGV[9]), ttl + keep + skew + CLOCK_MARGIN
local other = unchecked()
if other then return other end
if stale(now, keep, skew) then return {14} end
local hz = horizon(KEYS[1], now, skew)
if not inside(ts, hz, now, skew) then return {11} end
local v = load(KEYS[2], now, ts - skew + ttl)
if v then
  if view(v, now) ~= FENCED then return reply(9, v, now) end
  if through <= tonumber(v[4]) then
    -- A tombstone that already covers the ballot, perhaps this call's own
    -- first run, resent: a write for WAIT, as in begin.
    redis.pcall('HSET', KEYS[2], 'fen', v[4]) -- a full Redis refuses it; the answer stands
    return reply(9, v, now)
  end
  local exp = math.max(now + ttl, tonumber(v[14]) + skew + grace)
  redis.call('HSET', KEYS[2], 'fen', n(through), 'fa', n(now), 'exp', n(exp))
  track(KEYS[3], KEYS[2], now, expire(KEYS[1], KEYS[2], now, exp, keep, ts - skew + ttl), cap)
else
  if now >= ts - skew + ttl then return {11} end
  if not room(KEYS[3], now, cap) then return {13} end
  local exp = now + ttl
  redis.call('HSET', KEYS[2], 'st', FENCED, 'fp', '', 'try', '0', 'fen', n(through), 'code', '0', 'msg', '',
    'det', '', 'resp', '', 'ret', '0', 'units', '0', 'sa', '0', 'fa', n(now), 'lease', '0', 'dl', '0', 'exp', n(exp),
    'tok', '', 'ftok', '')
  track(KEYS[3], KEYS[2], now, expire(KEYS[1], KEYS[2], now, exp, keep, ts - skew + ttl), cap)
end
return reply(9, load(KEYS[2], now, ts - skew + ttl), now)
`)
