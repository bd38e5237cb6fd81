package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// xTenant names the caller's tenant from its authenticated metadata (a
// stand-in for an mTLS identity or a verified token).
func xTenant(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-tenant"); len(v) == 1 {
		return v[0]
	}
	return ""
}

// victimRecord makes backend's store hold a SUCCEEDED record of tenant
// "victim": a trusted peer's try carrying n=victim, as a tollgate gateway
// sends for its tenant's attempt. It returns the attempt ID.
func victimRecord(t *testing.T, backEnd *testsvc.Endpoint) string {
	t.Helper()
	time.Sleep(2 * time.Millisecond) // the attempt is created after the store's horizon
	id, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(id)
	raw := testingv1.NewTestServiceClient(backEnd.DialT(t))
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate",
		"a="+a.ID+";c=0;t=1;n=victim;d="+itoa(a.Deadline.UnixMilli()))
	resp, err := raw.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 7})
	require.NoError(t, err)
	require.Equal(t, int64(7), resp.GetTotal())
	return a.ID
}

// attemptProxy is a gateway's AttemptService that forwards each query, with
// its incoming metadata, to the backend that keeps the records (§2.1
// anticipates gateways that forward incoming metadata).
type attemptProxy struct {
	tollgatev1.UnimplementedAttemptServiceServer
	up tollgatev1.AttemptServiceClient
}

func (p attemptProxy) GetAttempt(ctx context.Context, r *tollgatev1.GetAttemptRequest) (*tollgatev1.AttemptRecord, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	return p.up.GetAttempt(metadata.NewOutgoingContext(ctx, md.Copy()), r)
}

// Invariant 11 across a tollgate gateway: the gateway does not trust its
// external callers (their tenant is its WithTenant's), and its backend trusts
// the gateway. On the data path the gateway's client interceptor replaces any
// tollgate header a handler forwards (§2.1); on the control path it passes
// the forwarded one through. A review found that an untrusted caller's
// forged "n" so reached the backend as a trusted peer's and read another
// tenant's record, stored response included. The server now takes a header
// it does not honour out of the handler's incoming metadata.
func TestGatewayDoesNotForwardAnUntrustedTenantOnTheControlPath(t *testing.T) {
	ledger := newLedger(nil)
	store := memoryStore(t)
	backEnd := recordedServer(t, &ledger.Service, store) // trusts every peer: the gateway
	victimID := victimRecord(t, backEnd)

	up := tollgatev1.NewAttemptServiceClient(backEnd.DialT(t, interceptor.DialOptions()...))
	gwStore := memoryStore(t)
	gw := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		tollgatev1.RegisterAttemptServiceServer(s, attemptProxy{up: up})
	}, interceptor.ServerOptions(interceptor.WithClockSkew(0), interceptor.WithAttemptStore(gwStore),
		interceptor.WithTenant(xTenant))...) // trusts no caller
	mallory := tollgatev1.NewAttemptServiceClient(gw.DialT(t))

	q := &tollgatev1.GetAttemptRequest{AttemptId: victimID, Call: "0", Method: testingv1.TestService_Apply_FullMethodName}
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-tenant", "mallory", "tollgate", "a="+victimID+";n=victim")
	rec, err := mallory.GetAttempt(ctx, q)
	require.NoError(t, err)
	require.NotEqual(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState(),
		"tenant mallory read tenant victim's record through the gateway: %v", rec)
	require.Empty(t, rec.GetResponse(), "tenant victim's stored response reached tenant mallory")
}

// The same hole on the data path, through a hop §2.3 allows: a transparent
// proxy that runs tollgate's server interceptor (for admission) and forwards
// each request with its incoming metadata to exactly one upstream, which
// trusts it. The proxy's interceptor judges its external caller untrusted
// and "ignores" its header (§2.1); a review found it left in the handler's
// metadata, so the upstream honoured the caller's forged attempt and tenant:
// the caller replayed tenant victim's stored response.
func TestProxyDoesNotForwardAnUntrustedHeader(t *testing.T) {
	ledger := newLedger(nil)
	store := memoryStore(t)
	backEnd := recordedServer(t, &ledger.Service, store)
	victimID := victimRecord(t, backEnd)

	upstream := backEnd.DialT(t) // the proxy's own client: no tollgate options
	proxyEnd := testsvc.StartT(t, testsvc.Bufconn, func(*grpc.Server) {},
		append(interceptor.ServerOptions(interceptor.WithClockSkew(0), interceptor.WithTenant(xTenant)), // trusts no caller
			grpc.UnknownServiceHandler(transparentProxy(upstream)), grpc.ForceServerCodec(rawCodec{}))...)
	mallory := testingv1.NewTestServiceClient(proxyEnd.DialT(t))

	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-tenant", "mallory",
		"tollgate", "a="+victimID+";c=0;t=2;n=victim")
	_, _ = mallory.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 7})
	rec, err := store.Get(t.Context(), idempotency.Key{Tenant: "victim", AttemptID: victimID, Call: "0",
		Method: testingv1.TestService_Apply_FullMethodName})
	require.NoError(t, err)
	require.Equal(t, uint32(1), rec.GetTry())
	require.Equal(t, int64(2), ledger.effects.Load(),
		"an untrusted caller's request ran as a try of tenant victim's attempt (answered from its record) instead of as a new attempt")
}

// idempotency.WithTenant's doc allows the interceptor's own tenant function
// when it returns tokens ("name the tenant as the server interceptor keys its
// records — which hashes any other name"). But the interceptor keys a trusted
// peer's try by its header's "n", which that function never sees: the
// owner's ballot resolves under another tenant than its try (§2.2), finds no
// record there, and a review found it answered FENCED — "no try up to n
// ran" — for a try that ran and succeeded. The resolved tenant now wins.
func TestServiceTenantOptionYieldsToTheResolvedTenant(t *testing.T) {
	ledger := newLedger(nil)
	store := memoryStore(t)
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		ledger.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store, idempotency.WithTenant(xTenant)))
	}, serverOpts(interceptor.WithAttemptStore(store), interceptor.WithTenant(xTenant))...)
	victimID := victimRecord(t, end) // a trusted peer's try with n=victim: it ran
	require.Equal(t, int64(1), ledger.effects.Load())

	fence := tollgatev1.NewAttemptServiceClient(end.DialT(t))
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a="+victimID+";n=victim") // as owner.resolve sends it
	rec, err := fence.FenceAttempt(ctx, &tollgatev1.FenceAttemptRequest{AttemptId: victimID, Call: "0",
		Method: testingv1.TestService_Apply_FullMethodName, FenceThroughTry: 1})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState(),
		"the ballot for a try that ran was answered from another tenant's (absent) record: %v", rec)
}
