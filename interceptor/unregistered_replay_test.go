package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// counterAdd is a method served by a hand-written grpc.ServiceDesc, as code
// without protoc output serves one: the protobuf registry knows its message
// types but not the method.
const counterAdd = "/demo.v1.Counter/Add"

type handWrittenCounter struct {
	total, runs atomic.Int64
}

func (c *handWrittenCounter) desc() *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: "demo.v1.Counter",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Add",
			Handler: func(_ any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
				req := new(wrapperspb.Int64Value)
				if err := dec(req); err != nil {
					return nil, err
				}
				h := func(context.Context, any) (any, error) {
					c.runs.Add(1)
					return wrapperspb.Int64(c.total.Add(req.GetValue())), nil
				}
				if in == nil {
					return h(ctx, req)
				}
				return in(ctx, req, &grpc.UnaryServerInfo{FullMethod: counterAdd}, h)
			},
		}},
	}
}

// A record's response of a method the registry does not know is replayed
// as the type its handler returned on this server, not answered COMMITTED
// (RESPONSE_NOT_RETAINED) while the record holds it: here an explicitly
// keyed call, whose owner verifies a finished record with a repeat (the
// query carries no request), after an interceptor outside tollgate's lost
// the first answer.
func TestUnregisteredMethodsResponseIsReplayed(t *testing.T) {
	c := &handWrittenCounter{}
	store := memoryStore(t)
	var lost atomic.Bool
	loseFirst := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if info.FullMethod == counterAdd && err == nil && lost.CompareAndSwap(false, true) {
			return nil, grpcstatus.Error(codes.Unavailable, "proxy: connection reset after the answer")
		}
		return resp, err
	})
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		s.RegisterService(c.desc(), nil)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, append([]grpc.ServerOption{loseFirst}, serverOpts(interceptor.WithAttemptStore(store))...)...)
	conn := end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))...)
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	out := new(wrapperspb.Int64Value)
	err = conn.Invoke(interceptor.WithCallKey(ctx, "add-seven"), counterAdd, wrapperspb.Int64(7), out)
	require.NoError(t, err)
	require.Equal(t, int64(7), out.GetValue(), "the recorded response of the one run")
	require.Equal(t, int64(1), c.runs.Load(), "the handler ran once")
	require.True(t, lost.Load(), "the first answer was lost")
}
