package interceptor_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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

// R62: WithTenant's function may name a tenant with any string; a name that
// is not a valid token is used as "h." and 40 hex digits of its SHA-256, to
// "keep its records apart". But a valid token is used as it is, so a tenant
// whose name is literally that digest ("h.<40 hex>", itself a valid token)
// shares the hashed tenant's records: it reads (and could fence) them
// (DESIGN.md §3.11: another tenant's attempt reads as UNSEEN to them).
func TestRegression13HashedTenantCollidesWithLiteralToken(t *testing.T) {
	const alice = "alice@example.com" // not a token: hashed
	sum := sha256.Sum256([]byte(alice))
	mallory := "h." + hex.EncodeToString(sum[:20]) // a valid token, used as is

	ledger := newLedger(nil)
	store := memoryStore(t)
	tenantOf := func(ctx context.Context) string {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("x-tenant"); len(v) > 0 {
			return v[0]
		}
		return ""
	}
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		ledger.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, serverOpts(interceptor.WithAttemptStore(store), interceptor.WithTenant(tenantOf))...)
	conn := end.DialT(t) // raw gRPC: the test writes the header
	client := testingv1.NewTestServiceClient(conn)
	attempts := tollgatev1.NewAttemptServiceClient(conn)

	actx, err := interceptor.StartAttempt(t.Context(), 0, 5*time.Second)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(actx)
	hdr := "a=" + a.ID + ";c=0;t=1;d=" + itoa(a.Deadline.UnixMilli())

	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", hdr, "x-tenant", alice)
	_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 7})
	require.NoError(t, err)

	// Alice sees her own record.
	own, err := attempts.GetAttempt(metadata.AppendToOutgoingContext(t.Context(), "x-tenant", alice),
		&tollgatev1.GetAttemptRequest{AttemptId: a.ID, Call: "0", Method: testingv1.TestService_Apply_FullMethodName})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, own.GetState())

	// Another tenant, whose name happens to be alice's digest, must not.
	other, err := attempts.GetAttempt(metadata.AppendToOutgoingContext(t.Context(), "x-tenant", mallory),
		&tollgatev1.GetAttemptRequest{AttemptId: a.ID, Call: "0", Method: testingv1.TestService_Apply_FullMethodName})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, other.GetState(),
		"tenant %q reads tenant %q's record: %v", mallory, alice, other)
}
