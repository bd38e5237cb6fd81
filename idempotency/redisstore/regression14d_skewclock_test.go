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

// A review found that, while DefaultKeep's doc (and the README) said the Begin and Fence scripts'
// staleness check "assumes Redis's clock within the skew of the servers'".
// With a policy skew of a minute (as CI's interceptor tests use, and
// interceptor.WithClockSkew allows), a server whose clock is 45 s behind
// Redis's is within that assumption, yet the check (Redis's TIME minus the
// call's reading > keep - skew = DefaultKeep, c5e851f) is true for every
// call the server makes: every Begin and every Fence fails
// STORE_UNAVAILABLE, "the script ran more than 30s after its call read the
// clock", although each ran at once. The server's clock is fed through
// hooks.RedisClock; Redis is the real, local one.
func TestRegression14dRecordsRedisClockWithinLargeSkewRefusesEveryBegin(t *testing.T) {
	c, prefix := newClient(t)
	p := storetest.Policy()
	p.Skew, p.TTL = time.Minute, 10*time.Minute
	behind := func() time.Time { return time.Now().Add(-45 * time.Second) } // within the skew of Redis's clock
	s := newStore(t, c, prefix, redisstore.WithPolicy(p), hooks.RedisClock(behind).(redisstore.Option))
	ctx := context.Background()
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(behind()), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: behind().Add(time.Second), Minted: true})
	require.NoError(t, err, "a Begin that ran at once, from a server whose clock is within the skew of Redis's, was refused")
	require.True(t, res.Started, "refused %v", res.Refusal)
	k.Call = "1"
	_, err = s.Fence(ctx, k, 1)
	require.NoError(t, err, "a Fence that ran at once, from a server whose clock is within the skew of Redis's, was refused")
}
