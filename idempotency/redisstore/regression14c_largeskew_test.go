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
)

// With a policy skew above DefaultKeep (a minute), the Begin script's
// staleness check (Redis's clock more than the keep less the skew past the
// call's reading) refused every try until the keep was made DefaultKeep
// plus the skew. CI's run of the interceptor's skew=1m tests found it.
func TestRegression14cSkewAboveDefaultKeepStillBegins(t *testing.T) {
	c, prefix := newClient(t)
	p := storetest.Policy()
	p.Skew, p.TTL = time.Minute, 10*time.Minute
	s := newStore(t, c, prefix, redisstore.WithPolicy(p))
	ctx := context.Background()
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: time.Now().Add(time.Second), Minted: true})
	require.NoError(t, err)
	require.True(t, res.Started, "refused %v", res.Refusal)
}

// New refuses a Redis whose clock differs from the server's by more than
// the skew (plus a second), either way: ahead, every Begin and Fence script
// would take its call for a stale one and refuse it, and fresh attempts
// would stay unverifiable after a horizon move; behind, the staleness check
// would be off (a later review found that one).
func TestRegression14cNewRefusesARedisClockFarOff(t *testing.T) {
	for _, off := range []time.Duration{-time.Minute, time.Minute} {
		c, prefix := newClient(t)
		server := func() time.Time { return time.Now().Add(off) }
		_, err := redisstore.New(context.Background(), c, redisstore.WithPrefix(prefix), hooks.RedisClock(server).(redisstore.Option))
		require.ErrorContains(t, err, "differs from this server's", "server clock off by %v", off)
	}
}
