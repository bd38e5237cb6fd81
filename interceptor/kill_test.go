package interceptor_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// The killed-server test of issue 4 (DESIGN.md §3 invariants 1, 5, 7, 8),
// end to end: a real server process, behind tollgate's interceptors and a
// Redis record store, runs a call's effect and is killed (SIGKILL) before the
// try's record is finished. Another server on the same store then answers
// for the call: IN_PROGRESS until the lease (d + skew) ends, then ABANDONED,
// never UNSEEN; no later try runs the handler again; the owner that sent the
// call ends it UNKNOWN with its attempt ID.

// killChildEnv, when set (to "prefix|skew in ms"), makes the test binary's
// TestHelperKillableServerProcess act as the server process that
// TestKilledServerProcessLeavesCallInProgressThenAbandoned starts and kills.
const killChildEnv = "TOLLGATE_INTERCEPTOR_KILL_CHILD"

const (
	// killSkew is the clock skew of both servers and of the store's policy
	// (WithAttemptStore asks for the same): not 0, so that the test sees the
	// lease last d + skew, not d.
	killSkew = 50 * time.Millisecond
	// killAttemptTimeout is the attempt's deadline d, counted from when the
	// owner starts it: the IN_PROGRESS window the test observes.
	killAttemptTimeout = 2 * time.Second
	// killPerTry is how long the owner waits for one try before it queries.
	killPerTry = 300 * time.Millisecond
	// killBound bounds every wait for a condition: generous, for -race on a
	// loaded machine.
	killBound = 30 * time.Second
)

// killPolicy is the store policy of both servers: short times, and a TTL
// that keeps the record (and so the ABANDONED answer) well past the lease.
func killPolicy(skew time.Duration) idempotency.Policy {
	p := idempotency.DefaultPolicy()
	p.Skew = skew
	p.Grace = time.Second
	p.MaxAttemptDeadline = 10 * time.Second
	p.TTL = 20 * time.Second
	return p
}

func killServerOptions(store idempotency.Store, skew time.Duration) []grpc.ServerOption {
	return interceptor.ServerOptions(
		interceptor.WithTrustedPeer(interceptor.TrustLoopback),
		interceptor.WithClockSkew(skew),
		interceptor.WithMaxAttemptTime(killPolicy(skew).MaxAttemptDeadline),
		interceptor.WithAttemptStore(store),
	)
}

func killRedisAddr() string {
	if a := os.Getenv("TOLLGATE_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

func newKillRedisClient() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: killRedisAddr(), ContextTimeoutEnabled: true})
}

// killRedis returns a client of the test Redis and a fresh key prefix; every
// key under the prefix is deleted and the client closed when the test ends.
// It skips the test when no Redis answers, unless TOLLGATE_REQUIRE_REDIS=1.
func killRedis(t *testing.T) (*redis.Client, string) {
	t.Helper()
	c := newKillRedisClient()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		if os.Getenv("TOLLGATE_REQUIRE_REDIS") == "1" {
			t.Fatalf("no Redis answers at %s (TOLLGATE_REQUIRE_REDIS=1): %v", killRedisAddr(), err)
		}
		t.Skipf("no Redis answers at %s (set TOLLGATE_REDIS_ADDR, or run scripts/ensure-redis.sh): %v", killRedisAddr(), err)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	prefix := "tollgate-test:kill:" + hex.EncodeToString(b) + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var keys []string
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("listing the test's Redis keys: %v", err)
		}
		if len(keys) > 0 {
			if err := c.Del(ctx, keys...).Err(); err != nil {
				t.Errorf("deleting the test's Redis keys: %v", err)
			}
		}
		_ = c.Close()
	})
	return c, prefix
}

// Keys of the handler's effect, under the test's prefix: how many times it
// ran, and the try that ran it.
func effectKey(prefix string) string    { return prefix + "effect" }
func effectTryKey(prefix string) string { return prefix + "effect-try" }

func killRequest() *testingv1.ApplyRequest {
	return &testingv1.ApplyRequest{Key: "acct", Amount: 5}
}

// applyEffect is the state change of Apply: it counts its runs in Redis and
// notes the try that ran.
func applyEffect(ctx context.Context, c *redis.Client, prefix string) error {
	a, _ := interceptor.AttemptFromContext(ctx)
	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Incr(ctx, effectKey(prefix))
		p.Set(ctx, effectTryKey(prefix), a.Try, 0)
		return nil
	})
	return err
}

func readInt(ctx context.Context, c *redis.Client, key string) (int64, error) {
	n, err := c.Get(ctx, key).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, err
}

// TestHelperKillableServerProcess is not a test: run as the child of
// TestKilledServerProcessLeavesCallInProgressThenAbandoned (killChildEnv
// set), it is the server process that test kills. It serves Apply (and the
// AttemptService) behind tollgate's interceptors and a Redis store; Apply
// performs its effect and then never returns, so the try's record is never
// finished. It prints "ADDR host:port" once serving, and exits if its parent
// goes away (stdin closes).
func TestHelperKillableServerProcess(t *testing.T) {
	spec := os.Getenv(killChildEnv)
	if spec == "" {
		t.Skip("helper process of TestKilledServerProcessLeavesCallInProgressThenAbandoned; runs only as its child")
	}
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "kill child: "+format+"\n", args...)
		os.Exit(2)
	}
	prefix, skewMS, ok := strings.Cut(spec, "|")
	ms, err := strconv.ParseInt(skewMS, 10, 64)
	if !ok || err != nil {
		fail("bad %s %q", killChildEnv, spec)
	}
	skew := time.Duration(ms) * time.Millisecond
	c := newKillRedisClient()
	store, err := redisstore.New(context.Background(), c, redisstore.WithPrefix(prefix), redisstore.WithPolicy(killPolicy(skew)))
	if err != nil {
		fail("store: %v", err)
	}
	never := make(chan struct{})
	svc := &testsvc.Service{
		ApplyFunc: func(ctx context.Context, _ *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			if err := applyEffect(ctx, c, prefix); err != nil {
				return nil, err
			}
			<-never // the effect happened; the process dies before the record is finished
			return &testingv1.ApplyResponse{}, nil
		},
	}
	e, err := testsvc.Start(testsvc.TCP, func(s *grpc.Server) {
		svc.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, killServerOptions(store, skew)...)
	if err != nil {
		fail("start: %v", err)
	}
	fmt.Printf("ADDR %s\n", e.Addr)
	_, _ = io.Copy(io.Discard, os.Stdin)
	fail("the parent went away before killing this process")
}

// killableChild is the running server process.
type killableChild struct {
	cmd  *exec.Cmd
	addr string
	once sync.Once
}

// startKillableChild re-executes the test binary as the server process and
// returns once it serves. The process is killed and waited for when the test
// ends, if the test has not done so.
func startKillableChild(t *testing.T, prefix string, skew time.Duration) *killableChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperKillableServerProcess$", "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%d", killChildEnv, prefix, skew.Milliseconds()))
	// The child reads stdin until it closes: it dies with its parent. Pipes
	// and os.Stderr are files, so no goroutine copies them.
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	ch := &killableChild{cmd: cmd}
	t.Cleanup(func() {
		ch.kill()
		_ = stdin.Close()
	})
	// A child that never says where it serves is killed, which ends the read.
	guard := time.AfterFunc(killBound, func() { _ = cmd.Process.Kill() })
	defer guard.Stop()
	r := bufio.NewReader(stdout)
	var seen []string
	for {
		line, err := r.ReadString('\n')
		if addr, ok := strings.CutPrefix(strings.TrimSpace(line), "ADDR "); ok {
			ch.addr = addr
			return ch
		}
		seen = append(seen, line)
		if err != nil {
			t.Fatalf("the server process ended before serving (%v); its output: %q", err, seen)
		}
	}
}

// kill sends SIGKILL and waits for the process to end (which also closes the
// stdout pipe). It returns the process state.
func (ch *killableChild) kill() *os.ProcessState {
	ch.once.Do(func() {
		_ = ch.cmd.Process.Kill()
		_ = ch.cmd.Wait()
	})
	return ch.cmd.ProcessState
}

// killObservation is one GetAttempt answer and when it was asked.
type killObservation struct {
	before, after time.Time
	rec           *tollgatev1.AttemptRecord
	err           error
}

func TestKilledServerProcessLeavesCallInProgressThenAbandoned(t *testing.T) {
	rc, prefix := killRedis(t)
	ctx := t.Context()
	store, err := redisstore.New(ctx, rc, redisstore.WithPrefix(prefix), redisstore.WithPolicy(killPolicy(killSkew)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() }) // after the server's stop (cleanups run last first)
	const method = testingv1.TestService_Apply_FullMethodName

	// The store's horizon (per tenant, under this prefix) starts at its first
	// script: before the attempt is minted, so that the attempt lies inside
	// it (ts − skew ≥ horizon) and absence is evidence (invariant 8).
	probe, err := interceptor.StartAttempt(ctx, 0, time.Second)
	require.NoError(t, err)
	pa, _ := interceptor.AttemptFromContext(probe)
	_, err = store.Get(ctx, idempotency.Key{AttemptID: pa.ID, Call: "0", Method: method})
	require.NoError(t, err)
	horizonBy := time.Now()

	child := startKillableChild(t, prefix, killSkew)

	// A precondition, not an assertion: mint the attempt at least skew after
	// the horizon began (usually long past, the child took longer to start).
	time.Sleep(time.Until(horizonBy.Add(killSkew + time.Millisecond)))
	actx, err := interceptor.StartAttempt(ctx, 1, killAttemptTimeout)
	require.NoError(t, err)
	a, _ := interceptor.AttemptFromContext(actx)
	key := idempotency.Key{AttemptID: a.ID, Call: "0", Method: method}
	rec, err := store.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec.GetState(), "before the call, the store vouches for its absence")

	// The owner sends the call to the server process: its first try runs the
	// effect there and never answers; after its per-try timeout the owner
	// fences the try and polls while it is IN_PROGRESS. An interceptor
	// chained after tollgate's sees what the owner sends: its tries, and its
	// queries (which go through the owner's invoker).
	var ownerTries, ownerInProgress atomic.Int64
	watch := func(ctx context.Context, m string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if m == method {
			ownerTries.Add(1)
		}
		err := invoker(ctx, m, req, reply, cc, opts...)
		if r, ok := reply.(*tollgatev1.AttemptRecord); ok && err == nil && m == tollgatev1.AttemptService_FenceAttempt_FullMethodName &&
			r.GetState() == tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS {
			ownerInProgress.Add(1)
		}
		return err
	}
	conn, err := grpc.NewClient(child.addr, append(append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		interceptor.DialOptions(
			interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, PerTryTimeout: killPerTry,
				InitialBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}),
		)...), grpc.WithChainUnaryInterceptor(watch))...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ownerDone := make(chan error, 1)
	go func() {
		_, err := testingv1.NewTestServiceClient(conn).Apply(actx, killRequest())
		ownerDone <- err
	}()

	effects := func() int64 {
		n, err := readInt(context.Background(), rc, effectKey(prefix))
		if err != nil {
			return -1
		}
		return n
	}
	require.Eventually(t, func() bool { return effects() == 1 && ownerInProgress.Load() > 0 }, killBound, 5*time.Millisecond,
		"the server process never ran the effect, or the owner never found its try IN_PROGRESS")

	// Kill it between the effect and the record's finish.
	state := child.kill()
	require.Equal(t, -1, state.ExitCode(), "the server process was killed by a signal: %v", state)
	effectTry, err := readInt(ctx, rc, effectTryKey(prefix))
	require.NoError(t, err)

	// A fresh server, in this process, on the same store.
	fresh := &testsvc.Service{
		ApplyFunc: func(ctx context.Context, _ *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			if err := applyEffect(ctx, rc, prefix); err != nil {
				return nil, err
			}
			return &testingv1.ApplyResponse{Total: 5}, nil
		},
	}
	end := testsvc.StartT(t, testsvc.TCP, func(s *grpc.Server) {
		fresh.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}, killServerOptions(store, killSkew)...)
	freshConn := end.DialT(t) // plain gRPC: the test reads records and sends tries itself
	attempts := tollgatev1.NewAttemptServiceClient(freshConn)
	tests := testingv1.NewTestServiceClient(freshConn)
	get := &tollgatev1.GetAttemptRequest{AttemptId: a.ID, Call: "0", Method: method}
	sendTry := func(try uint32, deadline time.Time) error {
		hdr := "a=" + a.ID + ";c=0;t=" + itoa(int64(try)) + ";d=" + itoa(deadline.UnixMilli())
		_, err := tests.Apply(metadata.AppendToOutgoingContext(ctx, "tollgate", hdr), killRequest())
		return err
	}

	// The record as the killed process left it: try running, lease until
	// exactly d + skew (invariants 1 and 7).
	rec, err = attempts.GetAttempt(ctx, get)
	require.NoError(t, err)
	lease := time.UnixMilli(a.Deadline.UnixMilli()).Add(killSkew)
	require.NotNil(t, rec.GetLeaseExpiresAt())
	require.True(t, lease.Equal(rec.GetLeaseExpiresAt().AsTime()), "lease %v, want d + skew = %v", rec.GetLeaseExpiresAt().AsTime(), lease)
	require.Equal(t, uint32(effectTry), rec.GetTry(), "the record names the try that ran the effect")
	require.NotNil(t, rec.GetStartedAt())
	require.Nil(t, rec.GetFinishedAt(), "the killed process never finished the record")
	require.Less(t, rec.GetFencedThroughTry(), rec.GetTry(), "the owner's fence left the running try alone")
	nextTry := rec.GetTry() + 1

	// While the lease lasts, a new try of the call is refused IN_PROGRESS,
	// and a fence changes nothing. (Asked right after the kill, normally
	// well before the lease ends; if this machine was too slow for that, the
	// answers of a lease already ended are accepted.)
	err = sendTry(nextTry, a.Deadline)
	o := status.OutcomeOf(err)
	if time.Now().Before(lease) {
		require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
		require.Equal(t, status.ReasonAttemptInProgress, o.Reason, "%v", err)
	} else {
		require.Contains(t, []status.Kind{status.KindNotAdmitted, status.KindUnknown}, o.Kind, "%v", err)
	}
	fenced, err := attempts.FenceAttempt(ctx, &tollgatev1.FenceAttemptRequest{AttemptId: a.ID, Call: "0", Method: method, FenceThroughTry: nextTry})
	require.NoError(t, err)
	require.Contains(t, []tollgatev1.AttemptState{tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS, tollgatev1.AttemptState_ATTEMPT_STATE_ABANDONED},
		fenced.GetState(), "a fence never turns a running try into a tombstone")
	require.Equal(t, int64(1), effects(), "the new try did not run")

	// Poll the record until it reads ABANDONED; every answer must be
	// IN_PROGRESS before the lease ends, ABANDONED after, never UNSEEN.
	var (
		mu  sync.Mutex
		obs []killObservation
	)
	require.Eventually(t, func() bool {
		before := time.Now()
		r, err := attempts.GetAttempt(ctx, get)
		mu.Lock()
		defer mu.Unlock()
		obs = append(obs, killObservation{before: before, after: time.Now(), rec: r, err: err})
		return r.GetState() == tollgatev1.AttemptState_ATTEMPT_STATE_ABANDONED
	}, time.Until(lease)+killBound, 10*time.Millisecond, "the record never read ABANDONED")
	mu.Lock()
	seen := append([]killObservation(nil), obs...)
	mu.Unlock()
	inProgress := 0
	for _, ob := range seen {
		require.NoError(t, ob.err)
		st := ob.rec.GetState()
		require.NotEqual(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, st, "never UNSEEN")
		switch {
		case ob.after.Before(lease):
			require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS, st, "before the lease ends (asked at %v, lease %v)", ob.after, lease)
			inProgress++
		case !ob.before.Before(lease):
			require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_ABANDONED, st, "after the lease ends (asked at %v, lease %v)", ob.before, lease)
		default:
			require.Contains(t, []tollgatev1.AttemptState{tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS, tollgatev1.AttemptState_ATTEMPT_STATE_ABANDONED}, st)
		}
		require.Equal(t, uint32(effectTry), ob.rec.GetTry())
		require.Nil(t, ob.rec.GetFinishedAt())
	}
	require.Positive(t, inProgress, "the record was seen IN_PROGRESS before its lease ended")

	// After the lease: the call never runs again. Even a try that comes
	// after d + skew is answered by the record (a record answers every later
	// try, DESIGN.md §3.7), never DEADLINE_EXPIRED, which would claim that
	// nothing ran; so is a try whose header claims a later deadline.
	err = sendTry(nextTry+1, a.Deadline)
	o = status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
	require.Equal(t, a.ID, o.Detail.GetAttemptId())
	err = sendTry(nextTry+2, time.Now().Add(5*time.Second))
	o = status.OutcomeOf(err)
	require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
	require.Equal(t, a.ID, o.Detail.GetAttemptId())
	require.Equal(t, "0", o.Detail.GetCall())
	require.Equal(t, nextTry+2, o.Detail.GetTry())
	require.Equal(t, int64(1), effects(), "no try after the lease ran the handler")
	fenced, err = attempts.FenceAttempt(ctx, &tollgatev1.FenceAttemptRequest{AttemptId: a.ID, Call: "0", Method: method, FenceThroughTry: nextTry + 2})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_ABANDONED, fenced.GetState(), "an abandoned try cannot be fenced")
	rec, err = attempts.GetAttempt(ctx, get)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_ABANDONED, rec.GetState())

	// The owner, cut off from the killed process, ended the call UNKNOWN with
	// its attempt ID (invariant 5): never success, never a repeat.
	select {
	case err := <-ownerDone:
		o := status.OutcomeOf(err)
		require.Equal(t, status.KindUnknown, o.Kind, "%v", err)
		require.Equal(t, a.ID, o.Detail.GetAttemptId(), "%v", err)
		require.Equal(t, "0", o.Detail.GetCall(), "%v", err)
		require.Equal(t, int64(1), ownerTries.Load(), "the owner never repeated the try")
	case <-time.After(killBound):
		t.Fatal("the owner's call never ended")
	}
	require.Equal(t, int64(1), effects(), "the effect ran exactly once")
	require.Zero(t, fresh.Calls("Apply"), "no try reached the fresh server's handler")
}
