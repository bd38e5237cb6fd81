package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A try's context (its grpc-timeout) that ends before WAIT's timeout must not
// lose WAIT's count: WAIT gets half the time left, answers its shortfall in
// time, and the begun try is fenced, so its next try can start. Sent with
// its own timeout, WAIT outlived the context, the whole pipeline failed, and
// the try stayed IN_PROGRESS until its lease ended, with no handler running
// it.
func TestRedisWaitFitsTheContext(t *testing.T) {
	c, prefix := newClient(t) // the lone Redis: no replica, so WAIT 1 waits its whole timeout
	clock := storetest.NewClock(time.Now())
	p := storetest.Policy()
	waiting := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock), redisstore.WithReplicas(1, 2*time.Second))
	plain := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock))
	k := idempotency.Key{AttemptID: storetest.AttemptIDAt(clock.Now().Add(p.Skew)), Call: "0", Method: "/x.Y/Z"}
	_, err := plain.Get(context.Background(), k)
	require.NoError(t, err)
	clock.Advance(p.Skew)

	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	_, err = waiting.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	require.ErrorContains(t, err, "0 of 1 replicas", "WAIT's count arrived before the context ended")

	rec, err := plain.Get(context.Background(), k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState(), "the try that fell short is fenced")
	res, err := plain.Begin(context.Background(), idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started, "the next try may start: refusal %v", res.Refusal)
}

// go-redis takes a read that outlasts its ReadTimeout for a lost reply and
// sends the pipeline again, so a WAIT longer than the client's ReadTimeout
// never delivers its count. New refuses a WAIT timeout over half the
// ReadTimeout, and a store within the bound fences a try that fell short.
func TestRedisWaitTimeoutWithinReadTimeout(t *testing.T) {
	_, prefix := newClient(t)
	c := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true, ReadTimeout: 300 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	_, err := redisstore.New(context.Background(), c, redisstore.WithPrefix(prefix), redisstore.WithReplicas(1, time.Second))
	require.ErrorContains(t, err, "ReadTimeout")

	clock := storetest.NewClock(time.Now())
	p := storetest.Policy()
	waiting := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock), redisstore.WithReplicas(1, 150*time.Millisecond))
	plain := newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock))
	k := idempotency.Key{AttemptID: storetest.AttemptIDAt(clock.Now().Add(p.Skew)), Call: "0", Method: "/x.Y/Z"}
	_, err = plain.Get(context.Background(), k)
	require.NoError(t, err)
	clock.Advance(p.Skew)
	_, err = waiting.Begin(context.Background(), idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.ErrorContains(t, err, "0 of 1 replicas")
	rec, err := plain.Get(context.Background(), k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
}

// go-redis sets no socket deadline at all, the context's included, when
// ReadTimeout or WriteTimeout is -2, even with ContextTimeoutEnabled: a
// Begin whose reply is lost would block past its try's deadline for as long
// as the connection lives. New refuses such a client; -1 (no timeout of
// its own) still follows the context and is accepted.
func TestRedisNewRefusesClientsWithoutDeadlines(t *testing.T) {
	ctx := context.Background()
	for _, o := range []redis.Options{{ReadTimeout: -2}, {WriteTimeout: -2}, {ReadTimeout: -2, WriteTimeout: 5 * time.Second}} {
		o.Addr, o.ContextTimeoutEnabled = redisAddr(), true
		c := redis.NewClient(&o)
		_, err := redisstore.New(ctx, c)
		_ = c.Close()
		require.ErrorContains(t, err, "-2", "Client ReadTimeout %v, WriteTimeout %v", o.ReadTimeout, o.WriteTimeout)
	}
	for _, o := range []redis.ClusterOptions{{ReadTimeout: -2}, {WriteTimeout: -2}} {
		o.Addrs, o.ContextTimeoutEnabled = clusterAddrs(), true
		c := redis.NewClusterClient(&o)
		_, err := redisstore.New(ctx, c)
		_ = c.Close()
		require.ErrorContains(t, err, "-2", "ClusterClient ReadTimeout %v, WriteTimeout %v", o.ReadTimeout, o.WriteTimeout)
	}

	_, prefix := newClient(t)
	c := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true, ReadTimeout: -1, WriteTimeout: -1})
	t.Cleanup(func() { _ = c.Close() })
	_, err := redisstore.New(ctx, c, redisstore.WithPrefix(prefix))
	require.NoError(t, err, "ReadTimeout -1: no timeout of its own, but the context's deadline")
}
