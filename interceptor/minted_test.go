package interceptor_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// mintedStore builds the store of a subtest: in memory, or in the test
// Redis under a fresh prefix (whose tenant horizons start at their first
// request). It skips the subtest when no Redis answers, unless
// TOLLGATE_REQUIRE_REDIS=1.
type mintedStore struct {
	name  string
	build func(t *testing.T, p idempotency.Policy) idempotency.Store
}

var mintedStores = []mintedStore{
	{"memory", func(t *testing.T, p idempotency.Policy) idempotency.Store {
		s, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p))
		require.NoError(t, err)
		return s
	}},
	{"redis", func(t *testing.T, p idempotency.Policy) idempotency.Store {
		c, prefix := killRedis(t)
		s, err := redisstore.New(t.Context(), c, redisstore.WithPrefix(prefix), redisstore.WithPolicy(p))
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() }) // after the server's stop (cleanups run last first)
		return s
	}},
}

// mintedServer starts svc and the AttemptService over bufconn behind
// ServerOptions(WithAttemptStore(store), extra...), as a user's server is
// built: no peer trusted unless extra says so.
func mintedServer(t *testing.T, svc *testsvc.Service, store idempotency.Store, extra ...interceptor.ServerOption) *testsvc.Endpoint {
	t.Helper()
	return testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
		svc.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, interceptor.ServerOptions(append([]interceptor.ServerOption{interceptor.WithAttemptStore(store)}, extra...)...)...)
}

// A caller that does not speak tollgate (no header), or one the server does
// not trust, gets an attempt the server mints for that very request: it
// cannot have had an earlier try anywhere, so the store begins it however
// recently it began retaining. Right after the server starts — its memory
// store just built, or its tenant's first request on Redis — a plain call
// runs the handler once and succeeds; it used to be refused
// ATTEMPT_UNVERIFIABLE for the first clock skew (500 ms by default).
func TestServerMintedAttemptRunsRightAfterStoreStarts(t *testing.T) {
	for _, st := range mintedStores {
		for _, skew := range []time.Duration{interceptor.DefaultClockSkew, time.Minute} {
			t.Run(st.name+"/skew="+skew.String(), func(t *testing.T) {
				p := idempotency.DefaultPolicy()
				p.Skew = skew
				store := st.build(t, p)
				var (
					runs     atomic.Int64
					mu       sync.Mutex
					attempts []interceptor.Attempt
				)
				svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
					runs.Add(1)
					a, _ := interceptor.AttemptFromContext(ctx)
					mu.Lock()
					attempts = append(attempts, a)
					mu.Unlock()
					return &testingv1.ApplyResponse{Total: r.GetAmount()}, nil
				}}
				// The tollgate client's attempt is older than the store: from a
				// trusted peer it would be refused; from an untrusted one it
				// is ignored.
				old, err := interceptor.StartAttempt(t.Context(), 4, 10*time.Second)
				require.NoError(t, err)
				end := mintedServer(t, svc, store, interceptor.WithClockSkew(skew))

				plain := testingv1.NewTestServiceClient(end.DialT(t))
				resp, err := plain.Apply(t.Context(), &testingv1.ApplyRequest{Key: "acct", Amount: 3})
				require.NoError(t, err, "a plain client's first call")
				require.Equal(t, int64(3), resp.GetTotal())
				require.Equal(t, int64(1), runs.Load(), "the handler ran once")

				untrusted := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
				resp, err = untrusted.Apply(old, &testingv1.ApplyRequest{Key: "acct", Amount: 5})
				require.NoError(t, err, "an untrusted tollgate peer's call")
				require.Equal(t, int64(5), resp.GetTotal())
				require.Equal(t, int64(2), runs.Load(), "the handler ran once more")

				oldAttempt, _ := interceptor.AttemptFromContext(old)
				mu.Lock()
				defer mu.Unlock()
				require.Len(t, attempts, 2)
				reqs := []*testingv1.ApplyRequest{{Key: "acct", Amount: 3}, {Key: "acct", Amount: 5}}
				for i, a := range attempts {
					require.True(t, a.Origin, "the server minted the attempt")
					require.NotEqual(t, oldAttempt.ID, a.ID, "an untrusted peer's attempt is not honoured")
					require.Equal(t, uint32(1), a.Try)
					key := idempotency.Key{Tenant: a.Tenant, AttemptID: a.ID, Call: a.Call, Method: testingv1.TestService_Apply_FullMethodName}
					b, err := proto.MarshalOptions{Deterministic: true}.Marshal(reqs[i])
					require.NoError(t, err)
					fp := idempotency.Fingerprint(key.Method, b)
					if skew == time.Minute {
						// Certainly within the skew of the horizon: a caller's
						// attempt created then would have been refused.
						res, err := store.Begin(t.Context(), idempotency.BeginRequest{Key: key, Try: 2, Fingerprint: fp,
							Deadline: time.Now().Add(time.Second)})
						require.NoError(t, err)
						require.Equal(t, idempotency.RefusedUnverifiable, res.Refusal, "the attempt lay within the skew of the horizon")
						require.False(t, res.VerifiableFrom.IsZero())
					}
					// The try was finished, not left running: a repeat of it
					// (as the server would begin it) is answered by the record.
					res, err := store.Begin(t.Context(), idempotency.BeginRequest{Key: key, Try: 1, Minted: true,
						Fingerprint: fp, Deadline: time.Now().Add(time.Second)})
					require.NoError(t, err)
					require.Equal(t, idempotency.RefusedFinished, res.Refusal, "%v", res.Record)
					require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, res.Record.GetState())
					got := &testingv1.ApplyResponse{}
					require.NoError(t, proto.Unmarshal(res.Record.GetResponse(), got))
					require.Equal(t, reqs[i].GetAmount(), got.GetTotal(), "the record kept the response")
				}
			})
		}
	}
}

// A trusted tollgate peer's attempt created before the store's horizon plus
// the skew is still refused — nothing runs — and the refusal says why: the
// store began retaining too recently. The owner ends the first try of its
// per-run call NOT_ADMITTED, final, says a new attempt can succeed, and
// passes on the server's retry-after: the time until a new attempt would be
// verifiable. A later try of such an attempt stays UNKNOWN, final, with no
// retry-after.
func TestTrustedAttemptBeforeHorizonIsRefusedHonestly(t *testing.T) {
	for _, st := range mintedStores {
		for _, skew := range []time.Duration{interceptor.DefaultClockSkew, time.Minute} {
			t.Run(st.name+"/skew="+skew.String(), func(t *testing.T) {
				p := idempotency.DefaultPolicy()
				p.Skew = skew
				ctx, err := interceptor.StartAttempt(t.Context(), 4, 10*time.Second)
				require.NoError(t, err)
				minted := time.Now()
				for time.Now().UnixMilli() <= minted.UnixMilli() {
					time.Sleep(time.Millisecond) // the horizon lies after the attempt
				}
				built := time.Now()
				store := st.build(t, p)
				var runs atomic.Int64
				svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
					runs.Add(1)
					return &testingv1.ApplyResponse{}, nil
				}}
				end := mintedServer(t, svc, store, interceptor.WithClockSkew(skew), interceptor.WithTrustedPeer(interceptor.TrustAll))
				client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))

				_, err = client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 1})
				o := status.OutcomeOf(err)
				require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
				require.Equal(t, status.ReasonAttemptUnverifiable, o.Reason)
				require.True(t, o.Final())
				require.Zero(t, runs.Load(), "the handler never ran")
				require.ErrorContains(t, err, "a new attempt can succeed")
				require.ErrorContains(t, err, "began retaining records")
				require.ErrorContains(t, err, "less than the clock skew before this attempt was created")
				ra, ok := status.RetryAfter(err)
				if skew == time.Minute {
					require.True(t, ok, "a retry-after until a new attempt is verifiable: %v", err)
				}
				if ok {
					// horizon + 2·skew − now (a peer's clock may lag by the
					// skew), the horizon lying after the store was built (to
					// the millisecond), jittered up to half again.
					require.Greater(t, ra, time.Duration(0))
					require.LessOrEqual(t, ra, 3*skew+time.Millisecond, "jittered up to half again")
					require.GreaterOrEqual(t, ra, 2*skew-time.Since(built)-time.Millisecond, "horizon + 2·skew − now")
				}

				// A later try of the same attempt, sent raw: UNKNOWN, final,
				// with the same explanation and no retry-after.
				a, _ := interceptor.AttemptFromContext(ctx)
				raw := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a="+a.ID+";t=2;d="+itoa(a.Deadline.UnixMilli()))
				_, err = testingv1.NewTestServiceClient(end.DialT(t)).Apply(raw, &testingv1.ApplyRequest{Key: "acct", Amount: 1})
				o = status.OutcomeOf(err)
				require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
				require.Equal(t, status.ReasonAttemptUnverifiable, o.Reason)
				require.True(t, o.Final())
				require.ErrorContains(t, err, "less than the clock skew before this attempt was created")
				_, ok = status.RetryAfter(err)
				require.False(t, ok, "a later try carries no retry-after")
				require.Zero(t, runs.Load())
			})
		}
	}
}
