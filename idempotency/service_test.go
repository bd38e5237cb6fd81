package idempotency_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

// serve runs an AttemptService over bufconn whose tenant is the "x-tenant"
// request header, put in the context the way tollgate's server interceptor
// does, and returns a client.
func serve(t *testing.T, store idempotency.Store, opts ...idempotency.ServiceOption) tollgatev1.AttemptServiceClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	tenantFromHeader := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("x-tenant"); len(v) == 1 {
			ctx = idempotency.ContextWithTenant(ctx, v[0])
		}
		return h(ctx, req)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(tenantFromHeader))
	tollgatev1.RegisterAttemptServiceServer(srv, idempotency.NewAttemptService(store, opts...))
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = conn.Close()
		srv.Stop()
		<-done
	})
	return tollgatev1.NewAttemptServiceClient(conn)
}

func as(tenant string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "x-tenant", tenant)
}

type fixture struct {
	clock *storetest.Clock
	store *idempotency.MemoryStore
}

func newFixture(t *testing.T, opts ...idempotency.MemoryOption) fixture {
	clock := storetest.NewClock(time.Now())
	s := newMemory(t, clock, storetest.Policy(), opts...)
	clock.Advance(storetest.Policy().Skew)
	return fixture{clock: clock, store: s}
}

const placeMethod = "/shop.v1.Orders/Place"

// Tenant B can neither read nor fence tenant A's records: A's attempt reads
// UNSEEN to B, B's fence makes B's own tombstone, and A's try goes on.
func TestAttemptServiceTenantIsolation(t *testing.T) {
	f := newFixture(t)
	client := serve(t, f.store)
	ctx := context.Background()
	keyA := idempotency.Key{Tenant: "tenant-a", AttemptID: storetest.AttemptIDAt(f.clock.Now()), Call: "0", Method: placeMethod}
	fp := idempotency.Fingerprint(placeMethod, []byte("order"))
	res, err := f.store.Begin(ctx, idempotency.BeginRequest{Key: keyA, Try: 1, Fingerprint: fp, Deadline: f.clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)

	get := &tollgatev1.GetAttemptRequest{AttemptId: keyA.AttemptID, Call: "0", Method: placeMethod}
	rec, err := client.GetAttempt(as("tenant-a"), get)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS, rec.GetState())

	rec, err = client.GetAttempt(as("tenant-b"), get)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec.GetState())
	fence := &tollgatev1.FenceAttemptRequest{AttemptId: keyA.AttemptID, Call: "0", Method: placeMethod, FenceThroughTry: 5}
	rec, err = client.FenceAttempt(as("tenant-b"), fence)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())

	// A's record is untouched: still running, and it finishes.
	rec, err = client.GetAttempt(as("tenant-a"), get)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS, rec.GetState())
	require.NoError(t, f.store.Finish(ctx, idempotency.FinishRequest{Key: keyA, Try: 1, Fingerprint: fp,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("placed")}))
	rec, err = client.FenceAttempt(as("tenant-a"), fence)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
	require.Equal(t, []byte("placed"), rec.GetResponse())
	rec, err = client.GetAttempt(as("tenant-b"), get)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
	require.Empty(t, rec.GetResponse())
}

func TestAttemptServiceFenceBallot(t *testing.T) {
	f := newFixture(t)
	client := serve(t, f.store)
	id := storetest.AttemptIDAt(f.clock.Now())
	rec, err := client.FenceAttempt(as("t"), &tollgatev1.FenceAttemptRequest{AttemptId: id, Call: "0", Method: placeMethod, FenceThroughTry: 2})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
	require.Equal(t, uint32(2), rec.GetFencedThroughTry())
	res, err := f.store.Begin(context.Background(), idempotency.BeginRequest{Key: idempotency.Key{Tenant: "t", AttemptID: id, Call: "0", Method: placeMethod}, Try: 2, Deadline: f.clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.Equal(t, idempotency.RefusedFenced, res.Refusal)
	// Outside the horizon: UNKNOWN, nothing fenced.
	rec, err = client.FenceAttempt(as("t"), &tollgatev1.FenceAttemptRequest{AttemptId: "order-7", Call: "0", Method: placeMethod, FenceThroughTry: 1})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState())
}

func TestAttemptServiceInvalidArgument(t *testing.T) {
	f := newFixture(t)
	client := serve(t, f.store)
	id := storetest.AttemptIDAt(f.clock.Now())
	cases := []struct {
		req  *tollgatev1.FenceAttemptRequest
		want string
	}{
		{&tollgatev1.FenceAttemptRequest{Call: "0", Method: placeMethod, FenceThroughTry: 1}, "attempt_id is empty"},
		{&tollgatev1.FenceAttemptRequest{AttemptId: "a b", Call: "0", Method: placeMethod, FenceThroughTry: 1}, "attempt_id must be 1–64 characters"},
		{&tollgatev1.FenceAttemptRequest{AttemptId: id, Method: placeMethod, FenceThroughTry: 1}, "call is empty"},
		{&tollgatev1.FenceAttemptRequest{AttemptId: id, Call: strings.Repeat("x", 129), Method: placeMethod, FenceThroughTry: 1}, "call must be 1–128 characters"},
		{&tollgatev1.FenceAttemptRequest{AttemptId: id, Call: "0", FenceThroughTry: 1}, "method is empty"},
		{&tollgatev1.FenceAttemptRequest{AttemptId: id, Call: "0", Method: "Place", FenceThroughTry: 1}, "method must be a full gRPC method name"},
		{&tollgatev1.FenceAttemptRequest{AttemptId: id, Call: "0", Method: placeMethod}, "fence_through_try must be 1–1000, not 0"},
		{&tollgatev1.FenceAttemptRequest{AttemptId: id, Call: "0", Method: placeMethod, FenceThroughTry: 1001}, "fence_through_try must be 1–1000"},
	}
	for _, c := range cases {
		_, err := client.FenceAttempt(as("t"), c.req)
		require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), c.want)
		require.Contains(t, grpcstatus.Convert(err).Message(), c.want)
		if c.req.GetFenceThroughTry() == 1 {
			_, err = client.GetAttempt(as("t"), &tollgatev1.GetAttemptRequest{AttemptId: c.req.AttemptId, Call: c.req.Call, Method: c.req.Method})
			require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err), c.want)
			require.Contains(t, grpcstatus.Convert(err).Message(), c.want)
		}
	}
	require.Zero(t, f.store.Len(), "nothing was written")
}

func TestAttemptServiceStoreFull(t *testing.T) {
	f := newFixture(t, idempotency.WithMaxRecords(1))
	client := serve(t, f.store)
	for i, want := range []codes.Code{codes.OK, codes.Unavailable} {
		_, err := client.FenceAttempt(as("t"), &tollgatev1.FenceAttemptRequest{AttemptId: storetest.AttemptIDAt(f.clock.Now()), Call: "0", Method: placeMethod, FenceThroughTry: 1})
		require.Equal(t, want, grpcstatus.Code(err), i)
		if err != nil {
			o := status.OutcomeOf(err)
			require.Equal(t, status.KindNotAdmitted, o.Kind)
			require.Equal(t, status.ReasonStoreUnavailable, o.Reason)
		}
	}
}

// TestAttemptServiceWithTenant: WithTenant names the tenant where no
// interceptor resolved one; where one did (here the fixture's stand-in), its
// tenant is the one the tries were keyed under, and it wins: a review found
// the option's tenant used instead, so an owner's ballot was answered FENCED
// under another tenant than its try's, for a try that ran.
func TestAttemptServiceWithTenant(t *testing.T) {
	f := newFixture(t)
	fixed := func(context.Context) string { return "only" }
	client := serve(t, f.store, idempotency.WithTenant(fixed))
	id := storetest.AttemptIDAt(f.clock.Now())
	_, err := client.FenceAttempt(context.Background(), &tollgatev1.FenceAttemptRequest{AttemptId: id, Call: "0", Method: placeMethod, FenceThroughTry: 1})
	require.NoError(t, err)
	rec, err := f.store.Get(context.Background(), idempotency.Key{Tenant: "only", AttemptID: id, Call: "0", Method: placeMethod})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState(), "no tenant resolved: the option's")

	_, err = client.FenceAttempt(as("resolved"), &tollgatev1.FenceAttemptRequest{AttemptId: id, Call: "0", Method: placeMethod, FenceThroughTry: 1})
	require.NoError(t, err)
	rec, err = f.store.Get(context.Background(), idempotency.Key{Tenant: "resolved", AttemptID: id, Call: "0", Method: placeMethod})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState(), "the interceptor's tenant, not the option's")

	// A name that is not a token is mapped as the interceptor maps it
	// (api_r18s_test.go); a malformed tenant put in the context is the
	// server's fault.
	named := serve(t, f.store, idempotency.WithTenant(func(context.Context) string { return "no spaces" }))
	_, err = named.GetAttempt(context.Background(), &tollgatev1.GetAttemptRequest{AttemptId: id, Call: "0", Method: placeMethod})
	require.NoError(t, err)
	_, err = named.GetAttempt(as("no spaces"), &tollgatev1.GetAttemptRequest{AttemptId: id, Call: "0", Method: placeMethod})
	require.Equal(t, codes.Internal, grpcstatus.Code(err))
}

func TestTenantContext(t *testing.T) {
	require.Equal(t, "", idempotency.TenantFromContext(context.Background()))
	require.Equal(t, "acme", idempotency.TenantFromContext(idempotency.ContextWithTenant(context.Background(), "acme")))
	require.Panics(t, func() { idempotency.NewAttemptService(nil) })
}

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// A handler's definite error whose message is not valid UTF-8 (grpc-go
// carries any bytes in grpc-message, percent-encoded) is recorded verbatim
// by the interceptor (finishTry copies the status's message into the
// FinishRequest), and the store keeps it. AttemptRecord.status_message is
// a proto3 string, so the AttemptService cannot marshal its answer: both
// GetAttempt and FenceAttempt fail INTERNAL for a record that is FAILED.
// The owner resolving a try in doubt then ends the call UNKNOWN ("the
// try's state could not be queried") instead of returning the definite
// error the record holds (DESIGN.md §3.5: FAILED → the definite error),
// and an operator cannot read the record at all.
func TestFailedRecordWithNonUTF8MessageCannotBeQueried(t *testing.T) {
	f := newFixture(t)
	client := serve(t, f.store)
	ctx := context.Background()
	key := idempotency.Key{Tenant: "tenant-a", AttemptID: storetest.AttemptIDAt(f.clock.Now()), Call: "0", Method: placeMethod}
	fp := idempotency.Fingerprint(placeMethod, []byte("order"))
	res, err := f.store.Begin(ctx, idempotency.BeginRequest{Key: key, Try: 1, Fingerprint: fp, Deadline: f.clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, f.store.Finish(ctx, idempotency.FinishRequest{Key: key, Try: 1, Fingerprint: fp,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, Code: codes.InvalidArgument, Message: "no such file: /data/\xff\xfe.csv"}))

	rec, err := client.FenceAttempt(as("tenant-a"), &tollgatev1.FenceAttemptRequest{AttemptId: key.AttemptID, Call: "0", Method: placeMethod, FenceThroughTry: 1})
	require.NoError(t, err, "the owner's ballot on a FAILED record")
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, rec.GetState())

	rec, err = client.GetAttempt(as("tenant-a"), &tollgatev1.GetAttemptRequest{AttemptId: key.AttemptID, Call: "0", Method: placeMethod})
	require.NoError(t, err, "an operator's read of a FAILED record")
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, rec.GetState())
	require.Equal(t, "no such file: /data/\uFFFD.csv", rec.GetStatusMessage(), "invalid bytes read as U+FFFD")
}
