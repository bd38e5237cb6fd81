package redisstore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
)

// An adversarial review (r17f) of the Finish resend loop. These tests run
// Redis servers of their own, on ports chosen at run time.

// The loop bounds each resend by what is left of its 5 s (a context whose
// deadline is the loop's end). A resend cut by that deadline — go-redis
// waiting out its own retry backoff on it, or the store waiting for a
// node's check on it — fails with context.DeadlineExceeded, and the
// Finish's error wrapped it: errors.Is(err, context.DeadlineExceeded) read
// as the caller's context ending while the caller's context had no
// deadline at all (the change claims the loop's own deadline is never the
// error's cause).
func TestR17fLoopDeadlineNotTheCallersCause(t *testing.T) {
	ctx := context.Background()
	admin, _ := r17aServer(t, t.TempDir(), "--replica-serve-stale-data", "no")
	// go-redis resends MASTERDOWN once, after 3 s: the loop's last resend
	// (at about 3 s, after the first send's own resend) is cut by the
	// loop's end while go-redis waits to resend it.
	client := redis.NewClient(&redis.Options{Addr: admin.Options().Addr, ContextTimeoutEnabled: true,
		MaxRetries: 1, MinRetryBackoff: 3 * time.Second, MaxRetryBackoff: 3 * time.Second})
	defer func() { _ = client.Close() }()
	s, err := New(ctx, client, WithPrefix("r17f-deadline:"))
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	key := r17aBegin(t, ctx, s, "0")
	require.NoError(t, admin.Do(ctx, "REPLICAOF", "127.0.0.1", ownPort(t)).Err()) // nothing listens there

	err = s.Finish(ctx, r17aFinishReq(key))
	require.Error(t, err, "the Redis stays a replica cut off from its primary")
	require.NoError(t, ctx.Err())
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	require.False(t, errors.Is(err, context.DeadlineExceeded),
		"a Finish whose caller's context has no deadline fails with context.DeadlineExceeded as its cause: %v", err)
}

// Looping Finishes on a Cluster, sharing reads of its map, end when their
// contexts end or the store is closed, and Close waits for the reads they
// started (TestMain's goleak finds none left). A check of the shared map
// read (readMap): no waiter stuck on a read, no read left running.
func TestR17fLoopingFinishesEndWithCloseAndContexts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := joinedPair(t, ctx)
	s, hook := r17aClusterStore(t, ctx, a, "r17f-close:")
	const n = 8
	ks, _ := r17aMigratingMany(t, ctx, s, a, b, n)

	// Half the Finishes have contexts of their own, canceled while they
	// loop; the store is closed while the others do.
	fctx, fcancel := context.WithCancel(ctx)
	defer fcancel()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, k := range ks {
		c := ctx
		if i%2 == 0 {
			c = fctx
		}
		wg.Go(func() { errs[i] = s.Finish(c, r17aFinishReq(k)) })
	}
	for hook.other.Load() < 2*n {
		require.NoError(t, hook.waitReply(ctx, "OTHER"))
	}
	fcancel()
	for hook.other.Load() < 3*n {
		require.NoError(t, hook.waitReply(ctx, "OTHER"))
	}
	require.NoError(t, s.Close()) // and again at cleanup: Close may be called more than once
	ended := make(chan struct{})
	go func() { wg.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-ctx.Done():
		t.Fatal("looping Finishes did not end after their contexts ended and the store was closed")
	}
	for i, err := range errs {
		require.ErrorIs(t, err, idempotency.ErrStoreUnavailable, "Finish %d", i)
	}
}
