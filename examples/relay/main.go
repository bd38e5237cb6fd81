// Command relay runs seed 000's cross-layer retry construction for real: a
// client, a frontend and a dependency, each a gRPC process role on loopback
// TCP, where the dependency refuses every call: RESOURCE_EXHAUSTED in the
// plain gRPC run, NOT_ADMITTED QUEUE_FULL with tollgate.
//
// It runs the construction twice. With independent local caps (plain gRPC,
// each layer repeating on its own), the origin's tries multiply with the
// frontend's: 3 tries × 2 calls per try = 6 calls reach the dependency. With
// tollgate, the same retry policies share the attempt's allowance of units:
// the dependency receives 4 calls, and the origin's third try is refused
// locally with NOT_ADMITTED ALLOWANCE_EXHAUSTED, final.
//
// Every number printed is counted by the servers and clients as they ran.
//
// The example is self-contained, as examples/quickstart is: its two services
// are its own (proto/relay/v1: FrontendService.Lookup and
// DependencyService.Fetch, both declared NO_SIDE_EFFECTS), its servers are
// plain grpc.Servers on loopback ports, and it imports only tollgate's
// public packages, so a copy of it builds outside this module.
//
//	go run ./examples/relay [-tries 3] [-calls-per-try 2] [-allowance 4] [-attempt-timeout 10s] [-backoff 1ms] [-json]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	relayv1 "github.com/tollgate-go/tollgate/examples/relay/proto/relay/v1"
	"github.com/tollgate-go/tollgate/interceptor"
	"github.com/tollgate-go/tollgate/status"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
)

type config struct {
	Tries       int
	CallsPerTry int
	Allowance   int64
	// AttemptTimeout bounds the origin's call, all its tries included (the
	// attempt's deadline with tollgate, the call's context in the plain run).
	AttemptTimeout time.Duration
	// Backoff is the wait between tries at both layers with tollgate, and
	// the pushback the dependency's refusals suggest.
	Backoff time.Duration
}

// MarshalJSON writes durations as Go duration strings ("10s").
func (c config) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]any{
		"tries": c.Tries, "calls_per_try": c.CallsPerTry, "allowance": c.Allowance,
		"attempt_timeout": c.AttemptTimeout.String(), "backoff": c.Backoff.String(),
	})
}

type result struct {
	Config                   config            `json:"config"`
	NaiveDependencyCalls     int64             `json:"naive_dependency_calls"`
	NaiveFrontendCalls       int64             `json:"naive_frontend_calls"`
	TollgateDependencyCalls  int64             `json:"tollgate_dependency_calls"`
	TollgateFrontendCalls    int64             `json:"tollgate_frontend_calls"`
	TollgateRefusedAllowance int64             `json:"tollgate_refused_allowance"`
	TollgateOutcome          string            `json:"tollgate_outcome"`
	TollgateReason           string            `json:"tollgate_reason"`
	TollgateFinal            bool              `json:"tollgate_final"`
	TollgateAttemptIDs       map[string]string `json:"tollgate_attempt_ids"`
}

func main() {
	var cfg config
	flag.IntVar(&cfg.Tries, "tries", 3, "tries the origin client may make (first included)")
	flag.IntVar(&cfg.CallsPerTry, "calls-per-try", 2, "calls the frontend may make to the dependency per origin try (first included)")
	flag.Int64Var(&cfg.Allowance, "allowance", 4, "units the attempt's allowance lets all layers below the origin spend")
	flag.DurationVar(&cfg.AttemptTimeout, "attempt-timeout", 10*time.Second, "bound on the origin's call, all its tries included (both runs)")
	flag.DurationVar(&cfg.Backoff, "backoff", time.Millisecond, "with tollgate: wait between tries at both layers, and the dependency's suggested pushback")
	asJSON := flag.Bool("json", false, "print the result as JSON")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "relay: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	res, err := run(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(1)
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(res)
		return
	}
	report(os.Stdout, res)
}

func report(w io.Writer, r *result) {
	c := r.Config
	fmt.Fprintf(w, "relay: client → frontend → dependency over loopback TCP; the dependency refuses every call (plain gRPC: RESOURCE_EXHAUSTED; tollgate: NOT_ADMITTED QUEUE_FULL)\n")
	fmt.Fprintf(w, "configured: origin tries=%d, frontend calls per try=%d, allowance=%d units, attempt timeout=%v, backoff=%v (tollgate; also the dependency's pushback)\n\n",
		c.Tries, c.CallsPerTry, c.Allowance, c.AttemptTimeout, c.Backoff)
	fmt.Fprintf(w, "independent local caps: the frontend received %d calls, the dependency %d\n", r.NaiveFrontendCalls, r.NaiveDependencyCalls)
	fmt.Fprintf(w, "tollgate, one shared allowance: the frontend received %d calls, the dependency %d\n", r.TollgateFrontendCalls, r.TollgateDependencyCalls)
	final := "not final"
	if r.TollgateFinal {
		final = "final"
	}
	fmt.Fprintf(w, "  the origin's call ended %s %s (%s); calls refused locally for lack of units: %d\n",
		r.TollgateOutcome, r.TollgateReason, final, r.TollgateRefusedAllowance)
	seen := func(tier string) string {
		if id := r.TollgateAttemptIDs[tier]; id != "" {
			return id
		}
		return "(none: it received no call)"
	}
	fmt.Fprintf(w, "  attempt ID seen by origin=%s frontend=%s dependency=%s\n", seen("origin"), seen("frontend"), seen("dependency"))
}

func run(ctx context.Context, cfg config) (*result, error) {
	if cfg.Tries < 1 || cfg.Tries > interceptor.MaxTriesCap || cfg.CallsPerTry < 1 || cfg.CallsPerTry > interceptor.MaxTriesCap || cfg.Allowance < 0 {
		return nil, fmt.Errorf("tries and calls-per-try must be in [1, %d], allowance ≥ 0", interceptor.MaxTriesCap)
	}
	if cfg.AttemptTimeout <= 0 || cfg.Backoff <= 0 {
		return nil, errors.New("attempt timeout and backoff must be positive")
	}
	// The interceptor's own bounds (allowance, attempt timeout, backoff),
	// checked before anything runs.
	for _, opts := range [][]interceptor.ClientOption{cfg.frontOptions(), cfg.originOptions()} {
		if _, err := interceptor.NewDialOptions(opts...); err != nil {
			return nil, err
		}
	}
	res := &result{Config: cfg}
	var err error
	if res.NaiveFrontendCalls, res.NaiveDependencyCalls, err = runNaive(ctx, cfg); err != nil {
		return nil, err
	}
	if err := runTollgate(ctx, cfg, res); err != nil {
		return nil, err
	}
	return res, nil
}

// dependency is the DependencyService: it counts the calls that reach its
// handler and answers each with fetch.
type dependency struct {
	relayv1.UnimplementedDependencyServiceServer
	calls atomic.Int64
	fetch func(context.Context, *relayv1.FetchRequest) (*relayv1.FetchResponse, error)
}

func (d *dependency) Fetch(ctx context.Context, r *relayv1.FetchRequest) (*relayv1.FetchResponse, error) {
	d.calls.Add(1)
	return d.fetch(ctx, r)
}

// frontend is the FrontendService: it counts the calls that reach its
// handler and answers each with lookup, which calls the dependency.
type frontend struct {
	relayv1.UnimplementedFrontendServiceServer
	calls  atomic.Int64
	lookup func(context.Context, *relayv1.LookupRequest) (*relayv1.LookupResponse, error)
}

func (f *frontend) Lookup(ctx context.Context, r *relayv1.LookupRequest) (*relayv1.LookupResponse, error) {
	f.calls.Add(1)
	return f.lookup(ctx, r)
}

// fetch is the frontend's call to the dependency for one lookup.
func fetch(ctx context.Context, dep relayv1.DependencyServiceClient, r *relayv1.LookupRequest) (*relayv1.LookupResponse, error) {
	resp, err := dep.Fetch(ctx, &relayv1.FetchRequest{Key: r.GetKey()})
	if err != nil {
		return nil, err
	}
	return &relayv1.LookupResponse{Value: resp.GetValue()}, nil
}

// server is one tier's gRPC server, serving on a loopback TCP port of its
// own until stop.
type server struct {
	srv  *grpc.Server
	addr string
	done chan struct{}
}

// serve starts a gRPC server with opts on a loopback port, with the
// services register registers.
func serve(register func(*grpc.Server), opts ...grpc.ServerOption) (*server, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &server{srv: grpc.NewServer(opts...), addr: lis.Addr().String(), done: make(chan struct{})}
	register(s.srv)
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(lis)
	}()
	return s, nil
}

// dial is a client connection to the server, without transport security
// (it is on loopback), with opts.
func (s *server) dial(opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return grpc.NewClient(s.addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
}

// stop closes the server's connections and listener and waits for Serve to
// return.
func (s *server) stop() {
	s.srv.Stop()
	<-s.done
}

// runNaive is the construction with independent local caps: plain gRPC, the
// frontend and the origin each repeat a refused call up to their own limit.
func runNaive(ctx context.Context, cfg config) (frontendCalls, dependencyCalls int64, err error) {
	dep := &dependency{fetch: func(context.Context, *relayv1.FetchRequest) (*relayv1.FetchResponse, error) {
		return nil, grpcstatus.Error(codes.ResourceExhausted, "dependency: queue full")
	}}
	depSrv, err := serve(func(s *grpc.Server) { relayv1.RegisterDependencyServiceServer(s, dep) })
	if err != nil {
		return 0, 0, err
	}
	defer depSrv.stop()
	depConn, err := depSrv.dial(grpc.WithDisableRetry())
	if err != nil {
		return 0, 0, err
	}
	defer depConn.Close()
	depClient := relayv1.NewDependencyServiceClient(depConn)
	front := &frontend{lookup: func(ctx context.Context, r *relayv1.LookupRequest) (*relayv1.LookupResponse, error) {
		return repeatPlain(cfg.CallsPerTry, func() (*relayv1.LookupResponse, error) { return fetch(ctx, depClient, r) })
	}}
	frontSrv, err := serve(func(s *grpc.Server) { relayv1.RegisterFrontendServiceServer(s, front) })
	if err != nil {
		return 0, 0, err
	}
	defer frontSrv.stop()
	conn, err := frontSrv.dial(grpc.WithDisableRetry())
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	client := relayv1.NewFrontendServiceClient(conn)
	cctx, cancel := context.WithTimeout(ctx, cfg.AttemptTimeout)
	defer cancel()
	_, _ = repeatPlain(cfg.Tries, func() (*relayv1.LookupResponse, error) {
		return client.Lookup(cctx, &relayv1.LookupRequest{Key: "k"})
	})
	return front.calls.Load(), dep.calls.Load(), nil
}

// repeatPlain repeats f while it is refused with RESOURCE_EXHAUSTED, up to
// tries times: a local cap that knows nothing of the layers around it.
func repeatPlain[Resp any](tries int, f func() (*Resp, error)) (*Resp, error) {
	var err error
	for range tries {
		var resp *Resp
		if resp, err = f(); grpcstatus.Code(err) != codes.ResourceExhausted {
			return resp, err
		}
	}
	return nil, err
}

// ids records the attempt ID each tier saw.
type ids struct {
	mu   sync.Mutex
	seen map[string]string
	odd  atomic.Int64 // a tier that saw a second, different ID
}

func (s *ids) note(ctx context.Context, tier string) {
	a, ok := interceptor.AttemptFromContext(ctx)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev, ok := s.seen[tier]; ok && prev != a.ID {
		s.odd.Add(1)
	}
	s.seen[tier] = a.ID
}

// frontOptions are the frontend's client options with tollgate: up to
// CallsPerTry tries of each call, Backoff apart.
func (cfg config) frontOptions() []interceptor.ClientOption {
	p := interceptor.RetryPolicy{MaxTries: cfg.CallsPerTry, InitialBackoff: cfg.Backoff, MaxBackoff: cfg.Backoff}
	return []interceptor.ClientOption{interceptor.WithRetry(p)}
}

// originOptions are the origin client's options with tollgate: the
// attempt's allowance and timeout, up to Tries tries, Backoff apart.
func (cfg config) originOptions() []interceptor.ClientOption {
	p := interceptor.RetryPolicy{MaxTries: cfg.Tries, InitialBackoff: cfg.Backoff, MaxBackoff: cfg.Backoff}
	return []interceptor.ClientOption{
		interceptor.WithAllowance(cfg.Allowance),
		interceptor.WithAttemptTimeout(cfg.AttemptTimeout),
		interceptor.WithRetry(p),
	}
}

// runTollgate is the same construction with tollgate on every edge: the same
// retry policies, one attempt, one allowance.
func runTollgate(ctx context.Context, cfg config, res *result) error {
	reader := sdkmetric.NewManualReader()
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer meters.Shutdown(context.Background())
	seen := &ids{seen: map[string]string{}}

	dep := &dependency{fetch: func(ctx context.Context, _ *relayv1.FetchRequest) (*relayv1.FetchResponse, error) {
		seen.note(ctx, "dependency")
		return nil, status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(cfg.Backoff))
	}}
	serverOpts := []interceptor.ServerOption{interceptor.WithTrustedPeer(interceptor.TrustLoopback), interceptor.WithServerMeterProvider(meters)}
	depSrv, err := serve(func(s *grpc.Server) { relayv1.RegisterDependencyServiceServer(s, dep) }, interceptor.ServerOptions(serverOpts...)...)
	if err != nil {
		return err
	}
	defer depSrv.stop()
	depDial, err := interceptor.NewDialOptions(append(cfg.frontOptions(), interceptor.WithClientMeterProvider(meters))...)
	if err != nil {
		return err
	}
	depConn, err := depSrv.dial(depDial...)
	if err != nil {
		return err
	}
	defer depConn.Close()
	depClient := relayv1.NewDependencyServiceClient(depConn)
	// The frontend's Lookup is declared NO_SIDE_EFFECTS, so the dependency's
	// refusals reach the origin as NOT_ADMITTED.
	front := &frontend{lookup: func(ctx context.Context, r *relayv1.LookupRequest) (*relayv1.LookupResponse, error) {
		seen.note(ctx, "frontend")
		return fetch(ctx, depClient, r)
	}}
	frontSrv, err := serve(func(s *grpc.Server) { relayv1.RegisterFrontendServiceServer(s, front) }, interceptor.ServerOptions(serverOpts...)...)
	if err != nil {
		return err
	}
	defer frontSrv.stop()
	originDial, err := interceptor.NewDialOptions(append(cfg.originOptions(), interceptor.WithClientMeterProvider(meters))...)
	if err != nil {
		return err
	}
	conn, err := frontSrv.dial(originDial...)
	if err != nil {
		return err
	}
	defer conn.Close()
	_, callErr := relayv1.NewFrontendServiceClient(conn).Lookup(ctx, &relayv1.LookupRequest{Key: "k"})

	o := status.OutcomeOf(callErr)
	res.TollgateOutcome = o.Kind.String()
	res.TollgateReason = status.ReasonName(o.Reason)
	res.TollgateFinal = o.Final()
	res.TollgateFrontendCalls = front.calls.Load()
	res.TollgateDependencyCalls = dep.calls.Load()
	seen.mu.Lock()
	res.TollgateAttemptIDs = map[string]string{"origin": o.Detail.GetAttemptId()}
	for tier, id := range seen.seen {
		res.TollgateAttemptIDs[tier] = id
	}
	seen.mu.Unlock()
	if seen.odd.Load() > 0 {
		return errors.New("a tier saw more than one attempt ID")
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return err
	}
	res.TollgateRefusedAllowance = sumCounter(rm, "tollgate.allowance.exhausted")
	return nil
}

func sumCounter(rm metricdata.ResourceMetrics, name string) int64 {
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, dp := range sum.DataPoints {
					n += dp.Value
				}
			}
		}
	}
	return n
}
