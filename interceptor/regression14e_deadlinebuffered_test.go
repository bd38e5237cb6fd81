package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
)

// A server stream that completed (every message and the OK status arrived,
// unread) before the caller's context reached its deadline: grpc-go still
// hands the caller every message and io.EOF. tollgate's abandon (the
// context's AfterFunc) ends the stream at the deadline whatever arrived, so
// the buffered messages and the success are lost.
func TestRegression14eStreamCompletedBeforeDeadlineKeepsItsMessages(t *testing.T) {
	for _, tollgate := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain grpc-go", true: "tollgate"}[tollgate], func(t *testing.T) {
			svc := &testsvc.Service{WatchFunc: func(_ *testingv1.WatchRequest, ss grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
				return sendWatch(ss, 3)
			}}
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
			seen := trailerSeen{ch: make(chan struct{}, 1)}
			dial := []grpc.DialOption{grpc.WithStatsHandler(seen)}
			if tollgate {
				dial = append(interceptor.DialOptions(fastRetry(3), interceptor.WithAttemptTimeout(time.Minute)), dial...)
			}
			conn, err := end.Dial(dial...)
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close() })
			client := testingv1.NewTestServiceClient(conn)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			finished := make(chan error, 1)
			st, err := client.Watch(ctx, &testingv1.WatchRequest{Key: "k"}, grpc.OnFinish(func(err error) { finished <- err }))
			require.NoError(t, err)
			select {
			case <-seen.ch: // the whole stream arrived, unread
			case <-time.After(10 * time.Second):
				t.Fatal("precondition: the server's status never arrived")
			}
			<-ctx.Done() // the caller was slow: its deadline passed before it read
			select {
			case err := <-finished:
				t.Logf("OnFinish ran with %v", err)
			case <-time.After(2 * time.Second):
				t.Log("OnFinish did not run after the deadline")
			}
			got, err := recvAll(st)
			require.NoError(t, err, "a stream that had ended OK before the deadline: %v", status.OutcomeOf(err))
			require.Equal(t, []string{"0", "1", "2"}, got)
		})
	}
}
