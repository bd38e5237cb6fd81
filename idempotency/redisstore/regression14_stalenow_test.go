package redisstore_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A review found that a store call read the server's clock (now) before it
// sent its script, and the script judged the record by that now ("exp <=
// now" for a record that has expired, "now < ts - skew + ttl" for an
// absence it may vouch for), while Redis removed the record by its own TTL,
// in real time, exactly exp - now after the last write. A call whose script
// ran later than it read the clock (it waited for a pooled connection, as
// here; or go-redis resent it after a lost reply, with the same arguments)
// found the record already gone while its stale now still vouched for the
// absence: Begin started the try of a call that had SUCCEEDED again — the
// handler ran twice for one record key (DESIGN.md §3.7). Redis now keeps a
// record DefaultKeep past its expiry, and a call whose reply comes later
// than that fails instead of acting on what it judged.
//
// The only artifice here is a small policy (TTL 1.2 s) so that the record
// expires during the test; the clock is the real one, the delay a real wait
// for the client's only pooled connection.
func TestRegression14RedisStaleNowResurrectsExpiredRecord(t *testing.T) {
	t.Run("within the keep", func(t *testing.T) {
		_, plain, held, rk, begin := staleBegin(t, nil)
		// Hold the connection until the record is past its expiry.
		exp, err := plain.HGet(t.Context(), rk, "exp").Int64()
		require.NoError(t, err)
		time.Sleep(time.Until(time.UnixMilli(exp)) + 50*time.Millisecond)
		require.EqualValues(t, 1, plain.Exists(t.Context(), rk).Val(), "Redis keeps the record past its expiry")
		require.NoError(t, held.Close()) // the connection is free again
		o := <-begin
		require.NoError(t, o.err)
		require.False(t, o.res.Started,
			"try 2 started although try 1 SUCCEEDED: its stale now vouched for an expired record's absence (refusal %v)", o.res.Refusal)
		require.Equal(t, idempotency.RefusedFinished, o.res.Refusal, "judged by its reading, the record had not expired")
	})
	t.Run("later than the keep", func(t *testing.T) {
		s, plain, held, rk, begin := staleBegin(t, hooks.RedisKeep(300*time.Millisecond).(redisstore.Option))
		waitFor(t, 10*time.Second, "Redis removing the record at its expiry plus the keep", func() bool {
			return plain.Exists(t.Context(), rk).Val() == 0
		})
		require.NoError(t, held.Close())
		o := <-begin
		require.ErrorIs(t, o.err, idempotency.ErrStoreUnavailable, "a reply later than the keep is not acted on")
		require.False(t, o.res.Started)
		// The script, judging by its stale now, began the try; what the
		// key reads as now must not let the owner repeat a call that
		// SUCCEEDED (UNSEEN, FENCED, or a try in progress that would read
		// ABANDONED and then be fenced): UNKNOWN.
		rec, err := s.Get(t.Context(), idempotency.Key{Tenant: "acme", AttemptID: attemptOf(rk), Call: "0", Method: "/x.Y/Z"})
		require.NoError(t, err)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState())
	})
}

type beginOut struct {
	res idempotency.BeginResult
	err error
}

// staleBegin begins and finishes try 1 of a call on a store whose client has
// one pooled connection, takes that connection, and starts Begin of try 2,
// which reads the clock and waits for it. It returns the store, a plain
// client, the held connection (close it to let Begin go on), the record's
// key and Begin's result.
func staleBegin(t *testing.T, opt redisstore.Option) (*redisstore.Store, *redis.Client, *redis.Conn, string, chan beginOut) {
	t.Helper()
	plain, prefix := newClient(t)
	p := idempotency.Policy{Skew: 100 * time.Millisecond, Grace: 100 * time.Millisecond,
		MaxAttemptDeadline: time.Second, TTL: 1200 * time.Millisecond, MaxResponseBytes: 1024}
	var read atomic.Int32
	readNow := make(chan struct{}, 1)
	clock := func() time.Time {
		t := time.Now()
		if read.Add(-1) == 0 {
			readNow <- struct{}{}
		}
		return t
	}
	c := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true, PoolSize: 1, PoolTimeout: 30 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	opts := []redisstore.Option{redisstore.WithPrefix(prefix), redisstore.WithPolicy(p), hooks.RedisClock(clock).(redisstore.Option)}
	if opt != nil {
		opts = append(opts, opt)
	}
	s, err := redisstore.New(context.Background(), c, opts...)
	require.NoError(t, err)
	ctx := context.Background()

	// The tenant's horizon starts, then k is minted skew ahead: inside it.
	_, err = s.Get(ctx, idempotency.Key{Tenant: "acme", AttemptID: attemptIDNow(0), Call: "h", Method: "/x.Y/Z"})
	require.NoError(t, err)
	afterHorizon()
	k := idempotency.Key{Tenant: "acme", AttemptID: attemptIDNow(p.Skew), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: time.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("charged")}))
	rk := prefix + "{t:acme}:r|" + k.AttemptID + "|0|/x.Y/Z"

	// Another goroutine of this server holds the client's only connection
	// for a while (a slow command, a busy pool).
	held := c.Conn()
	require.NoError(t, held.Ping(ctx).Err())
	done := make(chan beginOut, 1)
	read.Store(1)
	go func() {
		bctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r, err := s.Begin(bctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: time.Now().Add(time.Second)})
		done <- beginOut{r, err}
	}()
	<-readNow // try 2's Begin read the clock, and waits for the connection
	return s, plain, held, rk, done
}

func attemptIDNow(ahead time.Duration) string {
	return storetest.AttemptIDAt(time.Now().Add(ahead))
}

// attemptOf returns the attempt ID in record key rk (prefix{t:tenant}:r|id|call|method).
func attemptOf(rk string) string {
	return strings.Split(rk, "|")[1]
}
