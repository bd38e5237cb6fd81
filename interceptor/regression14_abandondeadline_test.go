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
	"github.com/tollgate-go/tollgate/status"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	grpcstatus "google.golang.org/grpc/status"
)

// A review found that a stream whose caller's context reaches its deadline
// while no RecvMsg is under way is ended by clientStream.abandon, which types
// the try UNKNOWN at once, without the resolution query DESIGN.md §3.1/§3.5
// promise ("Resolution queries are exempt: they run on a detached context
// with a bounded grace after the deadline … an unresolved UNKNOWN is the
// worst answer tollgate gives"). The same stream, with the caller waiting in
// Recv at the deadline, is resolved: the query fences the try, which never
// ran, and the stream ends NOT_ADMITTED with its grant back. The caller's
// answer depends on whether it happened to be inside Recv.
//
// Here a server interceptor outside tollgate's (a slow auth check, say) holds
// every Chat until its deadline without calling the handler, so tollgate's
// server never begins the record: FenceAttempt(1) finds it absent and fences
// it.
func TestRegression14ClientStreamDeadlineWithoutRecvIsResolved(t *testing.T) {
	for _, receiving := range []bool{true, false} {
		t.Run(map[bool]string{true: "Recv under way at the deadline", false: "no Recv under way at the deadline"}[receiving], func(t *testing.T) {
			svc := &testsvc.Service{}
			hold := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				if info.FullMethod != testingv1.TestService_Chat_FullMethodName {
					return h(srv, ss)
				}
				<-ss.Context().Done()
				return grpcstatus.FromContextError(ss.Context().Err()).Err()
			})
			end := recordedServer(t, svc, memoryStore(t), hold)
			spans := tracetest.NewInMemoryExporter()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
			client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
				fastRetry(3), interceptor.WithClientTracerProvider(tp),
				// A grace no loaded machine runs out of: the query must answer.
				interceptor.WithResolutionGrace(10*time.Second))...))

			actx, err := interceptor.StartAttempt(t.Context(), 4, 30*time.Second)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(actx, 400*time.Millisecond)
			defer cancel()
			st, err := client.Chat(ctx)
			require.NoError(t, err)
			require.NoError(t, st.Send(&testingv1.ChatRequest{Value: "a"}))
			if !receiving {
				<-ctx.Done()
				// Wait until the stream has ended (its tollgate.call span
				// ended), so that Recv below only reads its result.
				require.Eventually(t, func() bool { return len(spans.GetSpans()) == 1 }, 10*time.Second, time.Millisecond)
			}
			_, err = st.Recv()
			require.Error(t, err)
			o := status.OutcomeOf(err)
			ledger, _ := budget.FromContext(actx)
			t.Logf("result: %v; ledger: %+v", err, ledger.Snapshot())
			require.Zero(t, svc.Calls("Chat"), "the handler never ran")
			require.Equal(t, status.KindNotAdmitted, o.Kind,
				"the try never ran and the query can say so (FENCED); got %v", err)
		})
	}
}
