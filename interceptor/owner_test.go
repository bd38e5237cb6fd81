package interceptor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// arrivals records when each call reached a handler, and the attempt
// deadline it carried.
type arrivals struct {
	mu        sync.Mutex
	at        []time.Time
	deadlines []time.Time
}

func (a *arrivals) note(ctx context.Context) {
	at, _ := interceptor.AttemptFromContext(ctx)
	a.mu.Lock()
	a.at = append(a.at, time.Now())
	a.deadlines = append(a.deadlines, at.Deadline)
	a.mu.Unlock()
}

// The attempt lasts twice the retry-after, so whether a wait fits never
// hangs on how fast the machine is: after try 2 (sent a retry-after or more
// after try 1) no wait of a retry-after fits, whatever the timing; after try
// 1 one does (jittered, it is at most 600 ms), leaving 300 ms and more, less
// try 1's round trip, that a late timer on a loaded machine would have to
// overrun. (With 400 ms and 150 ms, a try 2 refused late
// could leave a wait that fitted by a few ms; the timer then fired past it,
// and the repeat was refused locally, DEADLINE_UNREACHABLE.)
func TestRetryAfterIsHonouredAndBackoffNeverPassesTheDeadline(t *testing.T) {
	var got arrivals
	const retryAfter = 500 * time.Millisecond
	const attempt = 2 * retryAfter
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		got.note(ctx)
		return nil, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(retryAfter))
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithAttemptTimeout(attempt),
		// PerTryTimeout: without it each try gets an equal share of what is
		// left for the ten (some 100 ms), which a loaded machine's round trip
		// can outlast; the try then ends by its own deadline, not with the
		// refusal, and its repeat rightly follows the 1 ms backoff.
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 10, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond,
			PerTryTimeout: attempt}),
	)...))
	_, err := client.Get(t.Context(), &testingv1.GetRequest{})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind)
	require.Equal(t, status.ReasonQueueFull, o.Reason, "the call ends with its last refusal when no wait fits before the deadline")

	got.mu.Lock()
	defer got.mu.Unlock()
	require.GreaterOrEqual(t, len(got.at), 1)
	for i := 1; i < len(got.at); i++ {
		require.GreaterOrEqual(t, got.at[i].Sub(got.at[i-1]), retryAfter, "a repeat never comes sooner than the retry-after")
	}
	for _, d := range got.deadlines {
		require.Equal(t, got.deadlines[0], d, "every try carries the one deadline")
	}
	// The attempt leaves room for at most two tries a retry-after apart:
	// the deadline, not the policy's ten tries, ended the call.
	require.LessOrEqual(t, len(got.at), 2)
}

func TestRetryBudgetStopsAStorm(t *testing.T) {
	svc := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return nil, status.NotAdmitted(status.ReasonQueueFull)
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Microsecond, MaxBackoff: time.Microsecond}),
	)...))
	const calls = 1000
	start := time.Now()
	exhausted := 0
	for range calls {
		_, err := client.Get(t.Context(), &testingv1.GetRequest{})
		if status.OutcomeOf(err).Reason == status.ReasonRetryBudgetExhausted {
			exhausted++
		}
	}
	elapsed := time.Since(start)
	retries := svc.Calls("Get") - calls
	// 10% of requests, plus the floor of 1 token per second over the run,
	// plus the initial reserve of 10.
	limit := int64(calls/10) + int64(elapsed.Seconds()+1) + 10
	require.LessOrEqual(t, retries, limit, "retries stay within the budget (without it: %d)", 2*calls)
	require.Positive(t, retries, "the budget still lets some retries through")
	require.Positive(t, exhausted, "calls that could not repeat say so")
}

// TestThreeTiersOfRetriesShareOneAllowance: every tier has a 3-try policy
// and the dependency refuses everything. Independent caps would send 3×3×3 =
// 27 calls to the dependency; one allowance bounds every RPC below the origin.
func TestThreeTiersOfRetriesShareOneAllowance(t *testing.T) {
	policy := interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	dep := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return nil, status.NotAdmitted(status.ReasonQueueFull)
	}}
	depEnd := testsvc.StartT(t, testsvc.Bufconn, dep.Register, serverOpts()...)
	toDep := testingv1.NewTestServiceClient(depEnd.DialT(t, interceptor.DialOptions(policy, interceptor.WithoutRetryBudget())...))
	b := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return toDep.Get(ctx, r)
	}}
	bEnd := testsvc.StartT(t, testsvc.Bufconn, b.Register, serverOpts()...)
	toB := testingv1.NewTestServiceClient(bEnd.DialT(t, interceptor.DialOptions(policy, interceptor.WithoutRetryBudget())...))
	a := &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return toB.Get(ctx, r)
	}}
	aEnd := testsvc.StartT(t, testsvc.Bufconn, a.Register, serverOpts()...)
	const allowance = 8
	origin := testingv1.NewTestServiceClient(aEnd.DialT(t, interceptor.DialOptions(policy, interceptor.WithoutRetryBudget(),
		interceptor.WithAllowance(allowance))...))

	_, err := origin.Get(t.Context(), &testingv1.GetRequest{})
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonAllowanceExhausted, o.Reason)
	require.True(t, o.Final(), "the origin stops on the final ALLOWANCE_EXHAUSTED")
	below := b.Calls("Get") + dep.Calls("Get")
	require.LessOrEqual(t, below, int64(allowance), "RPCs below the origin never exceed the allowance")
	require.Less(t, dep.Calls("Get"), int64(27))
	require.Positive(t, dep.Calls("Get"))
}

// TestServiceConfigRetryIsNotASecondLoop: a service config with a retry
// policy beside tollgate's owner would multiply tries; DialOptions keeps
// grpc-go's retry disabled, so the server sees only the owner's tries. The
// server is a plain one, whose UNAVAILABLE goes out as it is, trailers-only:
// the answer grpc-go's retry would repeat (a tollgate server would have made
// it UNKNOWN, which no retry policy names).
func TestServiceConfigRetryIsNotASecondLoop(t *testing.T) {
	svc := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return nil, grpcstatus.Error(codes.Unavailable, "down")
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register)
	const sc = `{"methodConfig":[{"name":[{"service":"tollgate.testing.v1.TestService"}],
		"retryPolicy":{"maxAttempts":5,"initialBackoff":"0.001s","maxBackoff":"0.001s","backoffMultiplier":1,"retryableStatusCodes":["UNAVAILABLE"]}}]}`
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithDefaultServiceConfig(sc),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 2, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
	)...))
	_, err := client.Get(t.Context(), &testingv1.GetRequest{})
	require.Equal(t, codes.Unknown, grpcstatus.Code(err), "an UNAVAILABLE answer without a detail is UNKNOWN, never sent as UNAVAILABLE")
	require.Equal(t, int64(2), svc.Calls("Get"), "two tries of tollgate's owner, not 2 × 5")
}

func TestMethodRetryOverridesThePolicy(t *testing.T) {
	svc := &testsvc.Service{
		GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			return nil, status.NotAdmitted(status.ReasonQueueFull)
		},
		PutFunc: func(context.Context, *testingv1.PutRequest) (*testingv1.PutResponse, error) {
			return nil, status.NotAdmitted(status.ReasonQueueFull)
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	fast := interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(fast),
		interceptor.WithMethodRetry(testingv1.TestService_Get_FullMethodName, interceptor.RetryPolicy{MaxTries: 1}),
	)...))
	_, err := client.Get(t.Context(), &testingv1.GetRequest{})
	require.Error(t, err)
	_, err = client.Put(t.Context(), &testingv1.PutRequest{})
	require.Error(t, err)
	require.Equal(t, int64(1), svc.Calls("Get"), "the method's own policy: one try")
	require.Equal(t, int64(3), svc.Calls("Put"), "the default policy: three tries")

	_, err = interceptor.NewDialOptions(interceptor.WithMethodRetry("/x/y", interceptor.RetryPolicy{MaxTries: 99}))
	require.ErrorIs(t, err, interceptor.ErrInvalidOption)
}

// TestPushbackTrailerIsHonoured: a plain gRPC server (no tollgate) answers
// with grpc-retry-pushback-ms. A positive value is the least wait before the
// next try; a negative one means "do not retry", as grpc-go reads it.
func TestPushbackTrailerIsHonoured(t *testing.T) {
	var got arrivals
	var pushback string
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		got.note(ctx)
		_ = grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", pushback))
		return nil, grpcstatus.Error(codes.ResourceExhausted, "busy")
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register) // no tollgate on the server
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 2, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
	)...))

	pushback = "-1"
	_, err := client.Get(t.Context(), &testingv1.GetRequest{})
	require.Error(t, err)
	require.Equal(t, int64(1), svc.Calls("Get"), "a negative pushback stops the repeats")

	pushback = "120"
	_, err = client.Get(t.Context(), &testingv1.GetRequest{})
	require.Error(t, err)
	require.Equal(t, int64(3), svc.Calls("Get"))
	got.mu.Lock()
	defer got.mu.Unlock()
	require.GreaterOrEqual(t, got.at[2].Sub(got.at[1]), 120*time.Millisecond, "the repeat waited at least the pushback")
}
