package interceptor_test

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	"github.com/tollgate-go/tollgate/internal/header"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
)

// The property test plays random call trees over real gRPC (one bufconn
// server per node, tollgate's interceptors on every server and every client
// connection) and checks DESIGN.md §3 invariants 1–4 on what the servers saw.
//
// A tree has 1–4 tiers below the origin, fan-out 0–3 and at most
// propertyMaxNodes nodes (one tree in four is steered to reach the fourth
// tier: see genTree; the test logs how deep the trees' RPCs went); each edge is a unary call (Get NO_SIDE_EFFECTS,
// Put IDEMPOTENT, Apply with side effects) or a stream (Watch, Upload).
// Every node's handler follows a plan drawn from the seed:
//
//   - the retry policy (MaxTries 1–3), accounting mode (lenient or
//     WithStrictAccounting) and hop margin (default or 0) of the calls it owns;
//   - how it fans out: in order or concurrently; default grants,
//     budget.Split, or budget.WithGrant per target;
//   - which calls it makes from a goroutine that outlives the handler (on
//     the handler's context or context.WithoutCancel), and whether the
//     handler answers only once such a call reached its server, so that the
//     call is in flight when the handler's ledger is sealed;
//   - whether its first runs refuse (NOT_ADMITTED, before or after calling
//     its children, with or without status.WithoutEffect);
//   - whether a run drops its response: it calls its children, then answers
//     only when its caller gave up (callers give such nodes a short timeout);
//   - under a strict caller, whether a plain gRPC proxy (no tollgate) sits on
//     the edge, forwarding the tollgate header once and dropping the callee's
//     tollgate-spent trailer (DESIGN.md §2.3).
//
// The origin is a test client with WithAllowance(N), N in 0..8, its own
// retry policy, accounting mode and hop margin; it makes one call, or 1–3
// calls (in order or concurrently) under one interceptor.StartAttempt. Its
// context deadline d falls seconds away (a backstop) or, in one tree out of
// eight, 40–150 ms away, and then the root may drop too.
//
// After the origin's calls return, the test waits until every handler and
// detached goroutine has ended, then stops every server waiting for its
// handlers (grpc.WaitForHandlers), so that no RPC can still be on its way
// when it counts. An outermost server interceptor notes every RPC that
// reached a server, with its raw tollgate header, also those tollgate
// refused before the handler. Then:
//
//   - one allowance: the RPCs that reached the servers below the root (all
//     sent below the origin: first tries and repeats at every layer) number
//     at most N; for each handler run, the RPCs that reached servers under
//     its call key number at most the units it was granted, and at most the
//     tollgate-spent it answered with (when its caller saw one);
//   - one identity: every RPC that reached a server carries the attempt ID,
//     and every handler runs under it (never as an origin of its own), with
//     a ledger of the units its header granted;
//   - call keys: (call, try) is unique among all RPCs of the attempt; the
//     origin's calls are 0, 1, …; every other key is p.T.k for a handler run
//     serving try T of call p on the caller's node, k within the calls that
//     run made; tries stay within the owner's MaxTries;
//   - one deadline: every RPC carries d (in Unix ms), every handler's attempt
//     deadline is that d and its context deadline is no later than d (skew 0).
//
// Seeds 1..propertyTrees run by default (propertyTreesShort with -short). To
// reproduce one seed (a failure prints the command and the tree):
//
//	TOLLGATE_PROPERTY_SEED=17 go test -race -run TestPropertyCallTrees ./interceptor/
//	go test -race -run TestPropertyCallTrees ./interceptor/ -seed 17
//
// TOLLGATE_PROPERTY_TREES=n runs seeds 1..n instead. The trees are
// reproducible; the interleavings of their goroutines are not, and none of
// the assertions depends on them or on time.

var propertySeed = flag.Uint64("seed", 0, "run TestPropertyCallTrees for this seed only (also TOLLGATE_PROPERTY_SEED)")

const (
	propertyTrees      = 300
	propertyTreesShort = 60
	propertyMaxNodes   = 16
	propertyMaxDepth   = 4
	propertyMaxFanOut  = 3
	propertyMaxUnits   = 8
)

// propertySeeds returns the seeds to run.
func propertySeeds(t *testing.T) []uint64 {
	t.Helper()
	if *propertySeed != 0 {
		return []uint64{*propertySeed}
	}
	if v := os.Getenv("TOLLGATE_PROPERTY_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "TOLLGATE_PROPERTY_SEED")
		return []uint64{s}
	}
	n := propertyTrees
	if testing.Short() {
		n = propertyTreesShort
	}
	if v := os.Getenv("TOLLGATE_PROPERTY_TREES"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(t, err, "TOLLGATE_PROPERTY_TREES")
	}
	seeds := make([]uint64, n)
	for i := range seeds {
		seeds[i] = uint64(i + 1)
	}
	return seeds
}

type splitMode int

const (
	splitNone  splitMode = iota // default grants
	splitEven                   // budget.Split
	splitGrant                  // budget.WithGrant per target
)

// pnode is one server of a tree and the plan of its handler.
type pnode struct {
	id     int
	depth  int // 1: the root, called by the origin
	parent *pnode
	method string // how its caller calls it: Get, Put, Apply, Watch or Upload

	// the plan of its handler runs
	tries      int  // MaxTries of the calls it owns
	strict     bool // WithStrictAccounting on its connections
	noMargin   bool // WithHopMargin(0) on its connections
	concurrent bool // fan out concurrently (joined before answering)
	split      splitMode
	refuseRuns int64 // its first refuseRuns runs refuse
	refuseLate bool  // … after calling its children (else before)
	noEffect   bool  // wrap its errors in status.WithoutEffect
	dropRuns   int64 // the next dropRuns runs call their children, then never answer
	children   []*pedge

	runs    atomic.Int64
	svc     *testsvc.Service
	end     *testsvc.Endpoint
	clients []testingv1.TestServiceClient
}

// pedge is one call a node's handler makes.
type pedge struct {
	to            *pnode
	grant         int64         // with splitGrant
	timeout       time.Duration // the call's own timeout, 0 for none
	detached      bool          // made from a goroutine that outlives the handler
	withoutCancel bool          // … on context.WithoutCancel(handler's context)
	// waitSent makes the handler answer only once the detached call
	// reached its server or ended, so that the call is in flight when the
	// handler's ledger is sealed.
	waitSent bool
	// proxy puts a plain gRPC server (no tollgate) between the caller and
	// the callee: it forwards the tollgate header once and drops the
	// callee's trailer, so only strict accounting keeps the caller's books
	// (DESIGN.md §2.3). Only under strict callers.
	proxy bool
}

// callTry names one try of one call.
type callTry struct {
	call string
	try  uint32
}

// arrival is one RPC that reached a server, read before tollgate's
// interceptor ran.
type arrival struct {
	node *pnode
	h    header.Header
	err  error
}

// prun is one handler run.
type prun struct {
	node        *pnode
	attempt     interceptor.Attempt
	hasAttempt  bool
	deadline    time.Time
	hasDeadline bool
	grant       int64
	hasLedger   bool
	issued      atomic.Int64 // calls the run started
}

// ptree is one random call tree, its servers and what they saw.
type ptree struct {
	seed           uint64
	units          int64
	originTries    int
	originStrict   bool
	originNoMargin bool
	// originCalls is 0 for one call whose attempt the origin client mints
	// (WithAllowance), or the number of calls made under one
	// interceptor.StartAttempt, concurrently when originConcurrent.
	originCalls      int
	originConcurrent bool
	// timeout is how long after the origin's first call d falls.
	timeout time.Duration
	nodes   []*pnode

	act     activity
	mu      sync.Mutex
	arr     []arrival
	runs    []*prun
	proxies []*testsvc.Endpoint
	conns   []*grpc.ClientConn
	reports map[callTry]int64        // tollgate-spent of the tries that answered
	signals map[string]chan struct{} // closed when the call reaches a server
	nextSig int

	refusals, drops, detached atomic.Int64
}

// activity counts handlers and detached goroutines still running.
type activity struct {
	mu   sync.Mutex
	cond sync.Cond
	n    int
}

func (a *activity) add() {
	a.mu.Lock()
	a.n++
	a.mu.Unlock()
}

func (a *activity) done() {
	a.mu.Lock()
	a.n--
	if a.n == 0 {
		a.cond.Broadcast()
	}
	a.mu.Unlock()
}

func (a *activity) wait() {
	a.mu.Lock()
	for a.n > 0 {
		a.cond.Wait()
	}
	a.mu.Unlock()
}

// genTree draws a tree from seed.
func genTree(seed uint64) *ptree {
	rng := rand.New(rand.NewPCG(seed, seed^0x746f6c6c67617465))
	tr := &ptree{
		seed:         seed,
		units:        int64(rng.IntN(propertyMaxUnits + 1)),
		originTries:  1 + rng.IntN(3),
		originStrict: rng.IntN(2) == 0,
	}
	tr.act.cond.L = &tr.act.mu
	tr.originNoMargin = rng.IntN(4) == 0
	tr.reports = map[callTry]int64{}
	tr.signals = map[string]chan struct{}{}
	if rng.IntN(2) == 0 {
		tr.originCalls = 1 + rng.IntN(3)
		tr.originConcurrent = rng.IntN(2) == 0
	}
	// d is the caller's deadline, earlier than the attempt timeout: a
	// backstop of seconds (drops are called with short timeouts), or in one
	// tree out of eight a short one that every tier must respect, and then
	// the root may drop too.
	tr.timeout = 5 * time.Second
	rootDrops := false
	if rng.IntN(8) == 0 {
		tr.timeout = time.Duration(40+rng.IntN(110)) * time.Millisecond
		rootDrops = rng.IntN(2) == 0
	}
	// Tiers below the origin: 2–4 (a lone root sends nothing below the
	// origin, so it is left out).
	maxDepth := 2 + rng.IntN(propertyMaxDepth-1)
	// One tree in four is steered deep: drawn freely, few trees reach the
	// fourth tier, since every hop's default grant keeps a unit back per
	// try its owner may still repeat, and a node that refuses before it
	// calls its children ends the descent. A deep tree has four tiers and
	// 4–8 units, and its chain (the root and each chain node's first child)
	// repeats at most once and refuses, if at all, after calling its
	// children.
	deep := rng.IntN(4) == 0
	if deep {
		maxDepth = propertyMaxDepth
		tr.units = max(tr.units, int64(4+rng.IntN(5)))
	}
	methods := []string{"Get", "Get", "Get", "Apply", "Put", "Watch", "Upload"}
	var gen func(parent *pnode, depth int, method string, chain bool) *pnode
	gen = func(parent *pnode, depth int, method string, chain bool) *pnode {
		chain = chain && deep
		n := &pnode{
			id: len(tr.nodes), depth: depth, parent: parent, method: method,
			tries:      1 + rng.IntN(3),
			strict:     rng.IntN(2) == 0,
			noMargin:   rng.IntN(4) == 0,
			concurrent: rng.IntN(2) == 0,
			split:      splitMode(rng.IntN(3)),
			refuseLate: rng.IntN(3) != 0,
			noEffect:   rng.IntN(2) == 0,
		}
		switch r := rng.IntN(10); {
		case r < 6:
		case r < 9:
			n.refuseRuns = 1
		default:
			n.refuseRuns = 2
		}
		if (depth > 1 || rootDrops) && rng.IntN(5) == 0 {
			n.dropRuns = 1
		}
		if chain {
			n.tries = min(n.tries, 2)
			n.refuseLate = true
		}
		tr.nodes = append(tr.nodes, n)
		fan := 0
		if depth < maxDepth {
			fan = rng.IntN(propertyMaxFanOut + 1)
			if (depth == 1 || chain) && fan == 0 {
				fan = 1
			}
		}
		for i := range fan {
			if len(tr.nodes) >= propertyMaxNodes {
				break
			}
			m := methods[rng.IntN(len(methods))]
			if method == "Put" && m != "Get" && m != "Watch" {
				// An IDEMPOTENT handler must key its calls to methods with
				// side effects explicitly; explicit keys repeat across
				// re-runs by design, so Put's children are all
				// NO_SIDE_EFFECTS methods.
				m = "Get"
			}
			e := &pedge{
				to:            gen(n, depth+1, m, chain && i == 0),
				grant:         int64(rng.IntN(4)),
				detached:      rng.IntN(5) == 0,
				withoutCancel: rng.IntN(3) != 0,
				waitSent:      rng.IntN(2) == 0,
				proxy:         n.strict && rng.IntN(3) == 0,
			}
			switch {
			case e.to.dropRuns > 0:
				e.timeout = time.Duration(15+rng.IntN(30)) * time.Millisecond
			case rng.IntN(6) == 0:
				e.timeout = time.Duration(20+rng.IntN(80)) * time.Millisecond
			}
			n.children = append(n.children, e)
		}
		return n
	}
	gen(nil, 1, methods[rng.IntN(len(methods))], true)
	return tr
}

func (tr *ptree) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: allowance %d, origin MaxTries %d strict %v noMargin %v calls %d concurrent %v, d after %v\n",
		tr.seed, tr.units, tr.originTries, tr.originStrict, tr.originNoMargin, tr.originCalls, tr.originConcurrent, tr.timeout)
	for _, n := range tr.nodes {
		fmt.Fprintf(&b, "%s#%d %s: tries %d strict %v noMargin %v concurrent %v split %d refuse %d (late %v, without effect %v) drop %d\n",
			strings.Repeat("  ", n.depth), n.id, n.method, n.tries, n.strict, n.noMargin, n.concurrent, n.split,
			n.refuseRuns, n.refuseLate, n.noEffect, n.dropRuns)
		for _, e := range n.children {
			fmt.Fprintf(&b, "%s  → #%d grant %d timeout %v detached %v (withoutCancel %v, waitSent %v) proxy %v\n",
				strings.Repeat("  ", n.depth), e.to.id, e.grant, e.timeout, e.detached, e.withoutCancel, e.waitSent, e.proxy)
		}
	}
	return b.String()
}

// start runs every node's server and dials its children.
func (tr *ptree) start(t *testing.T) {
	t.Helper()
	for _, n := range tr.nodes {
		n.svc = servingService(func(ctx context.Context) error { return tr.serve(ctx, n) })
		opts := append([]grpc.ServerOption{
			// Outermost: counts every RPC that reaches the server, also
			// those tollgate refuses before the handler.
			grpc.ChainUnaryInterceptor(tr.counter(n)),
			grpc.ChainStreamInterceptor(tr.streamCounter(n)),
			grpc.WaitForHandlers(true),
		}, serverOpts()...)
		end, err := testsvc.Start(testsvc.Bufconn, n.svc.Register, opts...)
		require.NoError(t, err)
		n.end = end
		t.Cleanup(end.Stop)
	}
	for _, n := range tr.nodes {
		for _, e := range n.children {
			opts := append(interceptor.DialOptions(clientOpts(n.tries, n.strict, n.noMargin, -1)...),
				grpc.WithChainUnaryInterceptor(tr.reporter(e.proxy)))
			to := e.to.end
			if e.proxy {
				to = tr.startProxy(t, e.to)
			}
			conn, err := to.Dial(opts...)
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close() })
			tr.conns = append(tr.conns, conn)
			n.clients = append(n.clients, testingv1.NewTestServiceClient(conn))
		}
	}
}

// startProxy runs a plain gRPC server that forwards each request once to
// node to with a plain client, carrying the tollgate header (and the test's
// signal) but answering without the callee's trailer.
func (tr *ptree) startProxy(t *testing.T, to *pnode) *testsvc.Endpoint {
	t.Helper()
	up, err := to.end.Dial()
	require.NoError(t, err)
	t.Cleanup(func() { _ = up.Close() })
	tr.conns = append(tr.conns, up)
	client := testingv1.NewTestServiceClient(up)
	forward := func(ctx context.Context) error {
		tr.act.add()
		defer tr.act.done()
		out := metadata.MD{}
		for _, k := range []string{header.Key, signalKey} {
			if vs := metadata.ValueFromIncomingContext(ctx, k); len(vs) > 0 {
				out.Set(k, vs...)
			}
		}
		return invoke(metadata.NewOutgoingContext(ctx, out), client, to.method)
	}
	svc := &testsvc.Service{
		GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			return &testingv1.GetResponse{}, forward(ctx)
		},
		PutFunc: func(ctx context.Context, _ *testingv1.PutRequest) (*testingv1.PutResponse, error) {
			return &testingv1.PutResponse{}, forward(ctx)
		},
		ApplyFunc: func(ctx context.Context, _ *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			return &testingv1.ApplyResponse{}, forward(ctx)
		},
		WatchFunc: func(_ *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
			if err := forward(st.Context()); err != nil {
				return err
			}
			return st.Send(&testingv1.WatchResponse{Value: "v"})
		},
		UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
			if _, err := testsvc.DrainUpload(st); err != nil {
				return err
			}
			if err := forward(st.Context()); err != nil {
				return err
			}
			return st.SendAndClose(&testingv1.UploadResponse{Count: 1})
		},
	}
	end, err := testsvc.Start(testsvc.Bufconn, svc.Register, grpc.WaitForHandlers(true))
	require.NoError(t, err)
	t.Cleanup(end.Stop)
	tr.proxies = append(tr.proxies, end)
	return end
}

// clientOpts are the options of a tier's connections; units < 0 for a tier
// below the origin. Without a hop margin a try's deadline is the attempt's d
// itself, so the server's own cap on the handler's deadline is what keeps it
// within d.
func clientOpts(tries int, strict, noMargin bool, units int64) []interceptor.ClientOption {
	opts := []interceptor.ClientOption{
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: tries, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}),
	}
	if noMargin {
		opts = append(opts, interceptor.WithHopMargin(0))
	}
	if strict {
		opts = append(opts, interceptor.WithStrictAccounting())
	}
	if units >= 0 {
		opts = append(opts, interceptor.WithAllowance(units), interceptor.WithAttemptTimeout(time.Minute))
	}
	return opts
}

// counter is node n's outermost server interceptor: it notes the RPC's
// tollgate header and counts the handler as running.
func (tr *ptree) counter(n *pnode) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		tr.act.add()
		defer tr.act.done()
		tr.arrive(ctx, n)
		return handler(ctx, req)
	}
}

// streamCounter is counter for streams.
func (tr *ptree) streamCounter(n *pnode) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		tr.act.add()
		defer tr.act.done()
		tr.arrive(ss.Context(), n)
		return handler(srv, ss)
	}
}

func (tr *ptree) arrive(ctx context.Context, n *pnode) {
	h, err := header.ParseValues(metadata.ValueFromIncomingContext(ctx, header.Key))
	tr.mu.Lock()
	tr.arr = append(tr.arr, arrival{node: n, h: h, err: err})
	var sent chan struct{}
	if sig := metadata.ValueFromIncomingContext(ctx, signalKey); len(sig) == 1 {
		sent = tr.signals[sig[0]]
		delete(tr.signals, sig[0])
	}
	tr.mu.Unlock()
	if sent != nil {
		close(sent)
	}
}

const signalKey = "x-property-signal"

// reporter is the innermost client interceptor of the tiers' connections:
// it sees each try with its tollgate header and notes the tollgate-spent
// the callee answered with (none on an OK answer is 0). Through a proxy,
// which drops the trailer, it notes nothing.
func (tr *ptree) reporter(viaProxy bool) grpc.UnaryClientInterceptor {
	if viaProxy {
		return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
	}
	return tr.report
}

func (tr *ptree) report(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var trailer metadata.MD
	err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Trailer(&trailer))...)
	md, _ := metadata.FromOutgoingContext(ctx)
	h, herr := header.ParseValues(md.Get(header.Key))
	if herr != nil {
		return err
	}
	spent, ok := int64(0), err == nil
	if vs := trailer.Get("tollgate-spent"); len(vs) == 1 {
		if v, perr := strconv.ParseInt(vs[0], 10, 64); perr == nil {
			spent, ok = v, true
		}
	}
	if ok {
		tr.mu.Lock()
		tr.reports[callTry{h.Call, h.Try}] = spent
		tr.mu.Unlock()
	}
	return err
}

var errPropertyRefused = status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Millisecond))

// serve is node n's handler.
func (tr *ptree) serve(ctx context.Context, n *pnode) error {
	r := &prun{node: n}
	r.attempt, r.hasAttempt = interceptor.AttemptFromContext(ctx)
	r.deadline, r.hasDeadline = ctx.Deadline()
	if l, ok := budget.FromContext(ctx); ok {
		r.grant, r.hasLedger = l.Snapshot().Total, true
	}
	tr.mu.Lock()
	tr.runs = append(tr.runs, r)
	tr.mu.Unlock()

	run := n.runs.Add(1)
	refuse := run <= n.refuseRuns
	drop := !refuse && run <= n.refuseRuns+n.dropRuns
	wrap := func(err error) error {
		if n.noEffect {
			return status.WithoutEffect(err)
		}
		return err
	}
	if refuse && !n.refuseLate {
		tr.refusals.Add(1)
		return wrap(errPropertyRefused)
	}
	err := tr.callChildren(ctx, n, r)
	switch {
	case refuse:
		tr.refusals.Add(1)
		return wrap(errPropertyRefused)
	case drop:
		tr.drops.Add(1)
		<-ctx.Done() // the caller gives up first: its call has a short timeout
		return ctx.Err()
	}
	return wrap(err)
}

// callChildren makes the calls of one run of n: detached ones first (so
// they overlap the rest of the run), then the others in order or
// concurrently. It returns the first error of the calls it waited for.
func (tr *ptree) callChildren(ctx context.Context, n *pnode, r *prun) error {
	ctxs := make([]context.Context, len(n.children))
	switch n.split {
	case splitEven:
		copy(ctxs, budget.Split(ctx, len(n.children)))
	case splitGrant:
		for i, e := range n.children {
			ctxs[i] = budget.WithGrant(ctx, e.grant)
		}
	default:
		for i := range ctxs {
			ctxs[i] = ctx
		}
	}
	call := func(ctx context.Context, i int) error {
		e := n.children[i]
		if e.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, e.timeout)
			defer cancel()
		}
		r.issued.Add(1)
		return invoke(ctx, n.clients[i], e.to.method)
	}
	type waiting struct{ sent, done chan struct{} }
	var waits []waiting
	for i, e := range n.children {
		if !e.detached {
			continue
		}
		cctx := ctxs[i]
		if e.withoutCancel {
			cctx = context.WithoutCancel(cctx)
		}
		done := make(chan struct{})
		if e.waitSent {
			w := waiting{sent: make(chan struct{}), done: done}
			tr.mu.Lock()
			tr.nextSig++
			sig := strconv.Itoa(tr.nextSig)
			tr.signals[sig] = w.sent
			tr.mu.Unlock()
			cctx = metadata.AppendToOutgoingContext(cctx, signalKey, sig)
			waits = append(waits, w)
		}
		tr.detached.Add(1)
		tr.act.add()
		go func() {
			defer tr.act.done()
			defer close(done)
			_ = call(cctx, i)
		}()
	}
	defer func() {
		for _, w := range waits {
			select {
			case <-w.sent:
			case <-w.done:
			}
		}
	}()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	note := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	for i, e := range n.children {
		switch {
		case e.detached:
		case n.concurrent:
			wg.Go(func() {
				if err := call(ctxs[i], i); err != nil {
					note(err)
				}
			})
		default:
			if err := call(ctxs[i], i); err != nil {
				note(err)
			}
		}
	}
	wg.Wait()
	return firstErr
}

// invoke calls method on c.
func invoke(ctx context.Context, c testingv1.TestServiceClient, method string) error {
	return chaosInvoke(ctx, c, method, "k")
}

// run plays the attempt and returns once nothing can reach a server any
// more.
func (tr *ptree) run(t *testing.T) (d time.Time, errs []error) {
	t.Helper()
	root := tr.nodes[0]
	conn, err := root.end.Dial(append(interceptor.DialOptions(clientOpts(tr.originTries, tr.originStrict, tr.originNoMargin, tr.units)...),
		grpc.WithChainUnaryInterceptor(tr.reporter(false)))...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	origin := testingv1.NewTestServiceClient(conn)
	if tr.timeout < time.Second {
		// Connect every tier first, so that a short d is spent on the
		// calls rather than on connecting.
		for _, c := range append(tr.conns, conn) {
			c.Connect()
		}
		for _, c := range append(tr.conns, conn) {
			for st := c.GetState(); st != connectivity.Ready; st = c.GetState() {
				require.True(t, c.WaitForStateChange(t.Context(), st), "connecting")
			}
		}
	}

	d = time.Now().Add(tr.timeout)
	ctx, cancel := context.WithDeadline(t.Context(), d)
	defer cancel()
	if tr.originCalls == 0 {
		errs = []error{invoke(ctx, origin, root.method)}
	} else {
		actx, err := interceptor.StartAttempt(ctx, tr.units, time.Minute)
		require.NoError(t, err)
		a, ok := interceptor.AttemptFromContext(actx)
		require.True(t, ok)
		require.True(t, a.Origin)
		require.True(t, a.Deadline.Equal(d), "StartAttempt keeps the caller's earlier deadline")
		errs = make([]error, tr.originCalls)
		var wg sync.WaitGroup
		for i := range errs {
			if tr.originConcurrent {
				wg.Go(func() { errs[i] = invoke(actx, origin, root.method) })
			} else {
				errs[i] = invoke(actx, origin, root.method)
			}
		}
		wg.Wait()
	}
	// Let handlers and detached goroutines finish on their own, then stop
	// every server and wait for its handlers, so that an RPC still on its
	// way (its caller gave up) is either counted or never served.
	tr.act.wait()
	for _, n := range tr.nodes {
		n.end.Stop()
	}
	for _, p := range tr.proxies {
		p.Stop()
	}
	tr.act.wait()
	return d, errs
}

// check asserts the invariants on what the servers saw.
func (tr *ptree) check(t *testing.T, d time.Time) {
	t.Helper()
	tr.mu.Lock()
	arr := append([]arrival(nil), tr.arr...)
	runs := append([]*prun(nil), tr.runs...)
	tr.mu.Unlock()
	root := tr.nodes[0]

	if len(arr) == 0 {
		// d passed before the origin's call reached the root (possible
		// with a short d on a loaded machine): nothing was sent.
		return
	}
	id := arr[0].h.Attempt
	require.NotEmpty(t, id)

	// One identity, one deadline on the wire; (call, try) unique.
	seen := map[callTry]arrival{}
	below := map[int]int{}
	belowRoot := 0
	for _, a := range arr {
		require.NoError(t, a.err, "node #%d: every RPC carries a well-formed tollgate header", a.node.id)
		require.Equal(t, id, a.h.Attempt, "node #%d call %s: one attempt ID everywhere", a.node.id, a.h.Call)
		require.Equal(t, d.UnixMilli(), a.h.Deadline, "node #%d call %s: the attempt's deadline d travels unchanged", a.node.id, a.h.Call)
		k := callTry{a.h.Call, a.h.Try}
		if prev, dup := seen[k]; dup {
			require.Failf(t, "duplicate call key", "call %s try %d reached node #%d and node #%d: (call, try) must be unique within the attempt", a.h.Call, a.h.Try, a.node.id, prev.node.id)
		}
		seen[k] = a
		if a.node == root {
			require.Contains(t, rootKeys(tr.originCalls), a.h.Call, "the origin's calls are keyed 0, 1, …")
			require.LessOrEqual(t, int(a.h.Try), tr.originTries, "the origin's tries stay within its MaxTries")
			continue
		}
		belowRoot++
		below[a.node.id]++
		require.LessOrEqual(t, int(a.h.Try), a.node.parent.tries, "node #%d call %s: tries stay within the owner's MaxTries", a.node.id, a.h.Call)
	}
	require.LessOrEqual(t, int64(belowRoot), tr.units,
		"one allowance: %d RPCs were sent below the origin with an allowance of %d (per node: %v)", belowRoot, tr.units, below)

	// Handler runs: identity, deadline, grant.
	runOf := map[callTry]*prun{}
	for _, r := range runs {
		require.True(t, r.hasAttempt, "node #%d: the handler runs under an attempt", r.node.id)
		a := r.attempt
		require.Equal(t, id, a.ID, "node #%d: one attempt ID everywhere", r.node.id)
		require.False(t, a.Origin, "node #%d call %s: a trusted tier never mints an attempt of its own", r.node.id, a.Call)
		require.True(t, a.Deadline.Equal(time.UnixMilli(d.UnixMilli())), "node #%d call %s: attempt deadline %v, want d %v", r.node.id, a.Call, a.Deadline, d)
		require.True(t, r.hasDeadline, "node #%d call %s: the handler has a deadline", r.node.id, a.Call)
		require.False(t, r.deadline.After(d), "node #%d call %s: handler deadline %v is after d %v (skew 0)", r.node.id, a.Call, r.deadline, d)
		require.False(t, r.deadline.After(a.Deadline), "node #%d call %s: handler deadline %v is after the attempt's %v (skew 0)", r.node.id, a.Call, r.deadline, a.Deadline)
		require.True(t, r.hasLedger, "node #%d call %s: the handler has a ledger", r.node.id, a.Call)
		k := callTry{a.Call, a.Try}
		w, ok := seen[k]
		require.True(t, ok, "node #%d: the run of call %s try %d matches an RPC that reached it", r.node.id, a.Call, a.Try)
		require.Same(t, r.node, w.node)
		require.Equal(t, w.h.Units, r.grant, "node #%d call %s: the ledger holds the units granted", r.node.id, a.Call)
		_, dup := runOf[k]
		require.False(t, dup, "call %s try %d ran twice", a.Call, a.Try)
		runOf[k] = r
	}

	// Call keys below the root hang off the run that made them, and every
	// run's subtree stays within its grant.
	spentUnder := map[*prun]int64{}
	for _, a := range arr {
		if a.node == root {
			continue
		}
		call := a.h.Call
		i := strings.LastIndexByte(call, '.')
		require.Positive(t, i, "node #%d: call key %q is p.T.k", a.node.id, call)
		j := strings.LastIndexByte(call[:i], '.')
		require.Positive(t, j, "node #%d: call key %q is p.T.k", a.node.id, call)
		k, err := strconv.ParseUint(call[i+1:], 10, 32)
		require.NoError(t, err, "node #%d: call key %q ends in the run's call number", a.node.id, call)
		pt, err := strconv.ParseUint(call[j+1:i], 10, 32)
		require.NoError(t, err, "node #%d: call key %q names its parent's try", a.node.id, call)
		parent, ok := runOf[callTry{call[:j], uint32(pt)}]
		require.True(t, ok, "node #%d: call key %q names a handler run that took place", a.node.id, call)
		require.Same(t, a.node.parent, parent.node, "call key %q: made by node #%d's run, received by node #%d", call, parent.node.id, a.node.id)
		require.GreaterOrEqual(t, k, uint64(1))
		require.LessOrEqual(t, k, uint64(parent.issued.Load()), "call key %q: its run made only %d calls", call, parent.issued.Load())
		for p := parent; p != nil; {
			spentUnder[p]++
			pc := p.attempt.Call
			i := strings.LastIndexByte(pc, '.')
			if i < 0 {
				break
			}
			j := strings.LastIndexByte(pc[:i], '.')
			pt, _ := strconv.ParseUint(pc[j+1:i], 10, 32)
			p = runOf[callTry{pc[:j], uint32(pt)}]
		}
	}
	tr.mu.Lock()
	reports := maps.Clone(tr.reports)
	tr.mu.Unlock()
	for r, n := range spentUnder {
		require.LessOrEqual(t, n, r.grant, "node #%d call %s try %d: %d RPCs were sent under a run granted %d units",
			r.node.id, r.attempt.Call, r.attempt.Try, n, r.grant)
		if spent, ok := reports[callTry{r.attempt.Call, r.attempt.Try}]; ok {
			require.LessOrEqual(t, n, spent, "node #%d call %s try %d: %d RPCs were sent under a run that reported spending %d",
				r.node.id, r.attempt.Call, r.attempt.Try, n, spent)
		}
	}
}

func rootKeys(calls int) []string {
	keys := []string{"0"}
	for i := 1; i < calls; i++ {
		keys = append(keys, strconv.Itoa(i))
	}
	return keys
}

type propertyTotals struct {
	trees, nodes, rpcs, full, streams, proxies, refusals, drops, detached int64
	// silent counts the trees that sent nothing below the origin; deepest[k]
	// those whose deepest RPC reached tier k (the root is tier 1).
	silent  int64
	deepest [propertyMaxDepth + 1]int64
}

func TestPropertyCallTrees(t *testing.T) {
	seeds := propertySeeds(t)
	var tot propertyTotals
	start := time.Now()
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			tr := genTree(seed)
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("reproduce: TOLLGATE_PROPERTY_SEED=%d go test -race -run TestPropertyCallTrees ./interceptor/\n%s", seed, tr)
				}
			})
			tr.start(t)
			d, errs := tr.run(t)
			t.Logf("origin: %v", errs)
			tr.check(t, d)

			tot.trees++
			tot.nodes += int64(len(tr.nodes))
			var rpcs int64
			deepest := 0
			for _, a := range tr.arr {
				if a.node != tr.nodes[0] {
					rpcs++
				}
				deepest = max(deepest, a.node.depth)
				if a.node.method == "Watch" || a.node.method == "Upload" {
					tot.streams++
				}
			}
			tot.proxies += int64(len(tr.proxies))
			tot.rpcs += rpcs
			if rpcs == tr.units {
				tot.full++
			}
			if rpcs == 0 {
				tot.silent++
			}
			tot.deepest[deepest]++
			tot.refusals += tr.refusals.Load()
			tot.drops += tr.drops.Load()
			tot.detached += tr.detached.Load()
		})
	}
	t.Logf("%d trees, %d nodes, %d proxies; %d RPCs below the origin (%d streams in all), %d trees spent their whole allowance, %d sent nothing below the origin; deepest tier reached (none, 1–%d): %v; %d refusals, %d drops, %d detached calls; %v",
		tot.trees, tot.nodes, tot.proxies, tot.rpcs, tot.streams, tot.full, tot.silent, propertyMaxDepth, tot.deepest,
		tot.refusals, tot.drops, tot.detached, time.Since(start).Round(time.Millisecond))
}

// TestClientStreamingCallSettlesItsGrant: a client-streaming call ended by
// CloseAndRecv (one RecvMsg that returns the response and nil) settles its
// grant, so the next call of the attempt is lent all the units again. The
// property test found this bug; it is fixed in clientStream.RecvMsg.
func TestClientStreamingCallSettlesItsGrant(t *testing.T) {
	var (
		mu     sync.Mutex
		grants []int64
	)
	svc := &testsvc.Service{
		UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
			n, err := testsvc.DrainUpload(st)
			if err != nil {
				return err
			}
			return st.SendAndClose(&testingv1.UploadResponse{Count: n}) // spends nothing
		},
		GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
			l, _ := budget.FromContext(ctx)
			mu.Lock()
			grants = append(grants, l.Snapshot().Total)
			mu.Unlock()
			return &testingv1.GetResponse{}, nil
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts()...)
	client := testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions()...))
	ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
	require.NoError(t, err)

	st, err := client.Upload(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&testingv1.UploadRequest{Value: "v"}))
	_, err = st.CloseAndRecv()
	require.NoError(t, err)

	_, err = client.Get(ctx, &testingv1.GetRequest{})
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int64{4}, grants, "the upload spent nothing and ended OK, so the next call of the attempt is lent all 4 units again")
}
