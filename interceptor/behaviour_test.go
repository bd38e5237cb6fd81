package interceptor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// twoTier starts a leaf service and a middle service whose handlers get a
// client to the leaf; the origin client dials the middle.
func twoTier(t *testing.T, leaf *testsvc.Service, mid func(leaf testingv1.TestServiceClient) *testsvc.Service, originOpts ...interceptor.ClientOption) (testingv1.TestServiceClient, *testsvc.Service) {
	t.Helper()
	leafEnd := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	leafClient := testingv1.NewTestServiceClient(leafEnd.DialT(t, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))...))
	m := mid(leafClient)
	midEnd := testsvc.StartT(t, testsvc.Bufconn, m.Register, serverOpts()...)
	return testingv1.NewTestServiceClient(midEnd.DialT(t, interceptor.DialOptions(originOpts...)...)), m
}

func TestIdempotentHandlerMustKeyCallsWithSideEffects(t *testing.T) {
	var keys []string
	leaf := &testsvc.Service{
		ApplyFunc: func(ctx context.Context, _ *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			a, _ := interceptor.AttemptFromContext(ctx)
			keys = append(keys, a.Call)
			return &testingv1.ApplyResponse{}, nil
		},
		GetFunc: okGet,
	}
	origin, _ := twoTier(t, leaf, func(leaf testingv1.TestServiceClient) *testsvc.Service {
		return &testsvc.Service{PutFunc: func(ctx context.Context, r *testingv1.PutRequest) (*testingv1.PutResponse, error) {
			switch r.GetKey() {
			case "unkeyed":
				_, err := leaf.Apply(ctx, &testingv1.ApplyRequest{})
				return nil, err
			case "read":
				_, err := leaf.Get(ctx, &testingv1.GetRequest{})
				return &testingv1.PutResponse{}, err
			case "too-long":
				_, err := leaf.Apply(interceptor.WithCallKey(ctx, strings.Repeat("x", 130)), &testingv1.ApplyRequest{})
				return nil, err
			default:
				_, err := leaf.Apply(interceptor.WithCallKey(ctx, "reserve-stock"), &testingv1.ApplyRequest{})
				return &testingv1.PutResponse{}, err
			}
		}}
	})

	_, err := origin.Put(t.Context(), &testingv1.PutRequest{Key: "unkeyed"})
	o := status.OutcomeOf(err)
	// The local refusal reached the origin through the Put handler, which
	// ran: its answer is UNKNOWN with the refusal from below.
	require.Equal(t, status.KindUnknown, o.Kind)
	require.Contains(t, grpcstatus.Convert(err).Message(), "must name its calls")
	require.Empty(t, keys, "the unkeyed call was never sent")

	_, err = origin.Put(t.Context(), &testingv1.PutRequest{Key: "read"})
	require.NoError(t, err, "a NO_SIDE_EFFECTS call needs no key")

	_, err = origin.Put(t.Context(), &testingv1.PutRequest{Key: "keyed"})
	require.NoError(t, err)
	require.Equal(t, []string{"0.reserve-stock"}, keys, "an explicit key hangs off the parent's key, without the try")

	_, err = origin.Put(t.Context(), &testingv1.PutRequest{Key: "too-long"})
	require.Error(t, err)
	require.Len(t, keys, 1, "an over-long key is refused before sending")
}

// A review found that the CALL_KEY_REQUIRED refusal an IDEMPOTENT handler
// gets for an unkeyed call to a method with side effects named the
// handler's own call and try (its inbound call's key), not the call it
// refused: the detail, final, then reads as a refusal of the handler's own
// call, while status.Fields says Call and Try are those of the refused
// call. It names the key the refused call takes (the run's next number,
// used, as any locally refused call's is: keys skip, never repeat) and its
// first try.
func TestCallKeyRequiredNamesTheRefusedCall(t *testing.T) {
	leaf := &testsvc.Service{GetFunc: okGet}
	type seen struct {
		own    interceptor.Attempt
		detail *tollgatev1.OutcomeDetail
	}
	got := make(chan seen, 1)
	var keys []string
	leaf.ApplyFunc = func(ctx context.Context, _ *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		a, _ := interceptor.AttemptFromContext(ctx)
		keys = append(keys, a.Call)
		return &testingv1.ApplyResponse{}, nil
	}
	origin, _ := twoTier(t, leaf, func(leaf testingv1.TestServiceClient) *testsvc.Service {
		return &testsvc.Service{PutFunc: func(ctx context.Context, r *testingv1.PutRequest) (*testingv1.PutResponse, error) {
			own, _ := interceptor.AttemptFromContext(ctx)
			_, err := leaf.Apply(ctx, &testingv1.ApplyRequest{})
			_, _ = leaf.Apply(interceptor.WithCallKey(ctx, "next"), &testingv1.ApplyRequest{})
			got <- seen{own: own, detail: status.OutcomeOf(err).Detail}
			return nil, status.WithoutEffect(err)
		}}
	})
	_, err := origin.Put(t.Context(), &testingv1.PutRequest{Key: "unkeyed"})
	require.Equal(t, status.ReasonCallKeyRequired, status.OutcomeOf(err).Reason, "%v", err)
	s := <-got
	require.Equal(t, status.ReasonCallKeyRequired, s.detail.GetReason())
	require.Equal(t, s.own.ID, s.detail.GetAttemptId())
	require.NotEqual(t, s.own.Call, s.detail.GetCall(), "the refusal names the handler's own call")
	require.Equal(t, s.own.Call+"."+itoa(int64(s.own.Try))+".1", s.detail.GetCall(), "the refused call's key: the run's first")
	require.Equal(t, uint32(1), s.detail.GetTry(), "the refused call's first try")
	require.Equal(t, []string{s.own.Call + ".next"}, keys, "only the keyed call was sent")
	// The origin's answer is re-addressed to the origin's call.
	require.Equal(t, "0", status.OutcomeOf(err).Detail.GetCall())
}

// The same review found that the MALFORMED_HEADER refusal of a call whose
// key would be over 128 characters named the handler's own call and try
// too. The refused call has no key it could be sent with: the refusal
// names the attempt only.
func TestMalformedCallKeyNamesNoCall(t *testing.T) {
	type seen struct {
		own    interceptor.Attempt
		detail *tollgatev1.OutcomeDetail
	}
	got := make(chan seen, 1)
	origin, _ := twoTier(t, &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return &testingv1.ApplyResponse{}, nil
	}}, func(leaf testingv1.TestServiceClient) *testsvc.Service {
		return &testsvc.Service{PutFunc: func(ctx context.Context, _ *testingv1.PutRequest) (*testingv1.PutResponse, error) {
			own, _ := interceptor.AttemptFromContext(ctx)
			_, err := leaf.Apply(interceptor.WithCallKey(ctx, strings.Repeat("x", 130)), &testingv1.ApplyRequest{})
			got <- seen{own: own, detail: status.OutcomeOf(err).Detail}
			return nil, status.WithoutEffect(err) // final: the origin does not repeat
		}}
	})
	_, err := origin.Put(t.Context(), &testingv1.PutRequest{Key: "too-long"})
	require.Error(t, err)
	s := <-got
	require.Equal(t, status.ReasonMalformedHeader, s.detail.GetReason())
	require.Equal(t, s.own.ID, s.detail.GetAttemptId())
	require.Empty(t, s.detail.GetCall(), "the refusal names the handler's own call")
	require.Zero(t, s.detail.GetTry())
	require.True(t, s.detail.GetFinal())
}

func TestLocalRefusalsAreTyped(t *testing.T) {
	svc := &testsvc.Service{GetFunc: okGet}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)

	// A try that cannot fit the hop margin is not started: here the
	// caller's deadline, the attempt's, leaves less than the margin (a
	// margin that leaves no time in WithAttemptTimeout's attempts is
	// refused by DialOptions).
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
		interceptor.WithHopMargin(time.Hour), interceptor.WithAttemptTimeout(2*time.Hour))...))
	short, cancelShort := context.WithTimeout(t.Context(), time.Minute)
	defer cancelShort()
	_, err := client.Get(short, &testingv1.GetRequest{})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind)
	require.Equal(t, status.ReasonDeadlineUnreachable, o.Reason)
	require.True(t, o.Final())
	require.Zero(t, svc.Calls("Get"))

	// A call whose context was cancelled before it was sent is NOT_SENT:
	// nothing reached the server.
	cctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...)).Get(cctx, &testingv1.GetRequest{})
	o = status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonNotSent, o.Reason)
	require.Equal(t, codes.Unavailable, grpcstatus.Code(err), "NOT_SENT is UNAVAILABLE (DESIGN.md §2.5), as the README says")
	require.NotEmpty(t, o.Detail.GetAttemptId())
	require.Zero(t, svc.Calls("Get"))

	// A call made under an attempt with no units left below the origin is
	// refused locally, and only the origin's refusal can be final.
	ctx, err := interceptor.StartAttempt(t.Context(), 0, time.Second)
	require.NoError(t, err)
	plain := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
	_, err = plain.Get(ctx, &testingv1.GetRequest{})
	require.NoError(t, err, "the origin's own try is not charged")
}

func TestHandlerErrorsAreAnsweredByTheirMeaning(t *testing.T) {
	refuse := func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		return nil, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(50*time.Millisecond))
	}
	leaf := &testsvc.Service{GetFunc: refuse}
	origin, _ := twoTier(t, leaf, func(leaf testingv1.TestServiceClient) *testsvc.Service {
		return &testsvc.Service{
			// Get has no side effects: the refusal from below stays NOT_ADMITTED.
			GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
				return leaf.Get(ctx, r)
			},
			// Apply has side effects: the same refusal becomes UNKNOWN, unless
			// the handler declares that it changed nothing.
			ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
				_, err := leaf.Get(ctx, &testingv1.GetRequest{})
				if r.GetKey() == "without-effect" {
					return nil, status.WithoutEffect(err)
				}
				if r.GetKey() == "definite" {
					return nil, grpcstatus.Error(codes.NotFound, "no such account")
				}
				return nil, err
			},
		}
	}, interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1}))

	var trailer metadata.MD
	_, err := origin.Get(t.Context(), &testingv1.GetRequest{}, grpc.Trailer(&trailer))
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind)
	require.Equal(t, status.ReasonQueueFull, o.Reason)
	require.Equal(t, "0", o.Detail.GetCall(), "the refusal is re-addressed to the call the middle tier served")
	require.Equal(t, []string{"50"}, trailer.Get("grpc-retry-pushback-ms"))
	require.Equal(t, []string{"1"}, trailer.Get("tollgate-spent"), "the middle tier spent one unit")

	_, err = origin.Apply(t.Context(), &testingv1.ApplyRequest{})
	o = status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind)
	require.NotEqual(t, codes.ResourceExhausted, grpcstatus.Code(err), "UNKNOWN is never sent as RESOURCE_EXHAUSTED")

	_, err = origin.Apply(t.Context(), &testingv1.ApplyRequest{Key: "without-effect"})
	require.Equal(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind)

	_, err = origin.Apply(t.Context(), &testingv1.ApplyRequest{Key: "definite"})
	require.Equal(t, codes.NotFound, grpcstatus.Code(err))
	require.Equal(t, status.KindFailed, status.OutcomeOf(err).Kind)
}

func TestServerCapsUnitsAndDeadlineAndRefusesExpiredTries(t *testing.T) {
	var got seen
	var units int64
	svc := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		got.note(ctx)
		a, _ := budget.FromContext(ctx)
		units = a.Snapshot().Total
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, interceptor.ServerOptions(
		interceptor.WithTrustedPeer(interceptor.TrustAll), interceptor.WithClockSkew(0),
		interceptor.WithMaxAllowance(5), interceptor.WithMaxAttemptTime(2*time.Second))...)
	client := testingv1.NewTestServiceClient(end.DialT(t))

	far := time.Now().Add(time.Hour).UnixMilli()
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a=x;u=1000;d="+itoa(far))
	_, err := client.Get(ctx, &testingv1.GetRequest{})
	require.NoError(t, err)
	require.Equal(t, int64(5), units, "claimed units are capped at the server's maximum")
	as, deadlines := got.all()
	require.WithinDuration(t, time.Now().Add(2*time.Second), as[0].Deadline, time.Second, "the deadline is capped at the server's maximum")
	require.False(t, deadlines[0].After(as[0].Deadline))

	past := time.Now().Add(-time.Second).UnixMilli()
	ctx = metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a=x;d="+itoa(past))
	_, err = client.Get(ctx, &testingv1.GetRequest{})
	o := status.OutcomeOf(err)
	require.Equal(t, status.ReasonDeadlineExpired, o.Reason)
	require.True(t, o.Final())
	require.Equal(t, int64(1), svc.Calls("Get"), "an expired try never reaches the handler")
}

func TestPanicIsUnknownOnlyWhenRecoveryIsOn(t *testing.T) {
	svc := &testsvc.Service{GetFunc: func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		panic("boom")
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, interceptor.ServerOptions(interceptor.WithRecovery())...)
	_, err := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...)).Get(t.Context(), &testingv1.GetRequest{})
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind)
	require.Equal(t, codes.Internal, o.Code)
}

func TestALostResponseHoldsTheGrant(t *testing.T) {
	release := make(chan struct{})
	leaf := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		<-release
		return &testingv1.GetResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	conn := end.DialT(t, interceptor.DialOptions()...)
	client := testingv1.NewTestServiceClient(conn)
	// Connect first, so that the short d is spent on the call, not on
	// connecting (a try that never left the client is NOT_SENT).
	conn.Connect()
	for st := conn.GetState(); st != connectivity.Ready; st = conn.GetState() {
		require.True(t, conn.WaitForStateChange(t.Context(), st), "connecting")
	}
	ctx, err := interceptor.StartAttempt(t.Context(), 6, 200*time.Millisecond)
	require.NoError(t, err)
	_, err = client.Get(ctx, &testingv1.GetRequest{})
	close(release)
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
	// Whether the client's own deadline or the server's RST came first, no
	// answer of the handler arrived: the outcome is UNKNOWN.
	ledger, _ := budget.FromContext(ctx)
	snap := ledger.Snapshot()
	require.Equal(t, int64(6), snap.Held, "a call whose response never arrived holds its grant until reconciled")
	require.Zero(t, snap.Free)
}

func TestSplitDividesAFanOut(t *testing.T) {
	var granted []int64
	leaf := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		a, _ := budget.FromContext(ctx)
		granted = append(granted, a.Snapshot().Total)
		return &testingv1.GetResponse{}, nil
	}}
	origin, _ := twoTier(t, leaf, func(leaf testingv1.TestServiceClient) *testsvc.Service {
		return &testsvc.Service{GetFunc: func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			for _, c := range budget.Split(ctx, 3) {
				if _, err := leaf.Get(c, r); err != nil {
					return nil, err
				}
			}
			return &testingv1.GetResponse{}, nil
		}}
	}, interceptor.WithAllowance(10))
	_, err := origin.Get(t.Context(), &testingv1.GetRequest{})
	require.NoError(t, err)
	require.Equal(t, []int64{3, 2, 2}, granted, "10 units: one per send, the rest shared")
}

func itoa(n int64) string { return strconvFormat(n) }

// TestUnderscoreIsAHeaderCharacter: DESIGN §2.1's charset [A-Za-z0-9._:-]
// includes '_': a trusted peer's tenant acme_corp and an explicit key
// reserve_stock travel.
func TestUnderscoreIsAHeaderCharacter(t *testing.T) {
	var got []interceptor.Attempt
	leaf := &testsvc.Service{ApplyFunc: func(ctx context.Context, _ *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		a, _ := interceptor.AttemptFromContext(ctx)
		got = append(got, a)
		return &testingv1.ApplyResponse{}, nil
	}}
	origin, _ := twoTier(t, leaf, func(leaf testingv1.TestServiceClient) *testsvc.Service {
		return &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			return leaf.Apply(interceptor.WithCallKey(ctx, "reserve_stock"), r)
		}}
	})
	_, err := origin.Apply(t.Context(), &testingv1.ApplyRequest{})
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, "0.reserve_stock", got[0].Call)

	end := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)
	_, err = testingv1.NewTestServiceClient(end.DialT(t)).Apply(
		metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a=x_1;n=acme_corp"), &testingv1.ApplyRequest{})
	require.NoError(t, err)
	require.Equal(t, "acme_corp", got[1].Tenant)
	require.Equal(t, "x_1", got[1].ID)
}
