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
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// TestRegression13VerifyingTriesOfAnExplicitKeyAreBounded: an owner of an
// explicitly keyed call whose try's answer is lost after commit resolves it
// SUCCEEDED and sends a verifying try, which "does not count against the
// tries" (owner.go decide: uncounted = w.verify). When the verifying try's
// answer is lost too (a middlebox or an outer server interceptor that fails
// every answer of this call after the handler), it is resolved SUCCEEDED
// again and another uncounted verifying try follows, and so on: MaxTries
// never bounds the loop, only the deadline, header.MaxTry or the retry
// budget. At the origin the allowance does not bound it either (its tries
// are not charged).
//
// Expected: at most MaxTries tries, plus at most one verifying try.
func TestRegression13VerifyingTriesOfAnExplicitKeyAreBounded(t *testing.T) {
	store := memoryStore(t)
	var arrivals atomic.Int64
	// Outermost: the handler (and tollgate's record) runs, the answer is lost.
	drop := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod != testingv1.TestService_Apply_FullMethodName {
			return handler(ctx, req)
		}
		arrivals.Add(1)
		_, _ = handler(ctx, req)
		return nil, grpcstatus.Error(codes.Unavailable, "r75: answer lost after commit")
	}
	ledger := newLedger(nil)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		ledger.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(drop)}, serverOpts(interceptor.WithAttemptStore(store))...)...)
	const maxTries = 2
	conn := end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: maxTries, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}),
		interceptor.WithoutRetryBudget())...)

	ctx, err := interceptor.StartAttempt(t.Context(), 3, 500*time.Millisecond)
	require.NoError(t, err)
	_, err = testingv1.NewTestServiceClient(conn).Apply(interceptor.WithCallKey(ctx, "pay"), &testingv1.ApplyRequest{Key: "acct", Amount: 1})

	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "%v", err)
	require.Equal(t, int64(1), ledger.effects.Load(), "the effect ran once (records hold)")
	require.LessOrEqual(t, arrivals.Load(), int64(maxTries+1),
		"MaxTries %d, but %d tries of one call reached the server", maxTries, arrivals.Load())
}
