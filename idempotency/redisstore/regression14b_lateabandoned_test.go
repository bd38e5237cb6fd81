package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A review found that DefaultKeep's doc says a try that a late Begin started "is
// finished UNKNOWN: no handler runs it". Begin sends that finish through
// the finish script with a fresh reading, which refuses a try whose lease
// (d + skew) ended: a late Begin of a try with a short deadline leaves the
// try it began on a vouched-for absence IN_PROGRESS, read ABANDONED for the
// rest of the TTL, and never UNKNOWN. (regression14's "later than the keep"
// subtest reads UNKNOWN only because there the new record has expired too.)
func TestRegression14bRecordsLateBeginOfShortTryIsLeftAbandoned(t *testing.T) {
	_, prefix := newClient(t)
	c := onePoolClient(t, nil)
	plain, _ := newClient(t)
	p := latePolicy
	clk := newArmedClock(0)
	s := newStore(t, c, prefix, redisstore.WithPolicy(p), hooks.RedisClock(clk.now).(redisstore.Option),
		hooks.RedisKeep(300*time.Millisecond).(redisstore.Option))
	ctx := context.Background()
	k, ts := succeededCall(t, s, clk.now, p.Skew)
	rk := recordKey(prefix, k)

	time.Sleep(time.Until(ts.Add(-p.Skew + p.TTL - 300*time.Millisecond)))
	held := c.Conn()
	require.NoError(t, held.Ping(ctx).Err())
	done := make(chan error, 1)
	clk.arm()
	go func() {
		_, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: time.Now().Add(100 * time.Millisecond)})
		done <- err
	}()
	<-clk.read
	waitFor(t, 10*time.Second, "Redis removing the SUCCEEDED record", func() bool { return plain.Exists(ctx, rk).Val() == 0 })
	require.NoError(t, held.Close())
	require.ErrorIs(t, <-done, idempotency.ErrStoreUnavailable)

	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState(), "a try a late Begin started is finished UNKNOWN")
}
