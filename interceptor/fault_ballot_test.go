package interceptor_test

import (
	"context"
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

// Explicit keys as ballots under concurrent re-runs: the origin
// calls an IDEMPOTENT Put on a frontend that keeps no records (so the origin
// repeats it without a query, while earlier runs may still be running); every
// run calls the dependency's Apply under the same explicit key. The
// dependency keeps records and suffers drops, slowness and refusals. Its
// effect must run at most once per (attempt, key) across all runs, and
// a Put answered OK means the dependency's effect ran.
func runFaultBallot(t *testing.T, seed uint64, calls int) {
	t.Logf("seed %d (TOLLGATE_FAULT_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0x62616c6c))
	ctx := t.Context()
	var act activity
	act.cond.L = &act.mu
	var effMu sync.Mutex
	eff := map[string]int{}
	var drops, runs atomic.Int64
	fault := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		act.add()
		defer act.done()
		h, _ := header.ParseValues(metadata.ValueFromIncomingContext(ctx, header.Key))
		r := h64(seed, "dep", info.FullMethod, h.Attempt, h.Call, strconv.Itoa(int(h.Try)))
		if r%1000 < 100 {
			drops.Add(1)
			return nil, grpcstatus.Error(codes.Unavailable, "fault: dropped before")
		}
		resp, err := handler(ctx, req)
		if (r>>10)%1000 < 150 {
			drops.Add(1)
			return nil, grpcstatus.Error(codes.Unavailable, "fault: dropped after")
		}
		return resp, err
	}
	depApply := func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		a, _ := interceptor.AttemptFromContext(ctx)
		p := h64(seed, "dep-h", a.ID, a.Call, strconv.Itoa(int(a.Try)))
		if p%10 == 0 {
			return nil, status.WithoutEffect(status.NotAdmitted(status.ReasonShed))
		}
		effMu.Lock()
		eff[a.ID+"/"+a.Call]++
		effMu.Unlock()
		if (p>>4)%3 == 0 {
			tm := time.NewTimer(time.Duration((p>>8)%60) * time.Millisecond)
			select {
			case <-tm.C:
			case <-ctx.Done():
			}
			tm.Stop()
		}
		return &testingv1.ApplyResponse{Total: 1}, nil
	}
	depStore := memoryStore(t)
	depSrv := &faultServer{t: t, seed: seed ^ 0x1234, store: depStore}
	depSrv.opts = append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(fault)}, serverOpts(interceptor.WithAttemptStore(depStore))...)
	depSrv.register = func(s *grpc.Server) {
		testingv1.RegisterTestServiceServer(s, &faultApply{f: depApply})
		tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(depStore))
	}
	depSrv.start()
	fast := grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.2, MaxDelay: 30 * time.Millisecond}, MinConnectTimeout: 200 * time.Millisecond})
	depConn, err := grpc.NewClient(depSrv.addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), fast},
		interceptor.DialOptions(interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 1 + rng.IntN(3), PerTryTimeout: time.Duration(10+rng.IntN(40)) * time.Millisecond,
			InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}), interceptor.WithoutRetryBudget(),
			interceptor.WithResolutionGrace(200*time.Millisecond))...)...)
	require.NoError(t, err)
	defer depConn.Close()
	dep := testingv1.NewTestServiceClient(depConn)
	putFn := func(ctx context.Context, r *testingv1.PutRequest) (*testingv1.PutResponse, error) {
		act.add()
		defer act.done()
		runs.Add(1)
		_, err := dep.Apply(interceptor.WithCallKey(ctx, "charge"), &testingv1.ApplyRequest{Key: r.GetKey(), Amount: 1})
		if err != nil {
			return nil, err
		}
		return &testingv1.PutResponse{Value: "ok"}, nil
	}
	frontSrv := &faultServer{t: t, seed: seed ^ 0x5678}
	frontSrv.opts = serverOpts() // no store, no AttemptService: recordless
	frontSrv.register = func(s *grpc.Server) { testingv1.RegisterTestServiceServer(s, &faultPut{f: putFn}) }
	frontSrv.start()
	frontConn, err := grpc.NewClient(frontSrv.addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), fast},
		interceptor.DialOptions(interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 2 + rng.IntN(3), PerTryTimeout: time.Duration(5+rng.IntN(30)) * time.Millisecond,
			InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}), interceptor.WithoutRetryBudget())...)...)
	require.NoError(t, err)
	defer frontConn.Close()
	origin := testingv1.NewTestServiceClient(frontConn)

	ids := make([]string, calls)
	outs := make([]error, calls)
	units := make([]int64, calls)
	for i := range units {
		units[i] = int64(2 + rng.IntN(12))
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= calls {
					return
				}
				actx, err := interceptor.StartAttempt(ctx, units[i], time.Duration(150+i%5*100)*time.Millisecond)
				require.NoError(t, err)
				a, _ := interceptor.AttemptFromContext(actx)
				ids[i] = a.ID
				_, outs[i] = origin.Put(actx, &testingv1.PutRequest{Key: "k" + strconv.Itoa(i)})
			}
		})
	}
	wg.Wait()
	act.wait()
	depSrv.stop()
	frontSrv.stop()
	kinds := map[string]int{}
	effMu.Lock()
	defer effMu.Unlock()
	for k, n := range eff {
		require.LessOrEqual(t, n, 1, "seed %d: the dependency's effect ran %d times under %s", seed, n, k)
	}
	for i, err := range outs {
		o := status.OutcomeOf(err)
		kinds[o.Kind.String()+"/"+status.ReasonName(o.Reason)]++
		n := eff[ids[i]+"/0.charge"]
		switch o.Kind {
		case status.KindOK:
			require.Equal(t, 1, n, "seed %d call %d: Put OK, dependency effect %d", seed, i, n)
		case status.KindNotAdmitted:
			require.Zero(t, n, "seed %d call %d: NOT_ADMITTED, dependency effect %d: %v", seed, i, n, err)
		}
	}
	if len(outs) > 0 && outs[0] != nil {
		t.Logf("first error: %v", outs[0])
	}
	t.Logf("seed %d: %d calls, %d frontend runs, %d drops; outcomes %v", seed, calls, runs.Load(), drops.Load(), kinds)
}

type faultPut struct {
	testingv1.UnimplementedTestServiceServer
	f func(context.Context, *testingv1.PutRequest) (*testingv1.PutResponse, error)
}

func (s *faultPut) Put(ctx context.Context, r *testingv1.PutRequest) (*testingv1.PutResponse, error) {
	return s.f(ctx, r)
}

func TestFaultsExplicitKeyBallots(t *testing.T) {
	for _, seed := range faultSeeds(t, 4) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) { runFaultBallot(t, seed, 100) })
	}
}
