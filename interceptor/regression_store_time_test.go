package interceptor_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
)

// A store that waits for replicas needs time for the wait (Redis answers a
// WAIT up to one serverCron tick late), and sends nothing for a try with too
// little time left. The try is refused NOT_ADMITTED DEADLINE_UNREACHABLE — it
// cannot fit the store's work, as admission refuses a try that cannot fit
// its service time — rather than STORE_UNAVAILABLE, which said the store was
// down. It is final only when the attempt's own time left could not fit the
// store's work either; a try cut short by its per-try timeout is not (a
// later try may be given more). Nothing is written and the handler does not
// run.
func TestStoreWithTooLittleTimeRefusesDeadlineUnreachable(t *testing.T) {
	c, prefix := killRedis(t)
	ctx := context.Background()
	cfg, err := c.ConfigGet(ctx, "hz").Result()
	require.NoError(t, err)
	hz, err := strconv.Atoi(cfg["hz"])
	require.NoError(t, err)
	tick := time.Second / time.Duration(hz)
	// The store needs two ticks and 2 ms; the try is given one tick.
	require.GreaterOrEqual(t, tick, 20*time.Millisecond, "the test needs Redis's default hz (10), not %d", hz)

	store, err := redisstore.New(ctx, c, redisstore.WithPrefix(prefix), redisstore.WithPolicy(killPolicy(killSkew)),
		redisstore.WithReplicas(1, 50*time.Millisecond))
	require.NoError(t, err)
	var ran atomic.Int64
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		ran.Add(1)
		return &testingv1.ApplyResponse{}, nil
	}}
	end := testsvc.StartT(t, testsvc.TCP, svc.Register, killServerOptions(store, killSkew)...)
	for _, tc := range []struct {
		name    string
		attempt time.Duration
		perTry  time.Duration
		final   bool
	}{
		{"the attempt's time is too short", tick, 0, true},
		{"the try's time is too short", 10 * tick, tick, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(
				interceptor.WithAttemptTimeout(tc.attempt),
				interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1, PerTryTimeout: tc.perTry}))...))
			_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "k", Amount: 1})
			o := status.OutcomeOf(err)
			require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
			require.Equal(t, status.ReasonDeadlineUnreachable, o.Reason, "%v", err)
			require.Equal(t, tc.final, o.Final(), "%v", err)
			require.ErrorContains(t, err, "too little time", "the server's refusal, not the client's own")
			require.Zero(t, ran.Load(), "the handler did not run")

			keys, err := c.Keys(ctx, prefix+"*").Result()
			require.NoError(t, err)
			require.Empty(t, keys, "nothing was written, not even the tenant's horizon")
		})
	}
}
