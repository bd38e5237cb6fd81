package idempotency_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// A nil option panicked in NewMemoryStore and NewAttemptService, where
// admission, budget and interceptor ignore one.
func TestNilOptionsAreIgnored_r18s(t *testing.T) {
	var s *idempotency.MemoryStore
	require.NotPanics(t, func() {
		var err error
		s, err = idempotency.NewMemoryStore(idempotency.SingleReplica, nil)
		require.NoError(t, err)
	})
	require.NotPanics(t, func() { idempotency.NewAttemptService(s, nil) })
}

// Configuration errors wrapped no sentinel (CONVENTIONS §4): a caller could
// not tell a bad option from any other failure.
func TestConfigurationErrorsWrapErrInvalidOption_r18s(t *testing.T) {
	p := idempotency.DefaultPolicy()
	p.MaxAttemptDeadline = 0
	short := idempotency.DefaultPolicy()
	short.TTL = time.Second
	neg := idempotency.DefaultPolicy()
	neg.Grace = -1
	for name, opts := range map[string][]idempotency.MemoryOption{
		"MaxBytes":            {idempotency.WithMaxBytes(1)},
		"MaxRecords":          {idempotency.WithMaxRecords(0)},
		"MaxRecordsPerTenant": {idempotency.WithMaxRecordsPerTenant(-1)},
		"MaxBytesPerTenant":   {idempotency.WithMaxBytesPerTenant(1)},
		"MaxAttemptDeadline":  {idempotency.WithPolicy(p)},
		"TTL":                 {idempotency.WithPolicy(short)},
		"NegativeGrace":       {idempotency.WithPolicy(neg)},
	} {
		_, err := idempotency.NewMemoryStore(idempotency.SingleReplica, opts...)
		require.ErrorIs(t, err, idempotency.ErrInvalidOption, name)
	}
	_, err := idempotency.NewMemoryStore(idempotency.Replicas{})
	require.ErrorIs(t, err, idempotency.ErrInvalidOption)
	require.ErrorIs(t, p.Validate(), idempotency.ErrInvalidOption)
}

// A memory store accepted a skew of an hour, which no server can use:
// interceptor.WithClockSkew is at most a minute and must equal the store's.
func TestPolicySkewBeyondTheInterceptorsIsRefused_r18s(t *testing.T) {
	p := idempotency.DefaultPolicy()
	p.Skew = time.Hour
	p.TTL = 2 * time.Hour
	_, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p))
	require.ErrorIs(t, err, idempotency.ErrInvalidOption)

	p.Skew = time.Minute // the interceptor's largest: usable
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p))
	require.NoError(t, err)
	_, err = interceptor.NewServerOptions(interceptor.WithAttemptStore(store), interceptor.WithClockSkew(time.Minute))
	require.NoError(t, err)
}

// Refusal's String said "Refusal(99)" where every other enum says "INVALID".
func TestRefusalStringOfAnUndeclaredValue_r18s(t *testing.T) {
	require.Equal(t, "INVALID", idempotency.Refusal(99).String())
	require.Equal(t, "UNVERIFIABLE", idempotency.RefusedUnverifiable.String())
}

// WithTenant(nil) was silently the default (TenantFromContext: tenant "" for
// every caller the interceptor did not resolve), where interceptor.WithTenant
// refuses nil. It panics now, as a nil store does.
func TestWithTenantNilPanics_r18s(t *testing.T) {
	s, err := idempotency.NewMemoryStore(idempotency.SingleReplica)
	require.NoError(t, err)
	require.Panics(t, func() { idempotency.NewAttemptService(s, idempotency.WithTenant(nil)) })
}

// spiffeTenant names the caller by an identity that is not a tenant token
// (a SPIFFE ID, as an mTLS peer's would be), from request metadata.
func spiffeTenant(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-spiffe"); len(v) == 1 {
		return v[0]
	}
	return ""
}

// The same tenant function given to interceptor.WithTenant and to
// idempotency.WithTenant found nothing: the interceptor keys a name that is
// not a token under "h." and its digest, while the AttemptService failed
// every query INTERNAL. The AttemptService maps the name the same way.
func TestAttemptServiceTenantMatchesTheInterceptors_r18s(t *testing.T) {
	p := idempotency.DefaultPolicy()
	p.Skew = 0
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p))
	require.NoError(t, err)

	var mu sync.Mutex
	var attemptID string
	svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		a, _ := interceptor.AttemptFromContext(ctx)
		mu.Lock()
		attemptID = a.ID
		mu.Unlock()
		return &testingv1.ApplyResponse{Total: r.GetAmount()}, nil
	}}
	data := testsvc.StartT(t, testsvc.Bufconn, svc.Register, interceptor.ServerOptions(
		interceptor.WithClockSkew(0), interceptor.WithAttemptStore(store), interceptor.WithTenant(spiffeTenant))...)
	// An operator's AttemptService on a server of its own (no interceptor),
	// reading the same store with the same tenant function.
	ops := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store, idempotency.WithTenant(spiffeTenant)))
	})

	orders := metadata.AppendToOutgoingContext(t.Context(), "x-spiffe", "spiffe://example.org/ns/shop/sa/orders")
	_, err = testingv1.NewTestServiceClient(data.DialT(t)).Apply(orders, &testingv1.ApplyRequest{Key: "k", Amount: 3})
	require.NoError(t, err)
	mu.Lock()
	id := attemptID
	mu.Unlock()
	require.NotEmpty(t, id)

	q := &tollgatev1.GetAttemptRequest{AttemptId: id, Call: "0", Method: testingv1.TestService_Apply_FullMethodName}
	client := tollgatev1.NewAttemptServiceClient(ops.DialT(t))
	rec, err := client.GetAttempt(orders, q)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())

	// Another identity is another tenant: it cannot see the record.
	other := metadata.AppendToOutgoingContext(t.Context(), "x-spiffe", "spiffe://example.org/ns/shop/sa/billing")
	rec, err = client.GetAttempt(other, q)
	require.NoError(t, err)
	require.NotEqual(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
}
