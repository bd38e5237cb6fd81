package idempotency

import (
	"context"
	"errors"
	"strings"
	"unicode/utf8"

	"github.com/tollgate-go/tollgate/internal/nilvalue"
	tenantname "github.com/tollgate-go/tollgate/internal/tenant"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// ServiceOption configures an [AttemptService].
type ServiceOption interface{ applyService(*AttemptService) }

type serviceOptionFunc func(*AttemptService)

func (f serviceOptionFunc) applyService(s *AttemptService) { f(s) }

// WithTenant sets the function that names the caller's tenant where none
// was put in the context with [ContextWithTenant]; every answer is scoped to
// it. It must be safe for concurrent use. Its name is mapped as
// interceptor.WithTenant maps its function's: a name that is not 1–64
// characters of [A-Za-z0-9._:-] (a SPIFFE ID, an e-mail), or that starts
// with "h.", is used as "h." and 40 hex digits of its SHA-256, so the same
// function given to both finds the records the interceptor keyed. tollgate's
// server interceptor puts the tenant it resolved in the context (a trusted
// peer's header "n", else its own WithTenant's, mapped so), and that one is
// used whatever this function says, since it is the tenant the call's tries
// were keyed under: a query answered under another would find no record,
// and fence a try that ran. Default [TenantFromContext]. A nil function
// makes [NewAttemptService] panic (interceptor.WithTenant(nil) is an
// invalid option too): answering every caller as tenant "" instead would
// read and fence the records of the wrong tenant.
func WithTenant(tenant func(ctx context.Context) string) ServiceOption {
	return serviceOptionFunc(func(s *AttemptService) {
		if tenant == nil {
			panic("idempotency: WithTenant needs a tenant function")
		}
		s.tenant = tenant
	})
}

// AttemptService serves tollgate.v1.AttemptService from a [Store]: GetAttempt
// reads a record, FenceAttempt casts the owner's ballot (DESIGN.md §3.5). Both
// are scoped to the caller's tenant, so one tenant can neither read nor fence
// another's records: another tenant's attempt reads as if absent. Malformed
// requests are INVALID_ARGUMENT; a store fault is NOT_ADMITTED
// STORE_UNAVAILABLE, and a request whose deadline leaves the store too
// little time ([ErrTooLittleTime]) DEADLINE_EXCEEDED. It is safe for concurrent use. Build one with
// [NewAttemptService]; the zero value is not usable.
//
// Calls of a method declared NO_SIDE_EFFECTS keep no records
// ([BypassesRecords]). For one of them GetAttempt answers only what the
// store holds (UNSEEN, although its tries may have run), and FenceAttempt
// answers UNKNOWN and fences nothing, since a tombstone would promise what
// no try heeds; tollgate's server interceptor answers such a ballot the same
// way before it reaches the service. That is harmless, since such tries have
// no effect, and tollgate's owner repeats them without asking (DESIGN.md
// §3.5), but neither answer says what ran.
type AttemptService struct {
	tollgatev1.UnimplementedAttemptServiceServer
	store  Store
	tenant func(ctx context.Context) string
}

// NewAttemptService returns the AttemptService of store. It panics if store
// is nil, or holds a nil pointer, map, slice, channel or function (a typed
// nil, such as a *redisstore.Store never set), whose methods would panic on
// the first query instead, and on WithTenant(nil). A nil option is ignored.
func NewAttemptService(store Store, opts ...ServiceOption) *AttemptService {
	if store == nil || nilvalue.Typed(store) {
		panic("idempotency: NewAttemptService needs a store")
	}
	s := &AttemptService{store: store, tenant: TenantFromContext}
	for _, o := range opts {
		if o != nil {
			o.applyService(s)
		}
	}
	return s
}

// GetAttempt returns the caller's tenant's record of one call, without
// changing it: UNSEEN when the store can vouch for its absence, UNKNOWN when
// it cannot.
func (s *AttemptService) GetAttempt(ctx context.Context, req *tollgatev1.GetAttemptRequest) (*tollgatev1.AttemptRecord, error) {
	key, err := s.key(ctx, req.GetAttemptId(), req.GetCall(), req.GetMethod())
	if err != nil {
		return nil, err
	}
	rec, err := s.store.Get(ctx, key)
	if err != nil {
		return nil, serviceError(err, key, 0)
	}
	return answerable(rec), nil
}

// FenceAttempt makes sure no try numbered fence_through_try or lower of the
// caller's tenant's call ever starts, and returns the record (see
// [Store.Fence]). fence_through_try must be 1–1000. A method declared
// NO_SIDE_EFFECTS is answered UNKNOWN, and nothing is fenced (see
// [AttemptService]).
func (s *AttemptService) FenceAttempt(ctx context.Context, req *tollgatev1.FenceAttemptRequest) (*tollgatev1.AttemptRecord, error) {
	key, err := s.key(ctx, req.GetAttemptId(), req.GetCall(), req.GetMethod())
	if err != nil {
		return nil, err
	}
	if err := ValidateFence(key, req.GetFenceThroughTry()); err != nil {
		return nil, grpcstatus.Error(codes.InvalidArgument, err.Error())
	}
	if BypassesRecords(key.Method) {
		// Its tries keep no records and run whatever the store holds, so a
		// tombstone would promise what no try heeds: the honest answer is
		// UNKNOWN, and nothing is fenced (as tollgate's interceptor answers).
		return &tollgatev1.AttemptRecord{AttemptId: key.AttemptID, Call: key.Call, Method: key.Method,
			State: tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN}, nil
	}
	rec, err := s.store.Fence(ctx, key, req.GetFenceThroughTry())
	if err != nil {
		return nil, serviceError(err, key, req.GetFenceThroughTry())
	}
	return answerable(rec), nil
}

// answerable returns rec as it can be sent: a handler's status message is
// any bytes (grpc-go percent-encodes them), and a record keeps it as it
// was, but status_message is a protobuf string, which must be UTF-8 — one
// that is not would fail the answer INTERNAL, and the record could not be
// read at all. Its invalid bytes are replaced with U+FFFD in a copy.
func answerable(rec *tollgatev1.AttemptRecord) *tollgatev1.AttemptRecord {
	if msg := rec.GetStatusMessage(); !utf8.ValidString(msg) {
		rec = proto.CloneOf(rec)
		rec.StatusMessage = strings.ToValidUTF8(msg, "\uFFFD")
	}
	return rec
}

func (s *AttemptService) key(ctx context.Context, attemptID, call, method string) (Key, error) {
	tenant, resolved := ctx.Value(tenantKey{}).(string) // the interceptor's
	if !resolved {
		tenant = tenantname.Token(s.tenant(ctx)) // as the interceptor maps its own
	}
	key := Key{Tenant: tenant, AttemptID: attemptID, Call: call, Method: method}
	if len(key.Tenant) > maxTenantLen || !tokenChars(key.Tenant) {
		return Key{}, grpcstatus.Error(codes.Internal, "idempotency: the tenant the server put in the context (ContextWithTenant) is malformed")
	}
	if err := ValidateKey(key); err != nil {
		return Key{}, grpcstatus.Error(codes.InvalidArgument, err.Error())
	}
	return key, nil
}

func serviceError(err error, key Key, try uint32) error {
	switch {
	case errors.Is(err, ErrMalformedKey):
		return grpcstatus.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), errors.Is(err, ErrTooLittleTime):
		if errors.Is(err, context.Canceled) {
			return grpcstatus.Error(codes.Canceled, err.Error())
		}
		return grpcstatus.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, ErrStoreUnavailable):
		return status.NotAdmitted(status.ReasonStoreUnavailable, status.Fields{
			AttemptID: key.AttemptID, Call: key.Call, Try: try,
			// The reason says "store unavailable": the sentinel's words
			// are not said again.
			Message: strings.TrimPrefix(err.Error(), ErrStoreUnavailable.Error()+": "),
		})
	}
	return grpcstatus.Error(codes.Internal, err.Error())
}

var _ tollgatev1.AttemptServiceServer = (*AttemptService)(nil)
