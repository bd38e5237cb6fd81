package interceptor_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/interceptor"
	"github.com/tollgate-go/tollgate/internal/header"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// Fault-injection harness: real servers on loopback TCP, a record
// store shared across server restarts, and faults drawn from a seed:
// responses dropped after commit (an outer interceptor answers UNAVAILABLE
// after tollgate finished the record), responses dropped before the handler,
// connections closed after a random number of bytes, server restarts
// (grpc.Server.Stop, a new server on the same port and store), slow handlers
// beyond the per-try timeout, callers cancelling at random instants.
//
// Every call's outcome must be honest about the effect counted by the
// handler (DESIGN.md §3.5, §3.6, §3.7).
//
//	TOLLGATE_FAULT_SEED=n   run this seed only
//	TOLLGATE_FAULT_SEEDS=n  run seeds 1..n (default: each test's own few)

func faultSeeds(t *testing.T, def int) []uint64 {
	if v := os.Getenv("TOLLGATE_FAULT_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err)
		return []uint64{s}
	}
	n := def
	if v := os.Getenv("TOLLGATE_FAULT_SEEDS"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(t, err)
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(i + 1)
	}
	return out
}

// h64 is a deterministic draw for one decision, from the seed and names.
func h64(seed uint64, parts ...string) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d", seed)
	for _, p := range parts {
		h.Write([]byte{0})
		h.Write([]byte(p))
	}
	return h.Sum64()
}

// flakyListener closes some accepted connections after a random number of
// bytes read or written.
type flakyListener struct {
	net.Listener
	seed   uint64
	n      atomic.Int64
	closed *atomic.Int64
}

func (l *flakyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	i := l.n.Add(1)
	r := h64(l.seed, "conn", strconv.FormatInt(i, 10))
	if r%3 == 0 {
		return c, nil
	}
	return &flakyConn{Conn: c, budget: int64(300 + (r>>8)%6000), closed: l.closed}, nil
}

type flakyConn struct {
	net.Conn
	budget int64
	used   atomic.Int64
	once   sync.Once
	closed *atomic.Int64
}

func (c *flakyConn) spend(n int) bool {
	if c.used.Add(int64(n)) > c.budget {
		c.once.Do(func() { c.closed.Add(1); _ = c.Conn.Close() })
		return false
	}
	return true
}

func (c *flakyConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && !c.spend(n) {
		return 0, net.ErrClosed
	}
	return n, err
}

func (c *flakyConn) Write(b []byte) (int, error) {
	if !c.spend(len(b)) {
		return 0, net.ErrClosed
	}
	return c.Conn.Write(b)
}

// faultEffects counts the handler's effects per (attempt, call).
type faultEffects struct {
	mu     sync.Mutex
	n      map[string]int
	totals map[string]int64
	seq    int64
	act    activity
}

func newFaultEffects() *faultEffects {
	e := &faultEffects{n: map[string]int{}, totals: map[string]int64{}}
	e.act.cond.L = &e.act.mu
	return e
}

func (e *faultEffects) apply(key string) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n[key]++
	e.seq++
	e.totals[key] = e.seq
	return e.seq
}

func (e *faultEffects) get(key string) (int, int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[key], e.totals[key]
}

// faultServer is a restartable TCP server on a fixed port over one store.
type faultServer struct {
	t        *testing.T
	seed     uint64
	addr     string
	store    idempotency.Store
	opts     []grpc.ServerOption
	register func(*grpc.Server)
	mu       sync.Mutex
	srv      *grpc.Server
	done     chan struct{}
	closed   atomic.Int64
	restarts int
}

func (s *faultServer) start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	var lis net.Listener
	var err error
	for range 200 {
		addr := s.addr
		if addr == "" {
			addr = "127.0.0.1:0"
		}
		lis, err = net.Listen("tcp", addr)
		if err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	require.NoError(s.t, err)
	s.addr = lis.Addr().String()
	srv := grpc.NewServer(s.opts...)
	s.register(srv)
	s.srv = srv
	done := make(chan struct{})
	s.done = done
	fl := &flakyListener{Listener: lis, seed: s.seed ^ uint64(s.restarts)<<32, closed: &s.closed}
	go func() { defer close(done); _ = srv.Serve(fl) }()
}

func (s *faultServer) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.srv.Stop()
	<-s.done
	s.restarts++
}

// faultOutcome is one call's final answer.
type faultOutcome struct {
	key     string
	err     error
	total   int64
	plan    string
	attempt string
	partial bool // a stream received messages, then failed
}

type faultConfig struct {
	calls      int
	workers    int
	redis      bool
	restarts   bool
	dropAfter  int // per mille of tries answered UNAVAILABLE after commit
	dropBefore int // per mille answered UNAVAILABLE before the handler
	streams    bool
}

func runFaultAtMostOnce(t *testing.T, seed uint64, cfg faultConfig) (faults map[string]int) {
	t.Logf("seed %d (TOLLGATE_FAULT_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0x7237355f))
	ctx := t.Context()
	var store idempotency.Store
	if cfg.redis {
		rc, prefix := killRedis(t)
		p := idempotency.DefaultPolicy()
		p.Skew = 0
		rs, err := redisstore.New(ctx, rc, redisstore.WithPrefix(prefix), redisstore.WithPolicy(p))
		require.NoError(t, err)
		t.Cleanup(func() { _ = rs.Close() }) // after the server's stop (cleanups run last first)
		// The tenant's horizon starts at its first script.
		_, err = rs.Get(ctx, idempotency.Key{AttemptID: "probe", Call: "0", Method: testingv1.TestService_Apply_FullMethodName})
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond)
		store = rs
	} else {
		store = memoryStore(t)
	}
	eff := newFaultEffects()
	var nDropAfter, nDropBefore, nSlow, nRefuse, nFail, nCancel, nStops atomic.Int64
	tryOf := func(ctx context.Context) (string, string) {
		vs := metadata.ValueFromIncomingContext(ctx, "tollgate")
		if len(vs) == 0 {
			return "", ""
		}
		h, err := header.ParseValues(vs)
		if err != nil {
			return "", ""
		}
		return h.Attempt + "/" + h.Call, strconv.Itoa(int(h.Try))
	}
	fault := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		key, try := tryOf(ctx)
		r := h64(seed, "fault", info.FullMethod, key, try)
		if int(r%1000) < cfg.dropBefore {
			nDropBefore.Add(1)
			return nil, grpcstatus.Error(codes.Unavailable, "fault: dropped before the handler")
		}
		resp, err := handler(ctx, req)
		if int((r>>10)%1000) < cfg.dropAfter {
			nDropAfter.Add(1)
			return nil, grpcstatus.Error(codes.Unavailable, "fault: response dropped after the handler")
		}
		return resp, err
	}
	sfault := func(srvi any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		key, try := tryOf(ss.Context())
		r := h64(seed, "fault", info.FullMethod, key, try)
		if int(r%1000) < cfg.dropBefore {
			nDropBefore.Add(1)
			return grpcstatus.Error(codes.Unavailable, "fault: dropped before the handler")
		}
		err := handler(srvi, ss)
		if int((r>>10)%1000) < cfg.dropAfter {
			nDropAfter.Add(1)
			return grpcstatus.Error(codes.Unavailable, "fault: response dropped after the handler")
		}
		return err
	}
	// effect is the shared body of every method: refuse or fail without
	// effect, or run the effect (and maybe be slow, maybe refuse after it).
	effect := func(ctx context.Context, planKey string) (int64, error) {
		eff.act.add()
		defer eff.act.done()
		a, ok := interceptor.AttemptFromContext(ctx)
		if !ok {
			return 0, grpcstatus.Error(codes.Internal, "no attempt")
		}
		key := a.ID + "/" + a.Call
		r64 := h64(seed, "handler", planKey, strconv.Itoa(int(a.Try)))
		switch r64 % 20 {
		case 0:
			nFail.Add(1)
			return 0, grpcstatus.Error(codes.NotFound, "fault: definite failure, no effect")
		case 1:
			nRefuse.Add(1)
			return 0, status.WithoutEffect(status.NotAdmitted(status.ReasonShed, status.WithMessage("fault: shed, no effect")))
		}
		total := eff.apply(key)
		if (r64>>8)%4 == 0 {
			nSlow.Add(1)
			d := time.Duration((r64>>16)%120) * time.Millisecond
			tm := time.NewTimer(d)
			select {
			case <-tm.C:
			case <-ctx.Done():
			}
			tm.Stop()
		}
		if (r64>>24)%25 == 0 {
			nRefuse.Add(1)
			return 0, status.NotAdmitted(status.ReasonShed, status.WithMessage("fault: shed after the effect"))
		}
		return total, nil
	}
	upload := func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
		var planKey string
		for {
			m, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			planKey = m.GetValue()
		}
		total, err := effect(st.Context(), planKey)
		if err != nil {
			return err
		}
		return st.SendAndClose(&testingv1.UploadResponse{Count: int32(total)})
	}
	consume := func(r *testingv1.ConsumeRequest, st grpc.ServerStreamingServer[testingv1.ConsumeResponse]) error {
		total, err := effect(st.Context(), r.GetKey())
		if err != nil {
			return err
		}
		for range r.GetCount() {
			if err := st.Send(&testingv1.ConsumeResponse{Value: strconv.FormatInt(total, 10)}); err != nil {
				return err
			}
		}
		return nil
	}
	apply := func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		total, err := effect(ctx, r.GetKey())
		if err != nil {
			return nil, err
		}
		return &testingv1.ApplyResponse{Total: total}, nil
	}
	srv := &faultServer{t: t, seed: seed, store: store}
	srv.opts = append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(fault), grpc.ChainStreamInterceptor(sfault)}, serverOpts(interceptor.WithAttemptStore(store))...)
	srv.register = func(s *grpc.Server) {
		testingv1.RegisterTestServiceServer(s, &faultApply{f: apply, upload: upload, consume: consume})
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
	}
	srv.start()

	tries := 1 + rng.IntN(4)
	perTry := time.Duration(10+rng.IntN(60)) * time.Millisecond
	t.Logf("client: MaxTries %d, PerTryTimeout %v", tries, perTry)
	conn, err := grpc.NewClient(srv.addr, append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.2, MaxDelay: 30 * time.Millisecond}, MinConnectTimeout: 200 * time.Millisecond}),
	}, interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: tries, PerTryTimeout: perTry, InitialBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}),
		interceptor.WithoutRetryBudget(),
		interceptor.WithResolutionGrace(300*time.Millisecond),
	)...)...)
	require.NoError(t, err)
	defer conn.Close()
	client := testingv1.NewTestServiceClient(conn)

	// Plans per call, drawn up front.
	type plan struct {
		timeout time.Duration
		cancel  time.Duration // 0: never
		units   int64
		method  int // 0 Apply, 1 Upload, 2 Consume
	}
	plans := make([]plan, cfg.calls)
	for i := range plans {
		plans[i].timeout = time.Duration(100+rng.IntN(900)) * time.Millisecond
		plans[i].units = int64(rng.IntN(4))
		if cfg.streams {
			plans[i].method = rng.IntN(3)
		}
		if rng.IntN(4) == 0 {
			plans[i].cancel = time.Duration(rng.IntN(200)) * time.Millisecond
		}
	}
	stopRestarts := make(chan struct{})
	var restartWG sync.WaitGroup
	if cfg.restarts {
		gaps := make([]time.Duration, 64)
		for i := range gaps {
			gaps[i] = time.Duration(30+rng.IntN(250)) * time.Millisecond
		}
		restartWG.Go(func() {
			for i := 0; ; i++ {
				tm := time.NewTimer(gaps[i%len(gaps)])
				select {
				case <-stopRestarts:
					tm.Stop()
					return
				case <-tm.C:
				}
				srv.stop()
				nStops.Add(1)
				srv.start()
			}
		})
	}

	outs := make([]faultOutcome, cfg.calls)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range cfg.workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= cfg.calls {
					return
				}
				p := plans[i]
				cctx, cancel := context.WithCancel(ctx)
				actx, err := interceptor.StartAttempt(cctx, p.units, p.timeout)
				if err != nil {
					cancel()
					outs[i].err = err
					continue
				}
				a, _ := interceptor.AttemptFromContext(actx)
				var stop func() bool
				if p.cancel > 0 {
					nCancel.Add(1)
					tm := time.AfterFunc(p.cancel, cancel)
					stop = tm.Stop
				}
				err = nil
				var got int64
				var partial bool
				planKey := "c" + strconv.Itoa(i)
				switch p.method {
				case 0:
					var resp *testingv1.ApplyResponse
					resp, err = client.Apply(actx, &testingv1.ApplyRequest{Key: planKey, Amount: 1})
					got = resp.GetTotal()
				case 1:
					var st grpc.ClientStreamingClient[testingv1.UploadRequest, testingv1.UploadResponse]
					st, err = client.Upload(actx)
					if err == nil {
						for range 3 {
							if err = st.Send(&testingv1.UploadRequest{Value: planKey}); err != nil {
								break
							}
						}
						var resp *testingv1.UploadResponse
						resp, err = st.CloseAndRecv()
						got = int64(resp.GetCount())
					}
				case 2:
					var st grpc.ServerStreamingClient[testingv1.ConsumeResponse]
					st, err = client.Consume(actx, &testingv1.ConsumeRequest{Key: planKey, Count: 3})
					if err == nil {
						n := 0
						for {
							var m *testingv1.ConsumeResponse
							m, err = st.Recv()
							if err != nil {
								break
							}
							n++
							v, _ := strconv.ParseInt(m.GetValue(), 10, 64)
							if got != 0 && v != got {
								err = fmt.Errorf("fault: mixed values %d %d", got, v)
								break
							}
							got = v
						}
						if errors.Is(err, io.EOF) {
							err = nil
							if n != 3 {
								err = fmt.Errorf("fault: %d messages", n)
							}
						} else {
							partial = n > 0
						}
					}
				}
				if stop != nil {
					stop()
				}
				cancel()
				outs[i] = faultOutcome{key: a.ID + "/0", err: err, total: got, attempt: a.ID, partial: partial,
					plan: fmt.Sprintf("call %d method %d units %d timeout %v cancel %v", i, p.method, p.units, p.timeout, p.cancel)}
			}
		})
	}
	wg.Wait()
	close(stopRestarts)
	restartWG.Wait()
	eff.act.wait()
	srv.stop()

	kinds := map[string]int{}
	for _, o := range outs {
		n, total := eff.get(o.key)
		oc := status.OutcomeOf(o.err)
		kind := oc.Kind.String()
		kinds[kind+"/"+status.ReasonName(oc.Reason)]++
		require.LessOrEqual(t, n, 1, "seed %d %s: effect ran %d times (outcome %v)", seed, o.plan, n, o.err)
		if o.partial {
			require.Equal(t, 1, n, "seed %d %s: messages received, effect %d", seed, o.plan, n)
			require.NotEqual(t, status.KindNotAdmitted, oc.Kind, "seed %d %s: messages received, then NOT_ADMITTED: %v", seed, o.plan, o.err)
			require.Equal(t, total, o.total, "seed %d %s", seed, o.plan)
		}
		switch oc.Kind {
		case status.KindOK:
			require.Equal(t, 1, n, "seed %d %s: OK but effect ran %d times", seed, o.plan, n)
			require.Equal(t, total, o.total, "seed %d %s: OK with a response that is not the effect's", seed, o.plan)
		case status.KindCommitted:
			require.Equal(t, 1, n, "seed %d %s: COMMITTED but effect ran %d times: %v", seed, o.plan, n, o.err)
		case status.KindNotAdmitted:
			require.Equal(t, 0, n, "seed %d %s: NOT_ADMITTED but effect ran: %v", seed, o.plan, o.err)
		case status.KindFailed:
			require.Equal(t, 0, n, "seed %d %s: FAILED (handler fails only before the effect) but effect ran: %v", seed, o.plan, o.err)
		case status.KindUnknown:
			if d := oc.Detail; d != nil && d.GetAttemptId() != "" {
				require.Equal(t, o.attempt, d.GetAttemptId(), "seed %d %s: UNKNOWN names another attempt", seed, o.plan)
			}
		default:
			t.Fatalf("seed %d %s: unexpected outcome %v: %v", seed, o.plan, oc.Kind, o.err)
		}
		if o.err != nil && oc.Kind != status.KindFailed {
			require.NotNil(t, oc.Detail, "seed %d %s: no tollgate detail on %v", seed, o.plan, o.err)
		}
	}
	faults = map[string]int{
		"dropAfter": int(nDropAfter.Load()), "dropBefore": int(nDropBefore.Load()), "slow": int(nSlow.Load()),
		"refuse": int(nRefuse.Load()), "fail": int(nFail.Load()), "cancel": int(nCancel.Load()),
		"restarts": int(nStops.Load()), "connsClosed": int(srv.closed.Load()),
	}
	t.Logf("seed %d: outcomes %v; faults %v", seed, kinds, faults)
	return faults
}

type faultApply struct {
	testingv1.UnimplementedTestServiceServer
	f       func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error)
	upload  func(grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error
	consume func(*testingv1.ConsumeRequest, grpc.ServerStreamingServer[testingv1.ConsumeResponse]) error
}

func (s *faultApply) Upload(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
	if s.upload == nil {
		return grpcstatus.Error(codes.Unimplemented, "fault")
	}
	return s.upload(st)
}

func (s *faultApply) Consume(r *testingv1.ConsumeRequest, st grpc.ServerStreamingServer[testingv1.ConsumeResponse]) error {
	if s.consume == nil {
		return grpcstatus.Error(codes.Unimplemented, "fault")
	}
	return s.consume(r, st)
}

func (s *faultApply) Apply(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
	return s.f(ctx, r)
}

func TestFaultsAtMostOnceMemory(t *testing.T) {
	for _, seed := range faultSeeds(t, 3) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			runFaultAtMostOnce(t, seed, faultConfig{calls: 150, workers: 8, restarts: seed%2 == 1, dropAfter: 150, dropBefore: 80})
		})
	}
}

func TestFaultsAtMostOnceRedis(t *testing.T) {
	for _, seed := range faultSeeds(t, 2) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			runFaultAtMostOnce(t, seed, faultConfig{calls: 120, workers: 8, redis: true, restarts: seed%2 == 1, dropAfter: 150, dropBefore: 80})
		})
	}
}

func TestFaultsAtMostOnceStreams(t *testing.T) {
	for _, seed := range faultSeeds(t, 3) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			runFaultAtMostOnce(t, seed, faultConfig{calls: 150, workers: 8, restarts: seed%2 == 1, dropAfter: 150, dropBefore: 80, streams: true, redis: seed%3 == 0})
		})
	}
}
