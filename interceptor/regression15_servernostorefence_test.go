package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// The README's quick start registers idempotency.NewAttemptService(store)
// beside ServerOptions(..., WithAttemptStore(store) /* optional */). A server
// built without the (optional) WithAttemptStore but with the AttemptService
// registered keeps no record of any call, yet answers every owner's
// FenceAttempt on such a call FENCED — "no try ≤ n ran, or ever will" —
// which is false: try n ran, or is running. The owner then repeats the call
// as try n+1 and the handler runs twice (DESIGN.md §3.7: at most once per
// record; §3.5: FENCED → repeat). tollgate's interceptor sees the ballot on
// the control path and knows it keeps no records: it must not let a fence
// be cast for calls it never records (answer UNKNOWN, or UNIMPLEMENTED so
// the owner treats the callee as recordless).
func TestRegression15ServerNoStoreFence(t *testing.T) {
	store := memoryStore(t)
	var first atomic.Bool
	first.Store(true)
	ledger := newLedger(func(ctx context.Context, _ *testingv1.ApplyRequest) {
		if first.Swap(false) {
			time.Sleep(900 * time.Millisecond) // past the per-try timeout: the answer is late
		}
	})
	end := storelessServer(t, store, ledger.Register)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithAttemptTimeout(5*time.Second),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, PerTryTimeout: 300 * time.Millisecond,
			InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))...))

	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	o := status.OutcomeOf(err)
	time.Sleep(1200 * time.Millisecond) // let the first run finish
	require.Equal(t, int64(1), ledger.effects.Load(),
		"the handler ran %d times: the fence answered FENCED for a call the server never records (call ended %v %v: %v)",
		ledger.effects.Load(), o.Kind, status.ReasonName(o.Reason), err)
}

// storelessServer starts a server whose interceptor has no
// WithAttemptStore but which registers an AttemptService over store beside
// register's services.
func storelessServer(t *testing.T, store idempotency.Store, register func(*grpc.Server)) *testsvc.Endpoint {
	t.Helper()
	return testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, interceptor.ServerOptions(interceptor.WithTrustedPeer(interceptor.TrustAll), interceptor.WithClockSkew(0))...)
}
