package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// f41cc30 releases a stream whose status arrived, unread, when its
// ClientConn closes (or at its try's deadline): releaseLocked settles the
// try with grpc-go's OnFinish error (CANCELED "the client connection is
// closing", or DEADLINE_EXCEEDED), not with the status that had arrived. In
// lenient accounting (DESIGN.md §2.3) a call that ended with the peer's OK
// status and no tollgate-spent spent nothing: its grant is refunded. Here
// the peer's OK status had arrived before the close, yet the grant is held
// — and no query ever reconciles a stream that ended OK, so the attempt's
// units stay held for good (at a middle tier, the seal then counts them as
// spent and reports them to its caller). Read before the close, the same
// stream refunds its grant (the control case).
func TestRegression15StreamReleasedGrantHeld(t *testing.T) {
	for _, readFirst := range []bool{true, false} {
		t.Run(map[bool]string{true: "read before the close", false: "released at the close"}[readFirst], func(t *testing.T) {
			svc := &testsvc.Service{WatchFunc: func(_ *testingv1.WatchRequest, ss grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
				return sendWatch(ss, 3)
			}}
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
			seen := trailerSeen{ch: make(chan struct{}, 1)}
			conn, err := end.Dial(append(interceptor.DialOptions(fastRetry(3)), grpc.WithStatsHandler(seen))...)
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close() })

			ctx, cancel := context.WithCancel(context.Background()) // no deadline of the caller's own
			defer cancel()
			actx, err := interceptor.StartAttempt(ctx, 4, time.Minute)
			require.NoError(t, err)
			ledger, ok := budget.FromContext(actx)
			require.True(t, ok)
			finished := make(chan error, 2)
			st, err := testingv1.NewTestServiceClient(conn).Watch(actx, &testingv1.WatchRequest{Key: "k"},
				grpc.OnFinish(func(err error) { finished <- err }))
			require.NoError(t, err)
			select {
			case <-seen.ch: // the whole stream and its OK status arrived
			case <-time.After(10 * time.Second):
				t.Fatal("precondition: the server's status never arrived")
			}
			if readFirst {
				got, err := recvAll(st)
				require.NoError(t, err)
				require.Len(t, got, 3)
			}
			require.NoError(t, conn.Close())
			select {
			case <-finished:
			case <-time.After(5 * time.Second):
				t.Fatal("OnFinish did not run")
			}
			got, err := recvAll(st)
			require.NoError(t, err, "the stream had ended OK before the close")
			if !readFirst {
				require.Len(t, got, 3)
			}
			snap := ledger.Snapshot()
			require.Zero(t, snap.Held, "the grant of a stream that ended with the peer's OK status (no tollgate-spent) is held: %+v", snap)
			require.Equal(t, int64(4), snap.Free, "%+v", snap)
		})
	}
}
