package redisstore_test

import (
	"context"
	"fmt"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A review found that, once every script carried the run_id of its node's
// check and refused to run on a Redis of another, the Finish that first
// reached a Redis restarted behind the same address (with its data: AOF or
// RDB; or a Sentinel's promoted replica, which holds the primary's records)
// failed, writing nothing, and was never sent again: the try, whose handler
// had run, read IN_PROGRESS until its lease ended, then ABANDONED, and its
// caller got UNKNOWN instead of the handler's answer (the server answers
// UNKNOWN when it cannot finish the record). Before, the Finish of a try the server minted the
// attempt for (a caller without a tollgate header: the horizon, which the
// restart moved, does not apply to it) found its record and ended it. A
// Finish now waits for the new Redis's check, as the next call does, and
// is sent once more with its run_id: its first run wrote nothing. It runs
// a Redis of its own, on a port chosen at run time, which it restarts.

// r16revPersistent starts a redis-server of the test's own on port (on a
// free one, redisstore.StartOnPortForTest's, when port is 0), keeping its
// data in dir (AOF, fsync at every write), and returns its port and a
// function that stops it gracefully (SIGTERM), also run at cleanup.
func r16revPersistent(t *testing.T, port int, dir string) (int, func()) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		skipOrFail(t, "no redis-server binary: "+err.Error())
	}
	if port != 0 {
		probe := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
		defer probe.Close()
		require.Error(t, probe.Ping(context.Background()).Err(), "port %d already answers: it is not the test's", port)
	}
	port, cmd, exited := redisstore.StartOnPortForTest(t, bin, port, func(port int) []string {
		return []string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
			"--appendfsync", "always", "--dir", dir, "--maxmemory-policy", "noeviction"}
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	probe := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer probe.Close()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	t.Cleanup(stop)
	ctx := context.Background()
	waitFor(t, 10*time.Second, "the redis-server of the test's own answering at "+addr, func() bool {
		info := probe.InfoMap(ctx, "server", "persistence")
		return info.Err() == nil && info.Item("Server", "process_id") == fmt.Sprint(cmd.Process.Pid) &&
			info.Item("Persistence", "loading") == "0"
	})
	return port, stop
}

func TestRedisStoreFinishesATryAfterARestartBehindItsAddress_r16rev(t *testing.T) {
	dir := t.TempDir()
	port, stop := r16revPersistent(t, 0, dir)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	const prefix = "r16rev-restart:"
	s := newStore(t, c, prefix)
	k, started, err := r16Begin(s, "minted")
	require.NoError(t, err)
	require.True(t, started)

	// The handler runs; meanwhile Redis restarts behind the same address,
	// with its data.
	stop()
	r16revPersistent(t, port, dir)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = admin.Close() })
	require.Equal(t, int64(1), admin.Exists(context.Background(), recordKey(prefix, k)).Val(), "the restarted Redis lost the record")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1, Minted: true,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("done")})
	require.NoError(t, err, "the handler's outcome was lost")
	// (Get answers UNKNOWN: the restart moved the horizon, and a lookup is
	// no minted try's.) The record holds the outcome.
	rec, err := admin.HMGet(ctx, recordKey(prefix, k), "st", "resp").Result()
	require.NoError(t, err)
	require.Equal(t, []any{fmt.Sprint(int(tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED)), "done"}, rec)
}
