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
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// r8Validating is a stream below tollgate's that refuses a request before
// sending it, as a validation interceptor (protovalidate and the like) does:
// INVALID_ARGUMENT, a definite code, from the client itself.
type r8Validating struct{ grpc.ClientStream }

func (v r8Validating) SendMsg(m any) error {
	if r, ok := m.(*testingv1.ChatRequest); ok && r.GetValue() == "bad" {
		return grpcstatus.Error(codes.InvalidArgument, "validation: value is bad")
	}
	return v.ClientStream.SendMsg(m)
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// A stream's try ended with the peer's UNAVAILABLE (no tollgate-spent: a
// proxy's own timeout answer, say), unread. DESIGN.md §2.3: such an ending
// holds the grant until reconciled. But when the caller's next SendMsg
// fails locally with a definite code (a validation interceptor below
// tollgate's), SendMsg settles the try with that local error instead of the
// peer's status: finish sees PeerStatus and spentNothing(INVALID_ARGUMENT),
// and refunds the grant. 76399a3's late refund of a released stream's held
// grant does the same for a stream already released (the caller's context
// ended): a grant held at the release is refunded by the same local error.
func TestRegression15StreamLocalRefund(t *testing.T) {
	for _, mode := range []string{"control: the status read", "unreleased", "released"} {
		release := mode == "released"
		t.Run(mode, func(t *testing.T) {
			svc := &testsvc.Service{ChatFunc: func(grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
				return grpcstatus.Error(codes.Unavailable, "upstream timed out")
			}}
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
			inner := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				st, err := streamer(ctx, desc, cc, method, opts...)
				if err != nil {
					return nil, err
				}
				return r8Validating{st}, nil
			}
			seen := trailerSeen{ch: make(chan struct{}, 1)}
			conn := end.DialT(t, append(interceptor.DialOptions(fastRetry(1)),
				grpc.WithChainStreamInterceptor(inner), grpc.WithStatsHandler(seen))...)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			actx, err := interceptor.StartAttempt(ctx, 4, time.Minute)
			require.NoError(t, err)
			ledger, _ := budget.FromContext(actx)
			finished := make(chan error, 2)
			st, err := testingv1.NewTestServiceClient(conn).Chat(actx, grpc.OnFinish(func(err error) { finished <- err }))
			require.NoError(t, err)
			select {
			case <-seen.ch:
			case <-time.After(10 * time.Second):
				t.Fatal("precondition: the server's status never arrived")
			}
			if release {
				cancel()
				select {
				case <-finished:
				case <-time.After(5 * time.Second):
					t.Fatal("precondition: the stream was not released")
				}
				snap := ledger.Snapshot()
				require.Equal(t, int64(4), snap.Held, "precondition: the grant is held at the release: %+v", snap)
			}
			if mode == "control: the status read" {
				_, err = st.Recv()
			} else {
				err = st.Send(&testingv1.ChatRequest{Value: "bad"})
			}
			require.Error(t, err)
			snap := ledger.Snapshot()
			require.Equal(t, int64(4), snap.Held,
				"the callee answered UNAVAILABLE without tollgate-spent (its grant must stay held, DESIGN.md §2.3), "+
					"yet a local INVALID_ARGUMENT from SendMsg refunded it: %+v (SendMsg: %v)", snap, err)
		})
	}
}
