package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
)

// A review found that commit 98391f5 handles a Begin whose script ran more than the keep
// after its clock reading only when the reply arrives (late → finish the
// begun try UNKNOWN). When the reply of such a late run is lost (the context
// ends, or go-redis gives up), Begin took the error path and its fence (endBegun)
// ended the begun try FENCED — a tombstone that licenses the next try. The
// late run had vouched, with its stale now, for the absence of a SUCCEEDED
// record that Redis had already removed: the next try starts and the
// handler of a call that SUCCEEDED runs again (DESIGN.md §3.7).
//
// Real clock, real Redis; the keep is shortened (hooks.RedisKeep) so the
// wait for the pooled connection need not exceed 30 s.
func TestRegression14bRecordsLateBeginLostReplyFencesSucceededCall(t *testing.T) {
	_, prefix := newClient(t)
	d := &lossyDialer{mode: lossTimeout}
	c := onePoolClient(t, func(o *redis.Options) { o.Dialer, o.ReadTimeout = d.dial, lossyReadTimeout })
	plain, _ := newClient(t)
	p := latePolicy
	clk := newArmedClock(0)
	s := newStore(t, c, prefix, redisstore.WithPolicy(p), hooks.RedisClock(clk.now).(redisstore.Option),
		hooks.RedisKeep(300*time.Millisecond).(redisstore.Option))
	ctx := context.Background()
	k, ts := succeededCall(t, s, clk.now, p.Skew)
	rk := recordKey(prefix, k)

	// Try 2's Begin reads the clock shortly before absence stops being
	// evidence (ts - skew + TTL), then waits for the only pooled connection
	// until Redis removed the SUCCEEDED record (its expiry plus the keep).
	vouchEnd := ts.Add(-p.Skew + p.TTL)
	time.Sleep(time.Until(vouchEnd.Add(-300 * time.Millisecond)))
	held := c.Conn()
	require.NoError(t, held.Ping(ctx).Err())
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	clk.arm()
	go func() {
		_, err := s.Begin(bctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: time.Now().Add(2 * time.Second)})
		done <- err
	}()
	<-clk.read
	waitFor(t, 10*time.Second, "Redis removing the SUCCEEDED record", func() bool {
		return plain.Exists(ctx, rk).Val() == 0
	})
	// The script runs now, with the stale reading; its reply is lost and the
	// caller's context ends before go-redis would send it again.
	d.arm()
	require.NoError(t, held.Close())
	waitFor(t, 10*time.Second, "Begin's reply being lost", func() bool { return d.lost.Load() == 1 })
	cancel()
	require.ErrorIs(t, <-done, idempotency.ErrStoreUnavailable)

	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	t.Logf("the key now reads %v (fenced through %d)", rec.GetState(), rec.GetFencedThroughTry())
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 3, Deadline: time.Now().Add(time.Second)})
	require.NoError(t, err)
	require.False(t, res.Started,
		"try 3 of a call whose try 1 SUCCEEDED started: the late Begin's lost reply had its try fenced, not ended UNKNOWN")
}
