package interceptor_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
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

// Three tiers over loopback TCP with faults: origin → frontend →
// dependency, repeats at the origin and in the frontend, random refusals,
// drops (after commit and before the handler), slow handlers, flaky
// connections, cancellations, restarts of the dependency. Invariant 3: the
// RPCs that reach the dependency for one attempt never exceed its allowance.

type faultTier struct {
	mu       sync.Mutex
	arrivals map[string]int // attempt → RPCs that reached this server (data methods)
}

func (tr *faultTier) note(ctx context.Context) {
	h, err := header.ParseValues(metadata.ValueFromIncomingContext(ctx, header.Key))
	if err != nil {
		return
	}
	tr.mu.Lock()
	if tr.arrivals == nil {
		tr.arrivals = map[string]int{}
	}
	tr.arrivals[h.Attempt]++
	tr.mu.Unlock()
}

func runFaultChain(t *testing.T, seed uint64, calls int) {
	t.Logf("seed %d (TOLLGATE_FAULT_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0x33746965))
	ctx := t.Context()
	var act activity
	act.cond.L = &act.mu
	var dep, front faultTier
	var drops, refusals, stops, sent atomic.Int64

	counter := func(tier *faultTier) grpc.UnaryServerInterceptor {
		return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			act.add()
			defer act.done()
			if info.FullMethod != "/tollgate.v1.AttemptService/FenceAttempt" && info.FullMethod != "/tollgate.v1.AttemptService/GetAttempt" {
				tier.note(ctx)
			}
			return handler(ctx, req)
		}
	}
	fault := func(name string) grpc.UnaryServerInterceptor {
		return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			h, _ := header.ParseValues(metadata.ValueFromIncomingContext(ctx, header.Key))
			r := h64(seed, name, info.FullMethod, h.Attempt, h.Call, strconv.Itoa(int(h.Try)))
			if r%1000 < 60 {
				drops.Add(1)
				return nil, grpcstatus.Error(codes.Unavailable, "fault: dropped before")
			}
			resp, err := handler(ctx, req)
			if (r>>10)%1000 < 120 {
				drops.Add(1)
				return nil, grpcstatus.Error(codes.Unavailable, "fault: dropped after")
			}
			return resp, err
		}
	}
	handlerPlan := func(name string, ctx context.Context) uint64 {
		a, _ := interceptor.AttemptFromContext(ctx)
		return h64(seed, name+"-handler", a.ID, a.Call, strconv.Itoa(int(a.Try)))
	}
	slow := func(ctx context.Context, r uint64) {
		if r%4 != 0 {
			return
		}
		tm := time.NewTimer(time.Duration((r>>4)%80) * time.Millisecond)
		defer tm.Stop()
		select {
		case <-tm.C:
		case <-ctx.Done():
		}
	}
	var effMu sync.Mutex
	depEff := map[string]int{}    // attempt/call → effects
	depEffByA := map[string]int{} // attempt → effects
	depApply := func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		p := handlerPlan("dep", ctx)
		if p%12 == 0 {
			refusals.Add(1)
			return nil, status.WithoutEffect(status.NotAdmitted(status.ReasonShed))
		}
		a, _ := interceptor.AttemptFromContext(ctx)
		effMu.Lock()
		depEff[a.ID+"/"+a.Call]++
		depEffByA[a.ID]++
		effMu.Unlock()
		switch p % 12 {
		case 1:
			refusals.Add(1)
			return nil, status.NotAdmitted(status.ReasonConcurrencyFull)
		}
		slow(ctx, p>>8)
		return &testingv1.ApplyResponse{Total: 1}, nil
	}
	depStore := memoryStore(t)
	depSrv := &faultServer{t: t, seed: seed ^ 0xdead, store: depStore}
	depSrv.opts = append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(counter(&dep), fault("dep")), grpc.WaitForHandlers(false)},
		serverOpts(interceptor.WithAttemptStore(depStore))...)
	depSrv.register = func(s *grpc.Server) {
		testingv1.RegisterTestServiceServer(s, &faultApply{f: depApply})
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(depStore))
	}
	depSrv.start()

	fastBackoff := grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.2, MaxDelay: 30 * time.Millisecond}, MinConnectTimeout: 200 * time.Millisecond})
	frontTries := 1 + rng.IntN(3)
	frontStrict := rng.IntN(2) == 0
	frontPerTry := time.Duration(rng.IntN(3)*20) * time.Millisecond
	fopts := []interceptor.ClientOption{interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: frontTries, PerTryTimeout: frontPerTry,
		InitialBackoff: 2 * time.Millisecond, MaxBackoff: 10 * time.Millisecond}), interceptor.WithoutRetryBudget(),
		interceptor.WithResolutionGrace(200 * time.Millisecond)}
	if frontStrict {
		fopts = append(fopts, interceptor.WithStrictAccounting())
	}
	depConn, err := grpc.NewClient(depSrv.addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), fastBackoff},
		interceptor.DialOptions(fopts...)...)...)
	require.NoError(t, err)
	defer depConn.Close()
	depClient := testingv1.NewTestServiceClient(depConn)

	frontApply := func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		p := handlerPlan("front", ctx)
		if p%10 == 0 {
			refusals.Add(1)
			return nil, status.WithoutEffect(status.NotAdmitted(status.ReasonShed))
		}
		n := 1 + int((p>>4)%2)
		conc := (p>>6)%2 == 0
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			sent.Add(1)
			if conc {
				wg.Go(func() { _, errs[i] = depClient.Apply(ctx, &testingv1.ApplyRequest{Key: "d", Amount: int64(i)}) })
			} else {
				_, errs[i] = depClient.Apply(ctx, &testingv1.ApplyRequest{Key: "d", Amount: int64(i)})
			}
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return nil, err
			}
		}
		if (p>>8)%8 == 0 {
			refusals.Add(1)
			return nil, status.NotAdmitted(status.ReasonShed) // after its calls: UNKNOWN
		}
		return &testingv1.ApplyResponse{Total: 1}, nil
	}
	frontStore := memoryStore(t)
	frontRecorded := rng.IntN(2) == 0
	fsopts := []interceptor.ServerOption{}
	if frontRecorded {
		fsopts = append(fsopts, interceptor.WithAttemptStore(frontStore))
	}
	frontSrv := &faultServer{t: t, seed: seed ^ 0xbeef, store: frontStore}
	frontSrv.opts = append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(counter(&front), fault("front"))}, serverOpts(fsopts...)...)
	frontSrv.register = func(s *grpc.Server) {
		testingv1.RegisterTestServiceServer(s, &faultApply{f: frontApply})
		if frontRecorded {
			tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(frontStore))
		}
	}
	frontSrv.start()

	originTries := 1 + rng.IntN(3)
	originStrict := rng.IntN(2) == 0
	oopts := []interceptor.ClientOption{interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: originTries,
		PerTryTimeout:  time.Duration(rng.IntN(3)*40) * time.Millisecond,
		InitialBackoff: 2 * time.Millisecond, MaxBackoff: 10 * time.Millisecond}), interceptor.WithoutRetryBudget(),
		interceptor.WithResolutionGrace(200 * time.Millisecond)}
	if originStrict {
		oopts = append(oopts, interceptor.WithStrictAccounting())
	}
	frontConn, err := grpc.NewClient(frontSrv.addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), fastBackoff},
		interceptor.DialOptions(oopts...)...)...)
	require.NoError(t, err)
	defer frontConn.Close()
	origin := testingv1.NewTestServiceClient(frontConn)
	t.Logf("origin tries %d strict %v; front tries %d strict %v perTry %v recorded %v",
		originTries, originStrict, frontTries, frontStrict, frontPerTry, frontRecorded)

	type plan struct {
		units   int64
		timeout time.Duration
		cancel  time.Duration
	}
	plans := make([]plan, calls)
	for i := range plans {
		plans[i] = plan{units: int64(rng.IntN(7)), timeout: time.Duration(80+rng.IntN(600)) * time.Millisecond}
		if rng.IntN(5) == 0 {
			plans[i].cancel = time.Duration(rng.IntN(150)) * time.Millisecond
		}
	}
	gaps := make([]time.Duration, 32)
	for i := range gaps {
		gaps[i] = time.Duration(50+rng.IntN(300)) * time.Millisecond
	}
	restart := seed%2 == 0
	stopR := make(chan struct{})
	var rwg sync.WaitGroup
	if restart {
		rwg.Go(func() {
			for i := 0; ; i++ {
				tm := time.NewTimer(gaps[i%len(gaps)])
				select {
				case <-stopR:
					tm.Stop()
					return
				case <-tm.C:
				}
				depSrv.stop()
				stops.Add(1)
				depSrv.start()
			}
		})
	}
	ids := make([]string, calls)
	outs := make([]error, calls)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= calls {
					return
				}
				p := plans[i]
				cctx, cancel := context.WithCancel(ctx)
				actx, err := interceptor.StartAttempt(cctx, p.units, p.timeout)
				require.NoError(t, err)
				a, _ := interceptor.AttemptFromContext(actx)
				ids[i] = a.ID
				var tm *time.Timer
				if p.cancel > 0 {
					tm = time.AfterFunc(p.cancel, cancel)
				}
				_, outs[i] = origin.Apply(actx, &testingv1.ApplyRequest{Key: "f", Amount: 1})
				if tm != nil {
					tm.Stop()
				}
				cancel()
			}
		})
	}
	wg.Wait()
	close(stopR)
	rwg.Wait()
	act.wait()
	depSrv.stop()
	frontSrv.stop()
	act.wait()

	for k, n := range depEff {
		require.LessOrEqual(t, n, 1, "seed %d: dependency effect ran %d times for %s", seed, n, k)
	}
	kinds := map[string]int{}
	total := 0
	for i, p := range plans {
		dep.mu.Lock()
		n := dep.arrivals[ids[i]]
		dep.mu.Unlock()
		total += n
		o := status.OutcomeOf(outs[i])
		kinds[o.Kind.String()+"/"+status.ReasonName(o.Reason)]++
		effMu.Lock()
		ne := depEffByA[ids[i]]
		effMu.Unlock()
		if o.Kind == status.KindNotAdmitted {
			require.Zero(t, ne, "seed %d call %d: NOT_ADMITTED at the origin, but the dependency's effect ran %d times: %v", seed, i, ne, outs[i])
		}
		require.LessOrEqual(t, int64(n), p.units, "seed %d call %d (units %d, timeout %v, cancel %v): the dependency saw %d RPCs; outcome %v",
			seed, i, p.units, p.timeout, p.cancel, n, outs[i])
	}
	t.Logf("seed %d: %d calls, %d dependency RPCs, %d front→dep calls started, drops %d refusals %d restarts %d conns closed %d; outcomes %v",
		seed, calls, total, sent.Load(), drops.Load(), refusals.Load(), stops.Load(), depSrv.closed.Load()+frontSrv.closed.Load(), kinds)
	_ = fmt.Sprint
}

func TestFaultsChainAllowance(t *testing.T) {
	for _, seed := range faultSeeds(t, 6) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) { runFaultChain(t, seed, 120) })
	}
}
