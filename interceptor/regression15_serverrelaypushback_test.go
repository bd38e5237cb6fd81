package interceptor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// 48aa2a2 removed f78bea8's handlerTransport/serverStream.SetTrailer wrapper,
// which kept both keys the interceptor owns — tollgate-spent and
// grpc-retry-pushback-ms — out of a handler's trailer ("or an upstream's
// pushback as this server's"). It made the client read several
// tollgate-spent values as their largest, but left grpc-retry-pushback-ms
// alone: parsePushback still reads anything but exactly one value as "do
// not retry" (stopPushback), as grpc-go does.
//
// A hop that relays its upstream's trailer (the raw relay 48aa2a2 is written
// for) now sends two pushback values whenever its own answer is a
// NOT_ADMITTED with a delay — here the upstream's QUEUE_FULL refusal of a
// NO_SIDE_EFFECTS method, which stays NOT_ADMITTED (DESIGN.md §3.6) and
// gets the interceptor's own pushback (§2.3). The owner reads "do not
// retry" and gives up after one try on a refusal that asks to be repeated
// in 5 ms. (So does a handler that calls status.SetPushbackTrailer, the
// helper status documents for handlers, and returns the same refusal.)
func TestRegression15ServerRelayPushback(t *testing.T) {
	leaf := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return nil, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(5*time.Millisecond))
	}}
	leafEnd := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	plain := testingv1.NewTestServiceClient(leafEnd.DialT(t)) // the proxy's own client: no tollgate options
	var relayed atomic.Pointer[metadata.MD]
	proxy := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		var tr metadata.MD
		resp, err := plain.Get(metadata.NewOutgoingContext(ctx, metadata.MD{"tollgate": md.Get("tollgate")}), r, grpc.Trailer(&tr))
		relayed.Store(&tr)
		_ = grpc.SetTrailer(ctx, tr)
		return resp, err
	}}
	proxyEnd := testsvc.StartT(t, testsvc.Bufconn, proxy.Register, serverOpts()...)
	origin := testingv1.NewTestServiceClient(proxyEnd.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))...))

	ctx, err := interceptor.StartAttempt(t.Context(), 6, 5*time.Second)
	require.NoError(t, err)
	var tr metadata.MD
	_, err = origin.Get(ctx, &testingv1.GetRequest{Key: "k"}, grpc.Trailer(&tr))
	require.Error(t, err)
	require.Equal(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind, "%v", err)
	require.Equal(t, int64(3), leaf.Calls("Get"),
		"a QUEUE_FULL refusal asking for a repeat in 5 ms was tried %d time(s) of 3: the relay's trailer carries grpc-retry-pushback-ms %q (upstream's %q)",
		leaf.Calls("Get"), tr.Get(status.PushbackKey), relayed.Load().Get(status.PushbackKey))
}
