package redisstore_test

// go-redis (v9.23) retries a command after some network errors even when
// the command was already written (shouldRetry in its error.go): after an
// EOF, after any other net.Error from the read (a reset connection), and
// after a read timeout set by ReadTimeout (default 3 s) — not once the
// context's deadline passed, which ends the call. A Client retries
// Options.MaxRetries times (default 3), a pipeline too; a ClusterClient up
// to MaxRedirects times (default 3). A script whose reply was lost
// therefore runs again. These tests lose the reply of one script run on a
// real connection to the real Redis and check that the store answers the
// second run as the first one deserved.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
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

// How a lossyConn loses a reply.
type loss int

const (
	// lossEOF: Redis ran the command, then the connection ended before its
	// reply reached the client (io.EOF).
	lossEOF loss = iota
	// lossTimeout: Redis ran the command, and its reply comes later than
	// the client's read deadline: the read fails as one past its deadline
	// does (a *net.OpError of os.ErrDeadlineExceeded, whose Timeout() is
	// true), at once rather than after a short ReadTimeout, so that no
	// reply a loaded machine merely delays is taken for a lost one.
	lossTimeout
)

func (l loss) String() string {
	if l == lossEOF {
		return "EOF"
	}
	return "ReadTimeout"
}

// lossyDialer dials real connections to Redis whose one reply can be lost:
// once armed, the first command written that contains "evalsha" runs in
// Redis, and its reply, read from the connection, never reaches go-redis.
type lossyDialer struct {
	mode    loss
	armed   atomic.Bool
	evalsha atomic.Int32 // EVALSHA commands written, on any connection
	lost    atomic.Int32 // replies lost
	onLoss  func()       // when set, called as a reply is lost (before go-redis resends)
}

// arm makes the next EVALSHA's reply get lost and starts counting anew.
func (d *lossyDialer) arm() {
	d.evalsha.Store(0)
	d.lost.Store(0)
	d.armed.Store(true)
}

func (d *lossyDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &lossyConn{Conn: c, d: d}, nil
}

type lossyConn struct {
	net.Conn
	d        *lossyDialer
	pending  atomic.Bool // the reply to lose is on its way
	timedOut atomic.Bool // lossTimeout: the reply was lost; every read times out
}

func (c *lossyConn) Write(b []byte) (int, error) {
	if bytes.Contains(bytes.ToLower(b), []byte("evalsha")) {
		c.d.evalsha.Add(1)
		if c.d.armed.CompareAndSwap(true, false) {
			c.pending.Store(true)
		}
	}
	return c.Conn.Write(b)
}

func (c *lossyConn) Read(b []byte) (int, error) {
	if c.timedOut.Load() {
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.ErrDeadlineExceeded}
	}
	if !c.pending.CompareAndSwap(true, false) {
		return c.Conn.Read(b)
	}
	// Wait for the reply to begin: once it does, Redis ran the script
	// (a script is atomic, its reply comes after it). Then lose it.
	if _, err := c.Conn.Read(b); err != nil {
		return 0, err
	}
	c.d.lost.Add(1)
	if c.d.onLoss != nil {
		c.d.onLoss()
	}
	if c.d.mode == lossEOF {
		_ = c.Conn.Close()
		return 0, io.EOF
	}
	// The rest is lost too (a pipeline's later replies): this read and every
	// later one fail as reads past their deadline do, until go-redis drops
	// the connection. (go-redis may first peek for push notifications, and
	// take a timeout there for "none": a single failed read would not do.)
	c.timedOut.Store(true)
	return c.Read(b)
}

// newLossyClient returns a client of the test Redis as the store is used
// with (ContextTimeoutEnabled, go-redis's default retries), whose
// connections lose a reply when the dialer is armed.
func newLossyClient(t testing.TB, addr string, mode loss) (*redis.Client, *lossyDialer) {
	t.Helper()
	d := &lossyDialer{mode: mode}
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, Dialer: d.dial})
	t.Cleanup(func() { _ = c.Close() })
	return c, d
}

// lossyStore is a store on a lossy client, with a started horizon, a manual
// clock, and a key inside the horizon.
type lossyStore struct {
	s     *redisstore.Store
	d     *lossyDialer
	clock *storetest.Clock
	key   idempotency.Key
}

func newLossyStore(t *testing.T, c redis.UniversalClient, d *lossyDialer, prefix string, opts ...redisstore.Option) lossyStore {
	t.Helper()
	clock := storetest.NewClock(time.Now().Add(storetest.ClockLead))
	p := storetest.Policy()
	s := newStore(t, c, prefix, append([]redisstore.Option{redisstore.WithPolicy(p), clockOption(clock),
		hooks.RedisFailedBeginFenceTimeout(lossyFenceTimeout).(redisstore.Option)}, opts...)...)
	k := idempotency.Key{Tenant: "acme", AttemptID: startHorizon(t, s, clock, "acme"), Call: "0", Method: "/x.Y/Z"}
	return lossyStore{s: s, d: d, clock: clock, key: k}
}

// lossyFenceTimeout bounds, in lossy stores, the fence a failed Begin sends
// (100 ms in production): the tests check that it ends the try, and on a
// loaded machine its dial and script may take longer than 100 ms.
const lossyFenceTimeout = 5 * time.Second

// startHorizon starts tenant's horizon on s, whose clock is clock, and
// returns an attempt ID created a skew after the horizon, the clock moved
// there: inside the horizon. A script starts a horizon at the later of its
// call's reading and Redis's TIME (a millisecond past it); the clock was
// made storetest.ClockLead ahead of real time, but a loaded machine may
// have spent the lead before the horizon starts (New's round trips, the
// race detector), and the horizon then lies past the clock. Redis runs on
// this machine's clock, so once the Get returned its TIME lies before real
// time: the clock is moved to ClockLead past real time if it is behind
// that, and so at or past the horizon.
func startHorizon(t testing.TB, s *redisstore.Store, clock *storetest.Clock, tenant string) string {
	t.Helper()
	p := s.Policy()
	_, err := s.Get(context.Background(), idempotency.Key{Tenant: tenant, AttemptID: storetest.AttemptIDAt(clock.Now()), Call: "h", Method: "/x.Y/Z"})
	require.NoError(t, err)
	if behind := time.Now().Truncate(time.Millisecond).Add(storetest.ClockLead).Sub(clock.Now()); behind > 0 {
		clock.Advance(behind)
	}
	id := storetest.AttemptIDAt(clock.Now().Add(p.Skew))
	clock.Advance(p.Skew)
	return id
}

var lossyFingerprint = idempotency.Fingerprint("/x.Y/Z", []byte("charge card"))

func (l lossyStore) begin() idempotency.BeginRequest {
	return idempotency.BeginRequest{Key: l.key, Try: 1, Fingerprint: lossyFingerprint, Deadline: l.clock.Now().Add(5 * time.Second)}
}

// requireRetried checks that go-redis sent the script a second time after
// its first reply was lost: what makes these tests mean anything.
func requireRetried(t *testing.T, d *lossyDialer) {
	t.Helper()
	require.Equal(t, int32(1), d.lost.Load(), "the first reply was lost")
	require.Equal(t, int32(2), d.evalsha.Load(), "go-redis ran the script again after its reply was lost")
}

// beginLostReply is the test of a Begin whose first reply is lost: the
// script runs twice for one Begin call, and the try must start. A
// duplicated delivery of the same try (another Begin call) is still refused.
func beginLostReply(t *testing.T, l lossyStore) {
	ctx := context.Background()
	req := l.begin()
	l.d.arm()
	res, err := l.s.Begin(ctx, req)
	require.NoError(t, err)
	requireRetried(t, l.d)
	require.True(t, res.Started, "the store refused its own try: %v, record %v", res.Refusal, res.Record)

	dup, err := l.s.Begin(ctx, req)
	require.NoError(t, err)
	require.Equal(t, idempotency.RefusedInProgress, dup.Refusal, "a duplicated delivery of the try is another call")

	require.NoError(t, l.s.Finish(ctx, idempotency.FinishRequest{Key: l.key, Try: 1, Fingerprint: lossyFingerprint,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("ok")}))
	rec, err := l.s.Get(ctx, l.key)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
}

func TestRedisBeginReplyLost(t *testing.T) {
	for _, mode := range []loss{lossEOF, lossTimeout} {
		t.Run(mode.String(), func(t *testing.T) {
			_, prefix := newClient(t)
			c, d := newLossyClient(t, redisAddr(), mode)
			beginLostReply(t, newLossyStore(t, c, d, prefix))
		})
	}
}

// A review suspected that a Begin whose reply was lost, resent by go-redis
// after the try's lease ended, would find its own try ABANDONED and refuse
// it instead of recognising its token. It does not: the script judges the
// record by its call's reading of the clock, which go-redis resends
// unchanged with the script, and the first run began the try only with
// that reading before the lease's end (dl + skew). Here the clock moves
// past the lease while the reply is lost: the resend still answers
// "started", while another Begin call, reading the later clock, finds the
// try ABANDONED.
func TestRedisBeginResentAfterLeaseStarts(t *testing.T) {
	for _, mode := range []loss{lossEOF, lossTimeout} {
		t.Run(mode.String(), func(t *testing.T) {
			_, prefix := newClient(t)
			c, d := newLossyClient(t, redisAddr(), mode)
			l := newLossyStore(t, c, d, prefix)
			ctx := context.Background()
			p := storetest.Policy()
			req := idempotency.BeginRequest{Key: l.key, Try: 1, Fingerprint: lossyFingerprint, Deadline: l.clock.Now().Add(50 * time.Millisecond)}
			d.onLoss = func() { l.clock.Advance(50*time.Millisecond + p.Skew + time.Second) } // past the lease
			d.arm()
			res, err := l.s.Begin(ctx, req)
			d.onLoss = nil
			require.NoError(t, err)
			requireRetried(t, d)
			require.True(t, res.Started, "the resent Begin refused its own try: %v, record %v", res.Refusal, res.Record)

			rec, err := l.s.Get(ctx, l.key)
			require.NoError(t, err)
			require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_ABANDONED, rec.GetState(), "by the clock now, the lease has ended")
			dup, err := l.s.Begin(ctx, req)
			require.NoError(t, err)
			require.Equal(t, idempotency.RefusedAbandoned, dup.Refusal, "another Begin call of the try")
		})
	}
}

// A Finish whose first reply is lost runs twice; the second run must not
// turn a finish that took place into ErrNotRunning, nor count the try's
// units twice. Another Finish of the same try is still refused.
func TestRedisFinishReplyLost(t *testing.T) {
	for _, mode := range []loss{lossEOF, lossTimeout} {
		t.Run(mode.String(), func(t *testing.T) {
			_, prefix := newClient(t)
			c, d := newLossyClient(t, redisAddr(), mode)
			l := newLossyStore(t, c, d, prefix)
			ctx := context.Background()
			res, err := l.s.Begin(ctx, l.begin())
			require.NoError(t, err)
			require.True(t, res.Started)
			fin := idempotency.FinishRequest{Key: l.key, Try: 1, Fingerprint: lossyFingerprint,
				State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("ok"), UnitsSpent: 2}
			d.arm()
			err = l.s.Finish(ctx, fin)
			requireRetried(t, d)
			require.NoError(t, err, "the finish took place")
			rec, err := l.s.Get(ctx, l.key)
			require.NoError(t, err)
			require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, rec.GetState())
			require.Equal(t, []byte("ok"), rec.GetResponse())
			require.Equal(t, int64(2), rec.GetUnitsSpent(), "the units are counted once")

			fin.State, fin.Response = tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, nil
			require.ErrorIs(t, l.s.Finish(ctx, fin), idempotency.ErrNotRunning, "another finish of the try")
		})
	}
}

// A Fence whose first reply is lost runs twice: the second run finds the
// tombstone the first one wrote (or raised) and answers it, as a repeated
// FenceAttempt would.
func TestRedisFenceReplyLost(t *testing.T) {
	for _, mode := range []loss{lossEOF, lossTimeout} {
		t.Run(mode.String(), func(t *testing.T) {
			_, prefix := newClient(t)
			c, d := newLossyClient(t, redisAddr(), mode)
			l := newLossyStore(t, c, d, prefix)
			ctx := context.Background()
			for _, through := range []uint32{1, 3} { // an absent record, then a tombstone raised
				d.arm()
				rec, err := l.s.Fence(ctx, l.key, through)
				require.NoError(t, err)
				requireRetried(t, d)
				require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
				require.Equal(t, through, rec.GetFencedThroughTry())
			}
			res, err := l.s.Begin(ctx, idempotency.BeginRequest{Key: l.key, Try: 4, Fingerprint: lossyFingerprint, Deadline: l.clock.Now().Add(time.Second)})
			require.NoError(t, err)
			require.True(t, res.Started)
		})
	}
}

// On a Cluster the ClusterClient retries (up to MaxRedirects times) what
// its node's client does not: the script runs twice as well.
func TestRedisClusterBeginReplyLost(t *testing.T) {
	for _, mode := range []loss{lossEOF, lossTimeout} {
		t.Run(mode.String(), func(t *testing.T) {
			_, prefix := newClusterClient(t)
			d := &lossyDialer{mode: mode}
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: clusterAddrs(), ContextTimeoutEnabled: true, Dialer: d.dial})
			t.Cleanup(func() { _ = c.Close() })
			beginLostReply(t, newLossyStore(t, c, d, prefix))
		})
	}
}

// With WithReplicas, Begin's script and WAIT go as one pipeline, which
// go-redis retries as a whole: the script runs twice, then WAIT counts the
// replica.
func TestRedisReplicatedBeginReplyLost(t *testing.T) {
	for _, mode := range []loss{lossEOF, lossTimeout} {
		t.Run(mode.String(), func(t *testing.T) {
			_, _, prefix := newReplicatedClients(t)
			c, d := newLossyClient(t, replicatedAddr(), mode)
			// A replica acknowledges at once, but a machine busy with the
			// other packages' race tests may delay it past 100 ms; the
			// timeout, plus Redis's tick of 100 ms at the default hz, fits
			// in half the ReadTimeout.
			beginLostReply(t, newLossyStore(t, c, d, prefix, redisstore.WithReplicas(1, 500*time.Millisecond)))
		})
	}
}

// A record IN_PROGRESS written by the scripts before Begin carried a token
// (it has no "tok" field) is never taken for the Begin call that sees it:
// the try is refused, whether go-redis ran the script once or twice.
func TestRedisBeginRecordWithoutToken(t *testing.T) {
	plain, prefix := newClient(t)
	c, d := newLossyClient(t, redisAddr(), lossEOF)
	l := newLossyStore(t, c, d, prefix)
	ctx := context.Background()
	req := l.begin()
	res, err := l.s.Begin(ctx, req)
	require.NoError(t, err)
	require.True(t, res.Started)
	require.Equal(t, int64(1), plain.HDel(ctx, recordKey(prefix, l.key), "tok").Val())
	for _, lose := range []bool{false, true} {
		if lose {
			d.arm()
		}
		res, err = l.s.Begin(ctx, req)
		require.NoError(t, err)
		require.Equal(t, idempotency.RefusedInProgress, res.Refusal)
		if lose {
			requireRetried(t, d)
		}
	}
}

// A Begin whose reply is lost as its context ends (go-redis does not send
// the script again then) fails unavailable, although Redis began the try. No
// handler will run that try, so Begin fences it: before, it read IN_PROGRESS
// until its lease ended at the attempt's deadline, and every later try of
// its call was refused ATTEMPT_IN_PROGRESS meanwhile.
func TestRedisBeginReplyLostAtDeadlineFencesTheTry(t *testing.T) {
	for _, replicated := range []bool{false, true} {
		t.Run(fmt.Sprintf("replicated=%v", replicated), func(t *testing.T) {
			var (
				c      *redis.Client
				d      *lossyDialer
				prefix string
				opts   []redisstore.Option
			)
			if replicated {
				_, _, prefix = newReplicatedClients(t)
				c, d = newLossyClient(t, replicatedAddr(), lossTimeout)
				opts = append(opts, redisstore.WithReplicas(1, 500*time.Millisecond)) // as in TestRedisReplicatedBeginReplyLost
			} else {
				_, prefix = newClient(t)
				c, d = newLossyClient(t, redisAddr(), lossTimeout)
			}
			l := newLossyStore(t, c, d, prefix, opts...)
			// The context ends as the reply is lost, before go-redis would
			// send the script again.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			d.onLoss = cancel
			d.arm()
			_, err := l.s.Begin(ctx, l.begin())
			require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
			require.Equal(t, int32(1), d.lost.Load(), "Begin's reply was lost")
			require.Equal(t, int32(2), d.evalsha.Load(), "Begin's script ran once, then the fence's")

			rec, err := l.s.Get(context.Background(), l.key)
			require.NoError(t, err)
			require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState(),
				"the try Redis began and no handler will run is fenced")
			require.Equal(t, uint32(1), rec.GetFencedThroughTry())
			res, err := l.s.Begin(context.Background(), idempotency.BeginRequest{Key: l.key, Try: 2,
				Fingerprint: lossyFingerprint, Deadline: l.clock.Now().Add(time.Second)})
			require.NoError(t, err)
			require.True(t, res.Started, "the call's next try starts: refusal %v", res.Refusal)
		})
	}
}

// blipDialer is a lossyDialer whose dials fail (a short network blip) once a
// reply was lost, while blip is set.
type blipDialer struct {
	*lossyDialer
	blip   atomic.Bool
	failed atomic.Int32
}

func (b *blipDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if b.blip.Load() && b.lost.Load() > 0 {
		b.failed.Add(1)
		return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
	}
	return b.lossyDialer.dial(ctx, network, addr)
}

// blipEnds is a go-redis hook that ends the blip once a command's process,
// its retries included, has returned an error: the fence Begin sends next
// can dial.
type blipEnds struct{ b *blipDialer }

func (h blipEnds) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h blipEnds) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil {
			h.b.blip.Store(false)
		}
		return err
	}
}
func (h blipEnds) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// go-redis sends a command again after an EOF and returns only its last
// attempt's error: here a failed dial, although the first attempt ran the
// script. Begin must not take that error for proof that nothing ran: the try
// Redis began is fenced, so the call's next try starts. (Found by review: a
// first version fenced only after errors other than Redis replies, pool
// timeouts and dial failures.)
func TestRedisBeginRetriedIntoDialErrorIsFenced(t *testing.T) {
	_, prefix := newClient(t)
	b := &blipDialer{lossyDialer: &lossyDialer{mode: lossEOF}}
	c := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true, Dialer: b.dial})
	t.Cleanup(func() { _ = c.Close() })
	l := newLossyStore(t, c, b.lossyDialer, prefix)
	c.AddHook(blipEnds{b})

	b.blip.Store(true)
	b.arm()
	_, err := l.s.Begin(context.Background(), l.begin())
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	var op *net.OpError
	require.ErrorAs(t, err, &op, "Begin's error is its last attempt's")
	require.Equal(t, "dial", op.Op)
	require.Equal(t, int32(1), b.lost.Load(), "the script ran and its reply was lost")
	require.Positive(t, b.failed.Load(), "go-redis sent it again and could not dial")

	rec, err := l.s.Get(context.Background(), l.key)
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState(),
		"Redis began the try and no handler runs it: it is fenced")
	res, err := l.s.Begin(context.Background(), idempotency.BeginRequest{Key: l.key, Try: 2,
		Fingerprint: lossyFingerprint, Deadline: l.clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started, "the call's next try starts: refusal %v", res.Refusal)
}

// hsetsOf runs f and returns how many HSETs of key rk Redis ran meanwhile, as
// MONITOR shows them (it shows the commands a script runs too). It speaks
// RESP on a connection of its own: MONITOR takes a connection for itself.
func hsetsOf(t *testing.T, rk string, f func()) int {
	t.Helper()
	ctx := context.Background()
	conn, err := net.DialTimeout("tcp", redisAddr(), 5*time.Second)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	_, err = conn.Write([]byte("MONITOR\r\n"))
	require.NoError(t, err)
	lines := bufio.NewReader(conn)
	probe := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer func() { _ = probe.Close() }()
	// MONITOR shows a command once it ran; an ECHO of a fresh marker, sent
	// after f, shows that every command before it was seen.
	until := func(marker string) []string {
		require.NoError(t, probe.Echo(ctx, marker).Err())
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
		var seen []string
		for {
			l, err := lines.ReadString('\n')
			require.NoError(t, err, "MONITOR never showed %s", marker)
			if strings.Contains(l, marker) {
				return seen
			}
			seen = append(seen, l)
		}
	}
	until(fmt.Sprintf("tollgate-monitor-start-%d", time.Now().UnixNano()))
	f()
	n := 0
	for _, l := range until(fmt.Sprintf("tollgate-monitor-end-%d", time.Now().UnixNano())) {
		if strings.Contains(strings.ToLower(l), `"hset"`) && strings.Contains(l, `"`+rk+`"`) {
			n++
		}
	}
	return n
}

// With WithReplicas, WAIT follows each Begin and Fence on the connection
// that sent it, and counts the replicas of that connection's writes (on
// Redis 7.2 and later, only of commands that propagated one). A script
// resent after its reply was lost — on a new connection — finds its own
// first run's write and used to answer it without writing: WAIT then had
// nothing of its own to count, and answered at once with every replica,
// for a write no replica may hold. Each resend now rewrites one field as it
// is, so the script propagates a write and the WAIT covers the first run's.
func TestResentScriptWritesForWAIT(t *testing.T) {
	_, prefix := newClient(t)
	c, d := newLossyClient(t, redisAddr(), lossEOF)
	l := newLossyStore(t, c, d, prefix)
	rk := prefix + "{t:acme}:r|" + l.key.AttemptID + "|0|/x.Y/Z"
	ctx := context.Background()

	n := hsetsOf(t, rk, func() {
		d.arm()
		res, err := l.s.Begin(ctx, l.begin())
		require.NoError(t, err)
		require.True(t, res.Started)
	})
	requireRetried(t, d)
	require.Equal(t, 2, n, "the resent Begin writes too")

	d.lost.Store(0)
	d.evalsha.Store(0)
	n = hsetsOf(t, rk, func() {
		d.arm()
		require.NoError(t, l.s.Finish(ctx, idempotency.FinishRequest{Key: l.key, Try: 1, Fingerprint: lossyFingerprint,
			State: tollgatev1.AttemptState_ATTEMPT_STATE_FENCED}))
	})
	requireRetried(t, d)
	require.Equal(t, 2, n, "the resent Finish writes too")

	d.lost.Store(0)
	d.evalsha.Store(0)
	n = hsetsOf(t, rk, func() {
		d.arm()
		rec, err := l.s.Fence(ctx, l.key, 1)
		require.NoError(t, err)
		require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
	})
	requireRetried(t, d)
	require.Equal(t, 2, n, "a Fence answered by the tombstone that covers it (the Finish's) writes, for its WAIT, in both runs")
}
