package idempotency

import (
	"container/heap"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Replicas is a promise about how many instances of a server share one store.
// The only value is [SingleReplica]; it exists so that building a memory
// store says, at the call site, what it requires.
type Replicas struct{ single bool }

// SingleReplica promises that at most one serving instance of the server
// ever exists at a time: one process, deployed by stopping the old instance
// before starting the new one (a Recreate rollout, never two pods at once).
// A memory store is only correct under that promise; several replicas need a
// shared store such as idempotency/redisstore.
var SingleReplica = Replicas{single: true}

// MemoryOption configures a [MemoryStore].
type MemoryOption interface{ applyMemory(*memoryConfig) }

type memoryConfig struct {
	policy         Policy
	maxRecords     int
	perTenant      int
	perTenantBytes int64
	maxBytes       int64
	now            func() time.Time
}

type memoryOptionFunc func(*memoryConfig)

func (f memoryOptionFunc) applyMemory(c *memoryConfig) { f(c) }

// WithPolicy sets the store's times and response size limit. Default
// [DefaultPolicy].
func WithPolicy(p Policy) MemoryOption {
	return memoryOptionFunc(func(c *memoryConfig) { c.policy = p })
}

// WithMaxRecords bounds the number of records the memory store holds.
// Default 100,000; it must be positive.
func WithMaxRecords(n int) MemoryOption {
	return memoryOptionFunc(func(c *memoryConfig) { c.maxRecords = n })
}

// WithMaxRecordsPerTenant bounds the records one tenant (Key.Tenant, ""
// included) holds, so that one tenant's callers — a trusted peer fencing
// made-up attempts, say, whose tombstones last the TTL — cannot use up
// WithMaxRecords and have every other tenant's new tries refused. A tenant
// at its bound is refused new tries and fences as a full store refuses
// them ([ErrStoreFull]); its existing records still answer and finish. A
// server refuses such a try NOT_ADMITTED STORE_UNAVAILABLE, not final, with
// the retry-after of any store fault (about 100 ms), although the bound
// clears only as the tenant's oldest records expire (TTL after their last
// write, at least): the store does not say when, and a caller's repeats
// until then are refused alike, spending its allowance.
// Records are bounded in bytes too: pair it with WithMaxBytesPerTenant.
// Default 0: no bound but WithMaxRecords; it must not be negative.
func WithMaxRecordsPerTenant(n int) MemoryOption {
	return memoryOptionFunc(func(c *memoryConfig) { c.perTenant = n })
}

// WithMaxBytesPerTenant bounds the bytes one tenant's records hold, counted
// as WithMaxBytes counts them, so that one tenant's large responses cannot
// use up WithMaxBytes: a tenant at its bound is refused new tries and fences
// ([ErrStoreFull]), and a response that would take it over is not kept (the
// record reads SUCCEEDED, response_retained false), as a full store does;
// status messages and details are kept and counted. Default 0: no bound but
// WithMaxBytes; it must not be negative, and a positive one at least 64 KiB.
func WithMaxBytesPerTenant(n int64) MemoryOption {
	return memoryOptionFunc(func(c *memoryConfig) { c.perTenantBytes = n })
}

// WithMaxBytes bounds the bytes the memory store holds: keys, messages,
// status details, kept responses and a fixed overhead per record. Default
// 256 MiB; it must be at least 64 KiB.
func WithMaxBytes(n int64) MemoryOption {
	return memoryOptionFunc(func(c *memoryConfig) { c.maxBytes = n })
}

func init() {
	hooks.MemoryClock = func(now func() time.Time) any {
		return memoryOptionFunc(func(c *memoryConfig) { c.now = now })
	}
}

// recordOverhead is the bytes counted for a record besides its variable parts.
const recordOverhead = 256

// MemoryStore is a [Store] that keeps records in the server's memory.
//
// AT MOST ONE SERVING INSTANCE, EVER. A memory store knows only the tries
// its own process began. If two instances of the server run at once — two
// pods during a rolling update, two replicas behind a load balancer — a
// repeated try that reaches the other instance finds no record and runs its
// handler a second time. Use it only for a server deployed as one replica with
// a Recreate strategy; otherwise use idempotency/redisstore.
//
// The store is bounded in records and bytes. It never removes a record
// before its expiry (TTL after its last write, and never before d + skew +
// grace); when full it refuses new tries and fences with an error wrapping
// [ErrStoreFull] instead of evicting. A finish is never refused for lack of
// room: a response that does not fit is dropped (the record reads SUCCEEDED
// with response_retained false), while status messages and details are kept
// and counted. Its horizon is the moment it was built (or [MemoryStore.Reset]):
// attempts created before then plus skew are UNKNOWN to it, because a
// previous process may have run them — except that an attempt the server
// minted for the request itself ([BeginRequest].Minted) begins at once.
// Expired records are removed as later writes happen, so the store starts
// no goroutine and needs no Close.
//
// A MemoryStore is safe for concurrent use; every operation takes one mutex
// for O(log n) time. Its zero value is not usable: build one with
// [NewMemoryStore].
type MemoryStore struct {
	policy     Policy
	maxRecords int
	perTenant  int   // 0: no per-tenant bound
	tenantCap  int64 // bytes per tenant; 0: none
	maxBytes   int64
	now        func() time.Time

	mu      sync.Mutex
	last    int64 // the latest clock reading, Unix ms (nowLocked)
	horizon int64 // Unix ms
	swept   int64 // the newest attempt time (Unix ms) of a swept record (sweep)
	records map[Key]*memRecord
	tenants map[string]tenantUse // with a per-tenant bound
	expiry  expiryHeap
	bytes   int64
}

type memRecord struct {
	key      Key
	fp       Digest
	state    tollgatev1.AttemptState // never ABANDONED: computed from lease
	try      uint32
	fenced   uint32
	code     int32
	message  string
	details  []*anypb.Any
	response []byte
	retained bool
	units    int64
	started  int64 // Unix ms; 0 = unset
	finished int64
	lease    int64
	deadline int64
	expire   int64
	size     int64
	index    int // in expiry
}

// NewMemoryStore returns a memory store for a server of which AT MOST ONE
// SERVING INSTANCE EVER EXISTS (see [MemoryStore]); replicas must be
// [SingleReplica]. It returns an error wrapping [ErrInvalidOption] for any
// other replicas value, an invalid option or an invalid policy
// ([Policy.Validate]). A nil option is ignored.
func NewMemoryStore(replicas Replicas, opts ...MemoryOption) (*MemoryStore, error) {
	if !replicas.single {
		return nil, invalid("a memory store requires SingleReplica: at most one serving instance ever")
	}
	c := memoryConfig{policy: DefaultPolicy(), maxRecords: 100_000, maxBytes: 256 << 20, now: time.Now}
	for _, o := range opts {
		if o != nil {
			o.applyMemory(&c)
		}
	}
	if err := c.policy.Validate(); err != nil {
		return nil, err
	}
	if c.maxRecords <= 0 {
		return nil, invalid("WithMaxRecords must be positive")
	}
	if c.perTenant < 0 {
		return nil, invalid("WithMaxRecordsPerTenant must not be negative")
	}
	if c.perTenantBytes < 0 || (c.perTenantBytes > 0 && c.perTenantBytes < 64<<10) {
		return nil, invalid("WithMaxBytesPerTenant must be 0 or at least 64 KiB")
	}
	if c.maxBytes < 64<<10 {
		return nil, invalid("WithMaxBytes must be at least 64 KiB")
	}
	s := &MemoryStore{
		policy:     c.policy,
		maxRecords: c.maxRecords,
		perTenant:  c.perTenant,
		tenantCap:  c.perTenantBytes,
		maxBytes:   c.maxBytes,
		now:        c.now,
		records:    make(map[Key]*memRecord),
	}
	if c.perTenant > 0 || c.perTenantBytes > 0 {
		s.tenants = make(map[string]tenantUse)
	}
	s.horizon = s.now().UnixMilli()
	return s, nil
}

// Reset drops every record and moves the horizon to now, as a restart would:
// from then on every attempt created before now (plus skew) reads UNKNOWN,
// and so does every attempt created no later than one whose record it
// dropped (as after a sweep: see nowLocked), an attempt created a skew
// ahead of a Begin in the very millisecond of the Reset, say.
func (s *MemoryStore) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	// The latest reading (see nowLocked): a clock stepped back a little
	// must not set the horizon before records it just dropped were written.
	_, latest := s.nowLocked()
	// A record of an attempt created up to a skew after latest (begun in
	// latest's own millisecond, or by a reading since forgotten) lies
	// inside the new horizon: its absence must not be evidence, as that of
	// a swept record is not.
	for k := range s.records {
		if ts, ok := attemptMillis(k.AttemptID); ok {
			s.swept = max(s.swept, ts)
		}
	}
	clear(s.records)
	clear(s.tenants)
	s.expiry = s.expiry[:0]
	s.bytes = 0
	s.horizon = latest
}

// Policy returns the store's policy (WithPolicy's, or DefaultPolicy).
func (s *MemoryStore) Policy() Policy { return s.policy }

// Len returns the number of records held, expired ones not yet removed
// included.
func (s *MemoryStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records)
}

func storeErr(err error) error {
	return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
}

// tenantUse is what one tenant's records hold.
type tenantUse struct {
	records int
	bytes   int64
}

// room returns nil when a new record of key, size bytes, fits: in the
// store's bounds and its tenant's; else the error to refuse it with.
func (s *MemoryStore) room(key Key, size int64) error {
	if len(s.records) >= s.maxRecords || s.bytes+size > s.maxBytes {
		return ErrStoreFull
	}
	u := s.tenants[key.Tenant]
	if s.perTenant > 0 && u.records >= s.perTenant {
		return fmt.Errorf("%w: tenant %q holds its %d records", ErrStoreFull, key.Tenant, s.perTenant)
	}
	if !s.tenantRoom(key.Tenant, size) {
		return fmt.Errorf("%w: tenant %q holds its %d bytes", ErrStoreFull, key.Tenant, s.tenantCap)
	}
	return nil
}

// tenantRoom reports whether n more bytes fit in tenant's byte bound.
func (s *MemoryStore) tenantRoom(tenant string, n int64) bool {
	return s.tenantCap == 0 || s.tenants[tenant].bytes+n <= s.tenantCap
}

// grow adds records and n bytes (either may be negative) to the accounts
// of tenant and of the store.
func (s *MemoryStore) grow(tenant string, records int, n int64) {
	s.bytes += n
	if s.tenants == nil {
		return
	}
	u := s.tenants[tenant]
	u.records += records
	u.bytes += n
	if u.records == 0 {
		delete(s.tenants, tenant)
		return
	}
	s.tenants[tenant] = u
}

// add puts the new record r in the store's accounts.
func (s *MemoryStore) add(r *memRecord) {
	s.records[r.key] = r
	s.grow(r.key.Tenant, 1, r.size)
}

// nowLocked reads the clock, in Unix milliseconds, under the lock, so that
// the calls' readings follow the order they act in. It returns the reading,
// by which deadlines, leases and the horizon are judged, and the one by
// which records are swept and an absence is vouched for: the latest reading
// any call made, when it is at most the skew plus the grace ahead of this
// one (a wall clock stepping back that far), else this one. A reading older
// than a call's that swept a record would vouch for the absence of a record
// that expired after it; a reading further ahead is taken for a clock that
// stepped forward and was corrected, and is forgotten, so that it does not
// keep the store from vouching until real time catches up with it. A
// record swept by a reading stepped further ahead would then read absent
// while its absence is evidence again: the store never vouches for an
// attempt created no later than the newest attempt whose record it swept
// (see sweep), which, with the clock going forward, it could not vouch for
// anyway. When the clock stayed stepped longer than the TTL, the swept
// records may be of attempts created at the stepped time (ones the server
// minted), and every attempt created before it is refused until real time
// passes it: Begin says from when a new attempt passes
// (BeginResult.VerifiableFrom).
func (s *MemoryStore) nowLocked() (now, latest int64) {
	now = s.now().UnixMilli()
	if s.last-now > (s.policy.Skew + s.policy.Grace).Milliseconds() {
		s.last = now
	}
	s.last = max(s.last, now)
	return now, s.last
}

// Begin implements [Store.Begin].
func (s *MemoryStore) Begin(ctx context.Context, req BeginRequest) (BeginResult, error) {
	if err := req.validate(); err != nil {
		return BeginResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return BeginResult{}, storeErr(err)
	}
	ts, isV7 := attemptMillis(req.Key.AttemptID)
	deadline := req.Deadline.UnixMilli()
	skew := s.policy.Skew.Milliseconds()

	s.mu.Lock()
	defer s.mu.Unlock()
	now, latest := s.nowLocked()
	s.sweep(latest)
	if !isV7 {
		return BeginResult{Refusal: RefusedUnverifiable, Record: unknownRecord(req.Key)}, nil
	}
	if !s.policy.inHorizonFor(ts, s.horizon, now, req.Minted) {
		return BeginResult{Refusal: RefusedUnverifiable, Record: unknownRecord(req.Key),
			VerifiableFrom: s.policy.verifiableFrom(ts, s.horizon, now)}, nil
	}
	r := s.records[req.Key]
	if r != nil {
		if r.fp != (Digest{}) && r.fp != req.Fingerprint {
			return BeginResult{Refusal: RefusedMismatch, Record: r.proto(now)}, nil
		}
		switch r.view(now) {
		case tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS:
			return BeginResult{Refusal: RefusedInProgress, Record: r.proto(now)}, nil
		case tollgatev1.AttemptState_ATTEMPT_STATE_ABANDONED:
			return BeginResult{Refusal: RefusedAbandoned, Record: r.proto(now)}, nil
		case tollgatev1.AttemptState_ATTEMPT_STATE_FENCED:
			if req.Try <= r.fenced {
				return BeginResult{Refusal: RefusedFenced, Record: r.proto(now)}, nil
			}
		default:
			return BeginResult{Refusal: RefusedFinished, Record: r.proto(now)}, nil
		}
	}
	if now >= deadline+skew { // the lease (d + skew) has ended: the try could never finish
		return BeginResult{Refusal: RefusedDeadlineExpired}, nil
	}
	if r == nil {
		if !s.absenceVouched(ts, latest, req.Minted) {
			return BeginResult{Refusal: RefusedUnverifiable, Record: unknownRecord(req.Key), VerifiableFrom: s.sweptFrom(ts, latest)}, nil
		}
		size := recordOverhead + keySize(req.Key)
		if err := s.room(req.Key, size); err != nil {
			return BeginResult{}, err
		}
		r = &memRecord{key: req.Key, size: size, index: -1}
		s.add(r)
	}
	// A new record, or a tombstone FENCED(n) letting try n+1 start: units
	// and fence are kept.
	r.fp = req.Fingerprint
	r.state = tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS
	r.try = req.Try
	r.started = now
	r.finished = 0
	r.lease = deadline + skew
	r.deadline = deadline
	s.written(r, now)
	return BeginResult{Started: true}, nil
}

// Finish implements [Store.Finish].
func (s *MemoryStore) Finish(ctx context.Context, req FinishRequest) error {
	if err := req.validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return storeErr(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now, latest := s.nowLocked()
	s.sweep(latest)
	r := s.records[req.Key]
	if r == nil {
		return fmt.Errorf("%w: no record (lost or expired)", ErrNotRunning)
	}
	if st := r.view(now); st != tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS || r.try != req.Try {
		return fmt.Errorf("%w: the record is %s with try %d", ErrNotRunning, st, r.try)
	} else if r.fp != req.Fingerprint {
		return fmt.Errorf("%w: try %d runs, begun with another request fingerprint than the finish names", ErrNotRunning, r.try)
	}
	old := r.variableSize()
	r.state = req.State
	r.finished = now
	r.units += req.UnitsSpent
	r.code, r.message, r.details, r.response, r.retained = 0, "", nil, nil, false
	switch req.State {
	case tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED:
		n := int64(len(req.Response))
		if !req.Withheld && len(req.Response) <= s.policy.MaxResponseBytes && s.bytes+n <= s.maxBytes &&
			s.tenantRoom(req.Key.Tenant, n) {
			r.response = append([]byte(nil), req.Response...)
			r.retained = true
		}
	case tollgatev1.AttemptState_ATTEMPT_STATE_FENCED:
		r.fenced = max(r.fenced, req.Try)
	default: // FAILED, UNKNOWN
		r.code, r.message, r.details = int32(req.Code), req.Message, req.Details
	}
	grown := r.variableSize() - old
	r.size += grown
	s.grow(r.key.Tenant, 0, grown)
	s.written(r, now)
	return nil
}

// Get implements [Store.Get].
func (s *MemoryStore) Get(ctx context.Context, key Key) (*tollgatev1.AttemptRecord, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, storeErr(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now, latest := s.nowLocked()
	s.sweep(latest)
	if r, ok := s.vouch(key, now, latest); !ok {
		return unknownRecord(key), nil
	} else if r != nil {
		return r.proto(now), nil
	}
	return unseenRecord(key), nil
}

// Fence implements [Store.Fence].
func (s *MemoryStore) Fence(ctx context.Context, key Key, throughTry uint32) (*tollgatev1.AttemptRecord, error) {
	if err := ValidateFence(key, throughTry); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, storeErr(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now, latest := s.nowLocked()
	s.sweep(latest)
	r, ok := s.vouch(key, now, latest)
	if !ok {
		return unknownRecord(key), nil
	}
	if r == nil {
		size := recordOverhead + keySize(key)
		if err := s.room(key, size); err != nil {
			return nil, err
		}
		r = &memRecord{key: key, size: size, index: -1, state: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED}
		s.add(r)
	} else if r.state != tollgatev1.AttemptState_ATTEMPT_STATE_FENCED || throughTry <= r.fenced {
		return r.proto(now), nil
	}
	r.fenced = throughTry
	r.finished = now
	s.written(r, now)
	return r.proto(now), nil
}

// vouch returns the live record of key, or nil and whether the store can
// vouch for its absence (judged by latest: see nowLocked). A present record
// of an attempt outside the horizon is not returned: ok is false then.
func (s *MemoryStore) vouch(key Key, now, latest int64) (r *memRecord, ok bool) {
	ts, isV7 := attemptMillis(key.AttemptID)
	if !isV7 || !s.policy.inHorizon(ts, s.horizon, now) {
		return nil, false
	}
	if r = s.records[key]; r != nil {
		return r, true
	}
	return nil, s.absenceVouched(ts, latest, false)
}

// absenceVouched reports whether the absence of a record of an attempt
// created at ts, inside the horizon, is evidence at the reading latest (see
// nowLocked): no record written for it can have expired (each lives until
// ts - skew + TTL at least), and none was swept by a reading that a
// stepped-back clock has since forgotten (ts is later than every swept
// record's attempt, or the attempt is one the server just minted for the
// request, which no try can have reached before: no record of it was
// swept, as none was lost before the horizon).
func (s *MemoryStore) absenceVouched(ts, latest int64, minted bool) bool {
	return latest < ts-s.policy.Skew.Milliseconds()+s.policy.TTL.Milliseconds() && (minted || ts > s.swept)
}

// sweptFrom returns, for an attempt created at ts that is refused, the
// creation time from which a new attempt is not refused for a swept record
// (see sweep), when ts is no later than swept and a record was swept (or
// dropped by Reset) that the reading latest could not have swept in the
// ordinary way — one of an attempt created after latest + skew - TTL —:
// after a clock stepped forward longer than the TTL and corrected, attempts
// the server minted at the stepped time may have been swept, and every
// attempt created before then is refused until real time passes it, this
// one too, whether or not it is also older than the TTL less the skew. The
// zero time otherwise: the attempt is refused for its age, as a store that
// never swept a record refuses it (an ordinary expiry, not a clock step),
// and a new attempt is not refused for a sweep.
func (s *MemoryStore) sweptFrom(ts, latest int64) time.Time {
	if ts > s.swept || s.swept <= latest+s.policy.Skew.Milliseconds()-s.policy.TTL.Milliseconds() {
		return time.Time{}
	}
	return time.UnixMilli(s.swept + 1)
}

// written sets r's expiry after a write at now: TTL from now, and never
// before the try's d + skew + grace, nor before its attempt's ts - skew +
// TTL, until which its absence would be evidence (a Finish judged by a
// clock stepped back, within the skew and the grace, from the Begin's, when
// the attempt was created a skew ahead of it).
func (s *MemoryStore) written(r *memRecord, now int64) {
	exp := now + s.policy.TTL.Milliseconds()
	if ts, ok := attemptMillis(r.key.AttemptID); ok {
		exp = max(exp, ts-s.policy.Skew.Milliseconds()+s.policy.TTL.Milliseconds())
	}
	if r.deadline != 0 {
		exp = max(exp, r.deadline+s.policy.Skew.Milliseconds()+s.policy.Grace.Milliseconds())
	}
	r.expire = exp
	if r.index < 0 {
		heap.Push(&s.expiry, r)
	} else {
		heap.Fix(&s.expiry, r.index)
	}
}

// sweep removes the records whose expiry has come, and notes the newest
// attempt time among them (swept). A record lives until its attempt's
// ts - skew + TTL at least (written), so, as long as the clock goes
// forward, every attempt created no later than a swept one is past the time
// its absence was evidence; after a reading stepped far ahead is forgotten
// (nowLocked) it is not, and swept keeps it from being vouched for.
func (s *MemoryStore) sweep(now int64) {
	for len(s.expiry) > 0 && s.expiry[0].expire <= now {
		r := heap.Pop(&s.expiry).(*memRecord)
		if ts, ok := attemptMillis(r.key.AttemptID); ok {
			s.swept = max(s.swept, ts)
		}
		delete(s.records, r.key)
		s.grow(r.key.Tenant, -1, -r.size)
	}
}

// view is the state r reads as at now.
func (r *memRecord) view(now int64) tollgatev1.AttemptState {
	if r.state == tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS && now >= r.lease {
		return tollgatev1.AttemptState_ATTEMPT_STATE_ABANDONED
	}
	return r.state
}

func (r *memRecord) variableSize() int64 {
	n := int64(len(r.message) + len(r.response))
	for _, d := range r.details {
		n += int64(proto.Size(d))
	}
	return n
}

func keySize(k Key) int64 {
	return int64(len(k.Tenant) + len(k.AttemptID) + len(k.Call) + len(k.Method))
}

func (r *memRecord) proto(now int64) *tollgatev1.AttemptRecord {
	p := &tollgatev1.AttemptRecord{
		AttemptId:        r.key.AttemptID,
		Call:             r.key.Call,
		Method:           r.key.Method,
		State:            r.view(now),
		Try:              r.try,
		StatusCode:       r.code,
		StatusMessage:    r.message,
		ResponseRetained: r.retained,
		UnitsSpent:       r.units,
		StartedAt:        msTimestamp(r.started),
		FinishedAt:       msTimestamp(r.finished),
		LeaseExpiresAt:   msTimestamp(r.lease),
		FencedThroughTry: r.fenced,
	}
	if len(r.details) > 0 {
		p.StatusDetails = make([]*anypb.Any, len(r.details))
		for i, d := range r.details {
			p.StatusDetails[i] = proto.Clone(d).(*anypb.Any)
		}
	}
	if r.retained {
		p.Response = append([]byte(nil), r.response...)
	}
	return p
}

func msTimestamp(ms int64) *timestamppb.Timestamp {
	if ms == 0 {
		return nil
	}
	return timestamppb.New(time.UnixMilli(ms))
}

func unknownRecord(k Key) *tollgatev1.AttemptRecord {
	return &tollgatev1.AttemptRecord{AttemptId: k.AttemptID, Call: k.Call, Method: k.Method, State: tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN}
}

func unseenRecord(k Key) *tollgatev1.AttemptRecord {
	return &tollgatev1.AttemptRecord{AttemptId: k.AttemptID, Call: k.Call, Method: k.Method, State: tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN}
}

// UnknownRecord returns the record a store answers for key when it cannot
// vouch for the attempt: state UNKNOWN and nothing else. For store
// implementations.
func UnknownRecord(key Key) *tollgatev1.AttemptRecord { return unknownRecord(key) }

// UnseenRecord returns the record a store answers for an absent key it can
// vouch for: state UNSEEN. For store implementations.
func UnseenRecord(key Key) *tollgatev1.AttemptRecord { return unseenRecord(key) }

// expiryHeap orders records by expiry, earliest first.
type expiryHeap []*memRecord

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].expire < h[j].expire }
func (h expiryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *expiryHeap) Push(x any) {
	r := x.(*memRecord)
	r.index = len(*h)
	*h = append(*h, r)
}
func (h *expiryHeap) Pop() any {
	old := *h
	r := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	r.index = -1
	return r
}

var _ Store = (*MemoryStore)(nil)
