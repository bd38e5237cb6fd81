package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
)

// A nil option panicked in New, where admission, budget and interceptor
// ignore one.
func TestRedisNilOptionIsIgnored_r18s(t *testing.T) {
	c, prefix := newClient(t)
	require.NotPanics(t, func() {
		s, err := redisstore.New(context.Background(), c, redisstore.WithPrefix(prefix), nil)
		require.NoError(t, err)
		require.NoError(t, s.Close())
	})
}

// New's option errors wrapped no sentinel (CONVENTIONS §4); they wrap
// idempotency.ErrInvalidOption, as the memory store's do. A Redis server
// New refuses (here one whose INFO hides its run_id) is not an invalid
// option: its error does not wrap the sentinel.
func TestRedisOptionErrorsWrapErrInvalidOption_r18s(t *testing.T) {
	c, prefix := newClient(t)
	ctx := context.Background()
	short := idempotency.DefaultPolicy()
	short.TTL = time.Second
	skewed := idempotency.DefaultPolicy()
	skewed.Skew, skewed.TTL = time.Hour, 3*time.Hour
	for name, opt := range map[string]redisstore.Option{
		"Prefix":              redisstore.WithPrefix("a{b"),
		"Policy":              redisstore.WithPolicy(short),
		"PolicySkew":          redisstore.WithPolicy(skewed),
		"Replicas":            redisstore.WithReplicas(-1, time.Second),
		"ReplicasTimeout":     redisstore.WithReplicas(1, 0),
		"ReplicasReadTimeout": redisstore.WithReplicas(1, time.Minute),
		"MaxRecordsPerTenant": redisstore.WithMaxRecordsPerTenant(-1),
		"IdleTenantExpiry":    redisstore.WithIdleTenantExpiry(time.Second),
	} {
		s, err := redisstore.New(ctx, c, redisstore.WithPrefix(prefix), opt)
		if s != nil {
			require.NoError(t, s.Close())
		}
		require.ErrorIs(t, err, idempotency.ErrInvalidOption, name)
	}

	c2, prefix2 := newClient(t)
	c2.AddHook(stripInfo{field: "run_id"})
	_, err := redisstore.New(ctx, c2, redisstore.WithPrefix(prefix2))
	require.ErrorContains(t, err, "run_id")
	require.NotErrorIs(t, err, idempotency.ErrInvalidOption)
}
