package redisstore_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/internal/hooks"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// ownRedis starts a redis-server of the test's own on a free port above
// 7400 and returns its address and process; it is killed at cleanup.
func ownRedis(t *testing.T) (string, *exec.Cmd) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("no redis-server")
	}
	for port := 7431; port < 7499; port++ {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		_ = l.Close()
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		cmd := exec.Command(bin, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--maxmemory-policy", "noeviction")
		require.NoError(t, cmd.Start())
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		c := redis.NewClient(&redis.Options{Addr: addr})
		defer c.Close()
		waitFor(t, 5*time.Second, "own redis-server answering", func() bool { return c.Ping(context.Background()).Err() == nil })
		return addr, cmd
	}
	t.Fatal("no free port")
	return "", nil
}

// A review found that a Begin whose reply is lost decided between FENCED and UNKNOWN by how
// long the call took on the client (endBegun: late = s.late(read) != nil),
// but a script that was sent may run much later than the client gave up:
// here Redis stalls (SIGSTOP, as a long fork, swap or VM pause would), the
// Begin's context ends after 150 ms — within the keep — so the lost-reply
// fence is FENCED, not UNKNOWN. When Redis goes on, it runs the Begin's
// script first with its stale reading: the SUCCEEDED record has been
// removed by its TTL, the reading vouches for its absence, try 2 begins;
// then the fence, which the Begin token now lets end the try: FENCED(2).
// Try 3 of the call that SUCCEEDED begins: its handler runs again.
func TestRegression14cStoreStalledLostReplyFenceTombstonesSucceededCall(t *testing.T) {
	addr, proc := ownRedis(t)
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 4})
	t.Cleanup(func() { _ = c.Close() })
	plain := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = plain.Close() })
	p := idempotency.Policy{Skew: 100 * time.Millisecond, Grace: 100 * time.Millisecond,
		MaxAttemptDeadline: 3 * time.Second, TTL: 3200 * time.Millisecond, MaxResponseBytes: 1024}
	s, err := redisstore.New(context.Background(), c, redisstore.WithPrefix("review:"), redisstore.WithPolicy(p),
		hooks.RedisKeep(300*time.Millisecond).(redisstore.Option))
	require.NoError(t, err)
	ctx := context.Background()
	// The tenant's horizon starts, then k is minted skew ahead: inside it.
	_, err = s.Get(ctx, idempotency.Key{Tenant: "acme", AttemptID: attemptIDNow(0), Call: "h", Method: "/x.Y/Z"})
	require.NoError(t, err)
	afterHorizon()
	k := idempotency.Key{Tenant: "acme", AttemptID: attemptIDNow(p.Skew), Call: "0", Method: "/x.Y/Z"}
	ts, _ := idempotency.AttemptTime(k.AttemptID)
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: time.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	require.NoError(t, s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("charged")}))
	rk := recordKey("review:", k)
	pttl := plain.PTTL(ctx, rk).Val()
	gone := time.Now().Add(pttl)

	// The pool holds several open connections (a busy server's would).
	conns := make([]*redis.Conn, 3)
	for i := range conns {
		conns[i] = c.Conn()
		require.NoError(t, conns[i].Ping(ctx).Err())
	}
	for _, cn := range conns {
		require.NoError(t, cn.Close()) // back to the pool, open
	}
	// Shortly before absence stops being evidence, Redis stalls.
	time.Sleep(time.Until(ts.Add(-p.Skew + p.TTL - 250*time.Millisecond)))
	require.NoError(t, proc.Process.Signal(syscall.SIGSTOP))
	bctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
	_, err = s.Begin(bctx, idempotency.BeginRequest{Key: k, Try: 2, Deadline: time.Now().Add(2 * time.Second)})
	cancel()
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	time.Sleep(time.Until(gone) + 500*time.Millisecond) // the SUCCEEDED record's TTL ends during the stall
	require.NoError(t, proc.Process.Signal(syscall.SIGCONT))

	time.Sleep(200 * time.Millisecond)
	rec, err := s.Get(ctx, k)
	require.NoError(t, err)
	t.Logf("after the stall the key reads %v (try %d, fenced through %d)", rec.GetState(), rec.GetTry(), rec.GetFencedThroughTry())
	res, err = s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 3, Deadline: time.Now().Add(time.Second)})
	require.NoError(t, err)
	require.False(t, res.Started,
		"try 3 of a call whose try 1 SUCCEEDED started: the lost-reply fence tombstoned the try a stalled, stale Begin script began")
}
