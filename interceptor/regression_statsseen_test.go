package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// NewClientInterceptors' state is shared by every ClientConn it is installed
// on, and so was the flag that the stats handler was seen at work: once seen
// on one conn, every try on a conn without the handler was "tracked" and,
// lacking OutHeader, classified NOT_SENT — a try that ran the handler and
// failed with a non-definite code was repeated without any query (found by
// review). The flag is now per connection: on the conn without the handler
// the try may have been sent, its outcome is UNKNOWN, the handler runs once.
func TestStatsSeenOnOneConnIsNotSeenOnAnother(t *testing.T) {
	var runs atomic.Int32
	svc := &testsvc.Service{
		GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			return &testingv1.GetResponse{}, nil
		},
		ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			runs.Add(1) // the effect happened …
			return nil, grpcstatus.Error(codes.Internal, "… then the handler failed")
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register) // a plain server
	unary, stream, err := interceptor.NewClientInterceptors(interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3}))
	require.NoError(t, err)
	// Conn A: interceptors and the stats handler, as the docs say.
	a := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithUnaryInterceptor(unary), grpc.WithStreamInterceptor(stream),
		grpc.WithStatsHandler(interceptor.StatsHandler()), grpc.WithDisableRetry()))
	// Conn B: the same interceptors, no stats handler (documented as "treated as maybe sent").
	b := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithUnaryInterceptor(unary), grpc.WithStreamInterceptor(stream),
		grpc.WithDisableRetry()))

	_, err = a.Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err)

	_, err = b.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k", Amount: 1})
	o := status.OutcomeOf(err)
	t.Logf("B.Apply: kind=%v reason=%v err=%v runs=%d", o.Kind, status.ReasonName(o.Reason), err, runs.Load())
	require.Equal(t, int32(1), runs.Load(), "a try that may have been sent was repeated without a query")
	require.Equal(t, status.KindUnknown, o.Kind)
}
