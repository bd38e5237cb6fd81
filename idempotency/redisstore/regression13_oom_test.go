package redisstore_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// privateRedis starts a redis-server of this test's own on a free port
// (so that its maxmemory can be changed without disturbing the shared one)
// and returns a client of it; both end at cleanup.
func privateRedis(t *testing.T) *redis.Client {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		skipOrFail(t, "no redis-server binary: "+err.Error())
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	cmd := exec.Command(path, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", t.TempDir(), "--maxmemory-policy", "noeviction")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	for i := 0; ; i++ {
		if c.Ping(context.Background()).Err() == nil {
			return c
		}
		require.Less(t, i, 200, "the private redis-server did not start")
		time.Sleep(10 * time.Millisecond)
	}
}

// A full Redis (noeviction, used memory over maxmemory) must refuse new
// tries, not the end of one already running: a started try that succeeded
// is recorded SUCCEEDED (its response not kept, as FinishRequest.Response
// says of a response "the store has no room for"), with its units, as the
// memory store does. Redis refuses the finish script's HSET instead: Finish
// fails with ErrStoreFull, the record stays IN_PROGRESS until its lease
// ends and then reads ABANDONED, so the owner ends the call UNKNOWN and the
// units stay held.
func TestRegression13FullRedisStillFinishesRunningTry(t *testing.T) {
	c := privateRedis(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s := newStore(t, c, "r63:", redisstore.WithPolicy(p), clockOption(clock))
	ctx := context.Background()
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(clock.Now().Add(p.Skew)), Call: "0", Method: "/x.Y/Z"}
	_, err := s.Get(ctx, k)
	require.NoError(t, err)
	clock.Advance(p.Skew)
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)

	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "1").Err()) // Redis is full
	finishErr := s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("ok"), UnitsSpent: 3})
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err())

	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	require.NoError(t, finishErr, "a full store refused the finish of a running try; record now %v", rec.GetState())
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
	require.Equal(t, int64(3), rec.GetUnitsSpent())
}
