package interceptor_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
)

// TestReadmeQuickStart runs the configuration of the README's quick start
// (examples/quickstart, whose own test keeps the README's snippets in step
// with it) — the server (memory store, one class, TrustLoopback, a tenant function,
// admission, the store, AttemptService) and the client (DialOptions with an
// allowance, an attempt timeout and three tries, plus transport
// credentials) — over loopback TCP, and checks what the README says of it:
// a caller without a tollgate header is served from the first request; a
// trusted tollgate client's attempt created before the store began
// retaining is refused ATTEMPT_UNVERIFIABLE, NOT_ADMITTED and final on the
// first try of its unnamed call, with nothing run and a retry-after; and a
// new attempt succeeds once that retry-after has passed. The README's
// switch on status.OutcomeOf is compiled here too.
func TestReadmeQuickStart(t *testing.T) {
	// An attempt minted before the store exists: the store cannot vouch
	// that no earlier try of it ran.
	early, err := interceptor.StartAttempt(context.Background(), 4, 10*time.Second)
	require.NoError(t, err)

	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return &testingv1.ApplyResponse{}, nil
	}}
	tenantFromPeer := func(context.Context) string { return "tenant-a" }

	// --- the quick start's server ---
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica) // one replica ever; else redisstore.New
	require.NoError(t, err)
	ctrl, err := admission.New(admission.WithClasses(
		admission.Class{Name: "default", Slots: 6, QueueItems: 12, // reserved slots, bounded queue
			ExpectedServiceTime: 50 * time.Millisecond}, // seeds waits and retry-afters until learned
	))
	require.NoError(t, err)
	srv := grpc.NewServer(interceptor.ServerOptions(
		interceptor.WithTrustedPeer(interceptor.TrustLoopback), // or TrustAll behind mTLS, or your own func(ctx) bool
		interceptor.WithTenant(tenantFromPeer),                 // your func(ctx) string: the caller's tenant, unless a trusted peer's header names one
		interceptor.WithAdmission(ctrl),                        // optional: admission control (and its tap)
		interceptor.WithAttemptStore(store),                    // optional: at most one run per call, answers for owners
	)...)
	tollgatev1.RegisterAttemptServiceServer(srv, idempotency.NewAttemptService(store))
	// --- end of the quick start ---
	require.NotNil(t, store)
	require.NotNil(t, ctrl)
	defer ctrl.Close()
	svc.Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	defer func() {
		srv.Stop()
		require.NoError(t, <-served)
	}()
	target := lis.Addr().String()

	// A caller without a tollgate header gets an attempt the server mints,
	// and is served from the first request on.
	plain, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer plain.Close()
	_, err = testingv1.NewTestServiceClient(plain).Apply(context.Background(), &testingv1.ApplyRequest{})
	require.NoError(t, err, "a plain caller is served from the store's first moment")
	require.EqualValues(t, 1, svc.Calls("Apply"))

	// --- the quick start's client (its target aside) ---
	opts := append(interceptor.DialOptions(
		interceptor.WithAllowance(4),                                // units all layers below may spend
		interceptor.WithAttemptTimeout(10*time.Second),              // the attempt's one deadline
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3}), // this edge's repeats
	), grpc.WithTransportCredentials(insecure.NewCredentials())) // or your TLS credentials
	conn, err := grpc.NewClient(target, opts...)
	// --- end of the quick start ---
	require.NoError(t, err)
	defer conn.Close()
	client := testingv1.NewTestServiceClient(conn)

	_, err = client.Apply(early, &testingv1.ApplyRequest{})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonAttemptUnverifiable, o.Reason, "%v", err)
	require.True(t, o.Final(), "no repeat of this attempt can pass")
	require.Equal(t, codes.Unavailable, o.Code)
	require.EqualValues(t, 1, svc.Calls("Apply"), "nothing ran for the refused attempt")
	wait, ok := status.RetryAfter(err)
	require.True(t, ok, "the refusal says when a new attempt would be verifiable: %v", err)
	require.Greater(t, wait, time.Duration(0))

	// The README's switch compiles against the outcome it describes.
	var kind string
	switch o := status.OutcomeOf(err); o.Kind {
	case status.KindNotAdmitted: // no effect anywhere below: safe to try again later (unless o.Final())
		kind = "not admitted"
	case status.KindUnknown: // may have happened: do not repeat blindly; o.Detail.GetAttemptId() names it
		kind = "unknown"
	case status.KindCommitted: // happened; the response is not available
		kind = "committed"
	case status.KindFailed: // a definite error
		kind = "failed"
	}
	require.Equal(t, "not admitted", kind)

	// A new attempt succeeds once the refusal's retry-after has passed.
	timer := time.NewTimer(wait)
	<-timer.C
	_, err = client.Apply(context.Background(), &testingv1.ApplyRequest{})
	require.NoError(t, err, "a new attempt after the retry-after is verifiable")
	require.EqualValues(t, 2, svc.Calls("Apply"))
}
