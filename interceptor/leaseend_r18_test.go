package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
)

// A recorded try whose handler runs until its own deadline — the attempt's
// deadline plus the skew, which is also when its record's lease ends — cannot
// have its record finished: the store refuses a Finish after the lease, and
// the record reads ABANDONED. The caller is told so in words of its own
// call (UNKNOWN, the handler ran until its deadline), not with the store's
// internal "try is not running" error. A long-lived watch that the server
// ends at its own maximum (WithMaxAttemptTime) meets this on every call; a
// unary handler that overruns does too.
func TestR18HandlerRunUntilLeaseEndIsToldInItsOwnWords(t *testing.T) {
	store := noSkewStore(t)
	svc := &testsvc.Service{
		ApplyFunc: func(ctx context.Context, _ *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		},
		WatchFunc: func(_ *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
			if err := st.Send(&testingv1.WatchResponse{}); err != nil {
				return err
			}
			<-st.Context().Done()
			return st.Context().Err()
		},
	}
	e := testsvc.StartT(t, testsvc.Bufconn, svc.Register, interceptor.ServerOptions(
		interceptor.WithAttemptStore(store), interceptor.WithClockSkew(0),
		interceptor.WithMaxAttemptTime(300*time.Millisecond))...)
	client := testingv1.NewTestServiceClient(e.DialT(t)) // plain: the server mints, capped at its maximum

	check := func(t *testing.T, err error, lease bool) {
		t.Helper()
		require.Error(t, err)
		o := status.OutcomeOf(err)
		require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
		require.Equal(t, codes.DeadlineExceeded, grpcstatus.Code(err), "%v", err)
		msg := grpcstatus.Convert(err).Message()
		require.NotContains(t, msg, idempotency.ErrNotRunning.Error(), "the store's internal refusal leaks to the caller")
		if lease {
			require.Contains(t, msg, "lease")
		}
	}
	t.Run("unary", func(t *testing.T) {
		_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
		check(t, err, true)
	})
	// The stream's Finish is sent on a context of its own, and may reach
	// the store within the lease's last millisecond (the memory store
	// judges leases in whole milliseconds): either way, no store error.
	t.Run("server-streaming", func(t *testing.T) {
		st, err := client.Watch(t.Context(), &testingv1.WatchRequest{})
		require.NoError(t, err)
		_, err = st.Recv()
		require.NoError(t, err)
		_, err = st.Recv()
		check(t, err, false)
	})
}
