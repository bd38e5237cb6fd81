package status_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"
)

const testService = "tollgate.status.test.Refuser"

// startServer serves one unary method per handler over bufconn, each taking
// and returning emptypb.Empty, and returns a client connection to it.
func startServer(t *testing.T, handlers map[string]func(ctx context.Context) error) *grpc.ClientConn {
	t.Helper()
	desc := grpc.ServiceDesc{ServiceName: testService, HandlerType: (*any)(nil)}
	for name, h := range handlers {
		desc.Methods = append(desc.Methods, grpc.MethodDesc{
			MethodName: name,
			Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				if err := dec(new(emptypb.Empty)); err != nil {
					return nil, err
				}
				if err := h(ctx); err != nil {
					return nil, err
				}
				return new(emptypb.Empty), nil
			},
		})
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	srv.RegisterService(&desc, struct{}{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDisableRetry(),
	)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, conn.Close())
		srv.Stop()
		require.NoError(t, <-served)
	})
	return conn
}

func invoke(conn *grpc.ClientConn, method string, trailer *metadata.MD) error {
	return conn.Invoke(context.Background(), "/"+testService+"/"+method, new(emptypb.Empty), new(emptypb.Empty), grpc.Trailer(trailer))
}

// TestOverGRPC sends refusals through a real grpc-go server and client.
func TestOverGRPC(t *testing.T) {
	setTrailerErr := make(chan error, 1)
	conn := startServer(t, map[string]func(context.Context) error{
		"Refuse": func(ctx context.Context) error {
			err := status.NotAdmitted(status.ReasonQueueFull,
				status.WithRetryAfter(1500*time.Millisecond), status.WithClass("heavy"),
				status.WithAttempt("0190a5b2-7c3e-7def-8123-456789abcdef", "0.2.1", 2))
			setTrailerErr <- status.SetPushbackTrailer(ctx, err)
			return err
		},
		"RefuseWrapped": func(ctx context.Context) error {
			err := fmt.Errorf("reserve stock: %w", status.NotAdmitted(status.ReasonDraining, status.WithRetryAfter(time.Millisecond+1)))
			if e := status.SetPushbackTrailer(ctx, err); e != nil {
				return e
			}
			return err
		},
		"UnknownBinaryCause": func(context.Context) error {
			return status.OutcomeUnknown(errors.New("store replied \xff\xfe\x00"), status.WithReason(status.ReasonCallLost))
		},
		"WithoutEffectDeadline": func(context.Context) error {
			return status.WithoutEffect(fmt.Errorf("wait: %w", context.DeadlineExceeded))
		},
		"Corrupt": func(context.Context) error {
			return grpcstatus.ErrorProto(&spb.Status{Code: int32(codes.ResourceExhausted), Message: "corrupt", Details: []*anypb.Any{
				{TypeUrl: "type.googleapis.com/tollgate.v1.OutcomeDetail", Value: []byte{0xff, 0xff, 0xff}},
				{TypeUrl: "type.googleapis.com/nobody.Knows", Value: []byte{0x08, 0x01}},
			}})
		},
		"OK": func(context.Context) error { return nil },
	})

	t.Run("NOT_ADMITTED with every detail and the pushback trailer", func(t *testing.T) {
		var md metadata.MD
		err := invoke(conn, "Refuse", &md)
		require.NoError(t, <-setTrailerErr)
		require.Equal(t, []string{"1500"}, md.Get(status.PushbackKey))

		w := onWireOf(t, err)
		require.Equal(t, codes.ResourceExhausted, w.st.Code())
		require.Equal(t, "tollgate: not admitted: queue full", w.st.Message())
		require.Empty(t, cmpDiff(&tollgatev1.OutcomeDetail{
			Outcome: tollgatev1.Outcome_OUTCOME_NOT_ADMITTED, Reason: status.ReasonQueueFull,
			AttemptId: "0190a5b2-7c3e-7def-8123-456789abcdef", Call: "0.2.1", Try: 2,
			RetryAfter: durationpb.New(1500 * time.Millisecond), WorkloadClass: "heavy",
		}, w.detail))
		require.Empty(t, cmpDiff(&errdetails.ErrorInfo{Reason: "QUEUE_FULL", Domain: "tollgate.dev"}, w.errorInfo))
		require.Empty(t, cmpDiff(&errdetails.RetryInfo{RetryDelay: durationpb.New(1500 * time.Millisecond)}, w.retryInfo))

		o := status.OutcomeOf(err)
		require.Equal(t, status.KindNotAdmitted, o.Kind)
		require.Equal(t, status.ReasonQueueFull, o.Reason)
		require.Equal(t, "heavy", o.Detail.GetWorkloadClass())
		d, ok := status.RetryAfter(err)
		require.True(t, ok)
		require.Equal(t, 1500*time.Millisecond, d)
		require.Equal(t, o.Kind, status.OutcomeOfCall(err, status.PeerStatus).Kind)
	})

	t.Run("a wrapped refusal keeps its details", func(t *testing.T) {
		var md metadata.MD
		err := invoke(conn, "RefuseWrapped", &md)
		require.Equal(t, []string{"2"}, md.Get(status.PushbackKey))
		require.Equal(t, codes.Unavailable, grpcstatus.Code(err))
		require.Equal(t, "reserve stock: tollgate: not admitted: draining", grpcstatus.Convert(err).Message())
		o := status.OutcomeOf(err)
		require.Equal(t, status.KindNotAdmitted, o.Kind)
		require.Equal(t, status.ReasonDraining, o.Reason)
	})

	t.Run("a cause with invalid UTF-8 does not cost the details", func(t *testing.T) {
		var md metadata.MD
		err := invoke(conn, "UnknownBinaryCause", &md)
		require.Empty(t, md.Get(status.PushbackKey))
		o := status.OutcomeOf(err)
		require.Equal(t, status.KindUnknown, o.Kind)
		require.Equal(t, status.ReasonCallLost, o.Reason)
		require.NotNil(t, o.Detail, "grpc-go drops all details of a status it cannot marshal")
		require.Equal(t, codes.Unknown, o.Code)
	})

	t.Run("WithoutEffect keeps grpc-go's mapping of context errors", func(t *testing.T) {
		var md metadata.MD
		err := invoke(conn, "WithoutEffectDeadline", &md)
		require.Equal(t, codes.DeadlineExceeded, grpcstatus.Code(err))
		require.Equal(t, status.Outcome{Kind: status.KindUnknown, Code: codes.DeadlineExceeded}, status.OutcomeOf(err))
	})

	t.Run("corrupt details are classified by code", func(t *testing.T) {
		var md metadata.MD
		err := invoke(conn, "Corrupt", &md)
		require.Equal(t, status.Outcome{Kind: status.KindUnknown, Code: codes.ResourceExhausted}, status.OutcomeOf(err))
		require.Equal(t, status.Outcome{Kind: status.KindNotAdmitted, Reason: status.ReasonNotSent, Code: codes.ResourceExhausted},
			status.OutcomeOfCall(err, status.NotSent))
	})

	t.Run("success", func(t *testing.T) {
		var md metadata.MD
		err := invoke(conn, "OK", &md)
		require.NoError(t, err)
		require.Equal(t, status.KindOK, status.OutcomeOf(err).Kind)
	})
}

// onWireOf reads the details of a status a client received.
func onWireOf(t *testing.T, err error) onWire {
	t.Helper()
	_, ok := grpcstatus.FromError(err)
	require.True(t, ok)
	return sendOverWire(t, err)
}
