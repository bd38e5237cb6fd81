package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// tick returns the serverCron period of the Redis behind c (1000/hz ms): how
// late Redis may answer a WAIT whose timeout ended.
func tick(t testing.TB, c *redis.Client) time.Duration {
	t.Helper()
	cfg, err := c.ConfigGet(context.Background(), "hz").Result()
	require.NoError(t, err)
	hz, err := strconv.Atoi(cfg["hz"])
	require.NoError(t, err)
	return time.Second / time.Duration(hz)
}

// waitingStores returns a store that waits for a replica the lone test Redis
// does not have (so WAIT 1 waits its whole timeout and falls short), a plain
// store sharing its clock, and a key inside their started horizon.
func waitingStores(t *testing.T, c *redis.Client, prefix string, timeout time.Duration) (waiting, plain *redisstore.Store, clock *storetest.Clock, k idempotency.Key) {
	t.Helper()
	clock = storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	waiting = newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock), redisstore.WithReplicas(1, timeout))
	plain = newStore(t, c, prefix, redisstore.WithPolicy(p), clockOption(clock))
	k = idempotency.Key{AttemptID: startHorizon(t, plain, clock, ""), Call: "0", Method: "/x.Y/Z"}
	return waiting, plain, clock, k
}

// requireNextTryStarts checks that try 2 of k may start: try 1 is fenced or
// was never begun.
func requireNextTryStarts(t *testing.T, plain *redisstore.Store, clock *storetest.Clock, k idempotency.Key) {
	t.Helper()
	res, err := plain.Begin(context.Background(), idempotency.BeginRequest{Key: k, Try: 2, Deadline: clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started, "the next try may start: refusal %v", res.Refusal)
}

// A try's context (its grpc-timeout) that ends before WAIT's timeout must not
// lose WAIT's count: WAIT gets half the time left, less a tick, answers its
// shortfall in time, and the begun try is fenced, so its next try can start.
// Sent with its own timeout, WAIT outlived the context, the whole pipeline
// failed, and the try stayed IN_PROGRESS until its lease ended, with no
// handler running it.
func TestRedisWaitFitsTheContext(t *testing.T) {
	c, prefix := newClient(t)
	waiting, plain, clock, k := waitingStores(t, c, prefix, 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*tick(t, c)+400*time.Millisecond)
	defer cancel()
	_, err := waiting.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	require.ErrorContains(t, err, "0 of 1 replicas", "WAIT's count arrived before the context ended")

	rec, err := plain.Get(context.Background(), k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState(), "the try that fell short is fenced")
	requireNextTryStarts(t, plain, clock, k)
}

// Redis answers a WAIT whose timeout ended only at its next serverCron tick
// (every 1000/hz ms; 100 ms at the default hz 10), so a WAIT given half of a
// short context's time answered after the context ended: Begin failed
// after its script had begun the try, and left it IN_PROGRESS, unfenced.
// Whatever time is left, a Begin that answers unavailable leaves no try
// IN_PROGRESS: with less than two ticks left it sends nothing, and with
// more, WAIT's count arrives in time and the try is fenced.
func TestRedisWaitShortContextLeavesNoTryInProgress(t *testing.T) {
	probe, _ := newClient(t)
	tk := tick(t, probe)
	for _, left := range []time.Duration{4 * time.Millisecond, 20 * time.Millisecond, 60 * time.Millisecond,
		150 * time.Millisecond, 2*tk + 60*time.Millisecond, 2*tk + 150*time.Millisecond} {
		t.Run(fmt.Sprint(left), func(t *testing.T) {
			c, prefix := newClient(t)
			waiting, plain, clock, k := waitingStores(t, c, prefix, time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), left)
			defer cancel()
			_, err := waiting.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Minute)})
			require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)

			rec, gerr := plain.Get(context.Background(), k)
			require.NoError(t, gerr)
			require.NotEqual(t, tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS, rec.GetState(),
				"Begin answered unavailable (no handler will run) but left try 1 IN_PROGRESS: %v", err)
			switch {
			case left < 2*tk+time.Millisecond: // less than a 1 ms WAIT fits: nothing is sent
				require.ErrorIs(t, err, idempotency.ErrTooLittleTime)
				var tl *idempotency.TooLittleTimeError
				require.ErrorAs(t, err, &tl)
				require.Equal(t, 2*(tk+time.Millisecond), tl.Needed, "WAIT gets half the time left less a tick, and at least 1 ms")
				require.LessOrEqual(t, tl.Left, left)
				require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec.GetState(), "nothing was begun")
			case left >= 2*tk+50*time.Millisecond: // a WAIT of 25 ms or more fits
				require.ErrorContains(t, err, "0 of 1 replicas")
				require.NotErrorIs(t, err, idempotency.ErrTooLittleTime)
				require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState(), "the try that fell short is fenced")
			}
			requireNextTryStarts(t, plain, clock, k)
		})
	}
}

// afterWait is a go-redis hook that calls then once a pipeline holding WAIT
// has returned: between Begin's script and WAIT, and Begin's fence.
type afterWait struct {
	once sync.Once
	then func()
}

func (h *afterWait) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *afterWait) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *afterWait) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if strings.EqualFold(cmd.Name(), "wait") {
				h.once.Do(h.then)
			}
		}
		return err
	}
}

// The fence Begin sends after a shortfall is sent even when the caller's
// context ends as WAIT's count arrives: it has a context of its own.
func TestRedisWaitShortfallFencedAfterTheContextEnds(t *testing.T) {
	_, prefix := newClient(t)
	c := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiting, plain, clock, k := waitingStores(t, c, prefix, 20*time.Millisecond)
	c.AddHook(&afterWait{then: cancel}) // after New, whose WAIT 0 0 it would take for Begin's

	_, err := waiting.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.ErrorContains(t, err, "0 of 1 replicas")
	require.Error(t, ctx.Err(), "the caller's context ended before the fence")
	rec, err := plain.Get(context.Background(), k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState(), "the try that fell short is fenced")
	requireNextTryStarts(t, plain, clock, k)
}

// The fence after a shortfall ends only the try its own Begin call began
// (the record's Begin token), never a record another Begin call wrote.
func TestRedisWaitShortfallFencesOnlyItsOwnBegin(t *testing.T) {
	plainClient, prefix := newClient(t)
	c := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	waiting, plain, clock, k := waitingStores(t, c, prefix, 20*time.Millisecond)
	c.AddHook(&afterWait{then: func() { // after New, whose WAIT 0 0 it would take for Begin's
		// Another Begin call's record of the same try, as far as the token
		// tells.
		require.NoError(t, plainClient.HSet(context.Background(), recordKey(prefix, k), "tok", "another call").Err())
	}})

	_, err := waiting.Begin(context.Background(), idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.ErrorContains(t, err, "0 of 1 replicas")
	rec, err := plain.Get(context.Background(), k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_IN_PROGRESS, rec.GetState(), "another call's try is not fenced")
}

// go-redis takes a read that outlasts its ReadTimeout for a lost reply and
// sends the pipeline again, so a WAIT that answers after the client's
// ReadTimeout never delivers its count, and Redis answers WAIT up to a tick
// after its timeout. New refuses a WAIT timeout unless timeout + tick is at
// most half the ReadTimeout (half of 60 ms, the review's case, let through
// a WAIT answered 100 ms late), and a store within the bound fences a try
// that fell short.
func TestRedisWaitTimeoutAndTickWithinReadTimeout(t *testing.T) {
	probe, prefix := newClient(t)
	tk := tick(t, probe)
	for _, tc := range []struct{ read, wait time.Duration }{
		{300 * time.Millisecond, time.Second},
		{300 * time.Millisecond, 150 * time.Millisecond},
		{60 * time.Millisecond, 30 * time.Millisecond},
		{2 * (tk + 50*time.Millisecond), 50*time.Millisecond + time.Millisecond},
	} {
		c := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true, ReadTimeout: tc.read})
		_, err := redisstore.New(context.Background(), c, redisstore.WithPrefix(prefix), redisstore.WithReplicas(1, tc.wait))
		_ = c.Close()
		require.ErrorContains(t, err, "ReadTimeout "+tc.read.String(), "WithReplicas(1, %v), ReadTimeout %v", tc.wait, tc.read)
		require.ErrorContains(t, err, "timeout "+tc.wait.String())
		require.ErrorContains(t, err, "hz ")
	}

	c := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true, ReadTimeout: 2 * (tk + 50*time.Millisecond)})
	t.Cleanup(func() { _ = c.Close() })
	waiting, plain, clock, k := waitingStores(t, c, prefix, 50*time.Millisecond)
	_, err := waiting.Begin(context.Background(), idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second)})
	require.ErrorContains(t, err, "0 of 1 replicas")
	rec, err := plain.Get(context.Background(), k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState(), "the try that fell short is fenced")
	requireNextTryStarts(t, plain, clock, k)
}

// On a Cluster New reads hz on every node, replicas included, and bounds
// the WAIT timeout by the slowest tick.
func TestRedisClusterWaitBoundReadsEveryNodesHz(t *testing.T) {
	c, _ := newClusterClient(t)
	ctx := context.Background()
	var mu sync.Mutex
	var addrs []string
	require.NoError(t, c.ForEachShard(ctx, func(_ context.Context, n *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		addrs = append(addrs, n.Options().Addr)
		return nil
	}))
	// The default ReadTimeout is 5 s: 2 s + a tick of 100 ms fits in half of
	// it, 2 s + 1 s (hz 1) does not.
	_, err := redisstore.New(ctx, c, redisstore.WithReplicas(1, 2*time.Second))
	require.NoError(t, err)
	for _, addr := range addrs {
		t.Run(addr, func(t *testing.T) {
			n := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
			defer n.Close()
			was, err := n.ConfigGet(ctx, "hz").Result()
			require.NoError(t, err)
			require.NoError(t, n.ConfigSet(ctx, "hz", "1").Err())
			defer func() { require.NoError(t, n.ConfigSet(ctx, "hz", was["hz"]).Err()) }()
			_, err = redisstore.New(ctx, c, redisstore.WithReplicas(1, 2*time.Second))
			require.ErrorContains(t, err, "hz 1)")
		})
	}
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

// The owner's ballot (FenceAttempt) with too little time left for WAIT sends
// nothing, as Begin does; the AttemptService answers DEADLINE_EXCEEDED (the
// request's deadline leaves the store too little time), not
// STORE_UNAVAILABLE, which said the store was down. (Found by review.)
func TestRedisFenceAttemptWithTooLittleTimeIsDeadlineExceeded(t *testing.T) {
	c, prefix := newClient(t)
	waiting, plain, _, k := waitingStores(t, c, prefix, time.Second)
	svc := idempotency.NewAttemptService(waiting)
	ctx, cancel := context.WithTimeout(context.Background(), tick(t, c))
	defer cancel()
	_, err := svc.FenceAttempt(ctx, &tollgatev1.FenceAttemptRequest{AttemptId: k.AttemptID, Call: k.Call,
		Method: k.Method, FenceThroughTry: 1})
	require.Equal(t, codes.DeadlineExceeded, grpcstatus.Code(err), "%v", err)
	require.ErrorContains(t, err, "too little time left")

	rec, err := plain.Get(context.Background(), k)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec.GetState(), "nothing was fenced")
}

// WithReplicas takes a time.Duration, but WAIT counts whole milliseconds and
// WAIT n 0 blocks for ever. A sub-millisecond timeout is a positive
// duration, so New accepts it; then every call whose context has a deadline
// answers TooLittleTimeError however much time it has (the timeout, under
// 1 ms, is taken for too little), and a call without a deadline sends
// WAIT n 0, which waits until the socket's ReadTimeout (and go-redis then
// sends the script again) or for ever. Options are checked at
// construction: New must refuse it.
func TestSubMillisecondWaitTimeoutRefused(t *testing.T) {
	c, prefix := newClient(t)
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s, err := redisstore.New(context.Background(), c, redisstore.WithPrefix(prefix), redisstore.WithPolicy(p),
		clockOption(clock), redisstore.WithReplicas(1, 500*time.Microsecond))
	if err == nil {
		// What such a store does: a Begin with 5 s left is refused as
		// having too little time.
		k := idempotency.Key{AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "0", Method: "/x.Y/Z"}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, berr := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Deadline: clock.Now().Add(time.Second), Minted: true})
		t.Fatalf("New accepted WithReplicas(1, 500µs), which is WAIT 1 0 (wait for ever); a Begin with 5 s left answers: %v", berr)
	}
}
