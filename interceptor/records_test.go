package interceptor_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
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
	"google.golang.org/protobuf/proto"
)

// ledgerService is a state-changing service: Apply adds to a total and
// counts how many times its effect ran.
type ledgerService struct {
	testsvc.Service
	mu      sync.Mutex
	total   int64
	effects atomic.Int64
}

func newLedger(slow func(ctx context.Context, r *testingv1.ApplyRequest)) *ledgerService {
	l := &ledgerService{}
	l.ApplyFunc = func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		if r.GetKey() == "missing" {
			return nil, grpcstatus.Error(codes.NotFound, "no such account")
		}
		l.mu.Lock()
		l.total += r.GetAmount()
		total := l.total
		l.mu.Unlock()
		l.effects.Add(1)
		if slow != nil {
			slow(ctx, r) // the effect has happened; the answer is slow
		}
		return &testingv1.ApplyResponse{Total: total}, nil
	}
	return l
}

// memoryStore is a memory store with no clock skew, like the test servers:
// attempts minted right after it was built lie inside its horizon.
func memoryStore(t *testing.T) *idempotency.MemoryStore {
	t.Helper()
	p := idempotency.DefaultPolicy()
	p.Skew = 0
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p))
	require.NoError(t, err)
	return store
}

// recordedServer runs svc with a memory store and the AttemptService, behind
// the extra (outer) server options given.
func recordedServer(t *testing.T, svc *testsvc.Service, store idempotency.Store, outer ...grpc.ServerOption) *testsvc.Endpoint {
	t.Helper()
	opts := append(outer, serverOpts(interceptor.WithAttemptStore(store))...)
	return testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		svc.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, opts...)
}

func TestConcurrentTriesOfOneCallRunTheHandlerOnce(t *testing.T) {
	ledger := newLedger(nil)
	end := recordedServer(t, &ledger.Service, memoryStore(t))
	client := testingv1.NewTestServiceClient(end.DialT(t)) // raw gRPC: the test plays the owner
	id, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(id)
	hdr := "a=" + a.ID + ";c=0;d=" + itoa(a.Deadline.UnixMilli())

	const n = 50
	var wg sync.WaitGroup
	results := make([]error, n)
	totals := make([]int64, n)
	for i := range n {
		wg.Go(func() {
			ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", hdr+";t="+itoa(int64(1+i%3)))
			resp, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 5})
			results[i], totals[i] = err, resp.GetTotal()
		})
	}
	wg.Wait()
	require.Equal(t, int64(1), ledger.effects.Load(), "the handler ran once")
	for i, err := range results {
		if err == nil {
			require.Equal(t, int64(5), totals[i], "every success is the one result")
			continue
		}
		o := status.OutcomeOf(err)
		require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
		require.Equal(t, status.ReasonAttemptInProgress, o.Reason)
	}

	// A second call of the same attempt to the same method is a call of its
	// own: it runs.
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a="+a.ID+";c=1;d="+itoa(a.Deadline.UnixMilli()))
	resp, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 5})
	require.NoError(t, err)
	require.Equal(t, int64(10), resp.GetTotal())
	require.Equal(t, int64(2), ledger.effects.Load())
}

func TestFinishedRecordsAnswerEveryLaterTry(t *testing.T) {
	ledger := newLedger(nil)
	end := recordedServer(t, &ledger.Service, memoryStore(t))
	client := testingv1.NewTestServiceClient(end.DialT(t))
	id, _ := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	a, _ := interceptor.AttemptFromContext(id)
	send := func(call string, try int64, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate",
			"a="+a.ID+";c="+call+";t="+itoa(try)+";d="+itoa(a.Deadline.UnixMilli()))
		return client.Apply(ctx, r)
	}
	first, err := send("0", 1, &testingv1.ApplyRequest{Key: "acct", Amount: 7})
	require.NoError(t, err)
	again, err := send("0", 3, &testingv1.ApplyRequest{Key: "acct", Amount: 7})
	require.NoError(t, err)
	require.Equal(t, first.GetTotal(), again.GetTotal(), "a SUCCEEDED record replays its response")
	require.Equal(t, int64(1), ledger.effects.Load())

	_, err = send("0", 4, &testingv1.ApplyRequest{Key: "acct", Amount: 8})
	o := status.OutcomeOf(err)
	require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err))
	require.Equal(t, status.ReasonAttemptRequestMismatch, o.Reason)
	require.Equal(t, tollgatev1.Outcome_OUTCOME_COMMITTED, o.Detail.GetOutcome(), "the mismatch says what the record holds")
	require.True(t, o.Final())

	_, err = send("1", 1, &testingv1.ApplyRequest{Key: "missing"})
	require.Equal(t, codes.NotFound, grpcstatus.Code(err))
	_, err = send("1", 2, &testingv1.ApplyRequest{Key: "missing"})
	require.Equal(t, codes.NotFound, grpcstatus.Code(err), "a FAILED record replays its definite error")
	require.Equal(t, "no such account", grpcstatus.Convert(err).Message())
}

// TestOwnerResolvesATryThatTimedOutAfterCommit: the client stops waiting
// (per-try timeout) after the effect happened; the server finishes the try
// on its detached context; the owner fences, polls while IN_PROGRESS, and
// returns the stored response. The effect ran once.
func TestOwnerResolvesATryThatTimedOutAfterCommit(t *testing.T) {
	release := make(chan struct{})
	ledger := newLedger(func(ctx context.Context, _ *testingv1.ApplyRequest) {
		select {
		case <-release:
		case <-ctx.Done():
		}
	})
	end := recordedServer(t, &ledger.Service, memoryStore(t))
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithAttemptTimeout(5*time.Second),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, PerTryTimeout: 50 * time.Millisecond,
			InitialBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond}),
	)...))
	go func() {
		// Let the handler finish only once the client has given up on try 1.
		for ledger.effects.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond)
		close(release)
	}()
	resp, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "acct", Amount: 3})
	require.NoError(t, err)
	require.Equal(t, int64(3), resp.GetTotal(), "the stored response of the one run")
	require.Equal(t, int64(1), ledger.effects.Load(), "never twice")
	require.Equal(t, int64(1), ledger.Calls("Apply"), "the owner queried instead of repeating")
}

// TestOwnerFencesATryThatNeverRan: a proxy in front of the server fails the
// first try without forwarding it. The owner cannot know that: it fences
// try 1, the absent record becomes a tombstone, and try 2 runs the handler.
func TestOwnerFencesATryThatNeverRan(t *testing.T) {
	ledger := newLedger(nil)
	var dropped atomic.Bool
	dropFirst := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if info.FullMethod == testingv1.TestService_Apply_FullMethodName && dropped.CompareAndSwap(false, true) {
			return nil, grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
		}
		return h(ctx, req)
	})
	store := memoryStore(t)
	end := recordedServer(t, &ledger.Service, store, dropFirst)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
	)...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	resp, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 2})
	require.NoError(t, err)
	require.Equal(t, int64(2), resp.GetTotal())
	require.Equal(t, int64(1), ledger.effects.Load())
	a, _ := interceptor.AttemptFromContext(ctx)
	rec, err := store.Get(t.Context(), idempotency.Key{AttemptID: a.ID, Call: "0", Method: testingv1.TestService_Apply_FullMethodName})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
	require.Equal(t, uint32(2), rec.GetTry(), "try 1 was fenced; try 2 ran")
	require.Equal(t, uint32(1), rec.GetFencedThroughTry())
	ledgerOf, _ := budget.FromContext(ctx)
	require.Zero(t, ledgerOf.Snapshot().Held, "the finished record reconciled the held grant")
}

// TestUnknownWithoutAttemptServiceStops: a callee that keeps no records
// cannot be queried; a method with side effects ends UNKNOWN with its
// attempt ID, while an IDEMPOTENT one may repeat without the query.
func TestUnknownWithoutAttemptServiceStops(t *testing.T) {
	var applies, puts atomic.Int64
	svc := &testsvc.Service{
		ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			applies.Add(1)
			return nil, grpcstatus.Error(codes.Internal, "boom")
		},
		PutFunc: func(context.Context, *testingv1.PutRequest) (*testingv1.PutResponse, error) {
			if puts.Add(1) == 1 {
				return nil, grpcstatus.Error(codes.Internal, "boom")
			}
			return &testingv1.PutResponse{Value: "v"}, nil
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
	)...))
	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind)
	require.NotEmpty(t, o.Detail.GetAttemptId(), "UNKNOWN names its attempt")
	require.Equal(t, int64(1), applies.Load(), "never repeated blindly")

	resp, err := client.Put(t.Context(), &testingv1.PutRequest{Key: "k", Value: "v"})
	require.NoError(t, err)
	require.Equal(t, "v", resp.GetValue())
	require.Equal(t, int64(2), puts.Load(), "an IDEMPOTENT method repeats at a callee without records")
}

// TestUnverifiableFirstTryIsNotAdmitted: a store built after the attempt
// began (here: within the clock skew of it) cannot vouch for the attempt's
// earlier tries. The server answers UNKNOWN, ATTEMPT_UNVERIFIABLE, final,
// without running the handler; the owner of a per-run key knows nobody else
// can have sent its first try, so the call ends NOT_ADMITTED, final.
func TestUnverifiableFirstTryIsNotAdmitted(t *testing.T) {
	ledger := newLedger(nil)
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica) // default skew: 500 ms
	require.NoError(t, err)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		ledger.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, interceptor.ServerOptions(interceptor.WithTrustedPeer(interceptor.TrustAll), interceptor.WithAttemptStore(store))...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))

	_, err = client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonAttemptUnverifiable, o.Reason)
	require.True(t, o.Final())
	require.Zero(t, ledger.effects.Load(), "the handler never ran")

	// Raw: a later try of the same attempt is UNKNOWN (someone may have sent
	// try 1), final.
	id, _ := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	a, _ := interceptor.AttemptFromContext(id)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a="+a.ID+";t=2;d="+itoa(a.Deadline.UnixMilli()))
	_, err = testingv1.NewTestServiceClient(end.DialT(t)).Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 1})
	o = status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind)
	require.Equal(t, status.ReasonAttemptUnverifiable, o.Reason)
	require.True(t, o.Final())
	require.Zero(t, ledger.effects.Load())
}

// TestALateTryIsAnsweredByItsRecord: a try that comes after the attempt's
// deadline is answered by a finished record (its stored response), and
// refused DEADLINE_EXPIRED only when there is none.
func TestALateTryIsAnsweredByItsRecord(t *testing.T) {
	ledger := newLedger(nil)
	end := recordedServer(t, &ledger.Service, memoryStore(t))
	client := testingv1.NewTestServiceClient(end.DialT(t))
	id, _ := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	a, _ := interceptor.AttemptFromContext(id)
	send := func(call string, try, deadline int64) (*testingv1.ApplyResponse, error) {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate",
			"a="+a.ID+";c="+call+";t="+itoa(try)+";d="+itoa(deadline))
		return client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 4})
	}
	later := time.Now().Add(2 * time.Second).UnixMilli()
	first, err := send("0", 1, later)
	require.NoError(t, err)
	past := time.Now().Add(-time.Second).UnixMilli()
	again, err := send("0", 2, past)
	require.NoError(t, err, "the late try gets the stored response, not DEADLINE_EXPIRED")
	require.Equal(t, first.GetTotal(), again.GetTotal())
	require.Equal(t, int64(1), ledger.effects.Load())

	_, err = send("1", 1, past)
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonDeadlineExpired, o.Reason, "no record: the late try is refused")
	require.True(t, o.Final())
	require.Equal(t, int64(1), ledger.effects.Load())
}

// spoilingCodec decodes as the proto codec, then gives an ApplyRequest keyed
// "spoil" a key that is not UTF-8, which proto.Marshal refuses: a request
// the handler could read but the record's fingerprint cannot be taken of.
type spoilingCodec struct{}

func (spoilingCodec) Marshal(v any) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }
func (spoilingCodec) Name() string                  { return "proto" }
func (spoilingCodec) Unmarshal(data []byte, v any) error {
	if err := proto.Unmarshal(data, v.(proto.Message)); err != nil {
		return err
	}
	if r, ok := v.(*testingv1.ApplyRequest); ok && r.GetKey() == "spoil" {
		r.Key = "\xff"
	}
	return nil
}

// TestUnfingerprintableRequestIsRefusedFinally: a request whose fingerprint
// cannot be taken is refused REQUEST_TOO_LARGE before it runs, and the
// refusal is final, as admission's REQUEST_TOO_LARGE is: the same request
// fails the same way on every try, so the owner must not repeat it. Before,
// the refusal was not final, and the owner spent its tries on it.
func TestUnfingerprintableRequestIsRefusedFinally(t *testing.T) {
	ledger := newLedger(nil)
	end := recordedServer(t, &ledger.Service, memoryStore(t), grpc.ForceServerCodec(spoilingCodec{}))
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))...))
	var trailer metadata.MD
	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "spoil", Amount: 1}, grpc.Trailer(&trailer))
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonRequestTooLarge, o.Reason)
	require.True(t, o.Final(), "the same request cannot be fingerprinted on any try")
	require.Equal(t, uint32(1), o.Detail.GetTry(), "the owner stops after the first try")
	require.Zero(t, ledger.Calls("Apply"), "the handler never ran")
}

// TestBeforeHorizonRetryAfterNeverWraps: the retry-after of a try refused
// for coming before its store's horizon is the time until the horizon
// (plus the skew), jittered upwards by up to a half. A horizon centuries
// ahead (a Redis horizon key may hold any time up to the year 9999) made
// Time.Sub saturate at the longest Duration, and the jitter then wrapped it
// negative: a refusal asking its caller to come back in the past.
func TestBeforeHorizonRetryAfterNeverWraps(t *testing.T) {
	for _, from := range []time.Time{
		time.Now().Add(time.Hour),
		time.Now().AddDate(200, 0, 0),
		time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC),
	} {
		for range 20 { // the jitter is random; a wrap needs only a draw over 0
			err := interceptor.BeforeHorizonRefusal(from)
			require.Equal(t, status.ReasonAttemptUnverifiable, status.OutcomeOf(err).Reason)
			d, ok := status.RetryAfter(err)
			require.True(t, ok, "a retry-after is suggested for a horizon at %v", from)
			require.GreaterOrEqual(t, d, time.Until(from)/2, "the wait reaches towards the horizon at %v", from)
		}
	}
}
