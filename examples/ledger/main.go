// Command ledger runs a state-changing service — a ledger whose Apply adds an
// amount to an account's balance — over loopback TCP behind tollgate, injects
// the faults that make a client unsure whether its change took place, and
// counts, on the ledger's side, how often each intended change really ran.
//
// The ledger's state (balances and an effect log keyed by the attempt and the
// call that made each change, so that a duplicate is visible) belongs to this
// process, not to the gRPC server: "restarting the server" stops the
// grpc.Server and starts a new one with a new record store, and the balances
// survive. The client is an origin with tollgate's DialOptions; the server
// runs tollgate's ServerOptions with a record store and registers the
// AttemptService. Each scenario is its own run with fresh attempts:
//
//  1. dropped-response: the ledger commits, then the response is lost
//     (UNAVAILABLE instead of the answer); the owner fences the try and
//     returns the stored response.
//  2. timeout-after-commit: the ledger commits and stays busy until the
//     client, past its per-try timeout, asks about the try (so the order does
//     not depend on timing); the owner fences, polls while IN_PROGRESS and
//     returns the stored response.
//  3. restart-memory: the ledger commits and hangs; a new server with a NEW
//     memory store binds the same address, then the old one dies (its
//     connection resets, its handler never answers). The client asks the
//     new server, whose store's horizon began after the attempt was minted,
//     so it cannot vouch: the call ends UNKNOWN with its attempt ID and is
//     never run again.
//  4. restart-redis: the same with the Redis store (TOLLGATE_REDIS_ADDR): the
//     record survives the restart, reads IN_PROGRESS until its lease runs
//     out, then ABANDONED: UNKNOWN with the attempt ID, never run twice.
//  5. unknown-second-call (seed 000's second adverse history): an origin
//     attempt with 4 units calls a frontend whose handler makes two Apply
//     calls to the ledger; the second one's response is lost and its state
//     cannot be queried. The attempt stops UNKNOWN with units still free, and
//     the program reports them.
//
// Every number printed is counted by the servers and clients as they ran.
//
// The example is self-contained, as examples/quickstart is: its service is
// its own (proto/ledger/v1: LedgerService.Apply, which has side effects, so
// declares no idempotency level), its servers are plain grpc.Servers on
// loopback ports, and it imports only tollgate's public packages, so a copy
// of it builds outside this module.
//
//	go run ./examples/ledger [-tries 3] [-per-try 50ms] [-attempt-timeout 500ms] [-allowance 4] [-json]
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/tollgate-go/tollgate/budget"
	ledgerv1 "github.com/tollgate-go/tollgate/examples/ledger/proto/ledger/v1"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/interceptor"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

type config struct {
	Tries          int
	PerTry         time.Duration
	RestartPerTry  time.Duration
	AttemptTimeout time.Duration
	Allowance      int64
	Skew           time.Duration
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	Amount         int64
	RedisAddr      string
}

// MarshalJSON writes durations as Go duration strings ("50ms").
func (c config) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]any{
		"tries": c.Tries, "per_try_timeout": c.PerTry.String(), "restart_per_try_timeout": c.RestartPerTry.String(),
		"attempt_timeout": c.AttemptTimeout.String(), "allowance": c.Allowance, "clock_skew": c.Skew.String(),
		"initial_backoff": c.InitialBackoff.String(), "max_backoff": c.MaxBackoff.String(),
		"amount": c.Amount, "redis_addr": c.RedisAddr,
	})
}

// units is an attempt's ledger as the origin saw it when its calls ended.
type units struct {
	Total int64 `json:"total"`
	Free  int64 `json:"free"`
	Held  int64 `json:"held"`
	Spent int64 `json:"spent"`
}

// callResult is one intended effect: a call to the ledger's Apply, how it
// ended for its caller, and how many times the ledger ran it.
type callResult struct {
	Account string `json:"account"`
	// AttemptID is the attempt the call was made under.
	AttemptID string `json:"attempt_id"`
	// Calls are the call keys under which the ledger logged the effect.
	Calls   []string `json:"ledger_calls"`
	Outcome string   `json:"outcome"`
	Reason  string   `json:"reason,omitempty"`
	Code    string   `json:"code"`
	// ReportedAttemptID is the attempt ID an UNKNOWN or COMMITTED error named.
	ReportedAttemptID string `json:"reported_attempt_id,omitempty"`
	Total             int64  `json:"total,omitempty"`
	Message           string `json:"message,omitempty"`
	// Why is the owner's last word on an unresolved call (the state its
	// query learned, or why it could not ask).
	Why string `json:"why,omitempty"`
	// Effects is how many times the ledger ran the change.
	Effects int `json:"effects"`
	// Verdict is "exactly-once", "reported-unknown", "reported-committed",
	// "not-run", or what went wrong: "duplicate", "lost", "unnamed-unknown".
	Verdict string `json:"verdict"`
}

type scenarioResult struct {
	Name       string `json:"name"`
	Store      string `json:"store"`
	Skipped    bool   `json:"skipped"`
	SkipReason string `json:"skip_reason,omitempty"`
	// Fault is the failure the scenario means to inject; FaultInjected
	// whether it did. A scenario whose fault did not happen (its try
	// refused before the handler ran, say) shows nothing about that fault.
	Fault         string `json:"fault"`
	FaultInjected bool   `json:"fault_injected"`
	// IntendedEffects is the changes the scenario's plan asks for, whether
	// or not a call for each was made.
	IntendedEffects int   `json:"intended_effects"`
	ExecutedEffects int   `json:"executed_effects"`
	Duplicates      int   `json:"duplicates"`
	Lost            int   `json:"lost"`
	UnknownReported int   `json:"unknown_reported"`
	Queries         int64 `json:"queries"`
	Restarts        int   `json:"restarts"`
	// ReplacementRecord is the state in which the replacement server's
	// store holds the call's record after the run, read directly: UNKNOWN
	// when it cannot vouch for the attempt (a new memory store), the
	// surviving record's state otherwise (Redis).
	ReplacementRecord string       `json:"replacement_record,omitempty"`
	Units             units        `json:"units"`
	UnitsLeft         int64        `json:"units_left"`
	Origin            *callResult  `json:"origin_call,omitempty"`
	Calls             []callResult `json:"calls"`
}

type result struct {
	Config          config   `json:"config"`
	IntendedEffects int      `json:"intended_effects"`
	ExecutedEffects int      `json:"executed_effects"`
	Duplicates      int      `json:"duplicates"`
	Lost            int      `json:"lost"`
	UnknownReported int      `json:"unknown_reported"`
	Queries         int64    `json:"queries"`
	UnitsLeft       int64    `json:"units_left"`
	Skipped         []string `json:"skipped"`
	// FaultsMissed names the scenarios that ran without their fault
	// happening; the program then exits 1.
	FaultsMissed []string         `json:"faults_missed"`
	Scenarios    []scenarioResult `json:"scenarios"`
}

func defaultConfig() config {
	addr := os.Getenv("TOLLGATE_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	return config{Tries: 3, PerTry: 50 * time.Millisecond, RestartPerTry: 500 * time.Millisecond, AttemptTimeout: 500 * time.Millisecond,
		Allowance: 4, InitialBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond, Amount: 10, RedisAddr: addr}
}

func main() {
	cfg := defaultConfig()
	flag.IntVar(&cfg.Tries, "tries", cfg.Tries, "tries each owner may make of a call (first included)")
	flag.DurationVar(&cfg.PerTry, "per-try", cfg.PerTry, "how long a client waits for one try (scenarios 1, 2, 5)")
	flag.DurationVar(&cfg.RestartPerTry, "restart-per-try", cfg.RestartPerTry, "per-try timeout in the restart scenarios (long enough for the restart to happen while the try waits); 0: tollgate's default share of the remaining time")
	flag.DurationVar(&cfg.AttemptTimeout, "attempt-timeout", cfg.AttemptTimeout, "each attempt's one deadline, from its start")
	flag.Int64Var(&cfg.Allowance, "allowance", cfg.Allowance, "units each attempt lets the layers below its origin spend")
	flag.DurationVar(&cfg.Skew, "skew", cfg.Skew, "clock skew assumed by the servers and their stores (one host: 0)")
	flag.DurationVar(&cfg.InitialBackoff, "initial-backoff", cfg.InitialBackoff, "upper bound of the first jittered wait between tries and between polls")
	flag.DurationVar(&cfg.MaxBackoff, "max-backoff", cfg.MaxBackoff, "cap of the jittered wait between tries and between polls")
	flag.Int64Var(&cfg.Amount, "amount", cfg.Amount, "amount each Apply adds")
	flag.StringVar(&cfg.RedisAddr, "redis", cfg.RedisAddr, "Redis address for the Redis scenario (the default is $TOLLGATE_REDIS_ADDR when set; \"\" skips the scenario)")
	asJSON := flag.Bool("json", false, "print the result as JSON")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "ledger: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	res, err := run(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ledger:", err)
		os.Exit(1)
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(res)
	} else {
		report(os.Stdout, res)
	}
	if code, why := verdict(res); code != 0 {
		fmt.Fprintln(os.Stderr, "ledger:", why)
		os.Exit(code)
	}
}

// verdict is the program's exit status and why: 2 when an effect ran twice
// or was lost, 1 when a scenario ran without its fault happening (its
// numbers then show nothing about that fault), else 0.
func verdict(r *result) (code int, why string) {
	switch {
	case r.Duplicates > 0 || r.Lost > 0:
		return 2, fmt.Sprintf("%d effect(s) ran twice and %d were lost", r.Duplicates, r.Lost)
	case len(r.FaultsMissed) > 0:
		var missed []string
		for _, s := range r.Scenarios {
			if !s.Skipped && !s.FaultInjected {
				missed = append(missed, s.Name+refusals(s))
			}
		}
		return 1, fmt.Sprintf("the intended fault did not happen in %s, so the run does not show what it is meant to "+
			"(a try refused before it reached the handler keeps it away: too small an -allowance gives ALLOWANCE_EXHAUSTED, "+
			"too short an -attempt-timeout or -per-try DEADLINE_UNREACHABLE)",
			strings.Join(missed, ", "))
	}
	return 0, ""
}

// refusals lists, as " (…)", the distinct refusals (NOT_ADMITTED and its
// reason) that the scenario's calls ended with, or "" for none.
func refusals(s scenarioResult) string {
	calls := s.Calls
	if s.Origin != nil {
		calls = append([]callResult{*s.Origin}, calls...)
	}
	var seen []string
	for _, c := range calls {
		if c.Outcome != status.KindNotAdmitted.String() {
			continue
		}
		if r := c.Outcome + " " + c.Reason; !slices.Contains(seen, r) {
			seen = append(seen, r)
		}
	}
	if len(seen) == 0 {
		return ""
	}
	return " (its calls were refused: " + strings.Join(seen, ", ") + ")"
}

func report(w io.Writer, r *result) {
	c := r.Config
	fmt.Fprintf(w, "ledger: a state-changing Apply over loopback TCP behind tollgate, with faults injected after the effect\n")
	fmt.Fprintf(w, "configured: tries=%d per-try=%v restart-per-try=%v attempt-timeout=%v allowance=%d skew=%v backoff=%v..%v amount=%d\n\n",
		c.Tries, c.PerTry, c.RestartPerTry, c.AttemptTimeout, c.Allowance, c.Skew, c.InitialBackoff, c.MaxBackoff, c.Amount)
	for _, s := range r.Scenarios {
		if s.Skipped {
			fmt.Fprintf(w, "%-21s [%s] SKIPPED: %s\n\n", s.Name, s.Store, s.SkipReason)
			continue
		}
		fmt.Fprintf(w, "%-21s [%s] intended=%d executed=%d duplicates=%d lost=%d unknown-reported=%d queries=%d restarts=%d\n",
			s.Name, s.Store, s.IntendedEffects, s.ExecutedEffects, s.Duplicates, s.Lost, s.UnknownReported, s.Queries, s.Restarts)
		injected := "injected"
		if !s.FaultInjected {
			injected = "DID NOT HAPPEN: this scenario shows nothing about it"
		}
		fmt.Fprintf(w, "  fault: %s → %s\n", s.Fault, injected)
		if s.ReplacementRecord != "" {
			fmt.Fprintf(w, "  the replacement server's store holds the call's record as %s\n", s.ReplacementRecord)
		}
		if s.Origin != nil {
			fmt.Fprintf(w, "  origin call: %s\n", describe(s.Origin, false))
		}
		for _, cr := range s.Calls {
			fmt.Fprintf(w, "  %-14s %s\n", cr.Account+":", describe(&cr, true))
		}
		fmt.Fprintf(w, "  units: total=%d free=%d held=%d spent=%d → %d not known to be spent\n\n",
			s.Units.Total, s.Units.Free, s.Units.Held, s.Units.Spent, s.UnitsLeft)
	}
	fmt.Fprintf(w, "total: intended=%d executed=%d duplicates=%d lost=%d unknown-reported=%d queries=%d units-left=%d",
		r.IntendedEffects, r.ExecutedEffects, r.Duplicates, r.Lost, r.UnknownReported, r.Queries, r.UnitsLeft)
	if len(r.Skipped) > 0 {
		fmt.Fprintf(w, " skipped=%s", strings.Join(r.Skipped, ","))
	}
	if len(r.FaultsMissed) > 0 {
		fmt.Fprintf(w, " faults-missed=%s", strings.Join(r.FaultsMissed, ","))
	}
	fmt.Fprintln(w)
}

func describe(c *callResult, ledgerCall bool) string {
	s := c.Outcome
	if c.Reason != "" {
		s += " " + c.Reason
	}
	s += " (" + c.Code + ")"
	if c.ReportedAttemptID != "" {
		s += " attempt=" + c.ReportedAttemptID
	} else {
		s += " attempt=" + c.AttemptID
	}
	if c.Outcome == "OK" {
		s += fmt.Sprintf(" total=%d", c.Total)
	}
	if c.Why != "" {
		s += " (" + c.Why + ")"
	}
	if ledgerCall {
		s += fmt.Sprintf(" ledger-ran=%d", c.Effects)
	}
	return s + " → " + c.Verdict
}

func run(ctx context.Context, cfg config) (*result, error) {
	if cfg.Tries < 1 || cfg.Tries > interceptor.MaxTriesCap || cfg.PerTry <= 0 || cfg.RestartPerTry < 0 ||
		cfg.AttemptTimeout <= 0 || cfg.Allowance < 0 || cfg.Skew < 0 || cfg.InitialBackoff <= 0 || cfg.MaxBackoff < cfg.InitialBackoff {
		return nil, fmt.Errorf("tries must be in [1, %d]; per-try, attempt-timeout and initial-backoff positive; allowance, skew and restart-per-try ≥ 0; max-backoff ≥ initial-backoff", interceptor.MaxTriesCap)
	}
	// The interceptor's own bounds (allowance, attempt timeout, backoff,
	// clock skew), checked before any scenario runs.
	for _, perTry := range []time.Duration{cfg.PerTry, cfg.RestartPerTry} {
		if _, err := interceptor.NewDialOptions(cfg.clientOptions(perTry)...); err != nil {
			return nil, err
		}
	}
	if _, err := interceptor.NewServerOptions(interceptor.WithClockSkew(cfg.Skew)); err != nil {
		return nil, err
	}
	res := &result{Config: cfg, Skipped: []string{}, FaultsMissed: []string{}}
	scenarios := []func(context.Context, config) (*scenarioResult, error){
		droppedResponse, timeoutAfterCommit, restartMemory, restartRedis, unknownSecondCall,
	}
	for _, sc := range scenarios {
		s, err := sc(ctx, cfg)
		if err != nil {
			return nil, err
		}
		res.Scenarios = append(res.Scenarios, *s)
		if s.Skipped {
			res.Skipped = append(res.Skipped, s.Name)
			continue
		}
		if !s.FaultInjected {
			res.FaultsMissed = append(res.FaultsMissed, s.Name)
		}
		res.IntendedEffects += s.IntendedEffects
		res.ExecutedEffects += s.ExecutedEffects
		res.Duplicates += s.Duplicates
		res.Lost += s.Lost
		res.UnknownReported += s.UnknownReported
		res.Queries += s.Queries
		res.UnitsLeft += s.UnitsLeft
	}
	return res, nil
}

// ----- the ledger: state owned by this process, outliving its servers -----

type effectKey struct{ attempt, call string }

type logEntry struct {
	account string
	count   int
}

// ledger is the service's own state. It survives the restarts of the gRPC
// servers that serve it.
type ledger struct {
	mu       sync.Mutex
	balances map[string]int64
	log      map[effectKey]*logEntry
	order    []effectKey
	// afterCommit, when set, runs in the handler after the change was made
	// and before the handler answers.
	afterCommit func(ctx context.Context, account string)
	// queries counts the AttemptService calls that reached any server of the
	// scenario.
	queries atomic.Int64
}

func newLedger() *ledger {
	return &ledger{balances: map[string]int64{}, log: map[effectKey]*logEntry{}}
}

// apply makes the change and logs it under the attempt and call the handler
// serves: a second run of the same call is logged as a duplicate.
func (l *ledger) apply(ctx context.Context, r *ledgerv1.ApplyRequest) (*ledgerv1.ApplyResponse, error) {
	a, ok := interceptor.AttemptFromContext(ctx)
	if !ok {
		return nil, grpcstatus.Error(codes.FailedPrecondition, "ledger: no attempt")
	}
	l.mu.Lock()
	l.balances[r.GetAccount()] += r.GetAmount()
	total := l.balances[r.GetAccount()]
	k := effectKey{a.ID, a.Call}
	e := l.log[k]
	if e == nil {
		e = &logEntry{account: r.GetAccount()}
		l.log[k] = e
		l.order = append(l.order, k)
	}
	e.count++
	hook := l.afterCommit
	l.mu.Unlock()
	if hook != nil {
		hook(ctx, r.GetAccount())
	}
	return &ledgerv1.ApplyResponse{Total: total}, nil
}

// effects returns the call keys under which attempt changed account, and how
// many times the change ran in all.
func (l *ledger) effects(attempt, account string) (calls []string, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range l.order {
		if e := l.log[k]; k.attempt == attempt && e.account == account {
			calls = append(calls, k.call)
			n += e.count
		}
	}
	return calls, n
}

// tally returns the changes the ledger ran and how many of them were
// repeats of a call already logged.
func (l *ledger) tally() (executed, duplicates int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.log {
		executed += e.count
		duplicates += e.count - 1
	}
	return executed, duplicates
}

// faults are the failures a scenario injects in front of tollgate's server
// interceptors (as a proxy or a broken network would).
type faults struct {
	// dropAccount: the response of the next Apply to this account is lost
	// after the ledger committed it.
	dropAccount atomic.Pointer[string]
	// unreachable: the AttemptService cannot be reached about the call
	// whose response was dropped.
	unreachable atomic.Bool
	dropped     atomic.Pointer[effectKey]
	// injected counts the faults that struck.
	injected atomic.Int64
	// queried is closed when the first query arrives.
	queried     chan struct{}
	queriedOnce sync.Once
}

func newFaults() *faults { return &faults{queried: make(chan struct{})} }

const attemptServicePrefix = "/tollgate.v1.AttemptService/"

// outer is the unary interceptor outside tollgate's: it counts the
// AttemptService queries and injects the faults.
func (l *ledger) outer(f *faults) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if strings.HasPrefix(info.FullMethod, attemptServicePrefix) {
			l.queries.Add(1)
			f.queriedOnce.Do(func() { close(f.queried) })
			if q, ok := req.(interface {
				GetAttemptId() string
				GetCall() string
			}); ok && f.unreachable.Load() {
				if d := f.dropped.Load(); d != nil && *d == (effectKey{q.GetAttemptId(), q.GetCall()}) {
					return nil, grpcstatus.Error(codes.Unavailable, "ledger: attempt service unreachable")
				}
			}
			return h(ctx, req)
		}
		r, _ := req.(*ledgerv1.ApplyRequest)
		p := f.dropAccount.Load()
		if r == nil || p == nil || *p != r.GetAccount() {
			return h(ctx, req)
		}
		// This call's answer will be lost (and, if so configured, nobody
		// can ask about it), from before the handler runs.
		k := headerKey(ctx)
		f.dropped.Store(&k)
		resp, err := h(ctx, req)
		if err == nil && f.dropAccount.CompareAndSwap(p, nil) {
			f.injected.Add(1)
			return nil, grpcstatus.Error(codes.Unavailable, "ledger: connection reset before the response was sent")
		}
		return resp, err
	}
}

// headerKey reads the attempt and call of a request from its tollgate
// header (DESIGN.md §2.1): the outer interceptor runs before tollgate's and
// has no attempt in its context.
func headerKey(ctx context.Context) effectKey {
	k := effectKey{call: "0"}
	for _, v := range metadata.ValueFromIncomingContext(ctx, "tollgate") {
		for field := range strings.SplitSeq(v, ";") {
			switch name, value, _ := strings.Cut(field, "="); name {
			case "a":
				k.attempt = value
			case "c":
				k.call = value
			}
		}
	}
	return k
}

// ----- servers that can be restarted -----

// service is the LedgerService a server registers; apply answers each
// Apply: the ledger's own change, or the frontend's two calls to the ledger.
type service struct {
	ledgerv1.UnimplementedLedgerServiceServer
	apply func(context.Context, *ledgerv1.ApplyRequest) (*ledgerv1.ApplyResponse, error)
}

// Apply implements ledgerv1.LedgerServiceServer.
func (s *service) Apply(ctx context.Context, r *ledgerv1.ApplyRequest) (*ledgerv1.ApplyResponse, error) {
	return s.apply(ctx, r)
}

// instance is one serving process of a server: a grpc.Server, its listener
// and the store it was built with.
type instance struct {
	srv  *grpc.Server
	lis  net.Listener
	addr string
	done chan struct{}
}

// serve starts a server on addr ("127.0.0.1:0" for a new port) with the
// given store, behind outer and tollgate's interceptors.
func serve(addr string, cfg config, store idempotency.Store, outer grpc.UnaryServerInterceptor, svc *service) (*instance, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	tollgate, err := interceptor.NewServerOptions(
		interceptor.WithTrustedPeer(interceptor.TrustLoopback),
		interceptor.WithAttemptStore(store),
		interceptor.WithClockSkew(cfg.Skew),
	)
	if err != nil {
		_ = lis.Close()
		return nil, err
	}
	opts := append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(outer)}, tollgate...)
	in := &instance{srv: grpc.NewServer(opts...), lis: lis, addr: lis.Addr().String(), done: make(chan struct{})}
	ledgerv1.RegisterLedgerServiceServer(in.srv, svc)
	tollgatev1.RegisterAttemptServiceServer(in.srv, idempotency.NewAttemptService(store))
	go func() {
		defer close(in.done)
		_ = in.srv.Serve(lis)
	}()
	return in, nil
}

// stop stops the server at once: its connections close, its running
// handlers are abandoned.
func (in *instance) stop() {
	in.srv.Stop()
	<-in.done
}

func (cfg config) policy(perTry time.Duration) interceptor.RetryPolicy {
	return interceptor.RetryPolicy{MaxTries: cfg.Tries, PerTryTimeout: perTry,
		InitialBackoff: cfg.InitialBackoff, MaxBackoff: cfg.MaxBackoff}
}

// clientOptions are an origin client's tollgate options with per-try
// timeout perTry.
func (cfg config) clientOptions(perTry time.Duration) []interceptor.ClientOption {
	return []interceptor.ClientOption{
		interceptor.WithAllowance(cfg.Allowance),
		interceptor.WithAttemptTimeout(cfg.AttemptTimeout),
		interceptor.WithRetry(cfg.policy(perTry)),
	}
}

// serveMemory serves svc behind outer with a fresh memory store on a free
// loopback port and dials it as an origin; the caller stops and closes both.
func serveMemory(ctx context.Context, cfg config, outer grpc.UnaryServerInterceptor, svc *service) (*instance, *grpc.ClientConn, error) {
	store, err := memoryStore(cfg)
	if err != nil {
		return nil, nil, err
	}
	srv, err := serve("127.0.0.1:0", cfg, store, outer, svc)
	if err != nil {
		return nil, nil, err
	}
	conn, err := dial(ctx, srv.addr, cfg, cfg.PerTry)
	if err != nil {
		srv.stop()
		return nil, nil, err
	}
	return srv, conn, nil
}

func memoryStore(cfg config) (*idempotency.MemoryStore, error) {
	p := idempotency.DefaultPolicy()
	p.Skew = cfg.Skew
	return idempotency.NewMemoryStore(idempotency.SingleReplica, idempotency.WithPolicy(p))
}

// dial connects an origin client with tollgate's DialOptions and waits until
// the connection is ready, so that the first try is not spent connecting.
func dial(ctx context.Context, addr string, cfg config, perTry time.Duration) (*grpc.ClientConn, error) {
	tollgate, err := interceptor.NewDialOptions(cfg.clientOptions(perTry)...)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, tollgate...)...)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(wctx, s) {
			_ = conn.Close()
			return nil, fmt.Errorf("connecting to %s: %w", addr, wctx.Err())
		}
	}
	return conn, nil
}

// ----- judging what happened -----

// outcome fills how a call ended for its caller.
func outcome(c *callResult, resp *ledgerv1.ApplyResponse, err error) {
	o := status.OutcomeOf(err)
	c.Outcome, c.Code = o.Kind.String(), o.Code.String()
	if o.Reason != status.ReasonUnspecified {
		c.Reason = status.ReasonName(o.Reason)
	}
	c.ReportedAttemptID = o.Detail.GetAttemptId()
	if err == nil {
		c.Total = resp.GetTotal()
	} else {
		c.Message = grpcstatus.Convert(err).Message()
		if i := strings.LastIndex(c.Message, "interceptor: "); i >= 0 && o.Kind != status.KindOK {
			c.Why = c.Message[i+len("interceptor: "):]
		}
	}
}

// judge compares how a call ended with what the ledger ran.
// With no ledger (the origin's call to the frontend, which changes nothing
// itself) only the naming of an UNKNOWN answer is judged.
func judge(l *ledger, c *callResult) {
	if l == nil {
		switch {
		case c.Outcome != status.KindUnknown.String() && c.Outcome != status.KindCommitted.String():
			c.Verdict = "answered"
		case c.ReportedAttemptID != c.AttemptID:
			c.Verdict = "unnamed-unknown"
		default:
			c.Verdict = "reported-" + strings.ToLower(c.Outcome)
		}
		return
	}
	c.Calls, c.Effects = l.effects(c.AttemptID, c.Account)
	switch {
	case c.Effects > 1:
		c.Verdict = "duplicate"
	case c.Outcome == status.KindOK.String() && c.Effects == 1:
		c.Verdict = "exactly-once"
	case (c.Outcome == status.KindUnknown.String() || c.Outcome == status.KindCommitted.String()) && c.ReportedAttemptID != c.AttemptID:
		c.Verdict = "unnamed-unknown"
	case c.Outcome == status.KindUnknown.String():
		c.Verdict = "reported-unknown"
	case c.Outcome == status.KindCommitted.String():
		c.Verdict = "reported-committed"
	case (c.Outcome == status.KindFailed.String() || c.Outcome == status.KindNotAdmitted.String()) && c.Effects == 0:
		c.Verdict = "not-run"
	default: // OK without an effect, or a "no effect" answer after one
		c.Verdict = "lost"
	}
}

// finish judges the scenario's calls and fills its counts; the intended
// effects and the fault are the caller's (the scenario's plan).
func (s *scenarioResult) finish(l *ledger, snap budget.Snapshot) {
	s.ExecutedEffects, s.Duplicates = l.tally()
	repeats := 0 // extra runs of each intended change, under any call key
	for i := range s.Calls {
		c := &s.Calls[i]
		judge(l, c)
		switch c.Verdict {
		case "reported-unknown", "reported-committed":
			s.UnknownReported++
		case "lost", "unnamed-unknown":
			s.Lost++
		case "duplicate":
			repeats += c.Effects - 1
		}
	}
	// tally sees a repeat under the same call key only, which the record
	// store rules out; a re-run handler's new keys show as a call judged
	// duplicate, counted here too.
	s.Duplicates = max(s.Duplicates, repeats)
	s.Queries = l.queries.Load()
	s.Units = units{Total: snap.Total, Free: snap.Free, Held: snap.Held, Spent: snap.Spent}
	s.UnitsLeft = snap.Free + snap.Held + snap.Reserved
}

// startAttempt begins an attempt at the origin and returns its context and ID.
func startAttempt(ctx context.Context, cfg config) (context.Context, string, *budget.Allowance, error) {
	actx, err := interceptor.StartAttempt(ctx, cfg.Allowance, cfg.AttemptTimeout)
	if err != nil {
		return nil, "", nil, err
	}
	a, _ := interceptor.AttemptFromContext(actx)
	led, _ := budget.FromContext(actx)
	return actx, a.ID, led, nil
}

// ----- scenarios 1 and 2: the answer is lost, the record is not -----

// oneCall runs one Apply under a new attempt against a ledger served with a
// memory store, with the fault set by prepare (which counts it in
// f.injected when it strikes).
func oneCall(ctx context.Context, cfg config, name, fault string, prepare func(l *ledger, f *faults)) (*scenarioResult, error) {
	l, f := newLedger(), newFaults()
	prepare(l, f)
	srv, conn, err := serveMemory(ctx, cfg, l.outer(f), &service{apply: l.apply})
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	defer conn.Close()
	settle(cfg)
	actx, id, led, err := startAttempt(ctx, cfg)
	if err != nil {
		return nil, err
	}
	c := callResult{Account: name, AttemptID: id}
	resp, err := ledgerv1.NewLedgerServiceClient(conn).Apply(actx, &ledgerv1.ApplyRequest{Account: name, Amount: cfg.Amount})
	outcome(&c, resp, err)
	s := &scenarioResult{Name: name, Store: "memory", Calls: []callResult{c}, Fault: fault, IntendedEffects: 1,
		FaultInjected: f.injected.Load() > 0}
	s.finish(l, led.Snapshot())
	return s, nil
}

func droppedResponse(ctx context.Context, cfg config) (*scenarioResult, error) {
	return oneCall(ctx, cfg, "dropped-response", "the answer is lost after the commit", func(_ *ledger, f *faults) {
		account := "dropped-response"
		f.dropAccount.Store(&account)
	})
}

func timeoutAfterCommit(ctx context.Context, cfg config) (*scenarioResult, error) {
	return oneCall(ctx, cfg, "timeout-after-commit", "the answer is held back after the commit until the client asks", func(l *ledger, f *faults) {
		// The change is made; the answer comes only once the client has
		// given up on the try and asked about it (or at the deadline).
		l.afterCommit = func(ctx context.Context, _ string) {
			f.injected.Add(1)
			select {
			case <-f.queried:
			case <-ctx.Done():
			}
		}
	})
}

// ----- scenarios 3 and 4: the server is replaced between effect and answer -----

// storeMaker builds the record store of one server process; closeStore ends
// what that process held (its Redis connections), as its death would.
type storeMaker func() (store idempotency.Store, closeStore func(), err error)

// restart runs one Apply whose handler commits and then hangs; meanwhile the
// server is replaced by a new process on the same address with a store from
// newStore, and the old process dies. The client sees its connection drop
// and asks the new process about its try.
func restart(ctx context.Context, cfg config, name, kind string, newStore storeMaker) (*scenarioResult, error) {
	l, f := newLedger(), newFaults()
	committed, kill, handlerDone := make(chan time.Time, 1), make(chan struct{}), make(chan struct{}, 1)
	var killOnce sync.Once
	killHandler := func() { killOnce.Do(func() { close(kill) }) }
	defer killHandler()
	l.afterCommit = func(hctx context.Context, _ string) {
		defer func() { handlerDone <- struct{}{} }()
		select {
		case committed <- time.Now():
		default: // a second run: the ledger has logged it as a duplicate
		}
		select {
		case <-kill:
		case <-hctx.Done():
		}
	}
	svc := &service{apply: l.apply}
	store, closeOld, err := newStore()
	if err != nil {
		return nil, err
	}
	old, err := serve("127.0.0.1:0", cfg, store, l.outer(f), svc)
	if err != nil {
		closeOld()
		return nil, err
	}
	oldStopped := false
	defer func() {
		if !oldStopped {
			old.stop()
			closeOld()
		}
	}()
	conn, err := dial(ctx, old.addr, cfg, cfg.RestartPerTry)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	settle(cfg)
	actx, id, led, err := startAttempt(ctx, cfg)
	if err != nil {
		return nil, err
	}
	type answer struct {
		resp *ledgerv1.ApplyResponse
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := ledgerv1.NewLedgerServiceClient(conn).Apply(actx, &ledgerv1.ApplyRequest{Account: name, Amount: cfg.Amount})
		answered <- answer{resp, err}
	}()

	s := &scenarioResult{Name: name, Store: kind, Fault: "the server is replaced between the commit and the answer", IntendedEffects: 1}
	var ans answer
	var replacement *instance
	select {
	case ans = <-answered: // ended before the ledger committed: nothing to restart
	case at := <-committed:
		// A new process starts on the same address before the client
		// notices the old one is gone: a new store, a new horizon.
		for time.Now().UnixMilli() <= at.UnixMilli() {
			time.Sleep(time.Millisecond) // the new horizon lies after the commit
		}
		_ = old.lis.Close()
		<-old.done
		store2, closeNew, err := newStore()
		if err != nil {
			return nil, err
		}
		defer closeNew()
		if replacement, err = serve(old.addr, cfg, store2, l.outer(f), svc); err != nil {
			return nil, err
		}
		defer replacement.stop()
		s.Restarts++
		// The old process dies: connections reset, its store connections
		// gone, its hung handler never answers.
		closeOld()
		old.stop()
		oldStopped = true
		killHandler()
		<-handlerDone
		ans = <-answered
		rec, err := store2.Get(ctx, idempotency.Key{AttemptID: id, Call: "0", Method: ledgerv1.LedgerService_Apply_FullMethodName})
		if err != nil {
			return nil, err
		}
		s.ReplacementRecord = strings.TrimPrefix(rec.GetState().String(), "ATTEMPT_STATE_")
	}
	c := callResult{Account: name, AttemptID: id}
	outcome(&c, ans.resp, ans.err)
	s.Calls = []callResult{c}
	s.FaultInjected = s.Restarts > 0
	s.finish(l, led.Snapshot())
	return s, nil
}

func restartMemory(ctx context.Context, cfg config) (*scenarioResult, error) {
	return restart(ctx, cfg, "restart-memory", "memory", func() (idempotency.Store, func(), error) {
		s, err := memoryStore(cfg)
		return s, func() {}, err
	})
}

// redisClient connects to the Redis at addr, or reports why it cannot.
func redisClient(ctx context.Context, addr string) (*redis.Client, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

func restartRedis(ctx context.Context, cfg config) (*scenarioResult, error) {
	const name = "restart-redis"
	if cfg.RedisAddr == "" {
		return &scenarioResult{Name: name, Store: "redis", Skipped: true, Calls: []callResult{},
			SkipReason: `-redis "" skips it`}, nil
	}
	admin, err := redisClient(ctx, cfg.RedisAddr)
	if err != nil {
		return &scenarioResult{Name: name, Store: "redis", Skipped: true, Calls: []callResult{},
			SkipReason: fmt.Sprintf("no Redis answers at %s (set TOLLGATE_REDIS_ADDR or -redis): %v", cfg.RedisAddr, err)}, nil
	}
	defer admin.Close()
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	prefix := "tollgate-ledger:" + hex.EncodeToString(b) + ":"
	defer deletePrefix(admin, prefix)
	p := idempotency.DefaultPolicy()
	p.Skew = cfg.Skew
	return restart(ctx, cfg, name, "redis", func() (idempotency.Store, func(), error) {
		// Each server process has its own connections to the one Redis.
		c := redis.NewClient(&redis.Options{Addr: cfg.RedisAddr, ContextTimeoutEnabled: true})
		s, err := redisstore.New(ctx, c, redisstore.WithPrefix(prefix), redisstore.WithPolicy(p))
		if err == nil {
			if err = openHorizon(ctx, s); err != nil {
				_ = s.Close()
			}
		}
		if err != nil {
			_ = c.Close()
			return nil, nil, err
		}
		var once sync.Once
		return s, func() { once.Do(func() { _ = s.Close(); _ = c.Close() }) }, nil
	})
}

// openHorizon makes the Redis store begin retaining for the tenant now, as
// a server that has been serving would have: the store keeps a horizon per
// tenant, created by the first script that touches the tenant, and an
// attempt minted before it (minus the skew) cannot be vouched for. The
// caller then waits out the skew (settle).
func openHorizon(ctx context.Context, s *redisstore.Store) error {
	id, err := uuid.NewV7()
	if err != nil {
		return err
	}
	_, err = s.Get(ctx, idempotency.Key{AttemptID: id.String(), Call: "0", Method: ledgerv1.LedgerService_Apply_FullMethodName})
	return err
}

// settle waits until attempts minted from now on lie inside the horizon of
// a store that began retaining just before: more than the skew later, in
// the next millisecond (horizons are kept in Unix ms).
func settle(cfg config) {
	time.Sleep(cfg.Skew + time.Millisecond)
}

// deletePrefix deletes this run's keys, leaving the rest of the Redis alone.
func deletePrefix(c *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if len(keys) > 0 {
		_ = c.Del(ctx, keys...).Err()
	}
}

// ----- scenario 5: seed 000's second adverse history -----

// unknownSecondCall: the origin's attempt (allowance units) calls a
// frontend's Apply, whose handler makes two state-changing calls to the
// ledger. The ledger commits both; the second one's response is lost and its
// AttemptService cannot be reached, so the frontend cannot resolve it: it
// stops with UNKNOWN, and so does the origin, which reports the units that
// are still free.
func unknownSecondCall(ctx context.Context, cfg config) (*scenarioResult, error) {
	const name = "unknown-second-call"
	l, f := newLedger(), newFaults()
	second := name + "-2"
	f.dropAccount.Store(&second)
	f.unreachable.Store(true)
	ledgerSrv, down, err := serveMemory(ctx, cfg, l.outer(f), &service{apply: l.apply})
	if err != nil {
		return nil, err
	}
	defer ledgerSrv.stop()
	defer down.Close()
	ledgerClient := ledgerv1.NewLedgerServiceClient(down)

	var (
		mu    sync.Mutex
		calls []callResult
	)
	frontend := &service{apply: func(ctx context.Context, r *ledgerv1.ApplyRequest) (*ledgerv1.ApplyResponse, error) {
		a, _ := interceptor.AttemptFromContext(ctx)
		var resp *ledgerv1.ApplyResponse
		for i, account := range []string{name + "-1", second} {
			var err error
			resp, err = ledgerClient.Apply(ctx, &ledgerv1.ApplyRequest{Account: account, Amount: r.GetAmount()})
			c := callResult{Account: account, AttemptID: a.ID}
			outcome(&c, resp, err)
			mu.Lock()
			calls = append(calls, c)
			mu.Unlock()
			if err != nil && i == 0 && status.OutcomeOf(err).Kind == status.KindNotAdmitted {
				// Nothing of this request took effect yet: say so, or the
				// server answers UNKNOWN (DESIGN.md §3.6).
				return nil, status.WithoutEffect(err)
			}
			if err != nil {
				return nil, err
			}
		}
		return resp, nil
	}}
	frontSrv, conn, err := serveMemory(ctx, cfg, l.outer(newFaults()), frontend)
	if err != nil {
		return nil, err
	}
	defer frontSrv.stop()
	defer conn.Close()
	settle(cfg)
	actx, id, led, err := startAttempt(ctx, cfg)
	if err != nil {
		return nil, err
	}
	resp, err := ledgerv1.NewLedgerServiceClient(conn).Apply(actx, &ledgerv1.ApplyRequest{Account: name, Amount: cfg.Amount})
	origin := &callResult{Account: name, AttemptID: id}
	outcome(origin, resp, err)
	judge(nil, origin)
	// The plan: two changes, the second one's answer lost and its record
	// out of reach.
	s := &scenarioResult{Name: name, Store: "memory", Origin: origin, IntendedEffects: 2,
		Fault: "the second call's answer is lost and its record cannot be queried", FaultInjected: f.injected.Load() > 0}
	mu.Lock()
	s.Calls = append([]callResult(nil), calls...)
	mu.Unlock()
	s.finish(l, led.Snapshot())
	return s, nil
}
