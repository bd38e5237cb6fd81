package interceptor_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	grpcstatus "google.golang.org/grpc/status"
)

// silentService is a plain grpc-go service (no tollgate) whose handlers
// take the request and never answer until released: a tollgate client
// sees no peer status before its deadline.
type silentService struct {
	testsvc.Service
	release chan struct{}
}

func (s *silentService) Consume(_ *testingv1.ConsumeRequest, _ grpc.ServerStreamingServer[testingv1.ConsumeResponse]) error {
	<-s.release
	return nil
}

func newSilentService() *silentService {
	s := &silentService{release: make(chan struct{})}
	s.ApplyFunc = func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		<-s.release
		return &testingv1.ApplyResponse{}, nil
	}
	s.UploadFunc = func(grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
		<-s.release
		return nil
	}
	s.ChatFunc = func(grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		<-s.release
		return nil
	}
	return s
}

// TestCallLostReachesTheCaller: DESIGN §2.5 — a call to a server that does
// not speak tollgate, whose status never arrived (the client's deadline
// passed), is UNKNOWN with reason CALL_LOST, and the error the application
// gets says so (its detail and its ErrorInfo), however the owner re-addressed
// it after the try: the query unimplemented (no AttemptService), or answered
// by a store that cannot vouch for the attempt; one try or three; the
// attempt's deadline or the caller's own; unary and every stream kind with
// side effects.
func TestCallLostReachesTheCaller(t *testing.T) {
	const wait = 300 * time.Millisecond
	type call func(ctx context.Context, c testingv1.TestServiceClient) error
	calls := map[string]call{
		"unary": func(ctx context.Context, c testingv1.TestServiceClient) error {
			_, err := c.Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
			return err
		},
		"server-stream": func(ctx context.Context, c testingv1.TestServiceClient) error {
			st, err := c.Consume(ctx, &testingv1.ConsumeRequest{Key: "k", Count: 1})
			if err != nil {
				return err
			}
			_, err = st.Recv()
			return err
		},
		"client-stream": func(ctx context.Context, c testingv1.TestServiceClient) error {
			st, err := c.Upload(ctx)
			if err != nil {
				return err
			}
			if err := st.Send(&testingv1.UploadRequest{}); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			_, err = st.CloseAndRecv()
			return err
		},
		"bidi": func(ctx context.Context, c testingv1.TestServiceClient) error {
			st, err := c.Chat(ctx)
			if err != nil {
				return err
			}
			if err := st.Send(&testingv1.ChatRequest{}); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			_, err = st.Recv()
			return err
		},
	}
	for name, do := range calls {
		for _, tries := range []int{1, 3} {
			for _, attempts := range []string{"none", "unvouching"} {
				for _, own := range []bool{false, true} {
					if name != "unary" && own {
						continue
					}
					t.Run(name+"/tries="+strconv.Itoa(tries)+"/attemptservice="+attempts+"/callerdeadline="+strconv.FormatBool(own), func(t *testing.T) {
						t.Parallel()
						svc := newSilentService()
						var store idempotency.Store
						if attempts == "unvouching" {
							// Its default skew puts every attempt made now
							// before its horizon: it answers UNKNOWN.
							s, err := idempotency.NewMemoryStore(idempotency.SingleReplica)
							require.NoError(t, err)
							store = s
						}
						end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
							testingv1.RegisterTestServiceServer(s, svc)
							if store != nil {
								tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
							}
						})
						t.Cleanup(func() { close(svc.release) }) // before the server stops
						timeout := wait
						if own {
							timeout = time.Minute
						}
						client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
							interceptor.WithAttemptTimeout(timeout),
							interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: tries}))...))
						ctx := t.Context()
						if own {
							var cancel context.CancelFunc
							ctx, cancel = context.WithTimeout(ctx, wait)
							defer cancel()
						}
						err := do(ctx, client)
						requireCallLost(t, err)
					})
				}
			}
		}
	}
}

// requireCallLost checks that err is UNKNOWN, reason CALL_LOST, in its
// detail and in its ErrorInfo, and names try 1 of call 0.
func requireCallLost(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
	require.Equal(t, status.ReasonCallLost, o.Reason, "%v", err)
	require.Equal(t, "0", o.Detail.GetCall())
	require.NotEmpty(t, o.Detail.GetAttemptId())
	var info *errdetails.ErrorInfo
	for _, d := range grpcstatus.Convert(err).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetDomain() == "tollgate.dev" {
			info = ei
		}
	}
	require.NotNil(t, info, "%v", err)
	require.Equal(t, "CALL_LOST", info.GetReason(), "%v", err)
}

// TestForeignUnknownReasonIsNotCarried: a server that does not speak
// tollgate passed up an UNKNOWN its own call got (CALL_LOST, naming that
// call's attempt); the owner, which re-addresses it to its own try after the
// query, does not carry a reason that describes another call.
func TestForeignUnknownReasonIsNotCarried(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return nil, status.OutcomeUnknown(errors.New("its own call was lost"),
			status.WithAttempt("0190a5b2-7c3e-7def-8123-456789abcdef", "0", 1), status.WithReason(status.ReasonCallLost))
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))
	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k", Amount: 1})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
	require.NotEqual(t, "0190a5b2-7c3e-7def-8123-456789abcdef", o.Detail.GetAttemptId(), "re-addressed to the caller's attempt")
	require.Equal(t, status.ReasonUnspecified, o.Reason, "%v", err)
}
