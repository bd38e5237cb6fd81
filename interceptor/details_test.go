package interceptor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// A review found that wherever tollgate rebuilds a status error — a
// server re-addressing its handler's refusal or unknown outcome
// (server.answer), a client typing a try's error (owner.typed), concluding a
// call in doubt (owner.conclude), running out of retry budget
// (owner.budgetExhausted), changing a refusal's final flag (client.result),
// answering a first try the callee cannot vouch for (owner.decide) or a try
// its record fenced (owner.resolve) — the status it built held tollgate's
// own details only: whatever else the peer or the handler sent (a
// QuotaFailure, a BadRequest, another domain's ErrorInfo…) was lost, or, for
// an UNKNOWN outcome, all but its ErrorInfo. These tests send such details
// through real gRPC servers and check that the caller gets them after
// tollgate's own, in order, with one OutcomeDetail (the rebuilt one), one
// ErrorInfo (tollgate's, with the other domain's in its cause_ metadata) and
// at most one RetryInfo (tollgate's).

// foreignDetails are what a server that speaks google.rpc sends with its
// own errors: a QuotaFailure, its ErrorInfo, a RetryInfo of 5 s and a
// BadRequest. keptDetails are those the caller must find after tollgate's.
func foreignDetails() []proto.Message {
	return []proto.Message{
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: "project:7", Description: "writes per second"}}},
		&errdetails.ErrorInfo{Domain: "quota.example.com", Reason: "RATE_LIMITED", Metadata: map[string]string{"limit": "10"}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(5 * time.Second)},
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "amount", Description: "too large"}}},
	}
}

func keptDetails() []proto.Message {
	d := foreignDetails()
	return []proto.Message{d[0], d[3]}
}

// withForeign returns err's status with foreignDetails appended, as a peer
// or handler that adds its own details to a (tollgate or plain) status
// sends it.
func withForeign(t testing.TB, err error) error {
	t.Helper()
	p := grpcstatus.Convert(err).Proto()
	for _, m := range foreignDetails() {
		a, aerr := anypb.New(m)
		require.NoError(t, aerr)
		p.Details = append(p.Details, a)
	}
	return grpcstatus.FromProto(p).Err()
}

// requireCarried checks what a caller reads from err with grpc-go's own
// status API: one OutcomeDetail, one ErrorInfo of tollgate's domain that
// carries the foreign ErrorInfo in its metadata, at most one RetryInfo
// (whose delay status.RetryAfter reads), then keptDetails in order.
func requireCarried(t *testing.T, err error) *tollgatev1.OutcomeDetail {
	t.Helper()
	st, ok := grpcstatus.FromError(err)
	require.True(t, ok, "no status: %v", err)
	var (
		detail  *tollgatev1.OutcomeDetail
		info    *errdetails.ErrorInfo
		retry   *errdetails.RetryInfo
		others  []proto.Message
		details = st.Details()
	)
	for i, d := range details {
		switch v := d.(type) {
		case *tollgatev1.OutcomeDetail:
			require.Nil(t, detail, "a second OutcomeDetail at %d: %v", i, details)
			detail = v
		case *errdetails.ErrorInfo:
			require.Nil(t, info, "a second ErrorInfo at %d: %v", i, details)
			info = v
		case *errdetails.RetryInfo:
			require.Nil(t, retry, "a second RetryInfo at %d: %v", i, details)
			retry = v
		case error:
			t.Fatalf("detail %d does not decode: %v", i, v)
		default:
			others = append(others, v.(proto.Message))
		}
	}
	require.NotNil(t, detail, "no OutcomeDetail: %v", err)
	require.Equal(t, status.Domain, info.GetDomain(), "the ErrorInfo is tollgate's: %v", details)
	require.Equal(t, map[string]string{"cause_domain": "quota.example.com", "cause_reason": "RATE_LIMITED", "cause_md_limit": "10"},
		info.GetMetadata(), "the foreign ErrorInfo's data is in tollgate's: %v", details)
	if retry != nil {
		ra, ok := status.RetryAfter(err)
		require.True(t, ok)
		require.Equal(t, ra, retry.GetRetryDelay().AsDuration(), "the RetryInfo is tollgate's guidance")
		require.Equal(t, ra, detail.GetRetryAfter().AsDuration(), "the RetryInfo is tollgate's guidance")
	}
	kept := keptDetails()
	require.Len(t, others, len(kept), "the foreign details are lost from %v", details)
	for i := range kept {
		require.True(t, proto.Equal(kept[i], others[i]), "detail %d: want %v, got %v", i, kept[i], others[i])
	}
	return detail
}

// A handler passes up, without effect, a refusal that carries details of
// its own (from a downstream that adds them): the server re-addresses it to
// its own call and keeps them.
func TestDetailsServerRefusalKeepsForeign(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return nil, status.WithoutEffect(withForeign(t, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(2*time.Second))))
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	plain := testingv1.NewTestServiceClient(end.DialT(t))
	_, err := plain.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	d := requireCarried(t, err)
	require.Equal(t, tollgatev1.Outcome_OUTCOME_NOT_ADMITTED, d.GetOutcome())
	require.Equal(t, status.ReasonQueueFull, d.GetReason())
	require.NotEmpty(t, d.GetAttemptId(), "re-addressed to the server's call")
	require.Equal(t, 2*time.Second, d.GetRetryAfter().AsDuration(), "the refusal's own delay, not the foreign RetryInfo's")
}

// A review found that a final refusal with no delay of its own took the
// delay of a RetryInfo another layer added (status.RetryAfter reads the
// first RetryInfo): the server re-sent it final but with a positive
// grpc-retry-pushback-ms instead of -1, inviting grpc-go's own retry to
// repeat what no repeat can change, and the client rebuilding an
// ALLOWANCE_EXHAUSTED refusal did the same. A final refusal suggests only
// the delay of its own detail.
func TestDetailsFinalRefusalTakesNoForeignDelay(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return nil, status.WithoutEffect(withForeign(t, status.NotAdmitted(status.ReasonRequestTooLarge, status.Final())))
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	plain := testingv1.NewTestServiceClient(end.DialT(t))
	var trailer metadata.MD
	_, err := plain.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"}, grpc.Trailer(&trailer))
	d := requireCarried(t, err)
	require.True(t, d.GetFinal())
	require.Nil(t, d.GetRetryAfter(), "a final refusal suggests no delay it did not make")
	_, ok := status.RetryAfter(err)
	require.False(t, ok)
	require.Equal(t, []string{"-1"}, trailer.Get(status.PushbackKey), "grpc-go's own retry is told to stop")
}

// A handler fails with a status that is not definite: the server answers
// UNKNOWN and keeps the handler's details, its ErrorInfo in tollgate's.
func TestDetailsServerUnknownKeepsForeign(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return nil, withForeign(t, grpcstatus.Error(codes.Internal, "ledger: write failed"))
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	plain := testingv1.NewTestServiceClient(end.DialT(t))
	_, err := plain.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	d := requireCarried(t, err)
	require.Equal(t, tollgatev1.Outcome_OUTCOME_UNKNOWN, d.GetOutcome())
	_, ok := status.RetryAfter(err)
	require.False(t, ok, "an unknown outcome suggests no delay")
}

// An interceptor inside tollgate's (a client-side limiter) refuses the try
// before it is sent, with a QuotaFailure and a RetryInfo: the client types
// it NOT_SENT, keeps the details, and takes the limiter's delay as its own,
// jittered upwards by up to half of it (see TestNotSentAdoptedDelay...).
func TestDetailsClientNotSentKeepsForeign(t *testing.T) {
	svc := &testsvc.Service{}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	limiter := func(context.Context, string, any, any, *grpc.ClientConn, grpc.UnaryInvoker, ...grpc.CallOption) error {
		return withForeign(t, grpcstatus.Error(codes.ResourceExhausted, "limiter: over quota"))
	}
	client := testingv1.NewTestServiceClient(end.DialT(t, append(interceptor.DialOptions(fastRetry(1)),
		grpc.WithChainUnaryInterceptor(limiter))...))
	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	d := requireCarried(t, err)
	require.Equal(t, status.ReasonNotSent, d.GetReason(), "%v", err)
	ra := d.GetRetryAfter().AsDuration()
	require.True(t, ra >= 5*time.Second && ra < 7500*time.Millisecond, "the limiter's delay (5 s), jittered, is the refusal's: %v", ra)
	require.Zero(t, svc.Calls("Apply"))
}

// A callee that does not speak tollgate fails with UNAVAILABLE and its own
// details: the client's UNKNOWN outcome keeps them, its ErrorInfo in
// tollgate's.
func TestDetailsClientUnknownKeepsForeign(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return nil, withForeign(t, grpcstatus.Error(codes.Unavailable, "backend: overloaded"))
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(1))...))
	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	d := requireCarried(t, err)
	require.Equal(t, tollgatev1.Outcome_OUTCOME_UNKNOWN, d.GetOutcome(), "%v", err)
}

// A callee refuses with ALLOWANCE_EXHAUSTED marked final and details of its
// own; at an origin whose allowance is not spent the refusal is not final,
// and the client rebuilds it (client.result) keeping them.
func TestDetailsClientAllowanceKeepsForeign(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return nil, withForeign(t, status.NotAdmitted(status.ReasonAllowanceExhausted, status.Final()))
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(1))...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "k"})
	d := requireCarried(t, err)
	require.Equal(t, status.ReasonAllowanceExhausted, d.GetReason(), "%v", err)
	require.False(t, d.GetFinal(), "the origin's allowance is not spent")
	ra := d.GetRetryAfter().AsDuration()
	require.True(t, ra >= 5*time.Second && ra < 7500*time.Millisecond,
		"a refusal that may be repeated adopts the other layer's delay, jittered upwards: %v", ra)
}

// A review found that a refusal a server re-addressed adopted another
// layer's RetryInfo as it was, when its own detail suggested no delay:
// unbounded (an hour went up as grpc-retry-pushback-ms to callers that
// layer never saw) and the same for every caller. It is now adopted as a
// NOT_SENT refusal adopts a limiter's: below admission.DefaultMaxRetryAfter,
// and jittered.
func TestDetailsServerRefusalAdoptsABoundedJitteredDelay(t *testing.T) {
	hour, err := anypb.New(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Hour)})
	require.NoError(t, err)
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		p := grpcstatus.Convert(status.NotAdmitted(status.ReasonQueueFull)).Proto()
		p.Details = append(p.Details, hour)
		return nil, status.WithoutEffect(grpcstatus.FromProto(p).Err())
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	plain := testingv1.NewTestServiceClient(end.DialT(t))
	seen := map[time.Duration]bool{}
	for range 10 {
		_, err := plain.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
		ra, ok := status.RetryAfter(err)
		require.True(t, ok, "%v", err)
		require.Less(t, ra, admission.DefaultMaxRetryAfter, "bounded")
		require.GreaterOrEqual(t, ra, admission.DefaultMaxRetryAfter*2/3)
		seen[ra] = true
	}
	require.Greater(t, len(seen), 1, "jittered: %v", seen)
}

// A callee refuses without effect, with details of its own, and the retry
// budget allows no repeat: the client's RETRY_BUDGET_EXHAUSTED keeps them.
func TestDetailsClientBudgetKeepsForeign(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return nil, withForeign(t, status.NotAdmitted(status.ReasonShed, status.WithRetryAfter(time.Millisecond)))
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3),
		interceptor.WithRetryBudget(budget.WithRetryRatio(0), budget.WithMinRetriesPerSecond(0), budget.WithMaxRetryTokens(1)))...))
	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	d := requireCarried(t, err)
	require.Equal(t, status.ReasonRetryBudgetExhausted, d.GetReason(), "%v", err)
	// The budget's refusal keeps the callee's suggestion (this budget has
	// no floor: only deposits refill it), jittered upwards.
	ra, ok := status.RetryAfter(err)
	require.True(t, ok, "%v", err)
	require.GreaterOrEqual(t, ra, time.Millisecond)
}

// triedHeader returns the attempt, call and try of the tollgate header ctx
// carries, as a server that reads it raw sees them.
func triedHeader(ctx context.Context) (attempt, call string, try uint32) {
	md, _ := metadata.FromIncomingContext(ctx)
	call, try = "0", 1
	for _, v := range md.Get("tollgate") {
		for f := range strings.SplitSeq(v, ";") {
			k, val, _ := strings.Cut(f, "=")
			switch k {
			case "a":
				attempt = val
			case "c":
				call = val
			case "t":
				if val != "1" {
					try = 0 // this test sends one try
				}
			}
		}
	}
	return attempt, call, try
}

// A callee cannot vouch for the attempt and says so for the first try, with
// details of its own: the client answers NOT_ADMITTED, final, keeping them.
func TestDetailsClientUnverifiableKeepsForeign(t *testing.T) {
	svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, _ *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		a, c, n := triedHeader(ctx)
		return nil, withForeign(t, status.OutcomeUnknown(nil, status.WithReason(status.ReasonAttemptUnverifiable),
			status.WithAttempt(a, c, n), status.Final()))
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3))...))
	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	d := requireCarried(t, err)
	require.Equal(t, tollgatev1.Outcome_OUTCOME_NOT_ADMITTED, d.GetOutcome(), "%v", err)
	require.Equal(t, status.ReasonAttemptUnverifiable, d.GetReason())
}

// A try fails with INTERNAL and details of its own at a callee whose
// AttemptService then fences it: the call ends NOT_ADMITTED
// (ATTEMPT_FENCED, no try left) and keeps what the try's answer said.
func TestDetailsClientFencedKeepsForeign(t *testing.T) {
	store := memoryStore(t)
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return nil, withForeign(t, grpcstatus.Error(codes.Internal, "backend: lost the write"))
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		svc.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	})
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(1))...))
	_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	d := requireCarried(t, err)
	require.Equal(t, status.ReasonAttemptFenced, d.GetReason(), "%v", err)
}

// The same for a stream: the server interceptor's stream path re-addresses
// the handler's refusal, keeping its details.
func TestDetailsServerStreamRefusalKeepsForeign(t *testing.T) {
	svc := &testsvc.Service{WatchFunc: func(*testingv1.WatchRequest, grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
		return status.WithoutEffect(withForeign(t, status.NotAdmitted(status.ReasonShed, status.WithRetryAfter(time.Second))))
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	plain := testingv1.NewTestServiceClient(end.DialT(t))
	st, err := plain.Watch(t.Context(), &testingv1.WatchRequest{Count: 1})
	require.NoError(t, err)
	_, err = recvAll(st)
	d := requireCarried(t, err)
	require.Equal(t, status.ReasonShed, d.GetReason(), "%v", err)
	require.NotEmpty(t, d.GetAttemptId(), "re-addressed to the server's call")
}

// A review found that a rebuilt status carried the other error's details
// however large: a callee's refusal with a 12 KiB DebugInfo, passed up
// without effect by the tier above, reached a caller whose header list limit
// is 8 KiB (grpc-java's and gRPC C++'s default) as a trailer it refuses, so
// the caller lost the whole answer and read an INTERNAL error, an unknown
// outcome, where the callee had refused the call. A rebuilt status carries
// a bounded share of the other error's details (status, # Details of
// another error): the refusal arrives, with the details that fit.
func TestDetailsChainCarriesBoundedDetails(t *testing.T) {
	quota := &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: "project:7"}}}
	dep := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		p := grpcstatus.Convert(status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Second))).Proto()
		for _, m := range []proto.Message{&errdetails.DebugInfo{Detail: strings.Repeat("x", 12<<10)}, quota} {
			a, err := anypb.New(m)
			require.NoError(t, err)
			p.Details = append(p.Details, a)
		}
		return nil, status.WithoutEffect(grpcstatus.FromProto(p).Err()) // it refused before changing anything
	}}
	depEnd := testsvc.StartT(t, testsvc.Bufconn, dep.Register, serverOpts()...)
	depClient := testingv1.NewTestServiceClient(depEnd.DialT(t, interceptor.DialOptions(fastRetry(1))...))
	mid := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		resp, err := depClient.Apply(ctx, r)
		if err != nil {
			return nil, status.WithoutEffect(err) // nothing ran below: pass the refusal up
		}
		return resp, nil
	}}
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
	origin := testingv1.NewTestServiceClient(midEnd.DialT(t, append(interceptor.DialOptions(fastRetry(1)),
		grpc.WithMaxHeaderListSize(8<<10))...))

	_, err := origin.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonQueueFull, o.Reason)
	var kept []proto.Message
	for _, d := range grpcstatus.Convert(err).Details() {
		switch d.(type) {
		case *tollgatev1.OutcomeDetail, *errdetails.ErrorInfo, *errdetails.RetryInfo:
		default:
			kept = append(kept, d.(proto.Message))
		}
	}
	require.Len(t, kept, 1, "the DebugInfo does not fit; the QuotaFailure does")
	require.True(t, proto.Equal(quota, kept[0]))
}
