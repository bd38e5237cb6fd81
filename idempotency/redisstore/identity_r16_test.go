package redisstore_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
)

// A review found that the store fully checked (maxmemory-policy noeviction
// included) only the Redis New reached, and, off a Cluster, kept one check
// for "the Redis behind the client": after New it only read the clock again
// once a minute. When the client's address came to reach another Redis (a
// Sentinel failover to a replica, a DNS name or VIP moved, Redis restarted
// behind the same address with another configuration), that server was
// never checked unless its clock stood behind the first's: a new primary
// with maxmemory-policy allkeys-lru took the store's records, and would
// evict them and let a repeated try run again. The scripts now compare the
// run_id of the Redis they run on with the one the store's last full check
// of the node read, and refuse, writing nothing, when they differ: that
// call fails (idempotency.ErrStoreUnavailable), and the next call has the
// node checked in full. These tests run servers of their own, on ports
// chosen at run time.

// r16Server starts a redis-server of the test's own on a free port
// (redisstore.StartOnPortForTest) with args (after the store's defaults,
// noeviction included, which they override), and returns its address and a
// function that kills it (also run at cleanup).
func r16Server(t *testing.T, args ...string) (string, func()) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		skipOrFail(t, "no redis-server binary: "+err.Error())
	}
	port, cmd, exited := redisstore.StartOnPortForTest(t, bin, 0, func(port int) []string {
		return append([]string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", t.TempDir(), "--maxmemory-policy", "noeviction"}, args...)
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	probe := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer probe.Close()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	t.Cleanup(stop)
	ctx := context.Background()
	waitFor(t, 10*time.Second, "the redis-server of the test's own answering at "+addr, func() bool {
		info := probe.InfoMap(ctx, "server")
		return info.Err() == nil && info.Item("Server", "process_id") == fmt.Sprint(cmd.Process.Pid)
	})
	return addr, stop
}

// r16Begin begins try 1 of a new call of tenant acme, minted by the server.
func r16Begin(s *redisstore.Store, call string) (idempotency.Key, bool, error) {
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: call, Method: "/x.Y/Z"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: time.Now().Add(5 * time.Second), Minted: true})
	return k, res.Started, err
}

// refusedEverywhere begins n calls on s and requires that none started and
// that lru (the evicting Redis the client now reaches) holds none of their
// records; it returns their errors.
func refusedEverywhere(t *testing.T, s *redisstore.Store, lru *redis.Client, prefix string, n int) []error {
	t.Helper()
	var errs []error
	for i := range n {
		k, started, err := r16Begin(s, fmt.Sprint("lru-", i))
		require.False(t, started, "call %d began a try on a Redis whose maxmemory-policy is allkeys-lru", i)
		require.Error(t, err, "call %d", i)
		require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
		require.Zero(t, lru.Exists(context.Background(), recordKey(prefix, k)).Val(), "call %d wrote its record to the evicting Redis", i)
		errs = append(errs, err)
	}
	return errs
}

// anyContains reports whether any of errs says want.
func anyContains(errs []error, want string) bool {
	for _, err := range errs {
		if strings.Contains(err.Error(), want) {
			return true
		}
	}
	return false
}

func TestRedisStoreChecksAnotherServerBehindItsAddress(t *testing.T) {
	aAddr, stopA := r16Server(t)
	cAddr, stopC := r16Server(t)
	bAddr, _ := r16Server(t, "--maxmemory-policy", "allkeys-lru")
	var target atomic.Value
	target.Store(aAddr)
	// A client of one address, which a DNS name or a VIP moves: its Dialer
	// reaches whichever server target names.
	c := redis.NewClient(&redis.Options{Addr: "redis.r16.invalid:6379", ContextTimeoutEnabled: true,
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, target.Load().(string))
		}})
	t.Cleanup(func() { _ = c.Close() })
	const prefix = "r16-addr:"
	s := newStore(t, c, prefix)
	_, started, err := r16Begin(s, "on-a")
	require.NoError(t, err)
	require.True(t, started)

	// A's address now reaches C, as checked as A (noeviction): the call
	// that finds C refuses, writing nothing, and the next one, after C's
	// check, begins its try there.
	target.Store(cAddr)
	stopA()
	k, started, err := r16Begin(s, "first-on-c")
	require.False(t, started)
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	require.ErrorContains(t, err, "another Redis")
	cc := redis.NewClient(&redis.Options{Addr: cAddr})
	t.Cleanup(func() { _ = cc.Close() })
	require.Zero(t, cc.Exists(context.Background(), recordKey(prefix, k)).Val(), "the refused call wrote its record")
	k, started, err = r16Begin(s, "second-on-c")
	require.NoError(t, err)
	require.True(t, started)
	require.Equal(t, int64(1), cc.Exists(context.Background(), recordKey(prefix, k)).Val())

	// C's address now reaches B, whose maxmemory-policy is allkeys-lru:
	// no call begins a try there, and B's check names the policy.
	target.Store(bAddr)
	stopC()
	b := redis.NewClient(&redis.Options{Addr: bAddr})
	t.Cleanup(func() { _ = b.Close() })
	errs := refusedEverywhere(t, s, b, prefix, 5)
	require.True(t, anyContains(errs, "noeviction"), "no refusal names the policy: %v", errs)
}

func TestRedisStoreChecksTheNewPrimaryAfterASentinelFailover(t *testing.T) {
	pAddr, _ := r16Server(t)
	_, pPort, err := net.SplitHostPort(pAddr)
	require.NoError(t, err)
	rAddr, _ := r16Server(t, "--maxmemory-policy", "allkeys-lru", "--replicaof", "127.0.0.1", pPort)
	_, rPort, err := net.SplitHostPort(rAddr)
	require.NoError(t, err)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		skipOrFail(t, "no redis-server binary: "+err.Error())
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	sPort, cmd, exited := redisstore.StartOnPortForTest(t, bin, 0, func(port int) []string {
		require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\n"+
			"sentinel monitor r16 127.0.0.1 %s 1\nsentinel down-after-milliseconds r16 2000\nsentinel failover-timeout r16 10000\n", port, dir, pPort)), 0o600))
		return []string{conf, "--sentinel"}
	})
	sAddr := fmt.Sprintf("127.0.0.1:%d", sPort)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sc := redis.NewSentinelClient(&redis.Options{Addr: sAddr})
	t.Cleanup(func() { _ = sc.Close() })
	waitFor(t, 20*time.Second, "the Sentinel knowing the primary and its replica", func() bool {
		a, err := sc.GetMasterAddrByName(ctx, "r16").Result()
		if err != nil || len(a) != 2 || a[0]+":"+a[1] != pAddr {
			return false
		}
		reps, err := sc.Replicas(ctx, "r16").Result()
		if err != nil {
			return false
		}
		for _, r := range reps {
			if r["ip"]+":"+r["port"] == rAddr && r["master-link-status"] == "ok" && !strings.Contains(r["flags"], "down") {
				return true
			}
		}
		return false
	})

	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "r16", SentinelAddrs: []string{sAddr}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	const prefix = "r16-sentinel:"
	s := newStore(t, c, prefix)
	_, started, err := r16Begin(s, "on-p")
	require.NoError(t, err)
	require.True(t, started)

	require.NoError(t, sc.Failover(ctx, "r16").Err())
	waitFor(t, 30*time.Second, "the failover client reaching the promoted replica", func() bool {
		a, err := sc.GetMasterAddrByName(ctx, "r16").Result()
		if err != nil || len(a) != 2 || a[0]+":"+a[1] != rAddr {
			return false
		}
		info, err := c.Info(ctx, "server", "replication").Result()
		return err == nil && strings.Contains(info, "tcp_port:"+rPort) && strings.Contains(info, "role:master")
	})
	r := redis.NewClient(&redis.Options{Addr: rAddr})
	t.Cleanup(func() { _ = r.Close() })
	errs := refusedEverywhere(t, s, r, prefix, 5)
	require.True(t, anyContains(errs, "noeviction"), "no refusal names the policy: %v", errs)
}
