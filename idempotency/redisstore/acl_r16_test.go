package redisstore_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
)

// A review found that a command Redis refuses to the store's ACL user after
// New (its ACL changed at runtime: EVALSHA taken away, a command its
// scripts run, the keys under its prefix) failed store calls with
// idempotency.ErrStoreUnavailable and Redis's bare reply — on Redis 7.0,
// for a command a script runs, "The user executing the script can't run
// this command or subcommand", which names neither the command nor what
// to grant —, while New reports the same refusal with what the store's
// user needs. A call still fails with ErrStoreUnavailable (the
// idempotency.Store contract has no other error for a fault of the store:
// a server refuses the try NOT_ADMITTED STORE_UNAVAILABLE, the try does not
// run, and calls work again once the ACL is restored), and its error now
// says that Redis refused the store's command, and what the user needs.
// It runs on a Redis of its own (on a port chosen at run time), whose ACL
// it changes.
func TestRedisStoreNamesACommandRefusedAfterNew(t *testing.T) {
	addr, _ := r16Server(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = admin.Close() })
	setUser := func(rules ...string) {
		t.Helper()
		require.NoError(t, admin.Do(ctx, append([]any{"ACL", "SETUSER", "app"}, toAny(rules)...)...).Err())
	}
	setUser("on", ">pw", "~*", "&*", "+@all")
	c := redis.NewClient(&redis.Options{Addr: addr, Username: "app", Password: "pw", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	const prefix = "r16-acl:"
	s := newStore(t, c, prefix)
	_, started, err := r16Begin(s, "before")
	require.NoError(t, err)
	require.True(t, started)

	for _, tc := range []struct {
		name            string
		revoke, restore []string
	}{
		{"EVALSHA and EVAL", []string{"-evalsha", "-eval"}, []string{"+evalsha", "+eval"}},
		{"a command its scripts run", []string{"-hset"}, []string{"+hset"}},
		{"the keys under its prefix", []string{"resetkeys", "~other:*"}, []string{"resetkeys", "~*"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setUser(tc.revoke...)
			t.Cleanup(func() { setUser(tc.restore...) }) // the next case's user, even when this one fails
			k, started, err := r16Begin(s, "revoked")
			require.False(t, started, "the try began")
			require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
			require.ErrorContains(t, err, "Redis refused a command of the store")
			require.ErrorContains(t, err, "needs CONFIG GET, INFO, TIME, SCRIPT LOAD, EVALSHA, EVAL")
			require.Zero(t, admin.Exists(ctx, recordKey(prefix, k)).Val(), "the refused Begin wrote its record")

			setUser(tc.restore...)
			_, started, err = r16Begin(s, "restored")
			require.NoError(t, err)
			require.True(t, started)
		})
	}
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
