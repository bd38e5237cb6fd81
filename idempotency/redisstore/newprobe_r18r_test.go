package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
)

// An operator found that New, with WithReplicas, accepted a store user who
// lacks WAIT: the first Begin then failed NOPERM, with an error blaming an
// ACL changed since New or a command only the scripts run, while WAIT is a
// command the store sends itself. The README says New reports a command
// Redis refuses as a setting, but for those only the scripts run. New now
// tries the commands it sends itself besides its checks' — EVALSHA (of a
// script Redis does not hold: NOSCRIPT, nothing runs), EVAL (of a script
// that touches no key) and, with WithReplicas, WAIT 0 0 (answered at once)
// — and reports one Redis refuses as a setting, not as an unreachable
// Redis. It runs a Redis of its own, on a port chosen at run time.
func TestNewTriesTheCommandsItSendsItself_r18r(t *testing.T) {
	addr, _ := r16Server(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = admin.Close() })
	c := redis.NewClient(&redis.Options{Addr: addr, Username: "app", Password: "pw", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	for _, tc := range []struct {
		lacks string
		opts  []redisstore.Option
	}{
		{"wait", []redisstore.Option{redisstore.WithReplicas(1, 50*time.Millisecond)}},
		{"evalsha", nil},
		{"eval", nil},
	} {
		t.Run(tc.lacks, func(t *testing.T) {
			require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "app", "reset", "on", ">pw", "~*", "&*", "+@all", "-"+tc.lacks).Err())
			s, err := redisstore.New(ctx, c, append([]redisstore.Option{redisstore.WithPrefix("r18r-probe:")}, tc.opts...)...)
			if err == nil {
				_ = s.Close()
			}
			require.Error(t, err, "New accepted a user that lacks %s, a command the store sends", tc.lacks)
			require.NotErrorIs(t, err, idempotency.ErrStoreUnavailable, "a refused command is a setting: %v", err)
			require.ErrorContains(t, err, "NOPERM")
		})
	}
	// Without WithReplicas, WAIT is not needed, nor tried.
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "app", "reset", "on", ">pw", "~*", "&*", "+@all", "-wait").Err())
	s, err := redisstore.New(ctx, c, redisstore.WithPrefix("r18r-probe:"))
	require.NoError(t, err)
	require.NoError(t, s.Close())
}
