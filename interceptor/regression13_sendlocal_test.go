package interceptor_test

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// Regression (review 72): a client- or bidi-streaming call whose SendMsg
// fails locally (here a message over the caller's MaxCallSendMsgSize; grpc-go
// then ends the stream, resetting it at the server, after earlier messages
// were delivered and may have acted) ends with grpc-go's bare
// RESOURCE_EXHAUSTED: no tollgate detail, no attempt ID. DESIGN.md §2.5 names
// exactly this code ("grpc-go makes one on the client for an oversized …")
// as one a tollgate client classifies UNKNOWN, and §3.6 / owner.conclude
// promise the caller a typed UNKNOWN naming the attempt, never a bare code a
// generic retry policy repeats. The unary path types the same failure.
func TestRegression13StreamLocalSendErrorIsTyped(t *testing.T) {
	received := make(chan string, 4)
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		for {
			m, err := st.Recv()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			received <- m.GetValue() // the effect of a message
		}
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	conn := end.DialT(t, append(interceptor.DialOptions(fastRetry(3)),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(1024)))...)
	client := testingv1.NewTestServiceClient(conn)
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(ctx)

	st, err := client.Chat(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.ChatRequest{Value: "small"}))
	require.Equal(t, "small", <-received, "the first message reached the handler: an effect may have happened")
	sendErr := st.Send(&testingv1.ChatRequest{Value: strings.Repeat("x", 4096)})
	require.Error(t, sendErr)
	_, err = st.Recv()
	require.Error(t, err)
	require.NotEqual(t, codes.ResourceExhausted, grpcstatus.Code(err), "an UNKNOWN is never RESOURCE_EXHAUSTED (DESIGN.md §2.5): a generic policy would repeat it")

	for _, c := range []struct {
		name string
		e    error
	}{{"Recv", err}, {"Send", sendErr}} {
		name, e := c.name, c.e
		o := status.OutcomeOf(e)
		require.Equal(t, status.KindUnknown, o.Kind, "%s: %v", name, e)
		require.NotNil(t, o.Detail, "%s: a tollgate client returns a typed UNKNOWN naming the attempt, not a bare RESOURCE_EXHAUSTED: %v", name, e)
		require.Equal(t, a.ID, o.Detail.GetAttemptId(), name)
	}
}

// The unary counterpart, for comparison: the same local failure is typed.
func TestRegression13UnaryLocalSendErrorIsTyped(t *testing.T) {
	svc := &testsvc.Service{}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	conn := end.DialT(t, append(interceptor.DialOptions(fastRetry(1)),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(1024)))...)
	client := testingv1.NewTestServiceClient(conn)
	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: strings.Repeat("x", 4096)})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
	require.NotEmpty(t, o.Detail.GetAttemptId(), "%v", err)
}
