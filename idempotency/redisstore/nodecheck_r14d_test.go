package redisstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
)

// configCounter is a go-redis hook that counts the CONFIG commands its
// client sends: the first command of a node's full check.
type configCounter struct{ n atomic.Int64 }

func (h *configCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *configCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "config" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *configCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds { // a full check sends its commands in one pipeline
			if cmd.Name() == "config" {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
// A node check that gets a Redis error reply (NOPERM on CONFIG GET for an
// ACL user without CONFIG, a CONFIG renamed away on a managed Redis,
// LOADING, MASTERDOWN) is treated like one that could not reach Redis:
// the node is never refused, so every call to it runs a whole check again
// — one or more round trips per call, for ever — and no script runs.
// Redis answered: its error reply is a verdict on the node, which must be
// refused for a second (failedCheckRefusal) with an error that says what
// Redis answered, so that calls stop paying a check each. Here the store's
// ACL user loses CONFIG after New, a blip on a clock check makes the next
// check a full one, and of the calls in the second after that, only the
// first may send a CONFIG GET.
func TestRedisNodeCheckErrorReplyRefusesNode(t *testing.T) {
	addr, _ := ownRedis(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = admin.Close() })
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all").Err())

	d := &downDialer{}
	counter := &configCounter{}
	c := redis.NewClient(&redis.Options{Addr: addr, Username: "app", Password: "pw", ContextTimeoutEnabled: true, MaxRetries: -1, Dialer: d.dial})
	c.AddHook(counter)
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, "own:", redisstore.WithPolicy(storetest.Policy()),
		hooks.RedisClockRecheckAfter(time.Nanosecond).(redisstore.Option)) // every call checks the node
	key := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	_, err := s.Get(ctx, key)
	require.NoError(t, err)

	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "app", "-config").Err())
	d.down.Store(true) // the clock check fails unreached: the next check is a full one
	_, err = s.Get(ctx, key)
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "a call during the blip")
	d.down.Store(false)

	start := time.Now()
	before := counter.n.Load()
	const calls = 5
	for i := range calls {
		_, err = s.Get(ctx, key)
		require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "call %d to a node whose check Redis answered NOPERM", i)
		require.ErrorContains(t, err, "NOPERM", "call %d: the error says what Redis answered", i)
	}
	// One check per refusal (1 s) at most: one for calls within a second;
	// a slow machine's calls may span another refusal or two.
	elapsed := time.Since(start)
	require.LessOrEqual(t, counter.n.Load()-before, int64(1+elapsed/time.Second),
		"CONFIG commands sent by %d calls within %v after Redis answered a check with an error", calls, elapsed)

	// Redis grants CONFIG again: once the refusal ends, the node passes.
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "app", "+config").Err())
	require.Eventually(t, func() bool {
		_, err := s.Get(ctx, key)
		return err == nil
	}, 5*time.Second, 50*time.Millisecond, "the node is refused for good")
}
