package interceptor_test

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// transparentProxy is a grpc.UnknownServiceHandler that forwards every call,
// with its incoming metadata, to upstream and relays the answer, header and
// trailer included: the "forwards each request to exactly one upstream
// without retrying it" hop of DESIGN.md §2.3.
func transparentProxy(upstream *grpc.ClientConn) grpc.StreamHandler {
	return func(_ any, ss grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(ss)
		md, _ := metadata.FromIncomingContext(ss.Context())
		ctx := metadata.NewOutgoingContext(ss.Context(), md.Copy())
		cs, err := upstream.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method,
			grpc.ForceCodec(rawCodec{}))
		if err != nil {
			return err
		}
		go func() {
			for {
				f := &rawFrame{}
				if err := ss.RecvMsg(f); err != nil {
					_ = cs.CloseSend()
					return
				}
				if err := cs.SendMsg(f); err != nil {
					return
				}
			}
		}()
		first := true
		for {
			f := &rawFrame{}
			err := cs.RecvMsg(f)
			if first {
				if h, herr := cs.Header(); herr == nil {
					_ = ss.SendHeader(h)
				}
				first = false
			}
			if errors.Is(err, io.EOF) {
				ss.SetTrailer(cs.Trailer())
				return nil
			}
			if err != nil {
				ss.SetTrailer(cs.Trailer())
				return err
			}
			if err := ss.SendMsg(f); err != nil {
				return err
			}
		}
	}
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// DESIGN.md §2.3/§3.3 allow a hop that forwards each request to exactly one
// upstream (the README: "every hop between two tollgate peers either speaks
// tollgate or forwards each request to exactly one upstream"), and such a
// proxy may run tollgate's server interceptor for admission
// (regression15_serverrawrelay_test.go). A transparent proxy forwards every
// method, AttemptService's included, through grpc.UnknownServiceHandler: the
// owner's FenceAttempt reaches the upstream, whose store recorded the try.
//
// 48aa2a2 moved the "no WithAttemptStore → UNIMPLEMENTED" answer from
// fenceShortcut (unary FenceAttemptRequest only) into control(), where it
// also catches control *streams* (req == nil). A generated AttemptService is
// unary, so an AttemptService method reaching the stream interceptor is an
// unknown-service handler — a proxy — whose answer is its upstream's. The
// proxy's interceptor now answers UNIMPLEMENTED itself: the owner cannot
// resolve a lost try, and a call whose handler committed upstream ends
// UNKNOWN (§3.5) instead of returning the upstream's stored response.
func TestRegression15ServerProxyFence(t *testing.T) {
	store := memoryStore(t)
	var runs atomic.Int64
	backend := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		if runs.Add(1) == 1 {
			time.Sleep(300 * time.Millisecond) // outlives the owner's first try; detached, it commits
		}
		return &testingv1.ApplyResponse{Total: 7}, nil
	}}
	backEnd := recordedServer(t, backend, store)
	upstream := backEnd.DialT(t) // the proxy's own client: no tollgate options

	// The proxy runs tollgate's interceptor (it trusts the origin, keeps no
	// records) and forwards everything.
	proxyEnd := testsvc.StartT(t, testsvc.Bufconn, func(*grpc.Server) {},
		append(serverOpts(), grpc.UnknownServiceHandler(transparentProxy(upstream)), grpc.ForceServerCodec(rawCodec{}))...)

	time.Sleep(2 * time.Millisecond) // the attempt is created after the store's horizon
	origin := testingv1.NewTestServiceClient(proxyEnd.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, PerTryTimeout: 100 * time.Millisecond,
			InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	resp, err := origin.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 7})
	require.NoError(t, err, "the upstream committed the call and keeps its record, but its owner could not resolve it through the proxy")
	require.Equal(t, int64(7), resp.GetTotal())
	require.Equal(t, int64(1), runs.Load())
}
