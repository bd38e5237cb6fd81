package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A review found that, while DefaultKeep's doc allowed a store call to run up to DefaultKeep after it
// read the clock (it waited for a pooled connection, or go-redis resent it),
// and 5655d6a has the Begin and Fence scripts write nothing when they run
// later than that. But every script, Get's included, still moves a missing
// or foreign horizon (a failover, restart or restore lost records) to its
// call's reading, however old: here server A's Get reads the clock, waits
// 1 s for its pooled connection; meanwhile server B runs call X's try 1 to
// SUCCEEDED, and Redis loses it (a failover; simulated as
// TestRedisIdentityChangeMovesHorizon does). A's Get then runs first on the
// new Redis and moves the horizon to its reading, 1 s before X's record was
// written: X lies inside the horizon, reads UNSEEN, is fenced and begun
// again. The horizon must move past every record Redis may have lost
// (DESIGN §3.8): to Redis's TIME, not to a reading that may be DefaultKeep
// old. Real clocks; skew 100 ms.
//
// A final review found the same window, narrowed to a skew, when the horizon
// moved to Redis's time less the skew: the client that minted X ran a skew
// ahead (as the skew allows). It now moves to Redis's time itself.
func TestRegression14dRecordsRedisStaleReadingMovesHorizonBeforeLostRecord(t *testing.T) {
	for _, ahead := range []time.Duration{0, 100 * time.Millisecond} { // the client's clock, ahead of the servers'
		t.Run("client ahead "+ahead.String(), func(t *testing.T) { staleHorizon(t, ahead) })
	}
}

func staleHorizon(t *testing.T, ahead time.Duration) {
	plain, prefix := newClient(t)
	p := idempotency.Policy{Skew: 100 * time.Millisecond, Grace: 100 * time.Millisecond,
		MaxAttemptDeadline: 3 * time.Second, TTL: 10 * time.Second, MaxResponseBytes: 1024}
	aClock := newArmedClock(0)
	ca := onePoolClient(t, nil)
	a := newStore(t, ca, prefix, redisstore.WithPolicy(p), hooks.RedisClock(aClock.now).(redisstore.Option))
	b := newStore(t, plain, prefix, redisstore.WithPolicy(p))
	ctx := context.Background()
	tenant := "acme"
	other := idempotency.Key{Tenant: tenant, AttemptID: storetest.AttemptIDAt(time.Now()), Call: "9", Method: "/x.Y/Z"}
	_, err := b.Get(ctx, other) // the horizon starts
	require.NoError(t, err)
	time.Sleep(2 * p.Skew)

	// Server A's Get reads the clock, then waits for its only connection.
	held := ca.Conn()
	require.NoError(t, held.Ping(ctx).Err())
	aClock.arm()
	done := make(chan error, 1)
	go func() {
		_, err := a.Get(ctx, other)
		done <- err
	}()
	<-aClock.read

	// Meanwhile server B runs call X to SUCCEEDED.
	time.Sleep(time.Second)
	x := idempotency.Key{Tenant: tenant, AttemptID: storetest.AttemptIDAt(time.Now().Add(ahead)), Call: "0", Method: "/x.Y/Z"}
	res, err := b.Begin(ctx, idempotency.BeginRequest{Key: x, Try: 1, Deadline: time.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started, "refused %v", res.Refusal)
	require.NoError(t, b.Finish(ctx, idempotency.FinishRequest{Key: x, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("charged")}))

	// A failover loses X's record (it had not reached the replica).
	require.NoError(t, plain.Del(ctx, recordKey(prefix, x)).Err())
	require.NoError(t, plain.HSet(ctx, prefix+"{t:"+tenant+"}:h", "id", "0000/0000").Err())

	// A's Get runs first on the new primary.
	require.NoError(t, held.Close())
	require.NoError(t, <-done)

	rec, err := b.Get(ctx, x)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState(),
		"X's record was lost in the failover, yet X reads %v", rec.GetState())
	_, err = b.Fence(ctx, x, 1)
	require.NoError(t, err)
	res, err = b.Begin(ctx, idempotency.BeginRequest{Key: x, Try: 2, Deadline: time.Now().Add(time.Second)})
	require.NoError(t, err)
	require.False(t, res.Started, "try 2 of a call whose try 1 SUCCEEDED started")
}
