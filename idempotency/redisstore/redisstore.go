// Package redisstore is an idempotency.Store kept in Redis, for servers that
// run as several replicas: every replica sees the same records.
//
// Each state change (begin, finish, fence) and each lookup is one Lua script:
// one atomic step and one round trip. Records are Redis hashes with Redis
// TTLs, counted from their last write and never ending before the try's
// deadline + skew + grace, nor, by Redis's own clock, before the attempt's
// time - skew + TTL (until which a reader vouches for a record's absence,
// whatever the writer's clock read). All keys live under a configurable prefix and
// carry the tenant as a hash tag ("{t:tenant}"), so a record and its
// tenant's horizon key always share a Redis Cluster slot. On a Cluster,
// go-redis finds the nodes only through the addresses it knows: it reads
// the Cluster's map from the nodes of its last map, and from its seeds
// (ClusterOptions.Addrs) only once none of those answers, so seed it with
// stable addresses (a Kubernetes Service name), not only with pods that
// may all be replaced.
//
// # What Redis can lose, and how the store stays honest
//
// A record that Redis evicts, or loses in a flush, restart, restore or
// failover, would make a repeated try look new. So:
//
//   - [New] refuses to start unless maxmemory-policy is noeviction: a full
//     Redis refuses writes (the store answers ErrStoreFull) instead of
//     evicting records. New reads the policy once (scripts cannot read the
//     configuration; on a Cluster, every node it knows, and a node that
//     joins later before the store first sends it a script, as for every
//     check of New, and a node whose check is redone; and any other Redis
//     the client comes to reach at a checked address — a Sentinel
//     failover, a restart, a DNS name or VIP that moved — before the store
//     writes there: every script carries the run_id its node's check read,
//     and runs on no Redis of another: see New), so a policy changed
//     afterwards (CONFIG SET) is not seen, but its
//     evictions are: once Redis has evicted keys (INFO stats evicted_keys),
//     their count is part of its identity (below), and each eviction moves
//     every tenant's horizon as a restart does. CONFIG RESETSTAT zeroes that
//     count: evictions followed by one before a tenant's next call go unseen
//     for that tenant, so after evictions delete every horizon key
//     (<prefix>{t:*}:h) or restart Redis, and keep CONFIG from other users.
//   - Each tenant hash tag has a horizon key holding the time it was created
//     and the identity of the Redis that created it (its run_id and
//     master_replid, and its evicted_keys once not 0). Every script
//     compares that identity with the running Redis's before it reads a
//     record. [New] refuses a server whose INFO does not tell its run_id
//     and master_replid (on a Cluster, any node): a Redis-compatible server
//     that hides them would look the same after a restart or a failover,
//     and a record it lost would read as absent. A missing key (flush) or
//     another identity (restart, a backup restored by restarting, failover
//     to a replica, an eviction) moves the horizon to now at once: every earlier attempt reads
//     UNKNOWN, and none of its tries runs, even when an old copy of its
//     record survived. A backup restored into the running Redis (its keys
//     RESTOREd after a FLUSHALL, or DEBUG RELOAD of an older RDB) brings the
//     horizon keys back with this Redis's own identity, and the records
//     written since are lost unseen: after such a restore, delete every
//     horizon key (<prefix>{t:*}:h) or restart Redis.
//     The key is also created at a tenant's first request, so for the
//     policy's skew after it a tollgate client's attempts are refused
//     (ATTEMPT_UNVERIFIABLE); an attempt the server minted for the request
//     itself (idempotency.BeginRequest.Minted: a caller without a tollgate
//     header, or one the server does not trust) begins at once. A horizon
//     key of this Redis whose time the store cannot have written (not
//     digits, before 2024, or past the year 9999), or whose field last
//     (when a record a store with WithIdleTenantExpiry(0) wrote is gone)
//     is not one either (not digits, before 2024, over 15 digits), is an
//     error for every call of its tenant (ErrStoreUnavailable), before it
//     writes anything, as a record key holding a hash that is not a
//     record is: the store cannot tell which absences are evidence, nor
//     how long the key must live. Deleting the key moves the horizon to now.
//   - Redis replicates asynchronously. Without [WithReplicas], a write that
//     Redis acknowledged can be lost if the primary fails before a replica
//     copied it; the horizon check then makes the loss visible (UNKNOWN)
//     rather than wrong, but a primary cut off from its replicas may keep
//     accepting tries that the promoted replica never sees. WithReplicas(n)
//     sends WAIT n after each Begin and Fence, on the same connection and in
//     the same round trip (on a Cluster, the connection to the primary of
//     the tenant's slot), and answers ErrStoreUnavailable when fewer than n
//     replicas acknowledged in time, so that a minority primary cannot start
//     tries or cast ballots on its own.
//
// Times come from the calling server's clock; servers' clocks are assumed to
// agree within the policy's skew. The horizon keys (one small hash, some 200
// bytes, per tenant and prefix, written by a tenant's first call of any
// kind, GetAttempt included) expire once no record of their tenant was
// written and none looked up for a day ([WithIdleTenantExpiry]), never
// before the tenant's last record. The
// set of tenant names seen in a day is therefore a memory bound: a trusted
// peer naming made-up tenants in its header, or a tenant function fed by
// caller-chosen names, adds a key per name for that long
// (WithMaxRecordsPerTenant bounds records within a tenant, not tenants).
//
// # A script that runs twice
//
// go-redis sends a command again when it lost its reply to an EOF, a reset
// connection or a ReadTimeout (up to Options.MaxRetries times; on a Cluster,
// MaxRedirects), although Redis may already have run it: one Begin, Finish
// or Fence call may run its script twice. Each Begin and each Finish call
// sends a random token that its script keeps in the record; a second run
// that finds its own token answers as the first run did (the try started,
// the finish took place) and changes nothing — it judges by its call's
// reading of the clock, resent with it, so a resend that arrives after the
// try's lease ended still finds its try running —: it only writes its token
// again over the same value, while any other call — a
// duplicated delivery of the same try, a second Finish — is refused as
// before. That write is deliberate: Redis 7.2 and later count, for WAIT,
// only the writes a connection propagated, and go-redis may resend on
// another connection, so a second run that wrote nothing would let the
// WAIT after it count replicas of nothing. A full Redis refuses the
// rewrite: Begin then fails, while Finish answers as the first run did. A
// second run of a Fence answers the record as it stands — the tombstone
// the first run wrote or raised, unless another call changed it since — as
// a repeated FenceAttempt would, rewriting the tombstone's ballot as it is
// for the same reason; Get changes no record. A reply
// lost when the context ends the call is not asked for again: the call
// fails with ErrStoreUnavailable. go-redis returns only its last attempt's
// error, so whenever a Begin fails after it started sending its script,
// whatever the error, Redis may have begun the try, and no handler will run
// it: Begin then fences the try its own call began (its token; best effort,
// on a context of its own bounded by 100 ms, which the caller waits for), so
// that it reads FENCED and its call's next try may start. If that fence
// does not reach Redis either, the try reads IN_PROGRESS until its lease
// ends, then ABANDONED.
package redisstore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Option configures a [Store]. [New] ignores a nil Option.
type Option interface{ apply(*Store) }

// invalid is an error of New's options: "redisstore: invalid option: " and
// format's text, wrapping idempotency.ErrInvalidOption (whose own words it
// does not say again).
func invalid(format string, args ...any) error {
	return optionError("redisstore: invalid option: " + fmt.Sprintf(format, args...))
}

type optionError string

func (e optionError) Error() string { return string(e) }
func (optionError) Unwrap() error   { return idempotency.ErrInvalidOption }

type optionFunc func(*Store)

func (f optionFunc) apply(s *Store) { f(s) }

// WithPrefix sets the prefix of every key the store writes. It must not
// contain '{' or '}' (the tenant's hash tag follows it). Default
// "tollgate:attempt:".
func WithPrefix(prefix string) Option { return optionFunc(func(s *Store) { s.prefix = prefix }) }

// WithPolicy sets the store's times and response size limit. Default
// idempotency.DefaultPolicy(). Every replica of a server must use the same:
// a record's expiry is written by one replica's policy and judged by
// another's, and a replica whose TTL or skew is longer reads a record that
// another let expire as never seen, and begins its tries again (a replica
// whose TTL is longer fails, ErrStoreUnavailable, on a record whose expiry
// lies before its attempt's time - skew + TTL by its own policy, while
// Redis still holds it: no store with its policy writes one). A policy is
// therefore not changed replica by replica: stop every replica, and before
// starting them with a longer TTL or skew, delete every horizon key
// (<prefix>{t:*}:h), so that the attempts created before read UNKNOWN.
// (Within one policy, a write may move a record's expiry earlier, as a
// fence from a server whose clock is behind does; never before the attempt's
// time - skew + TTL, after which every reader answers UNKNOWN.)
func WithPolicy(p idempotency.Policy) Option { return optionFunc(func(s *Store) { s.policy = p }) }

// WithReplicas makes Begin and Fence wait (Redis WAIT) until n replicas
// acknowledged their write, at most timeout (at least 1 ms: WAIT counts
// whole milliseconds), and fail with
// idempotency.ErrStoreUnavailable when fewer did. A try whose begin fell
// short is fenced again at once (best effort, on a context of its own
// bounded by a second, so that it is sent even when the caller's context is
// about to end), so its next try can start. Get is not waited for: it
// writes at most a tenant's horizon key, which a promoted replica's other
// identity moves again whether it had a copy or not; its answer is a
// reading of the primary it reached (an owner's decision goes through
// Fence, which waits).
//
// Redis times out a blocked WAIT only on its serverCron tick, every 1000/hz
// ms (hz 10 by default: up to 100 ms late), so New reads hz (on a Cluster,
// on every node, keeping the longest tick) and WAIT's count is expected up
// to one tick after its timeout. A call's WAIT gets at most half the time
// its context has left minus one tick, so that the count arrives with half
// the time left to spare; a call with too little time left for a WAIT of
// 1 ms (less than two ticks and 2 ms) is not sent at all and answers an
// *idempotency.TooLittleTimeError, which matches ErrTooLittleTime and
// ErrStoreUnavailable (nothing was written; a server refuses the try
// NOT_ADMITTED DEADLINE_UNREACHABLE). New refuses a timeout unless
// timeout + tick ≤ ReadTimeout/2 of the Redis client: go-redis takes a longer silence for a lost reply and
// sends the script again; and unless timeout + tick is at most half the
// keep (DefaultKeep plus twice the policy's skew and a second: 16 s with
// the default policy): a reply later than the keep is refused. Redis's dynamic-hz only raises hz, so the
// configured hz is the slowest tick; hz lowered after New is not seen.
//
// On a Cluster, Begin and Fence are then sent through the client of the
// tenant's primary (WAIT counts the writes of its own connection), which
// runs the hooks added per node (ClusterOptions.OnNewNode, as redisotel
// does) but not those added with ClusterClient.AddHook.
// Use a majority of the replicas. Default 0: no waiting.
//
// New tries WAIT (WAIT 0 0, answered at once) on every primary, so that a
// store user Redis refuses it to fails New, but it does not count the
// replicas connected: a replica may connect later (one started beside its
// primary, one resynchronising after a restart), and a server started
// before it should not fail for that. Until n replicas acknowledge, every
// Begin and Fence fails with idempotency.ErrStoreUnavailable, its error
// saying how many of n acknowledged in time; a server refuses those tries
// NOT_ADMITTED STORE_UNAVAILABLE, and they do not run. Watch
// connected_slaves (INFO replication) on the primaries to see it coming.
func WithReplicas(n int, timeout time.Duration) Option {
	return optionFunc(func(s *Store) { s.replicas, s.waitTimeout = n, timeout })
}

// WithMaxRecordsPerTenant bounds the records one tenant (Key.Tenant, ""
// included) holds, so that one tenant's callers — a trusted peer fencing
// made-up attempts, say, whose tombstones last the TTL — cannot fill Redis
// and have every other tenant's new tries refused. A tenant at its bound is
// refused new tries and fences with an error wrapping
// idempotency.ErrStoreFull (which matches ErrStoreUnavailable), as a full
// Redis refuses them; its existing records still answer and finish. A
// server refuses such a try NOT_ADMITTED STORE_UNAVAILABLE, not final, with
// the retry-after of any store fault (about 100 ms), although the bound
// clears only as the tenant's oldest records leave (their expiry plus the
// keep, below): the store does not say when, and a caller's repeats until
// then are refused alike, spending its allowance. Each tenant
// then keeps an index beside its records, a sorted set of its record keys
// scored by their expiry, under the tenant's hash tag; it lives as long as
// the tenant's longest-lived record. Records written while the store ran
// without the bound are counted only once a script writes them again.
// Bytes are bounded by the bound times the policy's MaxResponseBytes (plus
// status messages and details), and by Redis's maxmemory. The bound counts
// a record until Redis removes it, DefaultKeep plus twice the skew and a
// second after its expiry.
// While a Cluster migrates a slot, Redis refuses (TRYAGAIN, which go-redis
// resends a few times before the call fails unavailable; a Finish is then
// resent, at most five seconds: see New) a script whose
// keys are split between the slot's source and its target: a call names
// the tenant's horizon and the record, and under the bound the index too,
// so a tenant's calls may be refused between the moves of those keys.
// Without the bound a call never names the index, which then never exists.
// Default 0: no bound, no index; it must not be negative.
func WithMaxRecordsPerTenant(n int) Option {
	return optionFunc(func(s *Store) { s.perTenant = n })
}

// DefaultIdleTenantExpiry is how long a tenant's horizon key outlives its
// tenant's last call by default (see [WithIdleTenantExpiry]).
const DefaultIdleTenantExpiry = 24 * time.Hour

// WithIdleTenantExpiry has each tenant's horizon key (see the package
// documentation) expire once its tenant is idle for d: between 15/16
// of d and d after the last call that wrote one of its records or looked
// one up with Get (a Begin or Fence that writes no record, answered from
// one or refused, does not count) (a key is rewritten only when it has
// less than 15/16 of d left),
// and never before the last of its tenant's records, which Redis removes
// first. The set of tenant names therefore bounds memory only among the
// tenants of the last d. The key of a tenant whose next call comes later is
// created again, as at its first call: attempts created before read UNKNOWN
// (their records, if any, are gone: absence is no longer evidence), and
// for the policy's skew a tollgate client's new attempts are refused
// ATTEMPT_UNVERIFIABLE with a retry-after (the attempts a server mints for
// a request begin at once). d must be 0 or at least the policy's TTL.
// With 0, a store creates horizon keys without an expiry and never gives
// them one, but a key another replica gave one still outlives every record
// this store writes. A key without an expiry (written with 0, or by a
// version of this store before the option) is given at least the longest a
// record lives (the TTL, the keep of DefaultKeep, twice the skew and a second,
// and the skew and a second more) at its tenant's next call, as its records did not
// keep it; a store with 0 that writes a record which may live longer (a
// try's deadline further ahead than the policy's MaxAttemptDeadline, a
// clock ahead of Redis's) notes in the key when that record is gone, and
// the key is given at least until then. A version before the option notes
// nothing and keeps no key alive: while any replica runs one (a rolling
// deploy), run every other with 0, and set d only once none does (and
// once the records it wrote for tries whose deadline lay further ahead than
// MaxAttemptDeadline, if any, are gone), or a key may expire under such a
// replica's records (its running tries' results lost, its attempts read
// UNKNOWN).
// Every replica should use the same. Default DefaultIdleTenantExpiry.
func WithIdleTenantExpiry(d time.Duration) Option {
	return optionFunc(func(s *Store) { s.idle = d })
}

func init() {
	hooks.RedisClock = func(now func() time.Time) any {
		return optionFunc(func(s *Store) { s.now = now })
	}
	hooks.RedisKeep = func(keep time.Duration) any {
		return optionFunc(func(s *Store) { s.keep = keep })
	}
	hooks.RedisFailedBeginFenceTimeout = func(d time.Duration) any {
		return optionFunc(func(s *Store) { s.failedFenceTimeout = d })
	}
	hooks.RedisClockRecheckAfter = func(d time.Duration) any {
		return optionFunc(func(s *Store) { s.recheckAfter = d })
	}
}

// Store is an idempotency.Store kept in Redis; see the package documentation.
// It is safe for concurrent use by any number of goroutines and server
// replicas. It does not own the Redis client: closing the client is the
// caller's business. It runs the checks of Redis nodes in goroutines of its
// own (see New): [Store.Close] it once its server stopped. Build one with
// [New]; the zero value is not usable.
type Store struct {
	client      redis.UniversalClient
	prefix      string
	policy      idempotency.Policy
	replicas    int
	waitTimeout time.Duration
	tick        time.Duration // Redis's serverCron period (1000/hz ms), read by New when replicas > 0
	perTenant   int           // WithMaxRecordsPerTenant's bound; 0: none
	idle        time.Duration // WithIdleTenantExpiry's; 0: horizon keys never expire for idleness
	now         func() time.Time
	keep        time.Duration // DefaultKeep, or a test's (hooks.RedisKeep)
	// failedFenceTimeout bounds the fence a failed Begin sends:
	// failedBeginFenceTimeout, or a test's (hooks.RedisFailedBeginFenceTimeout).
	failedFenceTimeout time.Duration
	// recheckAfter is how long a node's passed check vouches for it
	// (clockRecheckAfter, or a test's: hooks.RedisClockRecheckAfter).
	recheckAfter time.Duration
	// nodes holds a *nodeCheck for the Redis nodes the store checked or
	// checks, by address on a Cluster, and "" for any other client. On a
	// Cluster it is bounded: prune drops the entries of nodes no longer in
	// the client's map (replaced under new addresses, as Kubernetes pods
	// are), at most once per recheckAfter.
	nodes sync.Map
	// mapLast is the last read of the Cluster's map that looping Finishes
	// share (readMap), under mapMu.
	mapMu   sync.Mutex
	mapLast *mapRead
	// pruneAt is when (since) prune may run next; unpruned is set when an
	// entry was added since prune last ran (node), or prune kept one of a
	// node not in the map: only then does prune read the map.
	pruneAt  atomic.Int64
	unpruned atomic.Bool
	// born is when New began: the node checks count their times on the
	// monotonic clock from it (since).
	born time.Time
	// stop ends the context every node check's is tied to (Close); checks
	// counts the checks' goroutines, started only while closed is unset
	// (closeMu).
	stop    context.Context
	stopAll context.CancelFunc
	closeMu sync.Mutex
	closed  atomic.Bool
	checks  sync.WaitGroup
}

// Close ends the checks of Redis nodes the store runs in goroutines of
// their own (see New), and the reads of a Cluster's map that looping
// Finishes share, and waits for them: a check waiting for a reply
// ends when it comes, or at the check's 5 s bound, as go-redis does not
// interrupt a read for a context's cancellation. It does not close the Redis
// client, which stays the caller's. After Close every call fails with an
// error wrapping idempotency.ErrStoreUnavailable, sending nothing; a call
// already in progress goes on (a Begin that failed after sending its
// script still fences the try it may have begun, on a node a check vouches
// for), but none starts a check. Close is safe to call more than once, and
// concurrently with calls; it returns nil. Close after the server stopped
// its handlers (GracefulStop): a Finish after Close fails, and its try
// reads IN_PROGRESS until its lease ends.
func (s *Store) Close() error {
	s.closeMu.Lock()
	s.closed.Store(true)
	s.closeMu.Unlock()
	s.stopAll()
	s.checks.Wait()
	return nil
}

// errClosed is the error of a call to a closed store.
var errClosed error = refusal{fmt.Errorf("%w: redisstore: the store is closed", idempotency.ErrStoreUnavailable)}

// refusal is the error of a call the store refused before sending anything,
// for what it knows already (it is closed, or a check found the node
// wrong), or whose script refused to run on a Redis the store did not check
// (Store.run): the call says nothing of where the Cluster's slots are, and
// reads no map (reloadAfter).
type refusal struct{ error }

func (r refusal) Unwrap() error { return r.error }

// goCheck runs f in a goroutine of its own that Close waits for, and
// reports false, running nothing, once the store is closed.
func (s *Store) goCheck(f func()) bool {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed.Load() {
		return false
	}
	s.checks.Add(1)
	go func() {
		defer s.checks.Done()
		f()
	}()
	return true
}

// DefaultKeep, plus twice the policy's skew and a second (the keep), is how long Redis
// keeps a record past its expiry, and the longest a store call may take from
// reading the clock to its reply. A script judges records by the time its
// call read (now), while Redis removes a record by its own TTL, in real
// time: a call whose script ran later than it read the clock (it waited for
// a pooled connection, or go-redis resent it after a lost reply) would find
// a record that expired meanwhile gone, and its older now would vouch for
// the absence: a finished call would be begun again. Kept this long past its
// expiry, the record is still there for every call that ran within the keep
// of its reading, which is judged by the expiry it holds.
//
// The Begin, Fence and Get scripts, which vouch for absences (and the
// first two write on them), check Redis's clock (TIME) first: one that runs
// more than DefaultKeep plus the skew after its call's reading (the pool was
// busy, go-redis resent it, Redis stalled, or the server's clock was stepped
// back after New) writes nothing and answers so. A Begin, Get or Fence
// whose reply comes more than the keep after the reading fails too, instead
// of acting on its judgement (a try such a Begin started is finished
// UNKNOWN: no handler runs it), and so does one whose script found itself
// stale. A horizon a script moves (a tenant's first request, a restart, a
// failover) moves to the later of its call's reading and Redis's TIME, so a
// call whose reading is old cannot set it before records Redis lost.
//
// This assumes Redis's clock within the skew of the servers': New refuses a
// node whose clock differs by more than the skew plus a second (a Cluster
// node that joins later is checked before its first script, as is any other
// Redis the client comes to reach), and the store
// reads every node's clock again about once a minute, at its first call
// after (see New): a clock stepped after a check is seen by the next, and
// until then the scripts compare the server's with it as it reads. A Finish that ran late may still
// end a try whose lease ended meanwhile. Records take up to the keep / TTL
// more memory (about 11% with the default policy: 32 s on a 5 min TTL), and WithMaxRecordsPerTenant
// counts them until Redis removes them.
const DefaultKeep = 30 * time.Second

// clock returns the time a call's script judges records by, and the real
// time it was read at.
func (s *Store) clock() (int64, time.Time) {
	return s.now().UnixMilli(), time.Now()
}

// checkClock refuses a Redis node whose clock differs from this
// server's by more than the skew plus clockMargin, either way (New checks
// every node, replicas included: they are promoted in a failover). The
// scripts compare the two clocks: a Redis far ahead would make them refuse
// every call as stale and keep fresh attempts unverifiable after its
// horizon moved; one far behind would turn the staleness check off (see
// DefaultKeep), and a horizon it moves would move to its call's reading
// rather than to Redis's time, however old the reading.
//
// It returns by how much Redis's clock is ahead of this server's (behind,
// when negative).
// It reads the reply of cmd, a TIME sent to the node.
func (s *Store) checkClock(cmd *redis.TimeCmd, where string) (time.Duration, error) {
	t, err := cmd.Result()
	if err != nil {
		return 0, checkErr("reading Redis's clock"+where, err)
	}
	d := t.Sub(s.now())
	if d > s.policy.Skew+clockMargin || -d > s.policy.Skew+clockMargin {
		return 0, fmt.Errorf("redisstore: Redis's clock%s differs from this server's by %v, more than the policy's skew %v plus %v: the store's scripts compare the two (keep the clocks within the skew)",
			where, d.Round(time.Millisecond), s.policy.Skew, clockMargin)
	}
	return d, nil
}

// clockMargin is what checkClock allows beyond the skew: the round trip of
// its TIME and the time between two clock readings. The scripts' CLOCK_MARGIN
// is the same, in milliseconds.
const clockMargin = time.Second

// stale is the error of a Begin, Fence or Get whose script found, by Redis's
// clock, that it ran too long after its call read the clock, and wrote
// nothing (see DefaultKeep).
func (s *Store) stale() error {
	return fmt.Errorf("%w: redisstore: the script ran more than %v after its call read the clock (by Redis's clock), and wrote nothing",
		idempotency.ErrStoreUnavailable, s.keep-s.policy.Skew-clockMargin)
}

// late fails a call whose reply came more than the keep after its clock was
// read (see DefaultKeep).
func (s *Store) late(read time.Time) error {
	if took := time.Since(read); took > s.keep {
		return fmt.Errorf("%w: redisstore: the call took %v from reading the clock to its reply, more than the %v records are kept past their expiry",
			idempotency.ErrStoreUnavailable, took.Round(time.Millisecond), s.keep)
	}
	return nil
}

// shortfallFenceTimeout bounds the fence Begin sends after a shortfall, on a
// context detached from the caller's: it is one script without WAIT.
const shortfallFenceTimeout = time.Second

// failedBeginFenceTimeout bounds the fence Begin sends when it failed after
// it started sending its script. It is shorter than shortfallFenceTimeout:
// Redis may be stalled, and the server's goroutine (and the request's
// admission slot) waits for the fence.
const failedBeginFenceTimeout = 100 * time.Millisecond

// sentError is a store call's error once its script may have been sent:
// Redis may have run it although the call failed. go-redis sends a command
// again after some errors and returns only the last attempt's error, so no
// error proves that an earlier attempt did not run the script: a Redis
// error reply, a failed dial or a pool timeout may follow a reply lost to
// an EOF.
type sentError struct{ error }

func (e sentError) Unwrap() error { return e.error }

// New returns a store that keeps its records in the Redis behind client
// (a *redis.Client or a *redis.ClusterClient, as redis.NewUniversalClient
// returns in each mode and redis.NewFailoverClient returns for a
// Sentinel-managed Redis; New refuses any other, a
// *redis.Ring included, whose Redis servers it could not check each: it
// would check the one server a command without keys goes to). The client
// must be built with
// ContextTimeoutEnabled: true and must not disable socket deadlines
// (ReadTimeout or WriteTimeout -2), so that a context's deadline bounds
// every store call (go-redis ignores deadlines otherwise). New checks that,
// that Redis answers, and that its maxmemory-policy is noeviction (on a
// Cluster, on every node the client knows of, replicas included), that it
// tells its identity (run_id and master_replid in INFO, on every node), that
// every primary lets the store's user run the commands the store sends
// itself (EVALSHA of a script Redis does not hold, answered NOSCRIPT; EVAL
// of a script that touches no key; with [WithReplicas], WAIT 0 0), and
// loads the scripts. With [WithReplicas] it also reads Redis's hz (on a Cluster,
// on every node) and refuses a timeout unless timeout + 1000/hz ms is at
// most half the client's ReadTimeout (when it has one) and at most half the
// keep (see WithReplicas). It returns an error
// wrapping idempotency.ErrStoreUnavailable when Redis cannot be reached (or
// answers that it cannot serve yet: LOADING, MASTERDOWN; on a Cluster, also
// when the map the client reads names no node, as its seeds answer before
// the Cluster's slots are assigned: New would check no node); an error
// wrapping idempotency.ErrInvalidOption for an invalid option or policy,
// the WithReplicas timeout that does not fit the client's ReadTimeout or
// the keep included (a nil option is ignored); and an error naming the
// problem, wrapping neither, for a client New cannot use (nil, another
// type, no context deadlines) and a wrong setting of Redis (its
// maxmemory-policy, its identity, its hz), a command Redis refuses
// to the store's user (NOPERM) or does not know (renamed away), credentials
// it refuses (WRONGPASS, NOAUTH) and a ClusterClient of a Redis without
// Cluster mode included. So every command the store sends itself is tried
// by New — CONFIG GET, INFO, TIME, SCRIPT LOAD, EVALSHA, EVAL, WAIT with
// WithReplicas, CLUSTER SLOTS on a Cluster — but not the commands only its
// scripts run (HSET, say: trying them would write under the prefix): Redis
// refusing one of those is found by the first call. After New,
// a call whose command Redis refuses to the store's user (an ACL changed
// since, a command renamed away, a command only the scripts run) fails
// with an error wrapping idempotency.ErrStoreUnavailable, as every fault of
// the store does (see idempotency.Store: a server refuses the try of a
// failed Begin NOT_ADMITTED STORE_UNAVAILABLE, and it does not run; a try
// whose Finish failed ran, and is answered UNKNOWN), which says that
// Redis refused the command and what the store's user needs; calls work
// again once Redis grants it.
//
// A Cluster node that New did not know (one added later, given slots or
// promoted) gets the same node checks of its own (its settings, its hz at
// least the lowest New read), before the store first sends it a script;
// but not New's trial of the commands (EVALSHA, EVAL, WAIT), which New
// sends to the primaries it knows only. ACLs are set per node, so a node
// that refuses one of them to the store's user is found by the first call
// sent there, as a command only the scripts run is.
//
// A check reads the node's run_id (INFO server), on the connection it sends
// its other commands on, and every script the store sends the node carries
// it: a script that runs on a Redis of another run_id (the client's address
// now reaches another Redis: a Sentinel failover, a restart, perhaps with
// another configuration, a DNS name or VIP that moved; off a Cluster the
// store keeps one check for the Redis behind the client) answers so before
// it reads or writes anything. The call that sent it fails with an error
// wrapping idempotency.ErrStoreUnavailable, having changed nothing there (a
// Begin then fences, as after any failure once it sent its script, the try
// an earlier run of its script, resent by go-redis, may have begun, on
// a context of its own bounded by 100 ms: that fence is the next call, and
// has the node checked), and the node's check no longer vouches for it: the
// next call waits for all of the checks of New on the Redis it now reaches,
// and is refused, as every call until it passes, when it fails them
// (maxmemory-policy not noeviction included). So no script runs on a Redis
// the store did not check, and the calls sent with the former run_id fail
// (but for a Finish: its try's handler ran, and the record, restored or
// replicated, may be there to end; it waits for that check, as the next
// call does, and is sent once more, with the new run_id). (On a
// Cluster, a call that the client follows from a MOVED or ASK reply reaches
// another node with the first's run_id: when a passed check of that node
// vouches for its run_id, the script is sent once more, with it; otherwise
// the call fails as above — but the check of the node the call was routed
// to is reset only when INFO there no longer tells the run_id its check
// read (else another node answered, a node a slot migrates to, say, which
// the map does not name: the routed node's check stays, and the error
// names the node that answered, or its run_id) — and
// the calls after it are routed by the map go-redis reads again; a Finish
// reads it first, one CLUSTER SLOTS, and has the masters it names checked
// whose check lapsed, before it is sent once more, and, while the Redis it
// reaches is one the map does not name yet, a node a slot migrates to that
// holds its keys (ASK), again after a pause, until the migration ends and
// the map names the node, or its context, at most five seconds, ends;
// looping Finishes share their reads of the map: one runs at a time, and
// each Finish is resent only after one that started after its failure.)
//
// A Finish is resent in that loop too (at once, then after pauses of
// 20 ms, doubled up to 1 s; the same five seconds, its context or Close ending it; each resend
// carrying the time it is sent at) after the replies with which Redis
// refuses a script before it runs it, once go-redis's own resends of them
// failed: TRYAGAIN (a slot's migration split its keys between source and
// target: a reshard moving its keys in batches, or the tenant's index under
// WithMaxRecordsPerTenant moved apart from its records), CLUSTERDOWN (its
// slot not served), LOADING (a restarted Redis reading its data) and
// MASTERDOWN (a replica cut off from its primary), from its script or from
// the check its node waited for. No other error is resent: the script may
// have run (a lost reply, a timeout) or Redis refused it for good. Each
// wait and resend of the loop gets only what is left of its five seconds.
//
// A node's check, New's included, vouches for it for a minute: the first
// call to the node after that has its clock and run_id read again (TIME
// and INFO server, on one connection; the calls within the minute cost no
// round trip of their own), and all of the checks redone when the node
// failed a check since it last passed them, when its run_id is another
// (another Redis behind the address, as above), or when its clock, against
// this server's, is found more than a second behind where the last check
// saw it (a node restored behind the same address shows that). On a Cluster the store forgets, at most
// once a minute, after a check and once it sent calls to a node it did not
// know (reading the client's map: one CLUSTER SLOTS), what it knows of the
// nodes no longer in the client's map (but for a node whose check runs,
// that it refuses, or that a check still vouches for, which a later one
// forgets): it keeps no entry for every address it ever sent a call to
// (nodes replaced under new addresses, as Kubernetes pods are), and a node
// that comes back gets every check again, as a new one does. One check of a node runs at a time, for
// every call that waits for it, in a goroutine of its own, detached from
// their contexts and bounded by 5 s (Close ends it and waits for it); a
// call whose context ends first fails, and the check goes on. A node found wrong by a check, or
// that answered one of its commands with an error (NOPERM, a CONFIG
// renamed away, LOADING, MASTERDOWN: the error tells what Redis answered),
// is refused for a second, then checked again at the next call; one that
// a check could not reach (no reply: a blip, a timeout) fails the calls
// that waited for that check, and the next call checks it again. Until it passes, every call
// whose slot it serves (every call, off a Cluster) fails with an error
// wrapping idempotency.ErrStoreUnavailable, and changes nothing.
func New(ctx context.Context, client redis.UniversalClient, opts ...Option) (*Store, error) {
	switch c := client.(type) {
	case nil:
		return nil, errors.New("redisstore: New needs a Redis client")
	case *redis.Client:
		if c == nil { // a nil pointer in the interface: no client either
			return nil, errors.New("redisstore: New needs a Redis client, not a nil *redis.Client")
		}
	case *redis.ClusterClient:
		if c == nil {
			return nil, errors.New("redisstore: New needs a Redis client, not a nil *redis.ClusterClient")
		}
	default:
		// eachNode, ready and WAIT's routing know the nodes of these two
		// only; another client (a Ring's shards) would have New's checks
		// run on whichever server it sends a command without keys to.
		return nil, fmt.Errorf("redisstore: New needs a *redis.Client or a *redis.ClusterClient, not a %T: the store checks each Redis node of those before it sends them scripts, and cannot check each server behind another client", client)
	}
	if err := honoursDeadlines(client); err != nil {
		return nil, err
	}
	s := &Store{client: client, prefix: "tollgate:attempt:", policy: idempotency.DefaultPolicy(), now: time.Now, keep: DefaultKeep,
		failedFenceTimeout: failedBeginFenceTimeout, recheckAfter: clockRecheckAfter, born: time.Now(), idle: DefaultIdleTenantExpiry}
	s.stop, s.stopAll = context.WithCancel(context.Background())
	for _, o := range opts {
		if o != nil {
			o.apply(s)
		}
	}
	if err := s.policy.Validate(); err != nil {
		return nil, err // wraps idempotency.ErrInvalidOption
	}
	s.pruneAt.Store(int64(s.recheckAfter))
	// The keep is counted in the reading's clock; a script judges it by
	// Redis's, which may differ by the skew plus clockMargin either way (see
	// DefaultKeep and checkClock): the scripts refuse a call DefaultKeep
	// plus the skew late by Redis's clock, and records are kept that long
	// plus the most by which Redis's clock may lag.
	s.keep += 2*s.policy.Skew + clockMargin
	if strings.ContainsAny(s.prefix, "{}") {
		return nil, invalid("prefix %q must not contain '{' or '}'", s.prefix)
	}
	if s.perTenant < 0 {
		return nil, invalid("WithMaxRecordsPerTenant(%d) must not be negative", s.perTenant)
	}
	if s.idle < 0 || (s.idle > 0 && s.idle < s.policy.TTL) {
		return nil, invalid("WithIdleTenantExpiry(%v) must be 0 or at least the policy's TTL %v", s.idle, s.policy.TTL)
	}
	if s.replicas < 0 || (s.replicas > 0 && s.waitTimeout < time.Millisecond) {
		// WAIT counts whole milliseconds, and WAIT n 0 waits for ever.
		return nil, invalid("WithReplicas(%d, %v) needs n ≥ 0 and, for n > 0, a timeout of at least 1 ms", s.replicas, s.waitTimeout)
	}
	if err := eachNode(ctx, client, func(ctx context.Context, c redis.UniversalClient, where string) error {
		off, id, err := s.checkNode(ctx, c, where)
		if err != nil {
			return err
		}
		s.node(s.addr(c)).passed(s, off, id)
		return nil
	}); err != nil {
		return nil, err
	}
	s.unpruned.Store(false) // New's entries are the client's map
	if s.replicas > 0 {
		hz, err := readHz(ctx, client)
		if err != nil {
			return nil, err
		}
		s.tick = time.Second / time.Duration(hz)
		if rt := readTimeout(client); rt > 0 && s.waitTimeout+s.tick > rt/2 {
			return nil, invalid("the WithReplicas timeout %v plus Redis's tick %v (hz %d), by which it may answer WAIT late, must be at most half the Redis client's ReadTimeout %v, or go-redis takes a WAIT still waiting for a lost reply and sends the script again",
				s.waitTimeout, s.tick, hz, rt)
		}
		if s.waitTimeout+s.tick > s.keep/2 {
			return nil, invalid("the WithReplicas timeout %v plus Redis's tick %v (hz %d) must be at most %v, half the store's keep %v (DefaultKeep plus twice the policy's skew and a second): a call whose reply comes later than the keep is refused (see DefaultKeep)",
				s.waitTimeout, s.tick, hz, s.keep/2, s.keep)
		}
	}
	if err := s.probeCommands(ctx, client); err != nil {
		return nil, err
	}
	for _, sc := range []*redis.Script{beginScript, finishScript, getScript, fenceScript} {
		if err := sc.Load(ctx, client).Err(); err != nil {
			return nil, checkErr("loading scripts", err)
		}
	}
	return s, nil
}

// noScript is the SHA1 of a script no Redis holds (its digest would need a
// preimage of all zeros): EVALSHA of it answers NOSCRIPT and runs nothing.
const noScript = "0000000000000000000000000000000000000000"

// probeCommands tries, on every primary the client knows (off a Cluster,
// the Redis behind it), the commands the store sends itself that New's
// checks do not send, so that one Redis refuses to the store's user (NOPERM)
// or does not know (renamed away) is reported by New, as a setting, and not
// by the first call: EVALSHA of noScript (answered NOSCRIPT), EVAL of a
// script that returns 0 and touches no key, and, when the store waits for
// replicas, WAIT 0 0 (answered at once, whatever the replicas). They are
// pipelined, one round trip per primary. The commands only the scripts run
// are not tried: that would take a write under the prefix.
func (s *Store) probeCommands(ctx context.Context, client redis.UniversalClient) error {
	probe := func(ctx context.Context, c redis.UniversalClient, where string) error {
		pipe := c.Pipeline()
		sha := pipe.EvalSha(ctx, noScript, nil)
		eval := pipe.Eval(ctx, "return 0", nil)
		var wait *redis.Cmd
		if s.replicas > 0 {
			wait = pipe.Do(ctx, "WAIT", 0, 0)
		}
		execAll(ctx, pipe) // each command's reply is read below
		if err := sha.Err(); err != nil && !redis.HasErrorPrefix(err, "NOSCRIPT") {
			return checkErr("trying EVALSHA"+where, err)
		}
		if err := eval.Err(); err != nil {
			return checkErr("trying EVAL"+where, err)
		}
		if wait != nil {
			if err := wait.Err(); err != nil {
				return checkErr("trying WAIT 0 0"+where, err)
			}
		}
		return nil
	}
	cluster, ok := client.(*redis.ClusterClient)
	if !ok {
		return probe(ctx, client, "")
	}
	return cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		return probe(ctx, node, " at "+node.Options().Addr)
	})
}

// eachNode calls f with client, or, on a Cluster, with every node the
// client knows, replicas included (a replica becomes a primary in a
// failover), concurrently; where names the node for f's errors. A
// ClusterClient would send a command without keys, as CONFIG GET is, to one
// primary only.
//
// On a Cluster it reads the client's map again (ForEachShard: one CLUSTER
// SLOTS), and fails when that fails (checkErr: ErrStoreUnavailable but for
// a refused command or credentials), or when the map names no node: its
// seeds answered, but serve no slots (they joined no Cluster, or its slots
// are not assigned yet; a ClusterSlots function that names none reads the
// same). That is ErrStoreUnavailable, as Redis's own CLUSTERDOWN is: a
// Cluster being created serves no slots until they are assigned, and a
// server started with it waits; a seed that never joins looks the same, and
// the error names the seeds. Without it New would check no node at all.
func eachNode(ctx context.Context, client redis.UniversalClient, f func(ctx context.Context, c redis.UniversalClient, where string) error) error {
	cluster, ok := client.(*redis.ClusterClient)
	if !ok {
		return f(ctx, client, "")
	}
	var (
		mu     sync.Mutex
		nodes  int
		failed bool // f failed: ForEachShard's error is f's
	)
	err := cluster.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error {
		mu.Lock()
		nodes++
		mu.Unlock()
		err := f(ctx, node, " at "+node.Options().Addr)
		if err != nil {
			mu.Lock()
			failed = true
			mu.Unlock()
		}
		return err
	})
	mu.Lock()
	defer mu.Unlock()
	switch {
	case err != nil && failed:
		return err
	case err != nil && redis.HasErrorPrefix(err, "This instance has cluster support disabled"):
		// Redis answered CLUSTER SLOTS that it runs without Cluster mode:
		// a *redis.Client is the client for it.
		return fmt.Errorf("redisstore: reading the Redis Cluster's map (CLUSTER SLOTS from %s): the Redis is not a Cluster, use a *redis.Client: %w", seeds(cluster), err)
	case err != nil:
		return checkErr("reading the Redis Cluster's map (CLUSTER SLOTS from "+seeds(cluster)+")", err)
	case nodes == 0:
		return fmt.Errorf("%w: redisstore: the Redis Cluster client knows no node serving slots: the map it read (from %s) names none (they joined no Cluster, or its slots are not assigned yet), so the store could check no node",
			idempotency.ErrStoreUnavailable, seeds(cluster))
	}
	return nil
}

// seeds names where a Cluster client reads its map from, for errors: its
// seeds (it reads from the nodes of its last map once it has one), or its
// ClusterSlots function.
func seeds(cluster *redis.ClusterClient) string {
	if o := cluster.Options(); o.ClusterSlots == nil {
		return "its seeds " + strings.Join(o.Addrs, ", ")
	}
	return "its ClusterSlots function"
}

// checkNode makes New's checks of one Redis node c (where names it for the
// errors): its maxmemory-policy, its clock and its identity, and, once New
// read the Cluster's hz (the store waits for replicas), that its tick is no
// longer than the one the store counts with. It returns checkClock's
// offset and the node's run_id. It sends them all in one pipeline, on one
// connection, so that they read one server even when the client's pool
// holds connections to two (an address that moved to another Redis, whose
// old connections still reach the first); go-redis runs the client's
// pipeline hooks for them, not its per-command ones.
func (s *Store) checkNode(ctx context.Context, c redis.UniversalClient, where string) (time.Duration, string, error) {
	pipe := c.Pipeline()
	policy := pipe.ConfigGet(ctx, "maxmemory-policy")
	clock := pipe.Time(ctx)
	infos := make([]*redis.StringCmd, len(identityFields))
	for i, f := range identityFields {
		infos[i] = pipe.Info(ctx, f.section)
	}
	var hzCmd *redis.MapStringStringCmd
	if s.tick > 0 {
		hzCmd = pipe.ConfigGet(ctx, "hz")
	}
	execAll(ctx, pipe) // each command's reply is read below
	if err := checkNoEviction(policy, where); err != nil {
		return 0, "", err
	}
	off, err := s.checkClock(clock, where)
	if err != nil {
		return 0, "", err
	}
	id, err := checkIdentity(infos, where)
	if err != nil {
		return 0, "", err
	}
	if hzCmd != nil {
		hz, err := checkHz(hzCmd, where)
		if err != nil {
			return 0, "", err
		}
		if tick := time.Second / time.Duration(hz); tick > s.tick {
			return 0, "", fmt.Errorf("redisstore: Redis hz%s is %d: its tick %v is longer than the %v the store's waits for replicas allow for", where, hz, tick, s.tick)
		}
	}
	return off, id, nil
}

// execAll sends the commands of pipe. When the pipeline failed as a whole
// before any command had its reply (a dial, or credentials Redis refused:
// go-redis then leaves each command without an error), it gives that error
// to every command, so that each reads as failed.
func execAll(ctx context.Context, pipe redis.Pipeliner) {
	cmds, err := pipe.Exec(ctx)
	if err == nil {
		return
	}
	for _, c := range cmds {
		if c.Err() != nil {
			return
		}
	}
	for _, c := range cmds {
		c.SetErr(err)
	}
}

// checkClockAndID is the check of a node that passed checkNode and failed
// nothing since: its clock (checkClock) and its run_id, in one pipeline
// (one round trip, one connection).
func (s *Store) checkClockAndID(ctx context.Context, c redis.UniversalClient, where string) (time.Duration, string, error) {
	pipe := c.Pipeline()
	clock := pipe.Time(ctx)
	info := pipe.Info(ctx, identityFields[0].section)
	execAll(ctx, pipe) // each command's reply is read below
	off, err := s.checkClock(clock, where)
	if err != nil {
		return 0, "", err
	}
	id, err := info.Result()
	if err != nil {
		return 0, "", checkErr("reading INFO "+identityFields[0].section+where, err)
	}
	id, _ = hexField(id, identityFields[0].field) // "" reads as another Redis: checkNode refuses it
	return off, id, nil
}

// The node checks after New: how long a passed check vouches for its node
// before the store reads the node's clock again, how long a failed one
// refuses its node before it is checked again, and how long one may take.
const (
	clockRecheckAfter  = time.Minute
	failedCheckRefusal = time.Second
	nodeCheckTimeout   = 5 * time.Second
)

// nodeCheck is what the store knows of the checks of one Redis node. Its
// zero value is a node never checked.
type nodeCheck struct {
	// good is until when (since) the last passed check vouches for the
	// node: before then a call sends its script without a check.
	good atomic.Int64

	mu sync.Mutex
	// full is set once the node passed checkNode, and cleared by a
	// failed check or a script that found another Redis (otherRedis): only
	// a node that passed it and failed nothing since has its clock and
	// run_id alone checked again.
	full bool
	// offset is checkClock's at the last passed check.
	offset time.Duration
	// id is the node's run_id that the last passed check read (set
	// before good): every script the store sends the node carries it,
	// and refuses to run on a Redis of another (see Store.run).
	id atomic.Pointer[string]
	// refused is the last check's verdict against the node (it answered,
	// and was found wrong or answered with an error), at refusedAt
	// (since); nil after a passed check. A check that could not reach the
	// node refuses nothing.
	refused   error
	refusedAt int64
	// running is the check that runs; nil when none does.
	running *checkRun
	// dropped is set once prune took the entry out of Store.nodes (its
	// node had left the Cluster's map, no check of it ran, and neither a
	// passed check vouched for it nor a refusal of it was in force): a caller that loaded it before takes
	// the table's entry instead (node), a new one, which knows no check:
	// a node that comes back is checked as a new node is.
	dropped bool
}

// checkRun is one check of a node, which its callers wait for.
type checkRun struct {
	done chan struct{} // closed when the check ends
	err  error         // its failure, set before done is closed
}

// passed notes that the node, whose run_id is id, passed a check (full or
// clock and identity) whose clock check read offset off.
func (n *nodeCheck) passed(s *Store, off time.Duration, id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.full, n.offset, n.refused = true, off, nil
	n.id.Store(&id)
	n.good.Store(s.since() + int64(s.recheckAfter))
}

// runID returns the run_id the node's last passed check read; "" before
// one passed.
func (n *nodeCheck) runID() string {
	if id := n.id.Load(); id != nil {
		return *id
	}
	return ""
}

// since returns the time since New began, on the monotonic clock.
func (s *Store) since() int64 { return int64(time.Since(s.born)) }

// node returns the nodeCheck of the node at addr (see Store.nodes): the
// table's, or a new one, never checked, when it has none (the node is new,
// or prune dropped its entry).
func (s *Store) node(addr string) *nodeCheck {
	if n, ok := s.nodes.Load(addr); ok {
		return n.(*nodeCheck)
	}
	n, loaded := s.nodes.LoadOrStore(addr, new(nodeCheck))
	if !loaded {
		s.unpruned.Store(true)
	}
	return n.(*nodeCheck)
}

// addr returns the key of Redis node c in Store.nodes: its address on a
// Cluster, "" for any other client.
func (s *Store) addr(c redis.UniversalClient) string {
	if _, ok := s.client.(*redis.ClusterClient); ok {
		if node, ok := c.(*redis.Client); ok {
			return node.Options().Addr
		}
	}
	return ""
}

// where names the node at addr for errors.
func where(addr string) string {
	if addr == "" {
		return ""
	}
	return " at " + addr
}

// ready returns the run_id of Redis node c (at addr, see Store.nodes) that
// the last passed check read, and no error, when a check vouches for the
// node, which a call may then send its script (carrying that run_id): for
// recheckAfter after a passed check, at no cost but a map lookup.
// Otherwise it has the node checked (check), once for every caller that
// finds it so: the first starts the check in a goroutine of its own,
// detached from its context and bounded by nodeCheckTimeout, and every
// caller waits for its end, or for its own context's (the check goes on),
// and returns its result. A check that found the node wrong (it answered),
// or that Redis answered with an error reply (a redis.Error), refuses the
// node, with its error, for failedCheckRefusal; the call after that checks
// it again. One that could not reach the node (no reply: its error wraps
// idempotency.ErrStoreUnavailable: a blip, a timeout) fails the calls that
// waited for it and refuses nothing: the next call checks the node again,
// as its script would have found out whether Redis answers. A caller that
// finds the entry it loaded dropped (prune) takes the table's instead; the
// goroutine of a check prunes the table (prune) once the check ended.
func (s *Store) ready(ctx context.Context, c redis.UniversalClient, addr string) (string, error) {
	n := s.node(addr)
	if s.since() < n.good.Load() {
		return n.runID(), nil
	}
	n.mu.Lock()
	for n.dropped {
		// prune took n out of the table since this call loaded it: no
		// check may start on it, which the next caller would not find.
		n.mu.Unlock()
		n = s.node(addr)
		n.mu.Lock()
	}
	now := s.since()
	if now < n.good.Load() {
		n.mu.Unlock()
		return n.runID(), nil
	}
	if n.refused != nil && now < n.refusedAt+int64(failedCheckRefusal) {
		err := n.refused
		n.mu.Unlock()
		return "", err
	}
	run := n.running
	if run == nil {
		run = &checkRun{done: make(chan struct{})}
		if !s.goCheck(func() {
			s.check(context.WithoutCancel(ctx), c, addr, n, run)
			s.prune()
		}) {
			n.mu.Unlock()
			return "", errClosed
		}
		n.running = run
	}
	n.mu.Unlock()
	select {
	case <-run.done:
		// The check this call waited for vouches for the node, or not,
		// even if a later one is due already (a test's recheckAfter).
		if run.err != nil {
			return "", run.err
		}
		return n.runID(), nil
	case <-ctx.Done():
		return "", fmt.Errorf("%w: redisstore: waiting for the check of Redis node%s: %w", idempotency.ErrStoreUnavailable, where(addr), ctx.Err())
	}
}

// check checks Redis node c, for ready, on ctx bounded by
// nodeCheckTimeout, and ends run: with every check of New (checkNode) a
// node that never passed them (a Cluster node that joined after New), that
// failed a check since, or whose script found it another Redis (Store.run);
// otherwise its clock, the only check that a node which passed them may
// fail without a change of configuration (an NTP step, a VM resumed on
// another host), and its run_id (checkClockAndID), and then every check
// again when the run_id is not the one the last check read (another Redis
// behind the address: a restart, a Sentinel failover, a DNS name or VIP
// moved) or its clock, against this server's, is found more than
// clockMargin behind where the last check saw it (a node restored or
// replaced behind the same address shows that too): the earlier check no
// longer vouches for it.
func (s *Store) check(ctx context.Context, c redis.UniversalClient, addr string, n *nodeCheck, run *checkRun) {
	ctx, cancel := context.WithTimeout(ctx, nodeCheckTimeout)
	defer cancel()
	defer context.AfterFunc(s.stop, cancel)() // Close ends it
	n.mu.Lock()
	clockOnly, before := n.full, n.offset
	n.mu.Unlock()
	var (
		off time.Duration
		id  string
		err error
	)
	if clockOnly {
		off, id, err = s.checkClockAndID(ctx, c, where(addr))
		// Else another Redis, or a clock stepped back: check it all.
		clockOnly = err == nil && id == n.runID() && before-off <= clockMargin
	}
	if !clockOnly && err == nil {
		off, id, err = s.checkNode(ctx, c, where(addr))
	}
	if err == nil {
		n.passed(s, off, id)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		n.full = false
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || ctx.Err() != nil {
			// The check's own bound (or Close) ended it, not a caller's
			// context: its callers must not read it as theirs. (go-redis
			// reports a pipeline cut by its context's deadline as the
			// socket's i/o timeout.)
			err = fmt.Errorf("%w: redisstore: the check ran out of its %v (or the store was closed): %v",
				idempotency.ErrStoreUnavailable, nodeCheckTimeout, err)
		}
		var reply redis.Error
		switch {
		case errors.As(err, &reply):
			// Redis answered a check's command with an error (NOPERM, a
			// CONFIG renamed away, LOADING, MASTERDOWN): a verdict, or
			// every call would pay a check that fails the same way.
			err = refusal{fmt.Errorf("%w: redisstore: Redis node%s answered the store's checks with an error (the store refuses it for %v, then checks it again): %w",
				idempotency.ErrStoreUnavailable, where(addr), failedCheckRefusal, err)}
			n.refused, n.refusedAt = err, s.since()
		case errors.Is(err, idempotency.ErrStoreUnavailable):
			// Redis did not answer: no verdict on the node.
			err = fmt.Errorf("%w: redisstore: the store could not check Redis node%s (the next call checks it again): %w",
				idempotency.ErrStoreUnavailable, where(addr), err)
		default:
			err = refusal{fmt.Errorf("%w: redisstore: Redis node%s failed the store's checks (the store refuses it for %v, then checks it again): %w",
				idempotency.ErrStoreUnavailable, where(addr), failedCheckRefusal, err)}
			n.refused, n.refusedAt = err, s.since()
		}
	}
	run.err = err
	n.running = nil
	close(run.done)
}

// prune drops from Store.nodes, on a Cluster, the entries of the nodes no
// longer in the Cluster client's map (ForEachShard, which reads it again:
// one CLUSTER SLOTS; the client's last map when that fails), so that a
// long-lived store on a Cluster whose nodes are replaced under new
// addresses keeps no entry for every address it ever sent a call to. It
// runs in a check's goroutine once the check ended, at most once per
// recheckAfter, and only when an entry was added since it last ran, or it
// kept one then of a node not in the map: a store on a Cluster whose nodes
// stay reads no map for it. It keeps an entry whose check runs, whose
// refusal is in force (the node is refused its second, even if the map
// names it again) or whose passed check still vouches for its node (a map
// read from a node that lags behind a slot's move costs the node it moved
// to no check), and drops it at a later prune; one it drops costs a call
// routed there (from an older map) a check, as a node never checked does,
// and never spares it one.
func (s *Store) prune() {
	cluster, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return
	}
	now, at := s.since(), s.pruneAt.Load()
	if !s.unpruned.Load() || now < at || !s.pruneAt.CompareAndSwap(at, now+int64(s.recheckAfter)) {
		return
	}
	// Cleared before the map is read: an entry added from now on makes
	// the next prune read it again.
	s.unpruned.Store(false)
	ctx, cancel := context.WithTimeout(s.stop, nodeCheckTimeout) // Close ends it
	defer cancel()
	var mu sync.Mutex
	known := make(map[string]bool)
	if err := cluster.ForEachShard(ctx, func(_ context.Context, node *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		known[node.Options().Addr] = true
		return nil
	}); err != nil {
		s.unpruned.Store(true)
		return
	}
	s.nodes.Range(func(k, v any) bool {
		addr, n := k.(string), v.(*nodeCheck)
		if known[addr] {
			return true
		}
		n.mu.Lock()
		defer n.mu.Unlock()
		now := s.since()
		if n.running == nil && now >= n.good.Load() && (n.refused == nil || now >= n.refusedAt+int64(failedCheckRefusal)) {
			n.dropped = true
			s.nodes.CompareAndDelete(addr, n)
		} else {
			s.unpruned.Store(true) // kept: dropped at a later prune
		}
		return true
	})
}

// checkErr is the error of a command of New's checks (what it did, and
// where) that failed. Redis refusing the client's credentials (WRONGPASS,
// NOAUTH, Redis 5's invalid password), refusing the command to the store's
// user (NOPERM) or not knowing it (a CONFIG renamed away: unknown command) is a
// setting that waiting does not change, and the error says so; anything
// else (no reply, LOADING, MASTERDOWN) wraps idempotency.ErrStoreUnavailable,
// as Redis may answer later. (The checks after New refuse a node either
// way: see ready.)
func checkErr(what string, err error) error {
	if redis.HasErrorPrefix(err, "WRONGPASS") || redis.HasErrorPrefix(err, "NOAUTH") || redis.HasErrorPrefix(err, "invalid password") {
		return fmt.Errorf("redisstore: %s: Redis refused the client's credentials: %w", what, err)
	}
	if refusedCommand(err) {
		return fmt.Errorf("redisstore: %s: Redis refused the command: %w (%s)", what, err, needs)
	}
	return fmt.Errorf("%w: redisstore: %s: %w", idempotency.ErrStoreUnavailable, what, err)
}

// refusedCommand reports whether err is Redis refusing a command to the
// store's user (NOPERM; a command a script runs: "The user executing the
// script can't run this command" on Redis 7.0, "ACL failure in script"
// later) or not knowing it (renamed away).
func refusedCommand(err error) bool {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return false
	}
	msg := reply.Error()
	return redis.HasErrorPrefix(reply, "NOPERM") || redis.HasErrorPrefix(reply, "unknown command") || redis.HasErrorPrefix(reply, "unknown subcommand") ||
		strings.Contains(msg, "can't run this command") || strings.Contains(msg, "ACL failure in script") ||
		strings.Contains(msg, "Unknown Redis command called from script")
}

// needs is what the store's Redis user needs: New's checks' commands, the
// scripts' (EVAL sends one Redis lost, and the finish of a full Redis, which
// is never loaded ahead), and the commands the scripts run, which Redis
// checks against the user's ACL too.
const needs = "the store's Redis user needs CONFIG GET, INFO, TIME, SCRIPT LOAD, EVALSHA, EVAL, " +
	"and for its scripts HMGET, HSET, EXISTS, PEXPIRE, PTTL, ZADD, ZCOUNT, ZREMRANGEBYSCORE, " +
	"on the keys under its prefix; with WithReplicas, WAIT; on a Cluster, CLUSTER SLOTS"

// checkNoEviction checks that a Redis node's maxmemory-policy, its reply to
// cmd (CONFIG GET maxmemory-policy), is noeviction.
func checkNoEviction(cmd *redis.MapStringStringCmd, where string) error {
	cfg, err := cmd.Result()
	if err != nil {
		return checkErr("reading maxmemory-policy"+where, err)
	}
	if p := cfg["maxmemory-policy"]; p != "noeviction" {
		return fmt.Errorf("redisstore: Redis maxmemory-policy%s is %q; it must be noeviction, or Redis may evict records and a repeated try would run again", where, p)
	}
	return nil
}

// identityFields are what the scripts' identity() reads from INFO: the
// section and the field, whose value must be hex digits.
var identityFields = []struct{ section, field string }{{"server", "run_id"}, {"replication", "master_replid"}}

// checkIdentity checks that a Redis node tells its identity in INFO (its
// replies to infos, one INFO per identityFields), as the scripts read it
// (run_id in the server section, master_replid in the replication one),
// and returns its run_id. A Redis-compatible server that leaves them out
// would give every script the same identity, so that a restart, a restore
// or a failover would not move the horizon, and a record it lost would
// read as absent.
func checkIdentity(infos []*redis.StringCmd, where string) (string, error) {
	var runID string
	for i, f := range identityFields {
		info, err := infos[i].Result()
		if err != nil {
			return "", checkErr("reading INFO "+f.section+where, err)
		}
		v, ok := hexField(info, f.field)
		if !ok {
			return "", fmt.Errorf("redisstore: Redis's INFO %s%s has no %s: the store tells a restart, a restore or a failover, which lose records, by run_id and master_replid, and without them would read a lost record as absent (a Redis-compatible server that hides them is not supported)",
				f.section, where, f.field)
		}
		if i == 0 {
			runID = v
		}
	}
	return runID, nil
}

// hexField returns the value of info's line "field:" when hex digits
// follow, as the scripts' pattern field:(%x+) finds, and whether there was
// one.
func hexField(info, field string) (string, bool) {
	for line := range strings.Lines(info) {
		v, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), field+":")
		if ok && v != "" && strings.Trim(v, "0123456789abcdefABCDEF") == "" {
			return v, true
		}
	}
	return "", false
}

// readHz returns Redis's hz: the lowest of every node's (eachNode), whose
// serverCron tick is the longest.
func readHz(ctx context.Context, client redis.UniversalClient) (int, error) {
	var mu sync.Mutex
	lowest := 0
	err := eachNode(ctx, client, func(ctx context.Context, c redis.UniversalClient, where string) error {
		hz, err := nodeHz(ctx, c, where)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if lowest == 0 || hz < lowest {
			lowest = hz
		}
		return nil
	})
	return lowest, err
}

// nodeHz returns Redis node c's hz.
func nodeHz(ctx context.Context, c redis.UniversalClient, where string) (int, error) {
	return checkHz(c.ConfigGet(ctx, "hz"), where)
}

// checkHz returns the hz a Redis node answered to cmd (CONFIG GET hz).
func checkHz(cmd *redis.MapStringStringCmd, where string) (int, error) {
	cfg, err := cmd.Result()
	if err != nil {
		return 0, checkErr("reading hz"+where, err)
	}
	hz, err := strconv.Atoi(cfg["hz"])
	if err != nil || hz <= 0 {
		return 0, fmt.Errorf("redisstore: Redis hz%s is %q, not a positive number", where, cfg["hz"])
	}
	return hz, nil
}

// honoursDeadlines reports why a context's deadline would not bound the
// client's calls: go-redis ignores it without ContextTimeoutEnabled, and
// never sets a socket deadline at all when ReadTimeout or WriteTimeout is
// -2. After the clients' own normalisation that is -1 on a Client (whose
// -1, "no timeout", becomes 0 and still follows the context) and -2 on a
// ClusterClient (whose -1 becomes 0).
func honoursDeadlines(c redis.UniversalClient) error {
	enabled, rt, wt, known := timeouts(c)
	if !known {
		return nil // no other client gets here: New refuses them
	}
	if !enabled {
		return errors.New("redisstore: the Redis client must be built with ContextTimeoutEnabled: true, or a try's deadline would not bound its store calls")
	}
	if rt < 0 || wt < 0 {
		return errors.New("redisstore: the Redis client's ReadTimeout and WriteTimeout must not be -2 (no socket deadlines), or a try's deadline would not bound its store calls")
	}
	return nil
}

// timeouts returns the deadline settings of a *redis.Client or a
// *redis.ClusterClient, as normalised by the client, and false for a client
// of another kind.
func timeouts(c redis.UniversalClient) (contextTimeout bool, read, write time.Duration, known bool) {
	switch c := c.(type) {
	case *redis.Client:
		o := c.Options()
		return o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout, true
	case *redis.ClusterClient:
		o := c.Options()
		return o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout, true
	}
	return false, 0, 0, false
}

// readTimeout returns the client's socket read timeout, 0 when reads have
// none (or the client is of another kind).
func readTimeout(c redis.UniversalClient) time.Duration {
	_, rt, _, _ := timeouts(c)
	return max(rt, 0)
}

// keys returns the keys every script is given: the tenant's horizon, the
// record of k and the tenant's index of records (WithMaxRecordsPerTenant),
// all under the tenant's hash tag.
//
// The tenant's index (its third key) is named only under
// WithMaxRecordsPerTenant, the only time the scripts use it: while a
// Cluster migrates the tenant's slot, Redis refuses (TRYAGAIN) a script
// naming keys of which only some are at the slot's source, and an index
// that never exists would have every call of the slot refused for as long
// as the migration runs.
func (s *Store) keys(k idempotency.Key) []string {
	tag := s.prefix + "{t:" + k.Tenant + "}:"
	if s.perTenant <= 0 {
		return []string{tag + "h", tag + "r|" + k.AttemptID + "|" + k.Call + "|" + k.Method}
	}
	return []string{tag + "h", tag + "r|" + k.AttemptID + "|" + k.Call + "|" + k.Method, tag + "n"}
}

// tenantFull is the refusal of a new record of key's tenant at its bound.
func (s *Store) tenantFull(key idempotency.Key) error {
	return fmt.Errorf("%w: redisstore: tenant %q holds its %d records", idempotency.ErrStoreFull, key.Tenant, s.perTenant)
}

// attemptMillis returns the attempt's UUIDv7 time, or -1.
func attemptMillis(id string) int64 {
	t, ok := idempotency.AttemptTime(id)
	if !ok {
		return -1
	}
	return t.UnixMilli()
}

// run runs sc on the Redis node of keys, once a check vouches for it
// (ready); when wait is set and the store waits for replicas, it
// pipelines WAIT on the same connection (WAIT covers only the writes of the
// connection that sends it) and reports how many replicas acknowledged, and
// -1 otherwise.
//
// The script is sent with the node's run_id as its last argument, as the
// check that vouches for it read it, and runs only on a Redis of that
// run_id: another (the client's address now reaches another Redis: a
// restart, a Sentinel failover, a DNS name or VIP moved) answers {15,
// its run_id}, having written nothing, for it was never checked. Then the
// entry of the node that answered no longer vouches for it (the next call
// checks it in full, as a node never checked; see otherRedis for a
// Cluster, where go-redis may have followed a redirect to another node),
// and the call fails with an error wrapping
// idempotency.ErrStoreUnavailable (a sentError: an earlier run of the
// script, which go-redis may have sent before on a connection to the
// first Redis, may have written; an anotherRedis, which Store.sendFinish
// sends once more). On a Cluster, a Redis the client was
// redirected to (MOVED, ASK) whose run_id a passed check of another node
// vouches for gets the script once more, with that run_id.
func (s *Store) run(ctx context.Context, wait bool, sc *redis.Script, keys []string, args ...any) (v []any, acked int, err error) {
	defer func() {
		if err != nil {
			s.reloadAfter(ctx, err)
		}
	}()
	cluster, _ := s.client.(*redis.ClusterClient)
	var node *redis.Client
	c, addr := s.client, ""
	if cluster != nil {
		if node, err = cluster.MasterForKey(ctx, keys[0]); err != nil {
			return nil, -1, storeErr(err) // nothing sent
		}
		c, addr = node, node.Options().Addr
	}
	want, err := s.ready(ctx, c, addr)
	if err != nil {
		return nil, -1, err // nothing sent
	}
	checked := want
	for resent := false; ; resent = true {
		v, acked, err = s.send(ctx, wait, sc, cluster, node, keys, append(args[:len(args):len(args)], want))
		if resent && err != nil && !errors.As(err, new(sentError)) {
			err = sentError{err} // the first send was sent
		}
		if err != nil || len(v) != 2 || num(v[0]) != kindOtherRedis {
			return v, acked, err
		}
		ran := str(v[1])
		if !resent && s.vouchedElsewhere(addr, ran) {
			want = ran
			continue
		}
		return nil, -1, sentError{refusal{anotherRedis{s.otherRedis(ctx, c, addr, checked, ran)}}}
	}
}

// anotherRedis is the error of a call whose script found that it ran on a
// Redis of another run_id than its node's check read (Store.run), and
// wrote nothing.
type anotherRedis struct{ error }

func (e anotherRedis) Unwrap() error { return e.error }

// vouchedElsewhere reports whether a passed check of a node other than the
// one at addr (on a Cluster) read run_id id and still vouches for it.
func (s *Store) vouchedElsewhere(addr, id string) bool {
	found := false
	now := s.since()
	s.nodes.Range(func(k, v any) bool {
		n := v.(*nodeCheck)
		found = k.(string) != addr && now < n.good.Load() && n.runID() == id
		return !found
	})
	return found
}

// otherRedis returns the error of a call whose script, sent to the node
// at addr (c) whose check read run_id checked, found that it ran on a
// Redis of run_id ran, and makes the entry of the node at addr no longer
// vouch for it when that node is the Redis that answered (unless a check
// since read another run_id). Off a Cluster it is. On a Cluster go-redis
// may have followed a MOVED or ASK reply to another node, which answered:
// the node at addr is asked its run_id (INFO server, one round trip on
// the call's context); when it is still the one its check read, it did not
// change, its entry stays, and the error names the node that answered: one
// whose check once read ran (its check lapsed, or run would have sent it
// the script with its run_id), or else a node no check read (a node a
// slot migrates to, which the map does not name). When INFO tells another
// run_id, or the node does not answer, the node at addr is taken to be
// the Redis that answered.
func (s *Store) otherRedis(ctx context.Context, c redis.UniversalClient, addr, checked, ran string) error {
	if addr != "" {
		if info, err := c.Info(ctx, identityFields[0].section).Result(); err == nil {
			if id, _ := hexField(info, identityFields[0].field); id == checked {
				to := "a node of run_id " + ran + ", which no check of the store read (a node a slot migrates to, which the Cluster's map names only once the migration ends)"
				if other := s.checkedElsewhere(addr, ran); other != "" {
					to = "the node at " + other + " (run_id " + ran + "), whose check no longer vouches for it"
				}
				return fmt.Errorf("%w: redisstore: the client was redirected (MOVED or ASK) from Redis node %s (still run_id %s) to %s; the script wrote nothing, and the store checks that node before it sends it one",
					idempotency.ErrStoreUnavailable, addr, checked, to)
			}
		}
	}
	n := s.node(addr)
	n.mu.Lock()
	if n.runID() == checked {
		n.full = false
		n.good.Store(0)
	}
	n.mu.Unlock()
	return fmt.Errorf("%w: redisstore: the client reached another Redis%s (run_id %s) than the one the store checked (run_id %s): a failover, a restart or an address that moved; the script wrote nothing, and the store checks the new Redis (maxmemory-policy, clock, identity) before it next sends it one",
		idempotency.ErrStoreUnavailable, where(addr), ran, checked)
}

// checkedElsewhere returns the address of a node other than the one at
// addr (on a Cluster) whose last passed check read run_id id, whether or
// not it still vouches for it; "" when there is none.
func (s *Store) checkedElsewhere(addr, id string) string {
	found := ""
	s.nodes.Range(func(k, v any) bool {
		if k.(string) != addr && v.(*nodeCheck).runID() == id {
			found = k.(string)
		}
		return found == ""
	})
	return found
}

// send sends sc, with args, for run: through the client, or, when wait is
// set and the store waits for replicas, pipelined with WAIT through the
// client of the keys' node (node, on a Cluster).
func (s *Store) send(ctx context.Context, wait bool, sc *redis.Script, cluster *redis.ClusterClient, node *redis.Client, keys []string, args []any) ([]any, int, error) {
	if s.replicas == 0 || !wait {
		v, err := sc.Run(ctx, s.client, keys, args...).Slice()
		if err != nil {
			return nil, -1, sentError{storeErr(err)}
		}
		return v, -1, nil
	}
	var client redis.UniversalClient = s.client
	if cluster != nil {
		// A ClusterClient sends a command without keys, as WAIT is, to any
		// primary, where it would count the replicas of another
		// connection's writes: send the pipeline to the keys' primary.
		client = node
	}
	// WAIT answers its count at the first serverCron tick after its
	// timeout; a context that ended first would lose the count and the
	// script's reply with it, and leave a begun try that no handler runs and
	// no fence ends. WAIT gets half of what the context has left, less a
	// tick, so that its count arrives by half the time left; the other half
	// carries the reply. (The fence after a shortfall has a context of its
	// own.) With too little time for that, nothing is sent.
	timeout := s.waitTimeout
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		timeout = min(timeout, left/2-s.tick)
		if timeout < time.Millisecond { // WAIT 0 would wait for ever
			return nil, -1, &idempotency.TooLittleTimeError{Left: left, Needed: 2 * (s.tick + time.Millisecond),
				Why: fmt.Sprintf("redisstore: waiting for replicas; Redis may answer WAIT up to %v after its timeout", s.tick)}
		}
	}
	waitMillis := timeout.Milliseconds()
	for attempt := 0; ; attempt++ {
		pipe := client.Pipeline()
		res := sc.EvalSha(ctx, pipe, keys, args...)
		waited := pipe.Do(ctx, "WAIT", s.replicas, waitMillis)
		_, _ = pipe.Exec(ctx)
		v, err := res.Slice()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") && attempt == 0 {
			if err := sc.Load(ctx, client).Err(); err != nil {
				return nil, -1, storeErr(err)
			}
			continue
		}
		if err != nil && cluster != nil && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK") ||
			redis.IsReadOnlyError(err)) {
			// The slot moved since the client last read the Cluster's map
			// (the script did not run), or its primary became a replica
			// in a failover and the connection is in READONLY mode, as a
			// client built with ReadOnly makes every one (the script
			// stopped at its first write, which a replica refuses):
			// answer unavailable, and have the map read again for the
			// next call.
			cluster.ReloadState(ctx)
		}
		if err != nil {
			return nil, -1, sentError{storeErr(err)}
		}
		acked, err := waited.Int()
		if err != nil {
			// The script ran (its reply came); WAIT's count did not.
			return nil, -1, sentError{storeErr(err)}
		}
		return v, acked, nil
	}
}

// storeErr is the error of a store call's command that failed: it wraps
// idempotency.ErrStoreUnavailable, as every fault of the store does
// (idempotency.Store), and ErrStoreFull when Redis is out of memory. A
// command Redis refuses to the store's user after New (its ACL changed, a
// command was renamed away, or one only the scripts run, which New does not
// try) is such a fault too, which the server answers
// NOT_ADMITTED STORE_UNAVAILABLE for a Begin, the try unrun (UNKNOWN for a
// Finish, whose try ran), until the user is granted the command again; the
// error says so, and what the user needs, as New's (checkErr).
func storeErr(err error) error {
	if redis.HasErrorPrefix(err, "OOM") {
		return fmt.Errorf("%w: redisstore: %w", idempotency.ErrStoreFull, err) // ErrStoreFull matches ErrStoreUnavailable
	}
	if refusedCommand(err) {
		return fmt.Errorf("%w: redisstore: Redis refused a command of the store to its user (its ACL changed since New, a command was renamed away, or it is a command only the store's scripts run, which New does not try): %w (%s)",
			idempotency.ErrStoreUnavailable, err, needs)
	}
	return fmt.Errorf("%w: redisstore: %w", idempotency.ErrStoreUnavailable, err)
}

func (s *Store) ms(d time.Duration) int64 { return d.Milliseconds() }

// Policy returns the store's policy (WithPolicy's, or
// idempotency.DefaultPolicy).
func (s *Store) Policy() idempotency.Policy { return s.policy }

// Begin implements idempotency.Store.
func (s *Store) Begin(ctx context.Context, req idempotency.BeginRequest) (idempotency.BeginResult, error) {
	if err := idempotency.ValidateBegin(req); err != nil {
		return idempotency.BeginResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return idempotency.BeginResult{}, storeErr(err) // nothing sent
	}
	if s.closed.Load() {
		return idempotency.BeginResult{}, errClosed
	}
	p := s.policy
	tok := callToken()
	now, read := s.clock()
	v, acked, err := s.run(ctx, true, beginScript, s.keys(req.Key),
		now, s.ms(p.Skew), s.ms(p.TTL), s.ms(p.Grace), attemptMillis(req.Key.AttemptID),
		req.Try, fingerprint(req.Fingerprint), req.Deadline.UnixMilli(), tok, req.Minted, s.perTenant, s.ms(s.keep), s.ms(s.idle))
	if err == nil {
		lerr := s.late(read)
		if lerr == nil && len(v) == 1 && num(v[0]) == kindStale {
			lerr = s.stale()
		}
		if lerr != nil {
			if len(v) == 1 && (num(v[0]) == kindStarted || num(v[0]) == kindStale) {
				// kindStale: this run wrote nothing, but go-redis may have
				// sent the script before, and that run may have begun it.
				s.endBegun(ctx, req, tok, true, s.failedFenceTimeout)
			}
			return idempotency.BeginResult{}, lerr
		}
	}
	if err != nil {
		if errors.As(err, new(sentError)) {
			// Redis may have begun the try and its reply was lost (the
			// context ended while it was on its way, say): no handler will
			// run it, so end it, or it would read IN_PROGRESS, and refuse
			// every later try of its call, until its lease ends at the
			// attempt's deadline.
			s.endBegun(ctx, req, tok, s.late(read) != nil, s.failedFenceTimeout)
		}
		return idempotency.BeginResult{}, err
	}
	if len(v) == 2 && num(v[0]) == kindUnverifiable {
		// Outside the horizon only for having been created before
		// horizon + skew, which the script sends along.
		return idempotency.BeginResult{Refusal: idempotency.RefusedUnverifiable, Record: idempotency.UnknownRecord(req.Key),
			VerifiableFrom: time.UnixMilli(num(v[1]))}, nil
	}
	kind, rec, err := decode(req.Key, v)
	if err != nil {
		return idempotency.BeginResult{}, err
	}
	switch kind {
	case kindStarted:
		if acked >= 0 && acked < s.replicas {
			// The handler will not run: make the try a tombstone so its
			// next try may start.
			s.endBegun(ctx, req, tok, false, shortfallFenceTimeout)
			return idempotency.BeginResult{}, s.short(acked)
		}
		return idempotency.BeginResult{Started: true}, nil
	case kindFinished:
		return idempotency.BeginResult{Refusal: idempotency.RefusedFinished, Record: rec}, nil
	case kindInProgress:
		return idempotency.BeginResult{Refusal: idempotency.RefusedInProgress, Record: rec}, nil
	case kindAbandoned:
		return idempotency.BeginResult{Refusal: idempotency.RefusedAbandoned, Record: rec}, nil
	case kindFenced:
		return idempotency.BeginResult{Refusal: idempotency.RefusedFenced, Record: rec}, nil
	case kindMismatch:
		return idempotency.BeginResult{Refusal: idempotency.RefusedMismatch, Record: rec}, nil
	case kindDeadline:
		return idempotency.BeginResult{Refusal: idempotency.RefusedDeadlineExpired}, nil
	case kindUnverifiable:
		return idempotency.BeginResult{Refusal: idempotency.RefusedUnverifiable, Record: idempotency.UnknownRecord(req.Key)}, nil
	case kindTenantFull:
		return idempotency.BeginResult{}, s.tenantFull(req.Key)
	}
	return idempotency.BeginResult{}, fmt.Errorf("%w: redisstore: unexpected begin reply %d", idempotency.ErrStoreUnavailable, kind)
}

// endBegun ends the try that Begin call tok may have begun, and that no
// handler will run: as a tombstone, so that the call's next try may start;
// or, when the call was late (see DefaultKeep), UNKNOWN, since its script
// may have begun it on an absence its old reading vouched for, and a
// tombstone would say that no try of the call ever ran. Best effort, on a
// context of its own bounded by timeout; the script ends the try even after
// its lease, and only if tok began it.
func (s *Store) endBegun(ctx context.Context, req idempotency.BeginRequest, tok []byte, late bool, timeout time.Duration) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	fin := idempotency.FinishRequest{Key: req.Key, Try: req.Try, Fingerprint: req.Fingerprint,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, Minted: req.Minted}
	if late {
		fin.State, fin.Code = tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, codes.Unavailable
		fin.Message = "redisstore: begun by a call that took too long to vouch for what it read"
	}
	_ = s.finish(fctx, fin, tok)
}

// callToken returns a random token naming one Begin or Finish call. go-redis
// sends a command again when its reply is lost (an EOF, a reset connection,
// a read timeout), although Redis may have run it: the script stores the
// token, and a second run that finds it knows it is the same call.
func callToken() []byte {
	tok := make([]byte, 16)
	_, _ = rand.Read(tok) // never fails (crypto/rand)
	return tok
}

func (s *Store) short(acked int) error {
	return fmt.Errorf("%w: redisstore: %d of %d replicas acknowledged in time",
		idempotency.ErrStoreUnavailable, acked, s.replicas)
}

// Finish implements idempotency.Store.
func (s *Store) Finish(ctx context.Context, req idempotency.FinishRequest) error {
	if err := idempotency.ValidateFinish(req); err != nil {
		return err
	}
	if s.closed.Load() {
		return errClosed
	}
	return s.finish(ctx, req, nil)
}

// finish finishes req's try; with beginTok, only if the record was begun by
// the Begin call that sent that token.
func (s *Store) finish(ctx context.Context, req idempotency.FinishRequest, beginTok []byte) error {
	p := s.policy
	var resp []byte
	retained := 0
	if req.State == tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED && !req.Withheld && len(req.Response) <= p.MaxResponseBytes {
		resp, retained = req.Response, 1
	}
	var code int
	var msg string
	var det []byte
	if req.State == tollgatev1.AttemptState_ATTEMPT_STATE_FAILED || req.State == tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN {
		code, msg = int(req.Code), req.Message
		if len(req.Details) > 0 {
			b, err := proto.Marshal(&tollgatev1.AttemptRecord{StatusDetails: req.Details})
			if err != nil {
				return fmt.Errorf("idempotency: redisstore: encoding status details: %w", err)
			}
			det = b
		}
	}
	args := []any{s.now().UnixMilli(), s.ms(p.Skew), s.ms(p.TTL), s.ms(p.Grace), attemptMillis(req.Key.AttemptID),
		req.Try, fingerprint(req.Fingerprint), int(req.State), code, msg, det, resp, retained, req.UnitsSpent, callToken(), beginTok, req.Minted, s.perTenant,
		s.ms(s.keep), s.ms(s.idle)}
	v, err := s.sendFinish(ctx, req.Key, args)
	if errors.Is(err, idempotency.ErrStoreFull) {
		// Redis is out of memory and refused the finish's write (a script
		// stops at its first refused write, before the record's). A full
		// store refuses new tries, not the end of a running one: finish it
		// anyway, without its response (the record reads SUCCEEDED,
		// response_retained false), as the memory store does.
		args[11], args[12] = []byte(nil), 0
		var ferr error
		if v, _, ferr = s.run(ctx, false, finishFullScript, s.keys(req.Key), args...); ferr != nil {
			return fmt.Errorf("%w; without its response: %w", err, ferr)
		}
		err = nil
	}
	if err != nil {
		return err
	}
	kind, rec, err := decode(req.Key, v)
	if err != nil {
		return err
	}
	switch kind {
	case kindOK:
		return nil
	case kindNotRunning:
		if rec == nil {
			return fmt.Errorf("%w: no record (lost, expired, or outside the horizon)", idempotency.ErrNotRunning)
		}
		if len(beginTok) == 0 && rec.GetState() == tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS && rec.GetTry() == req.Try {
			// The script refuses a running try of the same number, for a
			// Finish without a Begin's token, only for its fingerprint.
			return fmt.Errorf("%w: try %d runs, begun with another request fingerprint than the finish names", idempotency.ErrNotRunning, rec.GetTry())
		}
		return fmt.Errorf("%w: the record is %s with try %d", idempotency.ErrNotRunning, rec.GetState(), rec.GetTry())
	}
	return fmt.Errorf("%w: redisstore: unexpected finish reply %d", idempotency.ErrStoreUnavailable, kind)
}

// finishResendFor bounds how long a Finish is sent again (sendFinish),
// from its first send; finishPause bounds the first resend's wait for the
// checks of a Cluster's masters (it goes at once), and is doubled for each
// later resend, which waits that long first, up to finishMaxPause: the
// pauses are 20 ms, 40 ms, ... 1 s.
const (
	finishResendFor = nodeCheckTimeout
	finishPause     = 10 * time.Millisecond
	finishMaxPause  = time.Second
)

// sendFinish sends the finish script with args for key (args[0] is the
// time it is sent at), and sends it again while Redis refused it before
// running it (refusedBeforeRun): the try's handler ran, and its outcome
// must not be lost for a reply that shows the script wrote nothing — the
// record may be there, restored, replicated or migrated, and the refusal
// is over in a moment. Every send carries the same call token (args), so
// that a run go-redis sent before counts once, and the time it is sent at
// (the lease is judged then). The first resend goes at once, each later
// one after a pause (20 ms, doubled up to 1 s); it stops once
// finishResendFor passed since the first send, the context ends or the
// store is closed: each pause, wait for a check and resend runs on a
// context bounded by what is left of finishResendFor.
//
// A script that found another Redis behind its node's address (a restart,
// a failover: anotherRedis) is resent once the new Redis passed its check
// (run waits for it, and fails when it does not pass), with its run_id. On
// a Cluster the slot may have moved (go-redis followed MOVED to a node
// whose check no longer vouches for it, and reloads its map in the
// background), or a slot migrates to a node the map does not name yet
// (ASK: the store, which checks the nodes of the map, cannot check it until
// the migration ends): before each resend the Cluster's map is read
// (readMap: one CLUSTER SLOTS, shared by the Finishes that wait for it),
// so that the resend goes where the map says, checked, and every master it
// names is checked whose check lapsed (the others cost a map lookup), so
// that a node a slot migrates to is vouched for once the map names it, and
// the script is sent there with its run_id (see run). A resend waits for
// those checks no longer than its pause: a master that does not answer,
// which may serve no key of this call, must not hold it (the check goes
// on, and the next resend finds its result).
//
// When a send may have reached Redis (run's sentError), the call's error
// is a sentError too, whichever later send, or wait for a check, failed
// (nothing outside run reads it of a Finish today: endBegun ignores the
// error, and Finish's caller cannot see the type; it keeps the marking
// true for any caller that comes to read it). The loop's own end is never
// the error's cause: a wait or a resend it cut (go-redis waiting out its
// retry backoff, the store waiting for a check, on the loop's context)
// fails with the reply that made the loop resend, not with
// context.DeadlineExceeded, which would read as the caller's context
// ending.
func (s *Store) sendFinish(ctx context.Context, key idempotency.Key, args []any) ([]any, error) {
	keys := s.keys(key)
	until := time.Now().Add(finishResendFor)
	v, _, err := s.run(ctx, false, finishScript, keys, args...)
	sent := errors.As(err, new(sentError))
	cluster, _ := s.client.(*redis.ClusterClient)
	for pause, first := finishPause, true; refusedBeforeRun(err); pause, first = min(2*pause, finishMaxPause), false {
		failed := s.since()
		if !first && !time.Now().Add(pause).Before(until) {
			break
		}
		rctx, cancel := context.WithDeadline(ctx, until)
		last := err
		v, err = s.resendFinish(rctx, cluster, first, pause, failed, keys, args, err)
		own := rctx.Err() != nil && ctx.Err() == nil // the loop's end, not the caller's
		cancel()
		sent = sent || errors.As(err, new(sentError))
		if own && errors.Is(err, context.DeadlineExceeded) {
			// The loop's own deadline cut the resend (go-redis waiting
			// out its retry backoff, the store waiting for a check): the
			// caller's context did not end, and must not read as the
			// cause. The reply that made the loop resend is.
			err = fmt.Errorf("%w (its resend ran out of the %v a Finish is resent for: %v)", last, finishResendFor, err)
		}
		if ctx.Err() != nil || s.stop.Err() != nil || !time.Now().Before(until) {
			break
		}
	}
	if err != nil && sent && !errors.As(err, new(sentError)) {
		err = sentError{err} // an earlier send may have run the script
	}
	return v, err
}

// resendFinish is one resend of sendFinish, on ctx (bounded by the loop's
// end): after pause unless first, and on a Cluster after a read of the
// map that started after the failure (failed, since) and the checks of
// its masters. It returns the resend's reply, or, when ctx or the store
// ended a wait before it was sent, the error of the send before (last),
// noting why.
func (s *Store) resendFinish(ctx context.Context, cluster *redis.ClusterClient, first bool, pause time.Duration, failed int64, keys []string, args []any, last error) ([]any, error) {
	if !first {
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
		case <-s.stop.Done():
		}
		t.Stop()
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("%w (not sent again: %v)", last, err)
		}
		if s.stop.Err() != nil {
			return nil, fmt.Errorf("%w (not sent again: %v)", last, errClosed)
		}
	}
	if cluster != nil {
		masters, err := s.readMap(ctx, cluster, failed)
		if err != nil {
			return nil, fmt.Errorf("%w (not sent again: reading the Cluster's map: %v)", last, err)
		}
		var wg sync.WaitGroup
		for _, node := range masters {
			wg.Go(func() {
				cctx, cancel := context.WithTimeout(ctx, pause)
				defer cancel()
				_, _ = s.ready(cctx, node, node.Options().Addr)
			})
		}
		wg.Wait()
	}
	args[0] = s.now().UnixMilli()
	v, _, err := s.run(ctx, false, finishScript, keys, args...)
	return v, err
}

// refusedBeforeRun reports whether err, a finish script's (or the check
// its node waited for), is one with which Redis refused the script before
// running it, so that it wrote nothing: its script found another Redis
// (anotherRedis: it checks the run_id before it reads or writes anything),
// or Redis answered, before it ran the command, TRYAGAIN (a multi-key
// command whose keys a slot's migration split between its source and its
// target, as a reshard moves a batch of keys or the tenant's index under
// WithMaxRecordsPerTenant is moved apart from its records), CLUSTERDOWN (a
// slot not served, a Cluster down), LOADING (a Redis restarted, reading
// its data) or MASTERDOWN (a replica, replica-serve-stale-data no, whose
// link to its primary is down: as a restarted primary configured as a
// replica answers until its sync): Redis gives all four in processCommand,
// before the script's call, and none of them is a reply a running script
// can end with (an error a command inside a script meets ends the script
// with that command's error: OOM, NOPERM, READONLY, ERR..., never these).
// go-redis resends a command on the four itself, a few times in well under
// a second, and returns its last attempt's error: an earlier attempt that
// lost its reply may have run the script, which the call's token makes
// count once. No other error is resent: the script may have run (a lost
// reply, a timeout), or Redis refused it for good (NOPERM, a check's
// verdict).
func refusedBeforeRun(err error) bool {
	if err == nil {
		return false
	}
	if errors.As(err, new(anotherRedis)) {
		return true
	}
	for _, p := range []string{"TRYAGAIN", "CLUSTERDOWN", "LOADING", "MASTERDOWN"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

// mapRead is one read of the Cluster's map (readMap), shared by the
// Finishes that wait for it.
type mapRead struct {
	started int64         // since; before the read began
	done    chan struct{} // closed when it ended
	masters []*redis.Client
	err     error // set before done is closed
}

// readMap has the Cluster client read the Cluster's map (ForEachMaster:
// one CLUSTER SLOTS, which go-redis then routes by) and returns the
// masters it names: a read that started after failed (since), which every
// caller whose failure came before it started shares — one read runs at a
// time, in a goroutine of its own (Close ends it and waits for it)
// bounded by nodeCheckTimeout, and a caller that finds one running that
// started before its failure waits for it to end, then for the next. A
// caller whose context ends first fails; the read goes on.
func (s *Store) readMap(ctx context.Context, cluster *redis.ClusterClient, failed int64) ([]*redis.Client, error) {
	for {
		s.mapMu.Lock()
		r := s.mapLast
		if r != nil && r.started > failed {
			s.mapMu.Unlock()
		} else if r != nil && !isDone(r.done) {
			// Started before the failure: it may read a map older than
			// what the failure says. Wait for it, then start the next.
			s.mapMu.Unlock()
			select {
			case <-r.done:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		} else {
			r = &mapRead{started: s.since(), done: make(chan struct{})}
			if !s.goCheck(func() { s.readMapNow(cluster, r) }) {
				s.mapMu.Unlock()
				return nil, errClosed
			}
			s.mapLast = r
			s.mapMu.Unlock()
		}
		select {
		case <-r.done:
			return r.masters, r.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// readMapNow makes read r for readMap.
func (s *Store) readMapNow(cluster *redis.ClusterClient, r *mapRead) {
	ctx, cancel := context.WithTimeout(s.stop, nodeCheckTimeout) // Close ends it
	defer cancel()
	var mu sync.Mutex
	var masters []*redis.Client
	err := cluster.ForEachMaster(ctx, func(_ context.Context, node *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		masters = append(masters, node)
		return nil
	})
	r.masters, r.err = masters, err
	close(r.done)
}

func isDone(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Get implements idempotency.Store.
func (s *Store) Get(ctx context.Context, key idempotency.Key) (*tollgatev1.AttemptRecord, error) {
	if err := idempotency.ValidateKey(key); err != nil {
		return nil, err
	}
	if s.closed.Load() {
		return nil, errClosed
	}
	p := s.policy
	now, read := s.clock()
	v, _, err := s.run(ctx, false, getScript, s.keys(key), now, s.ms(p.Skew), s.ms(p.TTL), attemptMillis(key.AttemptID), s.ms(s.keep), s.ms(s.idle))
	if err == nil {
		err = s.late(read)
	}
	if err == nil && len(v) == 1 && num(v[0]) == kindStale {
		err = s.stale()
	}
	if err != nil {
		return nil, err
	}
	return s.record(key, v)
}

// Fence implements idempotency.Store.
func (s *Store) Fence(ctx context.Context, key idempotency.Key, throughTry uint32) (*tollgatev1.AttemptRecord, error) {
	if err := idempotency.ValidateFence(key, throughTry); err != nil {
		return nil, err
	}
	if s.closed.Load() {
		return nil, errClosed
	}
	p := s.policy
	now, read := s.clock()
	v, acked, err := s.run(ctx, true, fenceScript, s.keys(key),
		now, s.ms(p.Skew), s.ms(p.TTL), s.ms(p.Grace), attemptMillis(key.AttemptID), throughTry, s.perTenant, s.ms(s.keep), s.ms(s.idle))
	if err == nil {
		err = s.late(read)
	}
	if err == nil && len(v) == 1 && num(v[0]) == kindStale {
		err = s.stale()
	}
	if err != nil {
		return nil, err
	}
	if len(v) == 1 && num(v[0]) == kindTenantFull {
		return nil, s.tenantFull(key) // nothing was written
	}
	if acked >= 0 && acked < s.replicas {
		return nil, s.short(acked)
	}
	return s.record(key, v)
}

func (s *Store) record(key idempotency.Key, v []any) (*tollgatev1.AttemptRecord, error) {
	kind, rec, err := decode(key, v)
	if err != nil {
		return nil, err
	}
	switch kind {
	case kindRecord:
		return rec, nil
	case kindUnseen:
		return idempotency.UnseenRecord(key), nil
	case kindUnknown:
		return idempotency.UnknownRecord(key), nil
	}
	return nil, fmt.Errorf("%w: redisstore: unexpected reply %d", idempotency.ErrStoreUnavailable, kind)
}

// decode reads a script's reply: its kind and, when it carries one, the
// record {kind, st, try, fen, code, msg, det, resp, ret, units, sa, fa,
// lease, fp}.
func decode(key idempotency.Key, v []any) (int, *tollgatev1.AttemptRecord, error) {
	if len(v) == 0 {
		return 0, nil, fmt.Errorf("%w: redisstore: empty script reply", idempotency.ErrStoreUnavailable)
	}
	kind := int(num(v[0]))
	if len(v) == 1 {
		switch kind {
		case kindFinished, kindInProgress, kindAbandoned, kindFenced, kindMismatch, kindRecord:
			return 0, nil, fmt.Errorf("%w: redisstore: script reply of kind %d without its record", idempotency.ErrStoreUnavailable, kind)
		}
		return kind, nil, nil
	}
	if len(v) != 14 {
		return 0, nil, fmt.Errorf("%w: redisstore: script reply of %d elements", idempotency.ErrStoreUnavailable, len(v))
	}
	// A number out of its field's range (a foreign or corrupt hash that
	// load's digit check let through) is an error, never a clamped or
	// wrapped value read as a record.
	var bad []int
	field := func(i int, lo, hi int64) int64 {
		n, ok := numOK(v[i])
		if !ok || n < lo || n > hi {
			bad = append(bad, i)
		}
		return n
	}
	rec := &tollgatev1.AttemptRecord{
		AttemptId:        key.AttemptID,
		Call:             key.Call,
		Method:           key.Method,
		State:            tollgatev1.AttemptState(field(1, 0, math.MaxInt32)),
		Try:              uint32(field(2, 0, math.MaxUint32)),
		FencedThroughTry: uint32(field(3, 0, math.MaxUint32)),
		StatusCode:       int32(field(4, math.MinInt32, math.MaxInt32)),
		StatusMessage:    str(v[5]),
		ResponseRetained: field(8, 0, 1) == 1,
		UnitsSpent:       field(9, 0, math.MaxInt64),
		StartedAt:        stamp(field(10, 0, maxStampMs)),
		FinishedAt:       stamp(field(11, 0, maxStampMs)),
		LeaseExpiresAt:   stamp(field(12, 0, maxStampMs)),
	}
	if len(bad) > 0 {
		return 0, nil, fmt.Errorf("%w: redisstore: the record holds a number out of range (reply elements %v)", idempotency.ErrStoreUnavailable, bad)
	}
	if det := str(v[6]); det != "" {
		var holder tollgatev1.AttemptRecord
		if err := proto.Unmarshal([]byte(det), &holder); err != nil {
			return 0, nil, fmt.Errorf("%w: redisstore: decoding status details: %w", idempotency.ErrStoreUnavailable, err)
		}
		rec.StatusDetails = holder.StatusDetails
	}
	if rec.ResponseRetained {
		rec.Response = []byte(str(v[7]))
	}
	return kind, rec, nil
}

// fingerprint is a fingerprint as the scripts keep it: the zero Digest,
// which means "no fingerprint" (idempotency.Digest), as the empty string a
// fence's tombstone holds, so that a try begun without one matches any
// request, as in the memory store.
func fingerprint(d idempotency.Digest) []byte {
	if d == (idempotency.Digest{}) {
		return nil
	}
	return d[:]
}

func num(x any) int64 {
	n, _ := numOK(x)
	return n
}

// numOK reads a number of a script's reply, and whether it was one that
// fits an int64.
func numOK(x any) (int64, bool) {
	switch x := x.(type) {
	case int64:
		return x, true
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		return n, err == nil
	}
	return 0, false
}

// maxStampMs is the latest time a record's timestamps may hold, in Unix
// milliseconds: the year 9999, as far as a protobuf Timestamp goes.
const maxStampMs = 253402300799999

func str(x any) string {
	s, _ := x.(string)
	return s
}

func stamp(ms int64) *timestamppb.Timestamp {
	if ms == 0 {
		return nil
	}
	return timestamppb.New(time.UnixMilli(ms))
}

var _ idempotency.Store = (*Store)(nil)

// reloadAfter has a Cluster client read the Cluster's map again after a
// call failed without a reply from Redis (no redis.Error): its node may
// have crashed and its replica taken its slots, which go-redis learns by
// itself only from a MOVED reply, which a dead node never sends, or every
// ClusterStateReloadInterval (60 s by default) — until then every call to
// the slot would fail. The reload is go-redis's lazy one: at most one at a
// time, in the background. A call that sent nothing (too little time to
// wait for replicas, a closed store, a node a check found wrong) or that
// its caller cancelled says nothing of where the slots are and reads no
// map; one whose deadline passed may have met a node that no
// longer answers, and does.
func (s *Store) reloadAfter(ctx context.Context, err error) {
	cluster, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return
	}
	var (
		reply   redis.Error
		short   *idempotency.TooLittleTimeError
		refused refusal
	)
	if errors.As(err, &reply) || errors.As(err, &short) || errors.As(err, &refused) || errors.Is(err, context.Canceled) {
		return
	}
	cluster.ReloadState(ctx)
}
