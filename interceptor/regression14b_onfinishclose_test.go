package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
)

// grpc-go lists closing the ClientConn as a way to release a stream, and its
// watcher goroutine then finishes the stream, running grpc.OnFinish. Since
// 005c383 the owner keeps OnFinish from its tries and runs it only in
// clientStream.endLocked, which nothing calls when the connection closes
// under a stream whose caller neither reads nor cancels: the callback never
// runs (an in-flight gauge above tollgate leaks). Before 005c383 the try's
// grpc-go stream ran it.
func TestRegression14bClientStreamOnFinishRunsWhenTheConnCloses(t *testing.T) {
	for _, tollgate := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain grpc-go", true: "tollgate"}[tollgate], func(t *testing.T) {
			svc := &testsvc.Service{WatchFunc: func(_ *testingv1.WatchRequest, ss grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
				if err := ss.Send(&testingv1.WatchResponse{}); err != nil {
					return err
				}
				<-ss.Context().Done()
				return ss.Context().Err()
			}}
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
			var dial []grpc.DialOption
			if tollgate {
				dial = interceptor.DialOptions(fastRetry(3), interceptor.WithAttemptTimeout(time.Minute))
			}
			conn, err := end.Dial(dial...)
			require.NoError(t, err)
			client := testingv1.NewTestServiceClient(conn)

			// A context that outlives the checks (neither cancelled nor
			// timed out during the test): only the conn's close may end it.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			finished := make(chan error, 4)
			st, err := client.Watch(ctx, &testingv1.WatchRequest{Key: "k"}, grpc.OnFinish(func(err error) { finished <- err }))
			require.NoError(t, err)
			_, err = st.Recv()
			require.NoError(t, err)

			require.NoError(t, conn.Close()) // grpc-go's way 1 to release a stream
			select {
			case err := <-finished:
				t.Logf("OnFinish ran with %v", err)
			case <-time.After(10 * time.Second):
				t.Fatal("OnFinish never ran after the ClientConn closed under the stream")
			}
		})
	}
}
