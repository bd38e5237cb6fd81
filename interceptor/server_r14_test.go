package interceptor_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// r14Header is the tollgate header of try n of call "0" of attempt id with
// deadline d.
func r14Header(ctx context.Context, id uuid.UUID, n int, d time.Time) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "tollgate", fmt.Sprintf("a=%s;c=0;t=%d;d=%d", id, n, d.UnixMilli()))
}

// replayServer is a recorded server over store whose Apply handler answers
// an empty response, and a client of it whose header list limit is 8 KiB
// (grpc-java's and gRPC C++'s): the tests write a record straight into
// store and read what later tries of its call are answered.
func replayServer(t *testing.T, store idempotency.Store) (*testsvc.Service, testingv1.TestServiceClient) {
	t.Helper()
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return &testingv1.ApplyResponse{}, nil
	}}
	end := recordedServer(t, svc, store)
	return svc, testingv1.NewTestServiceClient(end.DialT(t, grpc.WithMaxHeaderListSize(8<<10)))
}

// writeFinishedTry1 writes straight into store the record of try 1 of call
// "0" of attempt id, an Apply of req with deadline d, begun and then
// finished as fin says (its State, Code, Message and Details; its Key, Try
// and Fingerprint are filled in here), as a build from before a fix, or a
// store's own writer, may have left it.
func writeFinishedTry1(t *testing.T, store idempotency.Store, id uuid.UUID, d time.Time, req *testingv1.ApplyRequest, fin idempotency.FinishRequest) {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	require.NoError(t, err)
	method := testingv1.TestService_Apply_FullMethodName
	key := idempotency.Key{AttemptID: id.String(), Call: "0", Method: method}
	fp := idempotency.Fingerprint(method, b)
	res, err := store.Begin(t.Context(), idempotency.BeginRequest{Key: key, Try: 1, Fingerprint: fp, Deadline: d})
	require.NoError(t, err)
	require.True(t, res.Started)
	fin.Key, fin.Try, fin.Fingerprint = key, 1, fp
	require.NoError(t, store.Finish(t.Context(), fin))
}

// r14DetailsWireSize is what details take in a status as it is sent.
func r14DetailsWireSize(details []*anypb.Any) int {
	return proto.Size(&spb.Status{Details: details})
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
//
// The server bounds a handler's fresh definite error (status.Bounded in
// answer) before it answers and records it, but a try answered from a
// finished record is sent what the record holds, unbounded: a FAILED record
// written by a build from before the bound, or by a store directly, whose
// message or details are larger than a caller's header list limit (8 KiB
// in grpc-java and gRPC C++) is lost by that caller to a transport
// INTERNAL, on every later try of the call. What is replayed must be
// bounded as the fresh answer is, and every later try reads the same one.
func TestR14ReplayOfAStoredFailedRecordIsBounded(t *testing.T) {
	big := strings.Repeat("x", 64<<10)
	var details []*anypb.Any
	for i := range 3 {
		a, err := anypb.New(&errdetails.DebugInfo{Detail: fmt.Sprintf("%d", i) + strings.Repeat("y", 16<<10)})
		require.NoError(t, err)
		details = append(details, a)
	}
	for _, tc := range []struct {
		name    string
		state   tollgatev1.AttemptState
		code    codes.Code
		msg     string
		details []*anypb.Any
	}{
		{"failed message", tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, codes.InvalidArgument, "bad request: " + big, nil},
		{"failed details", tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, codes.InvalidArgument, "bad request", details},
		{"unknown message and details", tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, codes.Internal, "lost: " + big, details},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := memoryStore(t)
			svc, client := replayServer(t, store)

			// Try 1's record, as an older build (or the store itself) left it.
			id, _ := uuid.NewV7()
			d := time.Now().Add(5 * time.Second)
			req := &testingv1.ApplyRequest{Key: "k"}
			writeFinishedTry1(t, store, id, d, req, idempotency.FinishRequest{
				State: tc.state, Code: tc.code, Message: tc.msg, Details: tc.details})

			var answers []string
			for n := 2; n <= 3; n++ {
				_, err := client.Apply(r14Header(t.Context(), id, n, d), req)
				st := grpcstatus.Convert(err)
				require.Equal(t, tc.code, st.Code(), "the record's answer arrives: %.300v", err)
				require.LessOrEqual(t, len(st.Message()), 1<<10, "the message is bounded")
				require.LessOrEqual(t, r14DetailsWireSize(st.Proto().GetDetails()), 4<<10,
					"the details are bounded (3 KiB carried, and tollgate's own)")
				answers = append(answers, st.Message())
			}
			require.Equal(t, answers[0], answers[1], "every try reads the same message")
			require.Zero(t, svc.Calls("Apply"), "the record answered: nothing ran")
		})
	}
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
//
// status.Bounded counts each detail by its type URL and encoded value
// only, not by the protobuf framing each detail takes in the status as
// sent (its Any's field tags and lengths, and its own tag and length in
// the status): thousands of tiny details count as next to nothing and pass
// the 3 KiB bound whole, and a handler's definite error carrying them
// reaches a caller whose header list limit is 8 KiB as a transport
// INTERNAL, while its record holds them all.
func TestR14ManyTinyDetailsAreBounded(t *testing.T) {
	store := memoryStore(t)
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		p := grpcstatus.New(codes.InvalidArgument, "bad request").Proto()
		for range 5000 {
			p.Details = append(p.Details, &anypb.Any{TypeUrl: "t"})
		}
		return nil, grpcstatus.FromProto(p).Err()
	}}
	end := recordedServer(t, svc, store)
	client := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithMaxHeaderListSize(8<<10)))

	id, _ := uuid.NewV7()
	d := time.Now().Add(5 * time.Second)
	_, err := client.Apply(r14Header(t.Context(), id, 1, d), &testingv1.ApplyRequest{Key: "k"})
	st := grpcstatus.Convert(err)
	require.Equal(t, codes.InvalidArgument, st.Code(), "the definite answer arrives: %.300v", err)
	require.LessOrEqual(t, r14DetailsWireSize(st.Proto().GetDetails()), 3<<10)
	require.NotEmpty(t, st.Proto().GetDetails(), "what fits is kept")

	rec, err := store.Get(t.Context(), idempotency.Key{AttemptID: id.String(), Call: "0", Method: testingv1.TestService_Apply_FullMethodName})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, rec.GetState())
	require.LessOrEqual(t, r14DetailsWireSize(rec.GetStatusDetails()), 3<<10, "the record holds what was answered")
}

// r14EndBeforeBegin is a memory store whose Begin, when armed, waits for the
// try's context to end before it begins (a slow store: the try's deadline,
// or its caller's cancellation, comes while the store works).
type r14EndBeforeBegin struct {
	*idempotency.MemoryStore
	mu    sync.Mutex
	armed bool
}

func (s *r14EndBeforeBegin) arm() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.armed = true
}

func (s *r14EndBeforeBegin) Begin(ctx context.Context, req idempotency.BeginRequest) (idempotency.BeginResult, error) {
	s.mu.Lock()
	armed := s.armed
	s.armed = false
	s.mu.Unlock()
	if armed {
		<-ctx.Done()
	}
	return s.MemoryStore.Begin(ctx, req)
}

// r14Misses sums tollgate.deadline.misses by stage.
func r14Misses(t *testing.T, rm metricdata.ResourceMetrics) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "tollgate.deadline.misses" {
				for _, dp := range sum.DataPoints {
					v, _ := dp.Attributes.Value("stage")
					out[v.AsString()] += dp.Value
				}
			}
		}
	}
	return out
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
//
// A recorded try whose context ended by its deadline while tollgate began
// it (the store's Begin was slow, or a timeout interceptor chained outside
// tollgate's cut it there) is refused DEADLINE_EXPIRED (contextEnded) and
// never runs, yet it went into no metric: it came in time, so it is no
// miss on arrival, and it had passed admission, so the controller's
// misses never see it. A store slow enough to make tries miss their
// deadlines showed nowhere in tollgate.deadline.misses. It is now counted
// there with stage=begin. A try its caller canceled is no deadline miss
// and is not counted (as admission counts a canceled waiter as cancelled,
// not as a miss).
func TestR14TryWhoseDeadlinePassedDuringBeginIsADeadlineMiss(t *testing.T) {
	for _, tc := range []struct {
		name   string
		end    func(context.Context) (context.Context, context.CancelFunc)
		reason status.Reason
		misses map[string]int64
	}{
		{"deadline", func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, 20*time.Millisecond)
		}, status.ReasonDeadlineExpired, map[string]int64{"begin": 1}},
		{"canceled", func(ctx context.Context) (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(ctx)
			t := time.AfterFunc(20*time.Millisecond, cancel) // its caller cancels while the store works
			return ctx, func() { t.Stop(); cancel() }
		}, status.ReasonUnspecified, map[string]int64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mp, reader := testMeter(t)
			store := &r14EndBeforeBegin{MemoryStore: memoryStore(t)}
			served := make(chan error, 1)
			// As a user's timeout interceptor, chained outside tollgate's.
			outer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				ctx, cancel := tc.end(ctx)
				defer cancel()
				resp, err := h(ctx, req)
				served <- err
				return resp, err
			})
			svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
				return &testingv1.ApplyResponse{}, nil
			}}
			opts := append([]grpc.ServerOption{outer}, serverOpts(interceptor.WithAttemptStore(store), interceptor.WithServerMeterProvider(mp))...)
			end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { svc.Register(s) }, opts...)
			client := testingv1.NewTestServiceClient(end.DialT(t))

			store.arm()
			id, _ := uuid.NewV7()
			_, err := client.Apply(r14Header(t.Context(), id, 1, time.Now().Add(5*time.Second)), &testingv1.ApplyRequest{Key: "k"})
			require.Error(t, err)
			o := status.OutcomeOf(<-served)
			require.Equal(t, status.KindNotAdmitted, o.Kind)
			require.Equal(t, tc.reason, o.Reason)
			require.Zero(t, svc.Calls("Apply"))

			var rm metricdata.ResourceMetrics
			require.NoError(t, reader.Collect(t.Context(), &rm))
			require.Equal(t, tc.misses, r14Misses(t, rm))
		})
	}
}

// r14LaggingStore is a memory store whose clock lags the server's: it
// begins a try the server already knows is past its attempt's deadline
// (the store starts it, with the lease it would give an attempt of its
// own deadline). When cut is set, the try's caller gives up while the
// store begins it: Begin cuts the try's context, then begins it anyway (as
// a store whose work had been sent when the cancellation came). Its Finish
// notes the deadline of the context it was given.
type r14LaggingStore struct {
	*idempotency.MemoryStore
	mu          sync.Mutex
	cut         context.CancelFunc
	finished    bool
	hasDeadline bool
	within      bool // the deadline was within a minute of the call
}

func (s *r14LaggingStore) Begin(ctx context.Context, req idempotency.BeginRequest) (idempotency.BeginResult, error) {
	req.Deadline = time.Now().Add(10 * time.Second)
	s.mu.Lock()
	cut := s.cut
	s.mu.Unlock()
	if cut != nil {
		cut()
		<-ctx.Done()
		ctx = context.WithoutCancel(ctx)
	}
	return s.MemoryStore.Begin(ctx, req)
}

func (s *r14LaggingStore) Finish(ctx context.Context, req idempotency.FinishRequest) error {
	dl, ok := ctx.Deadline()
	s.mu.Lock()
	s.finished, s.hasDeadline, s.within = true, ok, ok && dl.Before(time.Now().Add(time.Minute))
	s.mu.Unlock()
	return s.MemoryStore.Finish(ctx, req)
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
//
// A try that came after its attempt's deadline, and that a store whose
// clock lags started all the same, is ended as a tombstone, unrun
// (beginTry), with Finish called on the try's own context. When its
// caller had given up by then (the record was begun after the cancel, as
// a store whose work was sent before it comes), that context has ended:
// Finish fails, and the record stays IN_PROGRESS until its lease runs out
// and then reads ABANDONED — an UNKNOWN for a try that never ran — instead
// of the tombstone. And when the caller set no deadline (a plain client,
// no admission tap to bound it), the Finish has no time bound at all: a
// slow or hung store holds the goroutine for as long as the caller waits.
// The tombstone is now written on a context detached from the caller's
// cancellation and bounded by streamFinishTimeout, as the other Finish
// calls made after the caller may have left are.
func TestR14LateStartedTryIsTombstonedWithinABound(t *testing.T) {
	for _, tc := range []struct {
		name string
		cut  bool
	}{{"caller waiting, no deadline", false}, {"caller gave up during Begin", true}} {
		t.Run(tc.name, func(t *testing.T) {
			store := &r14LaggingStore{MemoryStore: memoryStore(t)}
			outer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				ctx, cancel := context.WithCancel(ctx)
				defer cancel()
				if tc.cut {
					store.mu.Lock()
					store.cut = cancel
					store.mu.Unlock()
				}
				return h(ctx, req)
			})
			svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
				return &testingv1.ApplyResponse{}, nil
			}}
			end := recordedServer(t, svc, store, outer)
			client := testingv1.NewTestServiceClient(end.DialT(t))

			id, _ := uuid.NewV7()
			_, err := client.Apply(r14Header(t.Context(), id, 1, time.Now().Add(-time.Second)), &testingv1.ApplyRequest{Key: "k"})
			require.Error(t, err)
			require.Zero(t, svc.Calls("Apply"), "the late try did not run")

			store.mu.Lock()
			finished, hasDeadline, within := store.finished, store.hasDeadline, store.within
			store.mu.Unlock()
			rec, err := store.Get(t.Context(), idempotency.Key{AttemptID: id.String(), Call: "0", Method: testingv1.TestService_Apply_FullMethodName})
			require.NoError(t, err)
			require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState(), "the late try is a tombstone: it never ran")
			require.True(t, finished, "the store was asked to end the late try")
			require.True(t, hasDeadline, "ending it is bounded in time")
			require.True(t, within, "by the server's finish timeout")
		})
	}
}
