package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
)

// A full Redis refuses a new try, and the refused script writes nothing
// (its first write, horizon()'s HSET for a tenant without a horizon key, is
// the one Redis refuses). But Begin takes the OOM error as "may have run"
// and sends the fence of the try it began (endBegun); that finish is refused for OOM too, and
// Store.finish then resends it as finishFullScript (allow-oom), whose
// horizon() writes the tenant's horizon key past maxmemory. A refused new
// try of a tenant Redis has not seen leaves a key behind on a full Redis:
// the allow-oom variant's first write is not the record's (it finishes
// nothing here: there is no record).
func TestRegression13cRefusedBeginWritesNothingOnFullRedis(t *testing.T) {
	c := privateRedis(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s := newStore(t, c, "r83oomh:", redisstore.WithPolicy(p), clockOption(clock))
	ctx := context.Background()
	k := idempotency.Key{Tenant: "newtenant", AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "0", Method: "/x.Y/Z"}

	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "1").Err()) // Redis is full
	_, beginErr := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second), Minted: true})
	keys, kerr := c.Keys(ctx, "r83oomh:*").Result()
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err())
	require.NoError(t, kerr)

	require.ErrorIs(t, beginErr, idempotency.ErrStoreFull)
	require.Empty(t, keys, "a Begin refused for want of memory left keys written past maxmemory")
}
