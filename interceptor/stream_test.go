package interceptor_test

import (
	"context"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// TestStreamsPropagateAndReportSpentUnits runs each stream kind through a
// middle tier whose handler calls the dependency: the dependency sees the
// origin's attempt, and the origin's ledger is charged what the stream's
// handler spent, from its tollgate-spent trailer.
func TestStreamsPropagateAndReportSpentUnits(t *testing.T) {
	dep := &testsvc.Service{}
	var depSeen seen
	dep.GetFunc = func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		depSeen.note(ctx)
		return &testingv1.GetResponse{Value: "d"}, nil
	}
	depEnd := testsvc.StartT(t, testsvc.Bufconn, dep.Register, serverOpts()...)
	callDep := getsFrom(testingv1.NewTestServiceClient(depEnd.DialT(t, interceptor.DialOptions()...)))
	mid := callingStreams(callDep)
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions()...))

	for _, tc := range callingStreamRuns {
		t.Run(tc.name, func(t *testing.T) {
			ctx, err := interceptor.StartAttempt(t.Context(), 8, 5*time.Second)
			require.NoError(t, err)
			before, _ := depSeen.all()
			st, err := tc.run(t, ctx, client)
			require.NoError(t, err)
			requireSpentReported(t, ctx, st.Trailer(), tc.spent, &depSeen, len(before))
		})
	}
}

// callingStreamRun is one stream kind, run against callingStreams: run
// opens it under ctx through client, checks the messages it gets, and
// returns it ended, for its trailer; spent is what the middle's handler
// spends below it.
type callingStreamRun struct {
	name, method string
	spent        int64
	run          func(t *testing.T, ctx context.Context, client testingv1.TestServiceClient) (grpc.ClientStream, error)
}

// callingStreamRuns are the three stream kinds run against callingStreams.
var callingStreamRuns = []callingStreamRun{
	{"server-streaming", "Watch", 2, func(t *testing.T, ctx context.Context, client testingv1.TestServiceClient) (grpc.ClientStream, error) {
		st, err := client.Watch(ctx, &testingv1.WatchRequest{Count: 3})
		if err != nil {
			return nil, err
		}
		n := 0
		for {
			if _, err := st.Recv(); err == io.EOF {
				break
			} else if err != nil {
				return nil, err
			}
			n++
		}
		require.Equal(t, 3, n)
		return st, nil
	}},
	{"client-streaming", "Upload", 1, func(t *testing.T, ctx context.Context, client testingv1.TestServiceClient) (grpc.ClientStream, error) {
		st, err := client.Upload(ctx)
		if err != nil {
			return nil, err
		}
		for range 4 {
			require.NoError(t, st.Send(&testingv1.UploadRequest{Value: "u"}))
		}
		resp, err := st.CloseAndRecv()
		if err != nil {
			return nil, err
		}
		require.Equal(t, int32(4), resp.GetCount())
		return st, nil
	}},
	{"bidi-streaming", "Chat", 3, func(t *testing.T, ctx context.Context, client testingv1.TestServiceClient) (grpc.ClientStream, error) {
		st, err := client.Chat(ctx)
		if err != nil {
			return nil, err
		}
		for _, v := range []string{"a", "b", "c"} {
			require.NoError(t, st.Send(&testingv1.ChatRequest{Value: v}))
			m, err := st.Recv()
			if err != nil {
				return nil, err
			}
			require.Equal(t, v, m.GetValue())
		}
		require.NoError(t, st.CloseSend())
		_, err = st.Recv()
		require.ErrorIs(t, err, io.EOF)
		return st, nil
	}},
}

// requireSpentReported requires that a call under ctx, an attempt of 8
// units, whose middle tier spent spent units calling the dependency, got
// tollgate-spent spent in its trailer, that the origin was charged it, and
// that the dependency saw spent calls since it had seen before, each of the
// attempt and within its deadline.
func requireSpentReported(t *testing.T, ctx context.Context, trailer metadata.MD, spent int64, dep *seen, before int) {
	t.Helper()
	a, _ := interceptor.AttemptFromContext(ctx)
	require.Equal(t, []string{strconv.FormatInt(spent, 10)}, trailer.Get("tollgate-spent"))

	ledger, ok := budget.FromContext(ctx)
	require.True(t, ok)
	snap := ledger.Snapshot()
	require.Equal(t, spent, snap.Spent, "the origin is charged what the stream's handler spent")
	require.Equal(t, 8-spent, snap.Free)
	require.Zero(t, snap.Reserved+snap.Held)

	all, deadlines := dep.all()
	require.Len(t, all, before+int(spent))
	for i, got := range all[before:] {
		require.Equal(t, a.ID, got.ID)
		require.False(t, deadlines[before+i].After(a.Deadline))
	}
}

// Every stream kind works through NewClientInterceptors placed by hand, as
// the README shows (with StatsHandler and WithDisableRetry). When the flag
// that the stats handler was seen became per connection, the stream owner's
// per-try call state was left without it, and every stream made this way
// panicked on its first try (found by review; no test sent a stream through
// NewClientInterceptors).
func TestStreamsThroughPlainClientInterceptors(t *testing.T) {
	su, ss, err := interceptor.NewServerInterceptors(interceptor.WithTrustedPeer(interceptor.TrustAll))
	require.NoError(t, err)
	svc := &testsvc.Service{
		WatchFunc: func(_ *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
			return st.Send(&testingv1.WatchResponse{})
		},
		UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
			for {
				if _, err := st.Recv(); err == io.EOF {
					return st.SendAndClose(&testingv1.UploadResponse{})
				} else if err != nil {
					return err
				}
			}
		},
		ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
			for {
				if _, err := st.Recv(); err == io.EOF {
					return nil
				} else if err != nil {
					return err
				}
				if err := st.Send(&testingv1.ChatResponse{}); err != nil {
					return err
				}
			}
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, grpc.ChainUnaryInterceptor(su), grpc.ChainStreamInterceptor(ss))
	cu, cs, err := interceptor.NewClientInterceptors(interceptor.WithAllowance(3))
	require.NoError(t, err)
	client := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithChainUnaryInterceptor(cu), grpc.WithChainStreamInterceptor(cs),
		grpc.WithStatsHandler(interceptor.StatsHandler()), grpc.WithDisableRetry()))

	w, err := client.Watch(t.Context(), &testingv1.WatchRequest{})
	require.NoError(t, err)
	_, err = w.Recv()
	require.NoError(t, err, "server streaming")

	u, err := client.Upload(t.Context())
	require.NoError(t, err)
	require.NoError(t, u.Send(&testingv1.UploadRequest{}))
	_, err = u.CloseAndRecv()
	require.NoError(t, err, "client streaming")

	c, err := client.Chat(t.Context())
	require.NoError(t, err)
	require.NoError(t, c.Send(&testingv1.ChatRequest{}))
	_, err = c.Recv()
	require.NoError(t, err, "bidi streaming")
	require.NoError(t, c.CloseSend())
	_, err = c.Recv()
	require.ErrorIs(t, err, io.EOF)
}

// callingStreams is a middle tier's service whose stream handlers call the
// dependency with callDep: Watch calls it twice, then sends the count of
// messages asked for; Upload reads its stream to the end, calls it once and
// answers the count of messages read; Chat calls it once per message, and
// echoes each (echoChat).
func callingStreams(callDep func(ctx context.Context, n int) error) *testsvc.Service {
	return &testsvc.Service{
		WatchFunc: func(r *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
			if err := callDep(st.Context(), 2); err != nil {
				return err
			}
			for range r.GetCount() {
				if err := st.Send(&testingv1.WatchResponse{Value: "w"}); err != nil {
					return err
				}
			}
			return nil
		},
		UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
			n, err := testsvc.DrainUpload(st)
			if err != nil {
				return err
			}
			if err := callDep(st.Context(), 1); err != nil {
				return err
			}
			return st.SendAndClose(&testingv1.UploadResponse{Count: n})
		},
		ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
			return echoChat(st, func(*testingv1.ChatRequest) error { return callDep(st.Context(), 1) })
		},
	}
}

// getsFrom returns the callDep of callingStreams: n Get calls on dep,
// stopping at the first that fails (its error).
func getsFrom(dep testingv1.TestServiceClient) func(ctx context.Context, n int) error {
	return func(ctx context.Context, n int) error {
		for range n {
			if _, err := dep.Get(ctx, &testingv1.GetRequest{}); err != nil {
				return err
			}
		}
		return nil
	}
}

// eachChat calls each for every message of st until its client closes its
// side (nil) or a receive or each fails (that error).
func eachChat(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse], each func(*testingv1.ChatRequest) error) error {
	for {
		m, err := st.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := each(m); err != nil {
			return err
		}
	}
}

// echoChat answers each message of st with one of the same value, once
// each (when not nil) returned nil for it, as eachChat reads them.
func echoChat(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse], each func(*testingv1.ChatRequest) error) error {
	return eachChat(st, func(m *testingv1.ChatRequest) error {
		if each != nil {
			if err := each(m); err != nil {
				return err
			}
		}
		return st.Send(&testingv1.ChatResponse{Value: m.GetValue()})
	})
}
