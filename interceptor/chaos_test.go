package interceptor_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	"github.com/tollgate-go/tollgate/internal/header"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// The chaos test plays random call trees, like TestPropertyCallTrees, but
// mixes what that test leaves out: streams of all three kinds as inner
// calls (Watch, Upload, Chat), WithCallKey keys re-used across re-runs of a
// handler (with the same or another request), an attempt store at some
// tiers and not others, admission with one slot and a small queue,
// per-try timeouts with handlers slower than them, handler panics with and
// without WithRecovery, WithoutEffect refusals, a retry budget of one token,
// strict accounting at some hops, budget.Split fan-out, and goroutines that
// outlive their handler and then try to call.
//
// After each tree it checks: RPCs below the origin ≤ allowance; one attempt
// ID; at most one effective handler run per record key at tiers with a
// store; every handler's deadline ≤ d; every client span ended; no leaked
// goroutine; no call ended NOT_ADMITTED when a handler run it sent had an
// effect it did not declare absent (DESIGN.md §3.6); no call sent by a
// goroutine after its handler answered reached a server (§3.3: sealed).
//
//	TOLLGATE_CHAOS_SEED=17 go test -race -run TestChaosCallTrees ./interceptor/
//	TOLLGATE_CHAOS_TREES=n (default 120)

const (
	chaosMaxNodes = 14
	chaosMaxDepth = 4
	chaosInvMD    = "x-chaos-inv"
	chaosLateMD   = "x-chaos-late"
)

var chaosNSE = map[string]bool{"Get": true, "Watch": true}

type cnode struct {
	id     int
	depth  int
	parent *cnode
	method string

	// server
	store    bool
	adm      bool
	queue    int
	recovery bool

	// handler plan
	panicRuns  int64
	panicLate  bool
	refuseRuns int64
	refuseLate bool
	noEffect   bool // early refusals wrapped in WithoutEffect
	slowRuns   int64
	slow       time.Duration
	outlive    bool // a goroutine calls child 0 again after the handler answered
	propagate  bool // when every call ended NOT_ADMITTED, answer status.WithoutEffect(first)
	abandon    bool // launch calls, answer once the first reached its server
	est        time.Duration
	concurrent bool
	split      bool

	// client plan (its connections to its children)
	tries     int
	perTry    time.Duration
	strict    bool
	lowBudget bool

	children []*cedge

	runs    atomic.Int64
	end     *testsvc.Endpoint
	clients []testingv1.TestServiceClient
}

type cedge struct {
	to      *cnode
	key     string // WithCallKey name, "" for none
	vary    bool   // the request differs on each run of the caller
	calls   int
	timeout time.Duration
}

type crun struct {
	seq      int64
	node     *cnode
	attempt  interceptor.Attempt
	hasAtt   bool
	deadline time.Time
	hasDl    bool
	inv      string
	effect   bool // ran and did not declare its effect absent
	done     bool
	grant    int64
	hasLdg   bool
}

type cinv struct {
	reached chan struct{}
	once    sync.Once
	fromRun *crun
	id      string
	from    string
	to      *cnode
	err     error
	late    bool
	ended   bool
}

type carrival struct {
	node *cnode
	h    header.Header
	err  error
	inv  string
	late bool
}

type ctree struct {
	seed        uint64
	units       int64
	originTries int
	originPer   time.Duration
	originStrct bool
	originLow   bool
	timeout     time.Duration
	originCalls int    // 0: one call, attempt minted by the client; else calls under StartAttempt
	originKey   string // WithCallKey name of every origin call under StartAttempt
	originConc  bool
	nodes       []*cnode

	act     activity
	mu      sync.Mutex
	seq     int64
	invSeq  int64
	arr     []carrival
	runs    []*crun
	invs    []*cinv
	reports map[[3]string]int64 // (inv, call, try) → tollgate-spent
	conns   []*grpc.ClientConn
	spans   *tracetest.SpanRecorder
	tp      *sdktrace.TracerProvider
	stops   []func()
	panics  atomic.Int64
}

func chaosSeeds(t *testing.T) []uint64 {
	if v := os.Getenv("TOLLGATE_CHAOS_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err)
		return []uint64{s}
	}
	n := 120
	if v := os.Getenv("TOLLGATE_CHAOS_TREES"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(t, err)
	}
	from := 1
	if v := os.Getenv("TOLLGATE_CHAOS_FROM"); v != "" {
		var err error
		from, err = strconv.Atoi(v)
		require.NoError(t, err)
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(from + i)
	}
	return out
}

func genChaos(seed uint64) *ctree {
	rng := rand.New(rand.NewPCG(seed, seed^0x6368616f73))
	tr := &ctree{
		seed:        seed,
		units:       int64(rng.IntN(13)),
		originTries: 1 + rng.IntN(3),
		originStrct: rng.IntN(2) == 0,
		originLow:   rng.IntN(3) == 0,
		timeout:     time.Duration(300+rng.IntN(700)) * time.Millisecond,
	}
	if rng.IntN(3) == 0 {
		tr.originPer = time.Duration(20+rng.IntN(60)) * time.Millisecond
	}
	if rng.IntN(2) == 0 {
		tr.originCalls = 1 + rng.IntN(3)
		tr.originConc = rng.IntN(2) == 0
		if rng.IntN(2) == 0 {
			tr.originKey = "pay"
		}
	}
	tr.act.cond.L = &tr.act.mu
	all := []string{"Get", "Put", "Apply", "Watch", "Upload", "Chat"}
	maxDepth := 2 + rng.IntN(chaosMaxDepth-1)
	var gen func(parent *cnode, depth int, method string) *cnode
	gen = func(parent *cnode, depth int, method string) *cnode {
		n := &cnode{
			id: len(tr.nodes), depth: depth, parent: parent, method: method,
			store:      rng.IntN(2) == 0,
			adm:        rng.IntN(2) == 0,
			queue:      rng.IntN(2),
			recovery:   rng.IntN(2) == 0,
			panicLate:  rng.IntN(2) == 0,
			refuseLate: rng.IntN(2) == 0,
			noEffect:   rng.IntN(2) == 0,
			outlive:    rng.IntN(5) == 0,
			concurrent: rng.IntN(2) == 0,
			split:      rng.IntN(2) == 0,
			propagate:  rng.IntN(2) == 0,
			abandon:    rng.IntN(4) == 0,
			tries:      1 + rng.IntN(3),
			strict:     rng.IntN(2) == 0,
			lowBudget:  rng.IntN(3) == 0,
		}
		if rng.IntN(3) == 0 {
			n.perTry = time.Duration(20+rng.IntN(40)) * time.Millisecond
		}
		switch r := rng.IntN(10); {
		case r < 2:
			n.panicRuns = 1
		case r < 5:
			n.refuseRuns = 1 + int64(rng.IntN(2))
		}
		if rng.IntN(6) == 0 {
			n.est = time.Duration(50+rng.IntN(300)) * time.Millisecond
		}
		if rng.IntN(4) == 0 {
			n.slowRuns = 1
			n.slow = time.Duration(40+rng.IntN(60)) * time.Millisecond
		}
		tr.nodes = append(tr.nodes, n)
		if depth < maxDepth {
			fan := rng.IntN(4)
			if depth == 1 && fan == 0 {
				fan = 1
			}
			for i := 0; i < fan && len(tr.nodes) < chaosMaxNodes; i++ {
				m := all[rng.IntN(len(all))]
				if chaosNSE[method] && !chaosNSE[m] {
					// a method declared NO_SIDE_EFFECTS calls only such methods
					if rng.IntN(2) == 0 {
						m = "Get"
					} else {
						m = "Watch"
					}
				}
				e := &cedge{calls: 1 + rng.IntN(2)}
				if rng.IntN(3) == 0 || (method == "Put" && !chaosNSE[m]) {
					e.key = fmt.Sprintf("k%d", i)
					if rng.IntN(4) != 0 {
						e.calls = 1
					}
					e.vary = rng.IntN(4) == 0
				}
				if rng.IntN(6) == 0 {
					e.timeout = time.Duration(20+rng.IntN(60)) * time.Millisecond
				}
				e.to = gen(n, depth+1, m)
				n.children = append(n.children, e)
			}
		}
		return n
	}
	gen(nil, 1, all[rng.IntN(len(all))])
	return tr
}

func (tr *ctree) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: allowance %d, origin tries %d perTry %v strict %v lowBudget %v, d after %v; origin calls %d key %q concurrent %v\n",
		tr.seed, tr.units, tr.originTries, tr.originPer, tr.originStrct, tr.originLow, tr.timeout, tr.originCalls, tr.originKey, tr.originConc)
	for _, n := range tr.nodes {
		fmt.Fprintf(&b, "%s#%d %s: store %v adm %v(q%d) recovery %v | panic %d(late %v) refuse %d(late %v, noEffect %v) slow %d(%v) outlive %v abandon %v conc %v split %v | tries %d perTry %v strict %v lowBudget %v\n",
			strings.Repeat("  ", n.depth), n.id, n.method, n.store, n.adm, n.queue, n.recovery,
			n.panicRuns, n.panicLate, n.refuseRuns, n.refuseLate, n.noEffect, n.slowRuns, n.slow, n.outlive, n.abandon, n.concurrent, n.split,
			n.tries, n.perTry, n.strict, n.lowBudget)
		for _, e := range n.children {
			fmt.Fprintf(&b, "%s  → #%d key %q vary %v calls %d timeout %v\n", strings.Repeat("  ", n.depth), e.to.id, e.key, e.vary, e.calls, e.timeout)
		}
	}
	return b.String()
}

type chaosSlotKey struct{}

type chaosRunKey struct{}

type chaosSigKey struct{}

// report notes the tollgate-spent a try was answered with.
func (tr *ctree) report(ctx context.Context, trailer metadata.MD, ok bool) {
	md, _ := metadata.FromOutgoingContext(ctx)
	h, herr := header.ParseValues(md.Get(header.Key))
	inv := md.Get(chaosInvMD)
	if herr != nil || len(inv) == 0 {
		return
	}
	spent := int64(0)
	if vs := trailer.Get("tollgate-spent"); len(vs) > 0 {
		ok = false
		for _, v := range vs {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				spent, ok = max(spent, n), true
			}
		}
	}
	if !ok {
		return
	}
	tr.mu.Lock()
	tr.reports[[3]string{inv[0], h.Call, strconv.FormatUint(uint64(h.Try), 10)}] = spent
	tr.mu.Unlock()
}

func (tr *ctree) unaryReporter(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var trailer metadata.MD
	err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Trailer(&trailer))...)
	tr.report(ctx, trailer, err == nil)
	return err
}

type reportingStream struct {
	grpc.ClientStream
	tr   *ctree
	ctx  context.Context
	desc *grpc.StreamDesc
	once sync.Once
}

func (s *reportingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil || !s.desc.ServerStreams {
		s.once.Do(func() { s.tr.report(s.ctx, s.ClientStream.Trailer(), err == nil || err == io.EOF) })
	}
	return err
}

func (tr *ctree) streamReporter(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return cs, err
	}
	return &reportingStream{ClientStream: cs, tr: tr, ctx: ctx, desc: desc}, nil
}

type chaosSlot struct{ done chan struct{} }

func (tr *ctree) arrive(ctx context.Context, n *cnode) {
	h, err := header.ParseValues(metadata.ValueFromIncomingContext(ctx, header.Key))
	a := carrival{node: n, h: h, err: err}
	if v := metadata.ValueFromIncomingContext(ctx, chaosInvMD); len(v) > 0 {
		a.inv = v[0]
	}
	a.late = len(metadata.ValueFromIncomingContext(ctx, chaosLateMD)) > 0
	tr.mu.Lock()
	tr.arr = append(tr.arr, a)
	var inv *cinv
	for _, x := range tr.invs {
		if x.id == a.inv {
			inv = x
		}
	}
	tr.mu.Unlock()
	if inv != nil {
		inv.once.Do(func() { close(inv.reached) })
	}
}

const chaosSvcPrefix = "/tollgate.testing.v1.TestService/"

func (tr *ctree) unaryOuter(n *cnode) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		if !strings.HasPrefix(info.FullMethod, chaosSvcPrefix) {
			return handler(ctx, req)
		}
		tr.act.add()
		defer tr.act.done()
		tr.arrive(ctx, n)
		slot := &chaosSlot{done: make(chan struct{})}
		defer close(slot.done)
		defer func() {
			if p := recover(); p != nil {
				tr.panics.Add(1)
				err = grpcstatus.Error(codes.Internal, fmt.Sprint("recovered outside tollgate: ", p))
			}
		}()
		return handler(context.WithValue(ctx, chaosSlotKey{}, slot), req)
	}
}

type chaosStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *chaosStream) Context() context.Context { return s.ctx }

func (tr *ctree) streamOuter(n *cnode) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		if !strings.HasPrefix(info.FullMethod, chaosSvcPrefix) {
			return handler(srv, ss)
		}
		tr.act.add()
		defer tr.act.done()
		tr.arrive(ss.Context(), n)
		slot := &chaosSlot{done: make(chan struct{})}
		defer close(slot.done)
		defer func() {
			if p := recover(); p != nil {
				tr.panics.Add(1)
				err = grpcstatus.Error(codes.Internal, fmt.Sprint("recovered outside tollgate: ", p))
			}
		}()
		return handler(srv, &chaosStream{ServerStream: ss, ctx: context.WithValue(ss.Context(), chaosSlotKey{}, slot)})
	}
}

func (tr *ctree) clientOpts(tries int, perTry time.Duration, strict, low bool, units int64) []interceptor.ClientOption {
	opts := []interceptor.ClientOption{
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: tries, InitialBackoff: time.Millisecond, MaxBackoff: 3 * time.Millisecond, PerTryTimeout: perTry}),
		interceptor.WithResolutionGrace(100 * time.Millisecond),
		interceptor.WithClientTracerProvider(tr.tp),
	}
	if strict {
		opts = append(opts, interceptor.WithStrictAccounting())
	}
	if low {
		opts = append(opts, interceptor.WithRetryBudget(budget.WithMaxRetryTokens(1), budget.WithRetryRatio(0), budget.WithMinRetriesPerSecond(0)))
	}
	if units >= 0 {
		opts = append(opts, interceptor.WithAllowance(units), interceptor.WithAttemptTimeout(time.Minute))
	}
	return opts
}

func (tr *ctree) start(t *testing.T) {
	t.Helper()
	tr.reports = map[[3]string]int64{}
	tr.spans = tracetest.NewSpanRecorder()
	tr.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tr.spans))
	for _, n := range tr.nodes {
		sopts := []interceptor.ServerOption{
			interceptor.WithTrustedPeer(interceptor.TrustAll),
			interceptor.WithClockSkew(0),
		}
		var store *idempotency.MemoryStore
		if n.store {
			p := idempotency.DefaultPolicy()
			p.Skew = 0
			s, err := idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p))
			require.NoError(t, err)
			store = s
			sopts = append(sopts, interceptor.WithAttemptStore(store))
		}
		if n.adm {
			ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: n.queue, ExpectedServiceTime: n.est}), admission.WithDefaultClass("work"))
			require.NoError(t, err)
			sopts = append(sopts, interceptor.WithAdmission(ctrl))
		}
		if n.recovery {
			sopts = append(sopts, interceptor.WithRecovery())
		}
		svc := tr.service(n)
		opts := append([]grpc.ServerOption{
			grpc.ChainUnaryInterceptor(tr.unaryOuter(n)),
			grpc.ChainStreamInterceptor(tr.streamOuter(n)),
			grpc.WaitForHandlers(true),
		}, interceptor.ServerOptions(sopts...)...)
		end, err := testsvc.Start(testsvc.Bufconn, func(s *grpc.Server) {
			svc.Register(s)
			if store != nil {
				tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
			}
		}, opts...)
		require.NoError(t, err)
		n.end = end
		tr.stops = append(tr.stops, end.Stop)
	}
	for _, n := range tr.nodes {
		for _, e := range n.children {
			conn, err := e.to.end.Dial(append(interceptor.DialOptions(tr.clientOpts(n.tries, n.perTry, n.strict, n.lowBudget, -1)...),
				grpc.WithChainUnaryInterceptor(tr.unaryReporter), grpc.WithChainStreamInterceptor(tr.streamReporter))...)
			require.NoError(t, err)
			tr.conns = append(tr.conns, conn)
			n.clients = append(n.clients, testingv1.NewTestServiceClient(conn))
		}
	}
}

func (tr *ctree) service(n *cnode) *testsvc.Service {
	return servingService(func(ctx context.Context) error { return tr.serve(ctx, n) })
}

// servingService is a test service whose every method, unary or stream,
// runs serve with its context (after reading what the caller sends, for
// client and bidi streams) and answers with one message unless serve
// failed.
func servingService(serve func(context.Context) error) *testsvc.Service {
	return &testsvc.Service{
		GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			if err := serve(ctx); err != nil {
				return nil, err
			}
			return &testingv1.GetResponse{Value: "v"}, nil
		},
		PutFunc: func(ctx context.Context, _ *testingv1.PutRequest) (*testingv1.PutResponse, error) {
			if err := serve(ctx); err != nil {
				return nil, err
			}
			return &testingv1.PutResponse{Value: "v"}, nil
		},
		ApplyFunc: func(ctx context.Context, _ *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			if err := serve(ctx); err != nil {
				return nil, err
			}
			return &testingv1.ApplyResponse{Total: 1}, nil
		},
		WatchFunc: func(_ *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
			if err := serve(st.Context()); err != nil {
				return err
			}
			return st.Send(&testingv1.WatchResponse{Value: "v"})
		},
		UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
			if _, err := testsvc.DrainUpload(st); err != nil {
				return err
			}
			if err := serve(st.Context()); err != nil {
				return err
			}
			return st.SendAndClose(&testingv1.UploadResponse{Count: 1})
		},
		ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
			for {
				_, err := st.Recv()
				if err == io.EOF {
					break
				}
				if err != nil {
					return err
				}
			}
			if err := serve(st.Context()); err != nil {
				return err
			}
			return st.Send(&testingv1.ChatResponse{Value: "v"})
		},
	}
}

var errChaosRefused = status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Millisecond))

func (tr *ctree) serve(ctx context.Context, n *cnode) (err error) {
	r := &crun{node: n}
	r.attempt, r.hasAtt = interceptor.AttemptFromContext(ctx)
	r.deadline, r.hasDl = ctx.Deadline()
	if v := metadata.ValueFromIncomingContext(ctx, chaosInvMD); len(v) > 0 {
		r.inv = v[0]
	}
	if l, ok := budget.FromContext(ctx); ok {
		r.grant, r.hasLdg = l.Snapshot().Total, true
	}
	ctx = context.WithValue(ctx, chaosRunKey{}, r)
	tr.mu.Lock()
	tr.seq++
	r.seq = tr.seq
	tr.runs = append(tr.runs, r)
	tr.mu.Unlock()
	nse := chaosNSE[n.method]
	// effect until proven otherwise: a panic or any return counts
	tr.mu.Lock()
	r.effect = !nse
	tr.mu.Unlock()
	defer func() {
		tr.mu.Lock()
		r.done = true
		tr.mu.Unlock()
	}()

	k := n.runs.Add(1)
	if k <= n.panicRuns && !n.panicLate {
		panic(fmt.Sprintf("chaos: node #%d panics early", n.id))
	}
	if k <= n.refuseRuns && !n.refuseLate {
		if n.noEffect {
			tr.mu.Lock()
			r.effect = false
			tr.mu.Unlock()
			return status.WithoutEffect(errChaosRefused)
		}
		return errChaosRefused
	}
	if n.outlive && len(n.children) > 0 {
		slot, _ := ctx.Value(chaosSlotKey{}).(*chaosSlot)
		if slot != nil {
			lctx := ctx
			if k%2 == 1 {
				lctx = context.WithoutCancel(ctx)
			}
			tr.act.add()
			go func() {
				defer tr.act.done()
				<-slot.done // the server has answered: the run's ledger is sealed
				tr.call(lctx, n, 0, k, true)
			}()
		}
	}
	cerr, allRefused := tr.callChildren(ctx, n, k)
	if k <= n.slowRuns {
		select {
		case <-time.After(n.slow):
		case <-ctx.Done():
		}
	}
	if k <= n.panicRuns {
		panic(fmt.Sprintf("chaos: node #%d panics late", n.id))
	}
	if k <= n.refuseRuns {
		return errChaosRefused
	}
	if cerr != nil && allRefused && n.propagate {
		// every call this run made ended NOT_ADMITTED (no effect below),
		// and the handler did nothing else: its refusal is honest.
		tr.mu.Lock()
		r.effect = false
		tr.mu.Unlock()
		return status.WithoutEffect(cerr)
	}
	return cerr
}

func (tr *ctree) callChildren(ctx context.Context, n *cnode, run int64) (error, bool) {
	type job struct{ i int }
	var jobs []job
	for i, e := range n.children {
		for range e.calls {
			jobs = append(jobs, job{i})
		}
	}
	ctxs := make([]context.Context, len(jobs))
	if n.split && len(jobs) > 0 {
		copy(ctxs, budget.Split(ctx, len(jobs)))
	} else {
		for i := range ctxs {
			ctxs[i] = ctx
		}
	}
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	all := true
	note := func(err error) {
		mu.Lock()
		if first == nil && err != nil {
			first = err
		}
		if status.OutcomeOf(err).Kind != status.KindNotAdmitted {
			all = false
		}
		mu.Unlock()
	}
	if n.abandon && len(jobs) > 0 {
		// Launch every call and answer once the first reached its server
		// (or ended): the others may still be in flight when the ledger is
		// sealed, and run on after the handler panics, refuses or answers.
		sig := make(chan *cinv, 1)
		for j, jb := range jobs {
			c := ctxs[j]
			if j == 0 {
				c = context.WithValue(c, chaosSigKey{}, sig)
			}
			tr.act.add()
			go func() {
				defer tr.act.done()
				_ = tr.call(c, n, jb.i, run, false)
			}()
		}
		<-(<-sig).reached
		return nil, false
	}
	for j, jb := range jobs {
		if n.concurrent {
			wg.Go(func() { note(tr.call(ctxs[j], n, jb.i, run, false)) })
		} else {
			note(tr.call(ctxs[j], n, jb.i, run, false))
		}
	}
	wg.Wait()
	return first, all && len(jobs) > 0
}

func (tr *ctree) call(ctx context.Context, n *cnode, i int, run int64, late bool) error {
	e := n.children[i]
	tr.mu.Lock()
	tr.invSeq++
	fr, _ := ctx.Value(chaosRunKey{}).(*crun)
	inv := &cinv{id: strconv.FormatInt(tr.invSeq, 10), from: fmt.Sprintf("#%d", n.id), to: e.to, late: late, fromRun: fr, reached: make(chan struct{})}
	tr.invs = append(tr.invs, inv)
	tr.mu.Unlock()
	if sig, ok := ctx.Value(chaosSigKey{}).(chan *cinv); ok {
		sig <- inv
	}
	defer inv.once.Do(func() { close(inv.reached) })
	ctx = metadata.AppendToOutgoingContext(ctx, chaosInvMD, inv.id)
	if late {
		ctx = metadata.AppendToOutgoingContext(ctx, chaosLateMD, "1")
	}
	if e.key != "" {
		ctx = interceptor.WithCallKey(ctx, e.key)
	}
	if e.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, e.timeout)
		defer cancel()
	}
	val := "v"
	if e.vary {
		val = "v" + strconv.FormatInt(run, 10)
	}
	err := chaosInvoke(ctx, n.clients[i], e.to.method, val)
	tr.mu.Lock()
	inv.err, inv.ended = err, true
	tr.mu.Unlock()
	return err
}

// chaosInvoke calls method on c with val in its request, reading a
// stream to its end; a stream's io.EOF is success.
func chaosInvoke(ctx context.Context, c testingv1.TestServiceClient, method, val string) error {
	var err error
	switch method {
	case "Get":
		_, err = c.Get(ctx, &testingv1.GetRequest{Key: val})
	case "Put":
		_, err = c.Put(ctx, &testingv1.PutRequest{Key: "k", Value: val})
	case "Apply":
		_, err = c.Apply(ctx, &testingv1.ApplyRequest{Key: val, Amount: 1})
	case "Watch":
		st, serr := c.Watch(ctx, &testingv1.WatchRequest{Key: val, Count: 1})
		if serr != nil {
			return serr
		}
		for {
			if _, err = st.Recv(); err != nil {
				break
			}
		}
		if err == io.EOF {
			err = nil
		}
	case "Upload":
		st, serr := c.Upload(ctx)
		if serr != nil {
			return serr
		}
		if err = st.Send(&testingv1.UploadRequest{Value: val}); err != nil && err != io.EOF {
			return err
		}
		_, err = st.CloseAndRecv()
	case "Chat":
		st, serr := c.Chat(ctx)
		if serr != nil {
			return serr
		}
		if err = st.Send(&testingv1.ChatRequest{Value: val}); err != nil && err != io.EOF {
			return err
		}
		if cerr := st.CloseSend(); cerr != nil {
			return cerr
		}
		for {
			if _, err = st.Recv(); err != nil {
				break
			}
		}
		if err == io.EOF {
			err = nil
		}
	default:
		panic("chaos: unknown method " + method)
	}
	return err
}

func (tr *ctree) run(t *testing.T) (time.Time, error) {
	t.Helper()
	root := tr.nodes[0]
	conn, err := root.end.Dial(interceptor.DialOptions(tr.clientOpts(tr.originTries, tr.originPer, tr.originStrct, tr.originLow, tr.units)...)...)
	require.NoError(t, err)
	tr.conns = append(tr.conns, conn)
	origin := testingv1.NewTestServiceClient(conn)
	d := time.Now().Add(tr.timeout)
	ctx, cancel := context.WithDeadline(context.Background(), d)
	defer cancel()
	one := func(ctx context.Context, name string) error {
		tr.mu.Lock()
		inv := &cinv{id: name, from: "origin", to: root, reached: make(chan struct{})}
		tr.invs = append(tr.invs, inv)
		tr.mu.Unlock()
		err := chaosInvoke(metadata.AppendToOutgoingContext(ctx, chaosInvMD, name), origin, root.method, "v")
		tr.mu.Lock()
		inv.err, inv.ended = err, true
		tr.mu.Unlock()
		return err
	}
	var oerr error
	if tr.originCalls == 0 {
		oerr = one(ctx, "origin")
	} else {
		actx, err := interceptor.StartAttempt(ctx, tr.units, time.Minute)
		require.NoError(t, err)
		if tr.originKey != "" {
			actx = interceptor.WithCallKey(actx, tr.originKey)
		}
		errs := make([]error, tr.originCalls)
		var wg sync.WaitGroup
		for i := range errs {
			if tr.originConc {
				wg.Go(func() { errs[i] = one(actx, fmt.Sprintf("origin%d", i)) })
			} else {
				errs[i] = one(actx, fmt.Sprintf("origin%d", i))
			}
		}
		wg.Wait()
		oerr = errors.Join(errs...)
	}
	tr.act.wait()
	for _, s := range tr.stops {
		s()
	}
	tr.act.wait()
	for _, c := range tr.conns {
		_ = c.Close()
	}
	return d, oerr
}

func (tr *ctree) check(t *testing.T, d time.Time) {
	t.Helper()
	tr.mu.Lock()
	arr := append([]carrival(nil), tr.arr...)
	runs := append([]*crun(nil), tr.runs...)
	invs := append([]*cinv(nil), tr.invs...)
	tr.mu.Unlock()
	root := tr.nodes[0]
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	// allowance + identity
	id := ""
	below := 0
	for _, a := range arr {
		if a.err != nil {
			fail("node #%d: malformed header: %v", a.node.id, a.err)
			continue
		}
		if id == "" {
			id = a.h.Attempt
		}
		if a.h.Attempt != id {
			fail("node #%d call %s: attempt %s, want %s", a.node.id, a.h.Call, a.h.Attempt, id)
		}
		if a.node != root {
			below++
		}
		if a.late {
			fail("node #%d call %s try %d (inv %s): a call made after its handler answered reached a server (ledger sealed, §3.3)", a.node.id, a.h.Call, a.h.Try, a.inv)
		}
	}
	if int64(below) > tr.units {
		fail("one allowance: %d RPCs below the origin with an allowance of %d", below, tr.units)
	}
	// runs: identity, deadline
	dl := time.UnixMilli(d.UnixMilli())
	for _, r := range runs {
		if !r.hasAtt {
			fail("node #%d: handler ran without an attempt", r.node.id)
			continue
		}
		if r.attempt.ID != id {
			fail("node #%d call %s: handler saw attempt %s, want %s", r.node.id, r.attempt.Call, r.attempt.ID, id)
		}
		if r.attempt.Origin {
			fail("node #%d call %s: handler is an origin", r.node.id, r.attempt.Call)
		}
		if !r.hasDl || r.deadline.After(d) {
			fail("node #%d call %s: handler deadline %v (has %v) after d %v", r.node.id, r.attempt.Call, r.deadline, r.hasDl, dl)
		}
	}
	// at most once per record
	type rk struct {
		node          int
		attempt, call string
	}
	byKey := map[rk][]*crun{}
	for _, r := range runs {
		if !r.node.store || chaosNSE[r.node.method] || !r.hasAtt {
			continue
		}
		k := rk{r.node.id, r.attempt.ID, r.attempt.Call}
		byKey[k] = append(byKey[k], r)
	}
	for k, rs := range byKey {
		sort.Slice(rs, func(i, j int) bool { return rs[i].seq < rs[j].seq })
		for i, r := range rs[:len(rs)-1] {
			if r.effect {
				fail("node #%d (store) call %s: handler ran %d times (run %d try %d had an effect; a later run try %d followed) — at most once per record (§3.7)",
					k.node, k.call, len(rs), i+1, r.attempt.Try, rs[i+1].attempt.Try)
				break
			}
		}
	}
	// typed outcomes: NOT_ADMITTED only if no effective run was sent by the call
	effectOf := map[string][]*crun{}
	for _, r := range runs {
		if r.effect && r.inv != "" {
			effectOf[r.inv] = append(effectOf[r.inv], r)
		}
	}
	for _, inv := range invs {
		if !inv.ended {
			fail("inv %s from %s to #%d never ended", inv.id, inv.from, inv.to.id)
			continue
		}
		o := status.OutcomeOf(inv.err)
		code := grpcstatus.Code(inv.err)
		switch o.Kind {
		case status.KindUnknown:
			if code == codes.Unavailable || code == codes.ResourceExhausted {
				fail("call %s → #%d: UNKNOWN outcome with code %v (§2.5): %v", inv.from, inv.to.id, code, inv.err)
			}
		case status.KindCommitted:
			if code != codes.FailedPrecondition {
				fail("call %s → #%d: COMMITTED with code %v (§2.5)", inv.from, inv.to.id, code)
			}
		case status.KindNotAdmitted:
			if code != codes.Unavailable && code != codes.ResourceExhausted && code != codes.InvalidArgument {
				fail("call %s → #%d: NOT_ADMITTED with code %v (§2.5): %v", inv.from, inv.to.id, code, inv.err)
			}
		}
		if o.Kind != status.KindNotAdmitted {
			continue
		}
		if rs := effectOf[inv.id]; len(rs) > 0 {
			fail("call %s → #%d (%s) ended NOT_ADMITTED (%v, %v) but its try %d ran the handler with an undeclared effect (§3.6)",
				inv.from, inv.to.id, inv.to.method, o.Reason, inv.err, rs[0].attempt.Try)
		}
	}
	// per run: the RPCs sent below it ≤ its grant and ≤ what its try reported
	invByID := map[string]*cinv{}
	for _, inv := range invs {
		invByID[inv.id] = inv
	}
	type tk struct {
		inv, call string
		try       uint32
	}
	runOf := map[tk]*crun{}
	for _, r := range runs {
		if r.hasAtt {
			runOf[tk{r.inv, r.attempt.Call, r.attempt.Try}] = r
		}
	}
	tr.mu.Lock()
	reports := tr.reports
	tr.mu.Unlock()
	under := map[*crun]int64{}
	for _, a := range arr {
		if a.node == root || a.err != nil {
			continue
		}
		inv := invByID[a.inv]
		if inv == nil {
			fail("node #%d: arrival of unknown call %q", a.node.id, a.inv)
			continue
		}
		for p := inv.fromRun; p != nil; {
			under[p]++
			pi := invByID[p.inv]
			if pi == nil {
				break
			}
			p = pi.fromRun
		}
	}
	for r, n := range under {
		if r.hasLdg && n > r.grant {
			fail("node #%d call %s try %d: %d RPCs sent below a run granted %d", r.node.id, r.attempt.Call, r.attempt.Try, n, r.grant)
		}
		if sp, ok := reports[[3]string{r.inv, r.attempt.Call, strconv.FormatUint(uint64(r.attempt.Try), 10)}]; ok && n > sp {
			fail("node #%d (%s) call %s try %d: %d RPCs sent below a run whose try reported tollgate-spent %d", r.node.id, r.node.method, r.attempt.Call, r.attempt.Try, n, sp)
		}
	}
	_ = runOf
	chaosStats.reports.Add(int64(len(reports)))
	chaosStats.underRuns.Add(int64(len(under)))
	for _, rs := range byKey {
		if len(rs) > 1 {
			chaosStats.multi.Add(1)
		}
	}
	for _, inv := range invs {
		if inv.late {
			chaosStats.late.Add(1)
		}
		if k := status.OutcomeOf(inv.err).Kind; k == status.KindNotAdmitted && len(effectOf[inv.id]) == 0 {
			chaosStats.na.Add(1)
		}
	}
	// spans
	started, ended := len(tr.spans.Started()), len(tr.spans.Ended())
	if started != ended {
		fail("client spans: %d started, %d ended", started, ended)
	}
	if len(problems) > 0 {
		t.Errorf("seed %d: %d problem(s):\n  %s", tr.seed, len(problems), strings.Join(problems, "\n  "))
	}
}

var chaosStats struct{ reports, underRuns, multi, late, na atomic.Int64 }

func TestChaosCallTrees(t *testing.T) {
	seeds := chaosSeeds(t)
	start := time.Now()
	var failed []uint64
	var rpcs, runsN, panics int
	for _, seed := range seeds {
		if time.Since(start) > 50*time.Second {
			t.Logf("time bound: stopping before seed %d", seed)
			break
		}
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			leaks := goleak.IgnoreCurrent()
			tr := genChaos(seed)
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("reproduce: TOLLGATE_CHAOS_SEED=%d go test -race -run TestChaosCallTrees ./interceptor/\n%s", seed, tr)
				}
			})
			tr.start(t)
			d, err := tr.run(t)
			t.Logf("origin: %v", err)
			tr.check(t, d)
			_ = tr.tp.Shutdown(context.Background())
			if lerr := goleak.Find(leaks); lerr != nil {
				t.Errorf("seed %d: goroutines leaked: %v", seed, lerr)
			}
			rpcs += len(tr.arr)
			runsN += len(tr.runs)
			panics += int(tr.panics.Load())
		})
		if !ok {
			failed = append(failed, seed)
		}
	}
	t.Logf("reports %d, runs with calls below %d, record keys run more than once %d, late calls %d, NOT_ADMITTED calls %d",
		chaosStats.reports.Load(), chaosStats.underRuns.Load(), chaosStats.multi.Load(), chaosStats.late.Load(), chaosStats.na.Load())
	t.Logf("%d RPCs, %d handler runs, %d panics recovered outside tollgate; failed seeds: %v; %v", rpcs, runsN, panics, failed, time.Since(start).Round(time.Millisecond))
}
