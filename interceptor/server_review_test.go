package interceptor_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// finishGate is a memory store whose first Finish waits, after closing
// entered, until release is closed: a store slow to finish a record.
type finishGate struct {
	*idempotency.MemoryStore
	once             sync.Once
	entered, release chan struct{}
}

func newFinishGate(t *testing.T) *finishGate {
	return &finishGate{MemoryStore: memoryStore(t), entered: make(chan struct{}), release: make(chan struct{})}
}

func (s *finishGate) Finish(ctx context.Context, req idempotency.FinishRequest) error {
	first := false
	s.once.Do(func() { first = true })
	if first {
		close(s.entered)
		<-s.release
	}
	return s.MemoryStore.Finish(ctx, req)
}

// A stream's admission slot is its handler's, as a unary call's is: once
// the handler returned, the slot is given back before the record is
// finished, so that a store slow to finish records does not keep the class
// full of streams whose handlers have all ended (a unary call's slot was
// already given back before its finish).
// workCtrl is an admission controller whose one class, c, is the default
// class, closed when the test ends.
func workCtrl(t testing.TB, c admission.Class) *admission.Controller {
	t.Helper()
	ctrl, err := admission.New(admission.WithClasses(c), admission.WithDefaultClass(c.Name))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	return ctrl
}

// releaseOnce returns a function that lets the gate's held Finish go on;
// it also runs when the test ends (when an assertion fails first).
func (s *finishGate) releaseOnce(t testing.TB) func() {
	release := sync.OnceFunc(func() { close(s.release) })
	t.Cleanup(release)
	return release
}

// consumeOne consumes one item of key "k" in a goroutine; the channel
// returned has the stream's end.
func consumeOne(t *testing.T, client testingv1.TestServiceClient) <-chan error {
	done := make(chan error, 1)
	go func() {
		st, err := client.Consume(t.Context(), &testingv1.ConsumeRequest{Key: "k", Count: 1})
		if err == nil {
			_, err = recvConsumed(st)
		}
		done <- err
	}()
	return done
}

// runningIn is how many requests of ctrl's class "work" run.
func runningIn(ctrl *admission.Controller) int {
	cs, _ := ctrl.Stats().Class("work")
	return cs.Running
}

func TestStreamSlotFreeWhileItsRecordIsFinished(t *testing.T) {
	ctrl := workCtrl(t, admission.Class{Name: "work", Slots: 1})
	store := newFinishGate(t)
	c := newConsumer()
	end := startRecorded(t, c, store, []interceptor.ServerOption{interceptor.WithAdmission(ctrl)})
	client := testingv1.NewTestServiceClient(end.DialT(t))
	release := store.releaseOnce(t)
	done := consumeOne(t, client)
	<-store.entered // the handler returned; its record is being finished
	require.Zero(t, runningIn(ctrl), "the stream's handler ended: its slot is free while the store finishes its record")
	release()
	require.NoError(t, <-done)
	require.Zero(t, runningIn(ctrl))
}

// An attempt this server mints (the caller sent no tollgate header, or is
// not trusted) whose deadline — the request's own — has passed when
// tollgate's interceptor sees it can have no record: its ID was made here,
// now. It is refused DEADLINE_EXPIRED, final, at once, as a try that keeps
// no record is. A review found it was taken for a caller's late try and
// looked up as one: admitted in the control class and sent to the store, so
// that any caller, untrusted ones included, could fill the class
// AttemptService queries answer in (DESIGN.md §3.12), and load the store,
// with requests timed to expire on arrival.
func TestMintedAttemptPastItsDeadlineIsNoRecordLookup(t *testing.T) {
	for _, withAdmission := range []bool{false, true} {
		t.Run(map[bool]string{false: "no admission", true: "admission"}[withAdmission], func(t *testing.T) {
			ctrl := lateTryController(t,
				admission.WithClasses(admission.Class{Name: "work", Slots: 4},
					admission.Class{Name: admission.ControlClass, Slots: 1}),
				admission.WithDefaultClass("work"))
			st := newGatedStore(t)
			ledger := newLedger(nil)
			// Outside tollgate's interceptor, a per-method timeout that
			// leaves the request no time (as a request whose grpc-timeout
			// ran out on its way).
			expire := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
				if info.FullMethod != testingv1.TestService_Apply_FullMethodName {
					return handler(ctx, req)
				}
				ctx, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Millisecond))
				defer cancel()
				return handler(ctx, req)
			})
			opts := []interceptor.ServerOption{interceptor.WithAttemptStore(st)}
			if withAdmission {
				opts = append(opts, interceptor.WithAdmission(ctrl))
			}
			end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
				ledger.Register(s)
				tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(st))
			}, append([]grpc.ServerOption{expire}, serverOpts(opts...)...)...)
			client := testingv1.NewTestServiceClient(end.DialT(t)) // no tollgate header: the server mints the attempt

			_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "acct", Amount: 1})
			o := status.OutcomeOf(err)
			require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
			require.Equal(t, status.ReasonDeadlineExpired, o.Reason, "%v", err)
			require.True(t, o.Final(), "%v", err)
			require.Empty(t, o.Detail.GetWorkloadClass(), "no class refused it: %v", err)
			require.Zero(t, st.lateBegins.Load(), "an attempt minted here has no record to look up")
			control, _ := ctrl.Stats().Class(admission.ControlClass)
			require.Zero(t, control.Admitted+uint64(len(control.Refused)), "nor is it admitted or refused in the control class")
			require.Zero(t, ledger.effects.Load())
		})
	}
}

// expiredStream is a server stream whose context's deadline has passed.
type expiredStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s expiredStream) Context() context.Context { return s.ctx }

// The same holds for a stream: a recorded server-streaming call of an
// attempt minted here, past its deadline on arrival, is refused
// DEADLINE_EXPIRED, final, and its store is not asked (it was asked on an
// expired context, and the call refused STORE_UNAVAILABLE).
func TestMintedStreamPastItsDeadlineIsNoRecordLookup(t *testing.T) {
	st := newGatedStore(t)
	c := newConsumer()
	expire := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, cancel := context.WithDeadline(ss.Context(), time.Now().Add(-time.Millisecond))
		defer cancel()
		return handler(srv, expiredStream{ServerStream: ss, ctx: ctx})
	})
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		testingv1.RegisterTestServiceServer(s, c)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(st))
	}, append([]grpc.ServerOption{expire}, serverOpts(interceptor.WithAttemptStore(st))...)...) // expire outside tollgate's
	client := testingv1.NewTestServiceClient(end.DialT(t))
	s, err := client.Consume(t.Context(), &testingv1.ConsumeRequest{Key: "k", Count: 1})
	require.NoError(t, err)
	_, err = recvConsumed(s)
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonDeadlineExpired, o.Reason, "%v", err)
	require.True(t, o.Final(), "%v", err)
	require.Zero(t, st.lateBegins.Load(), "an attempt minted here has no record to look up")
	require.Zero(t, c.runs.Load())
}

// panickyStore is a memory store whose Begin panics for the call key
// "begin-bug" and whose Finish panics for "finish-bug" (a bug in a
// third-party store, say).
type panickyStore struct{ *idempotency.MemoryStore }

func (s panickyStore) Begin(ctx context.Context, req idempotency.BeginRequest) (idempotency.BeginResult, error) {
	if req.Key.Call == "begin-bug" {
		panic("store bug in Begin")
	}
	return s.MemoryStore.Begin(ctx, req)
}

func (s panickyStore) Finish(ctx context.Context, req idempotency.FinishRequest) error {
	if req.Key.Call == "finish-bug" {
		panic("store bug in Finish")
	}
	return s.MemoryStore.Finish(ctx, req)
}

// WithRecovery covers the data path's store calls as it covers the
// AttemptService's (whose handler calls the same Store): a Store that
// panics in Begin or Finish, on a server that opted into recovery, is
// answered as a store failure — NOT_ADMITTED STORE_UNAVAILABLE before the
// handler ran, UNKNOWN after it — naming the try, with tollgate-spent for a
// strict caller. A review found the panic escaped tollgate's interceptor
// (the process dies without a recovery of the user's own outside it, and
// with one the answer carried no detail and no tollgate-spent).
func TestRecoveryCoversTheDataPathStore(t *testing.T) {
	store := panickyStore{memoryStore(t)}
	var escaped atomic.Int64
	outer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil { // stands in for the process dying
				escaped.Add(1)
				err = grpcstatus.Error(codes.Internal, "panic escaped tollgate")
			}
		}()
		return h(ctx, req)
	})
	ledger := newLedger(nil)
	end := testsvc.StartT(t, testsvc.Bufconn, ledger.Register,
		append([]grpc.ServerOption{outer}, serverOpts(interceptor.WithAttemptStore(store), interceptor.WithRecovery())...)...)
	client := testingv1.NewTestServiceClient(end.DialT(t))
	actx, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(actx)
	d := strconvFormat(time.Now().Add(5 * time.Second).UnixMilli())

	for _, tc := range []struct {
		call string
		kind status.Kind
		runs int64
	}{
		{"begin-bug", status.KindNotAdmitted, 0},
		{"finish-bug", status.KindUnknown, 1},
	} {
		var tr metadata.MD
		ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a="+a.ID+";c="+tc.call+";t=1;d="+d+";r=1")
		_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 1}, grpc.Trailer(&tr))
		o := status.OutcomeOf(err)
		require.Equal(t, tc.kind, o.Kind, "%s: %v", tc.call, err)
		require.Equal(t, a.ID, o.Detail.GetAttemptId(), "%s: the answer names the try: %v", tc.call, err)
		require.Equal(t, tc.call, o.Detail.GetCall())
		require.Equal(t, []string{"0"}, tr.Get("tollgate-spent"), "%s: a strict caller learns what was spent", tc.call)
		require.Equal(t, tc.runs, ledger.effects.Load(), tc.call)
	}
	require.Zero(t, escaped.Load(), "with WithRecovery a store's panic escaped tollgate's interceptor")
}

// So too when the stream's handler panics and the panic goes on up (no
// WithRecovery; a recovery of the user's own outside tollgate's answers
// it): the slot is given back before tollgate finishes the record UNKNOWN.
func TestPanickedStreamSlotFreeWhileItsRecordIsFinished(t *testing.T) {
	ctrl := workCtrl(t, admission.Class{Name: "work", Slots: 1})
	store := newFinishGate(t)
	c := newConsumer()
	c.consume = func(*testingv1.ConsumeRequest, grpc.ServerStreamingServer[testingv1.ConsumeResponse]) error {
		panic("handler bug")
	}
	outer := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = grpcstatus.Error(codes.Internal, "recovered")
			}
		}()
		return h(srv, ss)
	})
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { testingv1.RegisterTestServiceServer(s, c) },
		append([]grpc.ServerOption{outer}, serverOpts(interceptor.WithAttemptStore(store), interceptor.WithAdmission(ctrl))...)...)
	client := testingv1.NewTestServiceClient(end.DialT(t))
	release := store.releaseOnce(t)
	done := consumeOne(t, client)
	<-store.entered // the handler panicked; tollgate finishes its record
	require.Zero(t, runningIn(ctrl), "the stream's handler ended: its slot is free while the store finishes its record")
	release()
	require.Equal(t, codes.Internal, grpcstatus.Code(<-done))
	require.Zero(t, runningIn(ctrl))
}
