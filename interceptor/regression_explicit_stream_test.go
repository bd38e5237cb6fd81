package interceptor_test

import (
	"context"
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

// A bidi stream commits (a reply arrived), then its status is lost by a
// proxy. The record is SUCCEEDED: without a call key the stream ends
// COMMITTED; with an explicit key it ends UNKNOWN.
func TestRegressionExplicitKeyCommittedStream(t *testing.T) {
	for _, explicit := range []bool{false, true} {
		t.Run(map[bool]string{false: "per-run key", true: "explicit key"}[explicit], func(t *testing.T) {
			svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
				if _, err := st.Recv(); err != nil {
					return err
				}
				return st.Send(&testingv1.ChatResponse{})
			}}
			lose := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				if err := h(srv, ss); err != nil {
					return err
				}
				return grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
			})
			end := recordedServer(t, svc, memoryStore(t), lose)
			client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
			ctx := context.Context(t.Context())
			if explicit {
				ctx = interceptor.WithCallKey(ctx, "chat-1")
			}
			st, err := client.Chat(ctx)
			require.NoError(t, err)
			require.NoError(t, st.Send(&testingv1.ChatRequest{}))
			_, err = st.Recv()
			require.NoError(t, err)
			_, err = st.Recv()
			o := status.OutcomeOf(err)
			require.Equal(t, status.KindCommitted, o.Kind, "%v", err)
		})
	}
}
