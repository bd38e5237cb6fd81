package interceptor_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// slowHeaderStream is an inner interceptor's stream that does some work after
// the header arrives (here: waits until ready is closed, at most a bound), as
// a logging or metrics interceptor below tollgate's does.
type slowHeaderStream struct {
	grpc.ClientStream
	ready <-chan struct{}
}

func (s slowHeaderStream) Header() (metadata.MD, error) {
	md, err := s.ClientStream.Header()
	select {
	case <-s.ready:
	case <-time.After(300 * time.Millisecond):
	}
	return md, err
}

// A review found that a peer's CANCELLED status (a middle tier whose own downstream call was
// cancelled, a proxy's RST_STREAM(CANCEL)) read by grpc-go's Header runs the
// try's OnFinish with codes.Canceled while the caller's context lives.
// tryFinished takes that for "the ClientConn closed" and, on its goroutine,
// ends the whole stream — no decide, no repeat, no resolution — whenever it
// takes cs.mu before the Header that read the status does (Header does not
// set cs.receiving). The same NO_SIDE_EFFECTS Watch is repeated (and
// succeeds) when the goroutine loses the race. The inner interceptor here
// only widens the window deterministically.
func TestRegression14cClientStreamPeerCancelledInHeaderIsRepeated(t *testing.T) {
	for _, slow := range []bool{false, true} {
		t.Run(map[bool]string{false: "fast header", true: "slow inner header"}[slow], func(t *testing.T) {
			_, stream, err := interceptor.NewClientInterceptors(fastRetry(3), interceptor.WithAttemptTimeout(time.Minute))
			require.NoError(t, err)
			var calls atomic.Int32
			svc := &testsvc.Service{WatchFunc: func(_ *testingv1.WatchRequest, ss grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
				if calls.Add(1) == 1 {
					return grpcstatus.Error(codes.Canceled, "mid: the downstream call was cancelled")
				}
				return ss.Send(&testingv1.WatchResponse{Value: "v"})
			}}
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
			finished := make(chan struct{})
			var once sync.Once
			inner := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				st, err := streamer(ctx, desc, cc, method, opts...)
				if err != nil || !slow {
					return st, err
				}
				return slowHeaderStream{ClientStream: st, ready: finished}, nil
			}
			client := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithChainStreamInterceptor(stream, inner),
				grpc.WithStatsHandler(interceptor.StatsHandler()), grpc.WithDisableRetry()))

			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var result error
			st, err := client.Watch(ctx, &testingv1.WatchRequest{Key: "k"},
				grpc.OnFinish(func(err error) { result = err; once.Do(func() { close(finished) }) }))
			require.NoError(t, err)
			_, _ = st.Header()
			got, err := recvAll(st)
			require.NoError(t, err, "the NO_SIDE_EFFECTS Watch is repeated after the peer's CANCELLED (calls: %d, OnFinish: %v)", calls.Load(), result)
			require.Equal(t, []string{"v"}, got)
			require.EqualValues(t, 2, calls.Load())
		})
	}
}
