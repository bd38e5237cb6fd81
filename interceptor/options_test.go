package interceptor_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// Every option rejects what it cannot mean, at construction, with an error
// wrapping ErrInvalidOption that names the option's value; the edges it
// accepts are accepted.
func TestOptionsRejectInvalidValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  interceptor.ClientOption
		ok   bool
	}{
		{"allowance -1", interceptor.WithAllowance(-1), false},
		{"allowance 0", interceptor.WithAllowance(0), true},
		{"allowance 1,000,001", interceptor.WithAllowance(1_000_001), false},
		{"attempt timeout 0", interceptor.WithAttemptTimeout(0), false},
		{"attempt timeout -1s", interceptor.WithAttemptTimeout(-time.Second), false},
		{"hop margin -1ms", interceptor.WithHopMargin(-time.Millisecond), false},
		{"hop margin 0", interceptor.WithHopMargin(0), true},
		{"min try time -1ms", interceptor.WithMinTryTime(-time.Millisecond), false},
		{"min try time 0", interceptor.WithMinTryTime(0), true},
		{"resolution grace -1s", interceptor.WithResolutionGrace(-time.Second), false},
		{"resolution grace 2m", interceptor.WithResolutionGrace(2 * time.Minute), false},
		{"resolution grace 1m", interceptor.WithResolutionGrace(time.Minute), true},
		{"nil tracer provider", interceptor.WithClientTracerProvider(nil), false},
		{"nil meter provider", interceptor.WithClientMeterProvider(nil), false},
		{"retry MaxTries 11", interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 11}), false},
		{"retry negative backoff", interceptor.WithRetry(interceptor.RetryPolicy{InitialBackoff: -1}), false},
		{"retry negative per-try", interceptor.WithRetry(interceptor.RetryPolicy{PerTryTimeout: -1}), false},
		{"retry max below initial", interceptor.WithRetry(interceptor.RetryPolicy{InitialBackoff: time.Second, MaxBackoff: time.Millisecond}), false},
		{"attempt timeout 24h", interceptor.WithAttemptTimeout(24 * time.Hour), true},
		{"retry max backoff below the default initial", interceptor.WithRetry(interceptor.RetryPolicy{MaxBackoff: 5 * time.Millisecond}), true},
		{"retry initial backoff above the default max", interceptor.WithRetry(interceptor.RetryPolicy{InitialBackoff: 2 * time.Second}), true},
		{"retry initial backoff 24h", interceptor.WithRetry(interceptor.RetryPolicy{InitialBackoff: 24 * time.Hour}), true},
		{"retry initial backoff 25h", interceptor.WithRetry(interceptor.RetryPolicy{InitialBackoff: 25 * time.Hour}), false},
		{"retry max backoff 25h", interceptor.WithRetry(interceptor.RetryPolicy{MaxBackoff: 25 * time.Hour}), false},
		{"attempt timeout 48h", interceptor.WithAttemptTimeout(48 * time.Hour), false},
		{"method retry /pkg.S/M", interceptor.WithMethodRetry("/pkg.S/M", interceptor.RetryPolicy{MaxTries: 1}), true},
		{"method retry without the leading slash", interceptor.WithMethodRetry("pkg.S/M", interceptor.RetryPolicy{MaxTries: 1}), false},
		{"method retry without a method", interceptor.WithMethodRetry("/pkg.S/", interceptor.RetryPolicy{MaxTries: 1}), false},
		{"method retry without a service", interceptor.WithMethodRetry("//M", interceptor.RetryPolicy{MaxTries: 1}), false},
		{"method retry with a third part", interceptor.WithMethodRetry("/pkg.S/M/x", interceptor.RetryPolicy{MaxTries: 1}), false},
	} {
		t.Run("client/"+tc.name, func(t *testing.T) {
			_, err := interceptor.NewDialOptions(tc.opt)
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, interceptor.ErrInvalidOption)
			require.True(t, strings.HasPrefix(err.Error(), "interceptor: "), "messages name the package: %v", err)
		})
	}
	for _, tc := range []struct {
		name string
		opts []interceptor.ServerOption
		ok   bool
	}{
		{"nil tenant function", []interceptor.ServerOption{interceptor.WithTenant(nil)}, false},
		{"nil trusted-peer function", []interceptor.ServerOption{interceptor.WithTrustedPeer(nil)}, false},
		{"max allowance -1", []interceptor.ServerOption{interceptor.WithMaxAllowance(-1)}, false},
		{"max allowance 1,000,001", []interceptor.ServerOption{interceptor.WithMaxAllowance(1_000_001)}, false},
		{"default allowance over the maximum", []interceptor.ServerOption{interceptor.WithMaxAllowance(10), interceptor.WithDefaultAllowance(11)}, false},
		{"default allowance -1", []interceptor.ServerOption{interceptor.WithDefaultAllowance(-1)}, false},
		{"default allowance 0", []interceptor.ServerOption{interceptor.WithDefaultAllowance(0)}, true},
		{"max attempt time 0", []interceptor.ServerOption{interceptor.WithMaxAttemptTime(0)}, false},
		{"clock skew 2m", []interceptor.ServerOption{interceptor.WithClockSkew(2 * time.Minute)}, false},
		{"clock skew 0", []interceptor.ServerOption{interceptor.WithClockSkew(0)}, true},
		{"max recv msg size 0", []interceptor.ServerOption{interceptor.WithMaxRecvMsgSize(0)}, false},
		{"max recv msg size -1", []interceptor.ServerOption{interceptor.WithMaxRecvMsgSize(-1)}, false},
		{"max concurrent streams 0", []interceptor.ServerOption{interceptor.WithMaxConcurrentStreams(0)}, false},
		{"max concurrent streams 1", []interceptor.ServerOption{interceptor.WithMaxConcurrentStreams(1)}, true},
		{"nil meter provider", []interceptor.ServerOption{interceptor.WithServerMeterProvider(nil)}, false},
		{"typed nil attempt store", []interceptor.ServerOption{interceptor.WithAttemptStore((*idempotency.MemoryStore)(nil))}, false},
		{"nil attempt store", []interceptor.ServerOption{interceptor.WithAttemptStore(nil)}, false},
	} {
		t.Run("server/"+tc.name, func(t *testing.T) {
			_, err := interceptor.NewServerOptions(tc.opts...)
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, interceptor.ErrInvalidOption)
			require.True(t, strings.HasPrefix(err.Error(), "interceptor: "), "messages name the package: %v", err)
			require.Panics(t, func() { interceptor.ServerOptions(tc.opts...) }, "ServerOptions panics as regexp.MustCompile does")
		})
	}
}

// WithDefaultAllowance is the allowance of an attempt that starts at the
// server: a caller it does not trust gets it, whatever its header says.
func TestDefaultAllowanceForAnUntrustedCaller(t *testing.T) {
	totals := make(chan int64, 1)
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		a, _ := budget.FromContext(ctx)
		totals <- a.Snapshot().Total
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, interceptor.ServerOptions(interceptor.WithDefaultAllowance(7))...)
	c := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(interceptor.WithAllowance(40))...))
	_, err := c.Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err)
	require.Equal(t, int64(7), <-totals, "an untrusted caller's grant is not used; the server's default is")
}

// WithMaxRecvMsgSize bounds a request before any interceptor sees it.
func TestMaxRecvMsgSizeBoundsRequests(t *testing.T) {
	svc := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, interceptor.ServerOptions(interceptor.WithMaxRecvMsgSize(1024))...)
	c := testingv1.NewTestServiceClient(end.DialT(t))
	_, err := c.Get(t.Context(), &testingv1.GetRequest{Key: strings.Repeat("k", 2048)})
	require.Equal(t, codes.ResourceExhausted, grpcstatus.Code(err), "%v", err)
	require.Zero(t, svc.Calls("Get"))
	_, err = c.Get(t.Context(), &testingv1.GetRequest{Key: "k"})
	require.NoError(t, err)
}

// WithMaxConcurrentStreams bounds the streams one connection may have open:
// a second stream waits, on the client, for the first to end.
func TestMaxConcurrentStreamsBoundsAConnection(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	opened := make(chan struct{}, 2)
	svc := &testsvc.Service{ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		opened <- struct{}{}
		<-release
		return nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, interceptor.ServerOptions(interceptor.WithMaxConcurrentStreams(1))...)
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	c := testingv1.NewTestServiceClient(end.DialT(t))
	first, err := c.Chat(t.Context())
	require.NoError(t, err)
	require.NoError(t, first.Send(&testingv1.ChatRequest{}))
	<-opened
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	second, err := c.Chat(ctx)
	if err == nil {
		_, err = second.Recv()
	}
	require.Equal(t, codes.DeadlineExceeded, grpcstatus.Code(err), "the second stream waited for a free stream: %v", err)
	require.Len(t, opened, 0, "the second stream never reached its handler")
	once.Do(func() { close(release) })
}

// WithMinTryTime: a try whose remaining time (after the hop margin) is under
// it is refused locally, DEADLINE_UNREACHABLE; nothing is sent.
func TestMinTryTimeRefusesShortTriesLocally(t *testing.T) {
	svc := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	// The caller's deadline, earlier than the attempt timeout, is the
	// attempt's (a minimum that leaves no time in WithAttemptTimeout's
	// attempts is refused by DialOptions).
	c := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithAttemptTimeout(time.Hour), interceptor.WithMinTryTime(time.Minute))...))
	short, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := c.Get(short, &testingv1.GetRequest{})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonDeadlineUnreachable, o.Reason)
	require.True(t, o.Final())
	require.Zero(t, svc.Calls("Get"), "nothing was sent")
}

// StartAttempt takes the attempt timeouts WithAttemptTimeout takes, and
// refuses the others as it does.
func TestStartAttemptBoundsItsTimeoutAsWithAttemptTimeout(t *testing.T) {
	for _, tc := range []struct {
		timeout time.Duration
		ok      bool
	}{{24 * time.Hour, true}, {24*time.Hour + time.Nanosecond, false}, {48 * time.Hour, false}, {0, false}} {
		_, err := interceptor.StartAttempt(t.Context(), 1, tc.timeout)
		_, optErr := interceptor.NewDialOptions(interceptor.WithAttemptTimeout(tc.timeout))
		if tc.ok {
			require.NoError(t, err, tc.timeout)
			require.NoError(t, optErr, tc.timeout)
			continue
		}
		require.ErrorIs(t, err, interceptor.ErrInvalidOption, tc.timeout)
		require.ErrorIs(t, optErr, interceptor.ErrInvalidOption, tc.timeout)
	}
}

// AdmissionTap refuses a nil controller when it is built, as it refuses
// invalid options, rather than handing grpc-go a handle that panics on the
// transport's reader goroutine at the first request.
func TestAdmissionTapPanicsAtOnceOnANilController(t *testing.T) {
	require.PanicsWithValue(t, "interceptor: AdmissionTap: nil admission controller", func() { interceptor.AdmissionTap(nil) })
}

// An invalid retry budget is refused with an error that matches both
// ErrInvalidOption and the budget package's own sentinel.
func TestInvalidRetryBudgetMatchesBothSentinels(t *testing.T) {
	_, err := interceptor.NewDialOptions(interceptor.WithRetryBudget(budget.WithRetryRatio(2)))
	require.ErrorIs(t, err, interceptor.ErrInvalidOption)
	require.ErrorIs(t, err, budget.ErrInvalidRetryBudget)
	require.NotContains(t, err.Error(), "retry budget: budget:", "the budget names itself once")
}

// A store that tells its policy is checked against WithClockSkew: a record's
// lease (the store's skew) shorter than the handler's time (the server's)
// would read ABANDONED while the handler still runs.
func TestAttemptStoreSkewMustMatchTheServers(t *testing.T) {
	p := idempotency.DefaultPolicy()
	p.Skew = 0
	store, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p))
	require.NoError(t, err)
	_, err = interceptor.NewServerOptions(interceptor.WithAttemptStore(store)) // server skew: 500 ms
	require.ErrorIs(t, err, interceptor.ErrInvalidOption)
	require.ErrorContains(t, err, "differs from the attempt store's policy skew 0s")
	_, err = interceptor.NewServerOptions(interceptor.WithAttemptStore(store), interceptor.WithClockSkew(0))
	require.NoError(t, err)
	def, err := idempotency.NewMemoryStore(idempotency.SingleReplica)
	require.NoError(t, err)
	_, err = interceptor.NewServerOptions(interceptor.WithAttemptStore(def)) // both default to 500 ms
	require.NoError(t, err)
}

// ValidCallKey answers as WithCallKey's calls would: the names they take,
// and an error naming the rule for the ones that fail MALFORMED_HEADER.
func TestValidCallKey(t *testing.T) {
	for name, ok := range map[string]bool{
		"reserve-stock": true, "a1": true, "x:y_z": true, strings.Repeat("a", 128): true,
		"": false, "123": false, "a.b": false, "a b": false, strings.Repeat("a", 129): false, "é": false,
	} {
		err := interceptor.ValidCallKey(name)
		if ok {
			require.NoError(t, err, name)
			continue
		}
		require.Error(t, err, name)
		require.ErrorContains(t, err, "interceptor: call key")
	}
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// No attempt lasts longer than 24 h (WithAttemptTimeout's and
// WithMaxAttemptTime's cap), so a hop margin or a minimum try time of more
// than that refuses every try of every call DEADLINE_UNREACHABLE: a value
// that can never work, which CONVENTIONS.md §2 wants refused at
// construction ("invalid values are an error at construction, not a
// surprise at call time"), as every other duration option is bounded.
func TestHopMarginOptionBounded(t *testing.T) {
	for name, opt := range map[string]interceptor.ClientOption{
		"hop margin":   interceptor.WithHopMargin(25 * time.Hour),
		"min try time": interceptor.WithMinTryTime(25 * time.Hour),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := interceptor.NewDialOptions(opt)
			require.ErrorIs(t, err, interceptor.ErrInvalidOption)
		})
	}
}
