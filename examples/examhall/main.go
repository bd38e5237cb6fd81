// Command examhall reproduces seed 003's ExamHall and catalog scenarios:
// one worker, jobs of one tick, absolute inclusive deadlines. The transport
// is real (gRPC over loopback TCP, each job an RPC that stays open until its
// modelled completion); the ticks are modelled, and the admission controller
// runs on the same virtual clock (AdmitAt/ReleaseAt). The server counts the
// useful completions (finished by the job's deadline tick and within the
// observation horizon), refusals by reason and waiting requests discarded
// unrun.
//
// The catalog runs twice: once behind the seed's own gateway, which discards
// a waiting request only once its deadline has passed (a small model in this
// file: tollgate cannot be configured to do exactly that), and once behind
// tollgate's waiting room, which also drops a waiter that can no longer
// finish by its deadline.
//
//	go run ./examples/examhall
//	go run ./examples/examhall -json
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
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Config holds every number of the runs; each has a flag.
type Config struct {
	FirstDeadline   int           `json:"first_deadline"`
	LowFirst        int           `json:"low_first"`
	OverloadFirst   int           `json:"overload_first"`
	SecondAt        int           `json:"second_at"`
	Second          int           `json:"second"`
	SecondDeadline  int           `json:"second_deadline"`
	Horizon         int           `json:"horizon"`
	BoundedInside   int           `json:"bounded_inside"`
	ServiceTicks    int           `json:"service_ticks"`
	CatalogInside   int           `json:"catalog_inside"`
	CatalogWaiting  int           `json:"catalog_waiting"`
	CatalogDeadline int           `json:"catalog_deadline"`
	CatalogHorizon  int           `json:"catalog_horizon"`
	Timeout         time.Duration `json:"-"`
}

// Wave is a group of jobs arriving at one tick with one deadline.
type Wave struct {
	At       int `json:"at"`
	Count    int `json:"count"`
	Deadline int `json:"deadline"`
}

// ScenarioReport is what one run did, counted at the server.
type ScenarioReport struct {
	Admission string         `json:"admission"`
	Waves     []Wave         `json:"waves"`
	Horizon   int            `json:"horizon"`
	Offered   int            `json:"offered"`
	Completed int            `json:"completed"`
	Useful    int            `json:"useful"`
	Late      int            `json:"late"`          // finished after their deadline
	After     int            `json:"after_horizon"` // finished by their deadline, after the horizon
	Refused   map[string]int `json:"refused"`       // refused on arrival, by reason
	Discarded int            `json:"discarded"`     // left the waiting room unrun
	// Inside and Waiting are the most inside (holding a place on the
	// worker's FIFO) and waiting outside it at once, sampled after every
	// arrival wave and every worker step: the only moments they change.
	Inside   int `json:"max_inside"`
	Waiting  int `json:"max_waiting"`
	LastTick int `json:"last_tick"`
}

// Report is the program's result: the seed's four numbers, tollgate's
// counterparts and the detail.
type Report struct {
	Low           int `json:"low"`
	Unbounded     int `json:"unbounded"`
	Bounded       int `json:"bounded"`
	CatalogUseful int `json:"catalog_useful"` // behind the seed's gateway
	// BoundedDeadline is the bounded run with tollgate's deadline stages on
	// as well; CatalogTollgateUseful the catalog behind tollgate's waiting
	// room.
	BoundedDeadline       int                        `json:"bounded_deadline"`
	CatalogTollgateUseful int                        `json:"catalog_tollgate_useful"`
	Config                Config                     `json:"config"`
	Scenarios             map[string]*ScenarioReport `json:"scenarios"`
}

// order is the scenarios in the order they run and print.
var order = []string{"low", "low_bounded", "unbounded", "bounded", "bounded_deadline", "catalog", "catalog_tollgate"}

const (
	service = "examhall.Proctor"
	refresh = "/" + service + "/Refresh"
	tick    = time.Second // one virtual tick
)

// epoch is tick 0 of the virtual clock.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(t int) time.Time { return epoch.Add(time.Duration(t) * tick) }

func main() {
	cfg := Config{}
	flag.IntVar(&cfg.FirstDeadline, "first-deadline", 2, "deadline tick of the first wave (arriving at tick 0)")
	flag.IntVar(&cfg.LowFirst, "low-first", 2, "jobs in the first wave under low load")
	flag.IntVar(&cfg.OverloadFirst, "overload-first", 8, "jobs in the first wave under overload")
	flag.IntVar(&cfg.SecondAt, "second-at", 2, "arrival tick of the second wave")
	flag.IntVar(&cfg.Second, "second", 2, "jobs in the second wave")
	flag.IntVar(&cfg.SecondDeadline, "second-deadline", 4, "deadline tick of the second wave")
	flag.IntVar(&cfg.Horizon, "horizon", 4, "count useful completions through this tick")
	flag.IntVar(&cfg.BoundedInside, "bounded-inside", 2, "bounded admission: jobs let in at once, the one holding the worker's slot and those queued for it (the report's inside + waiting); the excess is refused QUEUE_FULL")
	flag.IntVar(&cfg.ServiceTicks, "service-ticks", 1, "ticks one job takes on the worker")
	flag.IntVar(&cfg.CatalogInside, "catalog-inside", 2, "catalog: requests the backend permits inside")
	flag.IntVar(&cfg.CatalogWaiting, "catalog-waiting", 3, "catalog: requests held in the waiting room")
	flag.IntVar(&cfg.CatalogDeadline, "catalog-deadline", 1, "catalog: the requests' absolute deadline tick")
	flag.IntVar(&cfg.CatalogHorizon, "catalog-horizon", 3, "catalog: count useful results through this tick")
	flag.DurationVar(&cfg.Timeout, "timeout", 30*time.Second, "bound on the whole run (wall clock)")
	asJSON := flag.Bool("json", false, "print the report as JSON")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "examhall: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	rep, err := Run(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "examhall:", err)
		os.Exit(1)
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
		return
	}
	Print(os.Stdout, rep)
}

// Print writes the report for people.
func Print(w io.Writer, r *Report) {
	cfg := r.Config
	fmt.Fprintf(w, "one worker, jobs of %d tick(s), deadlines absolute and inclusive; useful = finished by deadline and horizon\n",
		cfg.ServiceTicks)
	fmt.Fprintf(w, "configured: bounded inside=%d (1 on the worker's slot + %d queued); catalog inside=%d outside=%d deadline=%d; horizons %d and %d (catalog); timeout %v for the whole run\n",
		cfg.BoundedInside, cfg.BoundedInside-1, cfg.CatalogInside, cfg.CatalogWaiting, cfg.CatalogDeadline, cfg.Horizon, cfg.CatalogHorizon, cfg.Timeout)
	for _, name := range order {
		s := r.Scenarios[name]
		after := ""
		if s.After > 0 {
			after = fmt.Sprintf(", %d on time after the horizon", s.After)
		}
		fmt.Fprintf(w, "  %-16s %-27s waves %v: offered %d, completed %d (late %d%s), useful %d through tick %d, refused %v, discarded %d, max inside %d + waiting %d, last tick %d\n",
			name, s.Admission, s.Waves, s.Offered, s.Completed, s.Late, after, s.Useful, s.Horizon, s.Refused, s.Discarded, s.Inside, s.Waiting, s.LastTick)
	}
	c, ct := r.Scenarios["catalog"], r.Scenarios["catalog_tollgate"]
	fmt.Fprintf(w, "example useful completions: low=%d unbounded=%d bounded=%d\n", r.Low, r.Unbounded, r.Bounded)
	fmt.Fprintf(w, "  with tollgate's deadline stages as well: bounded=%d\n", r.BoundedDeadline)
	fmt.Fprintf(w, "waiting room admission layout: inside=%d outside=%d; absolute-deadline useful=%d\n", c.Inside, c.Waiting, r.CatalogUseful)
	fmt.Fprintf(w, "  seed's gateway (discards passed deadlines): useful=%d, ran %d (late %d), discarded %d; tollgate (also drops waiters that cannot finish in time): useful=%d, ran %d (late %d), discarded %d\n",
		c.Useful, c.Completed, c.Late, c.Discarded, ct.Useful, ct.Completed, ct.Late, ct.Discarded)
}

// maxFlagValue bounds every count and tick a flag sets: every job is an
// RPC, every tick a step of the virtual clock.
const maxFlagValue = 10000

// scenario is one run's setup.
type scenario struct {
	waves   []Wave
	horizon int
	// ctrl options; nil (and gate nil): no admission (an unbounded FIFO in
	// front of the worker)
	classes *admission.Class
	stages  admission.Stage
	// gate, when set, is the seed's own waiting-room gateway: gate inside,
	// gateRoom outside.
	gate, gateRoom int
	label          string
}

// Run runs the scenarios, all within cfg.Timeout, and reports what the
// servers counted.
func Run(cfg Config) (*Report, error) {
	if cfg.Timeout <= 0 {
		return nil, fmt.Errorf("-timeout %v: must be positive", cfg.Timeout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
	defer cancel()
	return RunContext(ctx, cfg)
}

// RunContext is Run bounded by ctx instead of cfg.Timeout: every scenario
// runs within it.
func RunContext(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.ServiceTicks < 1 || cfg.BoundedInside < 1 || cfg.CatalogInside < 1 || cfg.CatalogWaiting < 0 {
		return nil, errors.New("service ticks and inside counts must be positive")
	}
	// Job counts and ticks: the virtual clock starts at tick 0 and never
	// goes back, and every job is a real RPC.
	for _, f := range []struct {
		name string
		v    int
	}{
		{"-low-first", cfg.LowFirst}, {"-overload-first", cfg.OverloadFirst}, {"-second", cfg.Second},
		{"-catalog-inside", cfg.CatalogInside}, {"-catalog-waiting", cfg.CatalogWaiting}, {"-bounded-inside", cfg.BoundedInside},
		{"-second-at", cfg.SecondAt}, {"-first-deadline", cfg.FirstDeadline}, {"-second-deadline", cfg.SecondDeadline},
		{"-horizon", cfg.Horizon}, {"-catalog-deadline", cfg.CatalogDeadline}, {"-catalog-horizon", cfg.CatalogHorizon},
		{"-service-ticks", cfg.ServiceTicks},
	} {
		if f.v < 0 || f.v > maxFlagValue {
			return nil, fmt.Errorf("%s %d: must be 0–%d", f.name, f.v, maxFlagValue)
		}
	}
	svc := time.Duration(cfg.ServiceTicks) * tick
	low := []Wave{{0, cfg.LowFirst, cfg.FirstDeadline}, {cfg.SecondAt, cfg.Second, cfg.SecondDeadline}}
	over := []Wave{{0, cfg.OverloadFirst, cfg.FirstDeadline}, {cfg.SecondAt, cfg.Second, cfg.SecondDeadline}}
	// Bounded admission as the seed's MR !1840 has it: total inside
	// limited to BoundedInside (one worker slot, the rest queued for it),
	// the excess refused at once (QUEUE_FULL). No deadline stage: the bound
	// alone decides. bounded_deadline adds tollgate's deadline stages (on
	// arrival and at dequeue), which refuse work that cannot finish in time
	// before the bound is reached.
	bounded := &admission.Class{Name: "proctor", Slots: 1, QueueItems: cfg.BoundedInside - 1, ExpectedServiceTime: svc}
	deadlines := admission.StageDeadline | admission.StageDequeue
	catalog := []Wave{{0, cfg.CatalogInside + cfg.CatalogWaiting, cfg.CatalogDeadline}}
	scenarios := map[string]scenario{
		"low":              {waves: low, horizon: cfg.Horizon, label: "none (FIFO)"},
		"low_bounded":      {waves: low, horizon: cfg.Horizon, classes: bounded, label: "tollgate (inside bound)"},
		"unbounded":        {waves: over, horizon: cfg.Horizon, label: "none (FIFO)"},
		"bounded":          {waves: over, horizon: cfg.Horizon, classes: bounded, label: "tollgate (inside bound)"},
		"bounded_deadline": {waves: over, horizon: cfg.Horizon, classes: bounded, stages: deadlines, label: "tollgate (bound + deadline)"},
		// The catalog's waiting room: the backend permits CatalogInside in
		// and CatalogWaiting wait outside. The seed's gateway, modelled
		// here, admits a waiter when capacity frees and discards those
		// whose deadline has passed, so it admits one exactly at its
		// deadline, which then finishes late.
		"catalog": {waves: catalog, horizon: cfg.CatalogHorizon, gate: cfg.CatalogInside, gateRoom: cfg.CatalogWaiting,
			label: "seed's gateway (modelled)"},
		// tollgate's waiting room re-checks the deadline when capacity
		// frees and drops, unrun, a waiter that cannot finish by it (the
		// arrival-time deadline stage is off so the room fills as in the
		// seed).
		"catalog_tollgate": {
			waves:   catalog,
			horizon: cfg.CatalogHorizon,
			classes: &admission.Class{Name: "catalog", Slots: cfg.CatalogInside, QueueItems: cfg.CatalogWaiting, ExpectedServiceTime: svc},
			stages:  admission.StageDequeue,
			label:   "tollgate (waiting room)",
		},
	}
	rep := &Report{Config: cfg, Scenarios: map[string]*ScenarioReport{}}
	for _, name := range order {
		sr, err := runScenario(ctx, cfg, scenarios[name])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		rep.Scenarios[name] = sr
	}
	rep.Low = rep.Scenarios["low"].Useful
	rep.Unbounded = rep.Scenarios["unbounded"].Useful
	rep.Bounded = rep.Scenarios["bounded"].Useful
	rep.BoundedDeadline = rep.Scenarios["bounded_deadline"].Useful
	rep.CatalogUseful = rep.Scenarios["catalog"].Useful
	rep.CatalogTollgateUseful = rep.Scenarios["catalog_tollgate"].Useful
	return rep, nil
}

// job is one modelled job on the worker.
type job struct {
	deadline int
	release  func(tick int) // frees its place in the admission at its completion; nil: none
	done     chan struct{}
}

// gate is the seed's catalog gateway, modelled in this program because
// tollgate cannot be configured to behave exactly like it: limit requests
// inside, the next room wait outside, the rest are refused. When capacity
// frees, it discards the waiters whose deadline has passed (the tick is
// after it) and admits the next in arrival order, even one whose deadline
// is the current tick and which therefore cannot finish in time.
type gate struct {
	limit, room int
	inside      int
	waiting     []*gateWaiter
}

type gateWaiter struct {
	deadline int
	admitted chan bool // true: admitted; false: discarded. Buffered: the sender never waits.
}

// sim is the server side of one run: a virtual clock, one worker with a
// FIFO, the admission in front of it (tollgate's controller, the seed's
// gateway, or none) and the counts.
type sim struct {
	ctx     context.Context // the run's bound: waits give up when it ends
	ctrl    *admission.Controller
	gate    *gate
	service int
	horizon int

	mu         sync.Mutex
	cond       *sync.Cond
	tick       int
	fifo       []*job
	arrivals   int // arrivals decided: on the worker's FIFO, waiting for admission, or refused
	pending    int // admitted jobs not yet on the FIFO
	completed  int
	useful     int
	late       int // finished after their deadline
	after      int // finished by their deadline, after the horizon
	refused    map[string]int
	discarded  int // left the waiting room unrun
	maxInside  int
	maxWaiting int
}

type releaseKey struct{}

// observe acknowledges arrivals and starts from the controller's events,
// so the clock advances only once every job is where it belongs, and counts
// refusals on arrival and waiters dropped unrun.
func (s *sim) observe(e admission.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch e.Kind {
	case admission.EventAdmitted:
		s.arrivals++
		s.pending++
	case admission.EventQueued:
		s.arrivals++
	case admission.EventRefused:
		s.arrivals++
		s.refused[status.ReasonName(e.Reason)]++
	case admission.EventStarted:
		s.pending++
	case admission.EventDropped:
		s.discarded++
	}
	s.cond.Broadcast()
}

// admit is the server's admission glue on the virtual clock. It is not
// interceptor.ServerOptions(interceptor.WithAdmission(ctrl)) on purpose:
// that interceptor admits on the real clock, and this simulation drives the
// controller tick by tick with AdmitAt and ReleaseAt. It asks the
// controller (or the seed's gateway) at the current tick and hands the
// worker a release, which it calls at the job's modelled completion; the
// deferred Release is then a no-op.
func (s *sim) admit(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	deadline := int(req.(*wrapperspb.Int64Value).GetValue())
	switch {
	case s.gate != nil:
		return s.admitGate(ctx, deadline, req, handler)
	case s.ctrl == nil:
		return handler(ctx, req)
	}
	s.mu.Lock()
	now := at(s.tick)
	s.mu.Unlock()
	p, err := s.ctrl.AdmitAt(ctx, admission.Request{Method: info.FullMethod, Size: -1, Deadline: at(deadline)}, now)
	if err != nil {
		return nil, err // counted by observe
	}
	defer p.Release()
	return handler(context.WithValue(ctx, releaseKey{}, func(t int) { p.ReleaseAt(at(t)) }), req)
}

// admitGate admits through the seed's gateway: inside if there is room,
// else into the waiting room until releaseGate admits or discards it.
func (s *sim) admitGate(ctx context.Context, deadline int, req any, handler grpc.UnaryHandler) (any, error) {
	g := s.gate
	s.mu.Lock()
	s.arrivals++
	s.cond.Broadcast()
	switch {
	case g.inside < g.limit:
		g.inside++
		s.pending++
		s.mu.Unlock()
	case len(g.waiting) < g.room:
		w := &gateWaiter{deadline: deadline, admitted: make(chan bool, 1)}
		g.waiting = append(g.waiting, w)
		s.mu.Unlock()
		select {
		case ok := <-w.admitted:
			if !ok {
				return nil, grpcstatus.Error(codes.DeadlineExceeded, "examhall: deadline passed while waiting")
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	default:
		s.refused["WAITING_ROOM_FULL"]++
		s.mu.Unlock()
		return nil, grpcstatus.Error(codes.ResourceExhausted, "examhall: waiting room full")
	}
	return handler(context.WithValue(ctx, releaseKey{}, s.releaseGate), req)
}

// releaseGate frees a place inside at tick t: the gateway discards the
// waiters whose deadline has passed, then admits the next ones.
func (s *sim) releaseGate(t int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.gate
	g.inside--
	kept := g.waiting[:0]
	for _, w := range g.waiting {
		if t > w.deadline {
			s.discarded++
			w.admitted <- false
			continue
		}
		kept = append(kept, w)
	}
	g.waiting = kept
	for len(g.waiting) > 0 && g.inside < g.limit {
		w := g.waiting[0]
		g.waiting = g.waiting[1:]
		g.inside++
		s.pending++
		w.admitted <- true
	}
	s.cond.Broadcast()
}

// handle puts the job on the worker's FIFO and answers at its completion.
func (s *sim) handle(ctx context.Context, in *wrapperspb.Int64Value) (*emptypb.Empty, error) {
	rel, _ := ctx.Value(releaseKey{}).(func(int))
	j := &job{deadline: int(in.GetValue()), release: rel, done: make(chan struct{})}
	s.mu.Lock()
	s.fifo = append(s.fifo, j)
	if rel == nil {
		s.arrivals++ // no admission in front: the arrival is placed here
	} else {
		s.pending--
	}
	s.cond.Broadcast()
	s.mu.Unlock()
	select {
	case <-j.done:
		return &emptypb.Empty{}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// awaitArrivals waits until n arrivals are decided and placed.
func (s *sim) awaitArrivals(ctx context.Context, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.arrivals < n || s.pending > 0 {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.cond.Wait()
	}
	return nil
}

// step runs the worker for one job (or one idle tick).
func (s *sim) step() {
	s.mu.Lock()
	for s.pending > 0 {
		if s.ctx.Err() != nil {
			s.mu.Unlock()
			return
		}
		s.cond.Wait()
	}
	var j *job
	if len(s.fifo) > 0 {
		j = s.fifo[0]
		s.fifo = s.fifo[1:]
		s.tick += s.service
		s.completed++
		switch {
		case s.tick > j.deadline:
			s.late++
		case s.tick > s.horizon:
			s.after++
		default:
			s.useful++
		}
	} else {
		s.tick++
	}
	now := s.tick
	s.mu.Unlock()
	if j != nil {
		if j.release != nil {
			j.release(now) // may start the next waiter
		}
		close(j.done)
	}
}

func (s *sim) now() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tick
}

// idle waits until every admitted job is on the FIFO and reports whether
// the FIFO is empty (or the run's bound ended).
func (s *sim) idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.pending > 0 && s.ctx.Err() == nil {
		s.cond.Wait()
	}
	return len(s.fifo) == 0 || s.ctx.Err() != nil
}

// record samples how many are inside and waiting once every admitted job is
// placed, and keeps the most of each. It runs after every arrival wave and
// every worker step, the only moments the layout changes, so the maxima are
// the run's true maxima.
func (s *sim) record() {
	s.idle()
	in, wait := s.layout()
	s.mu.Lock()
	s.maxInside, s.maxWaiting = max(s.maxInside, in), max(s.maxWaiting, wait)
	s.mu.Unlock()
}

// layout reports how many hold a place inside (on the worker's FIFO) and
// how many wait outside for one.
func (s *sim) layout() (inside, waiting int) {
	if s.ctrl == nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.gate != nil {
			return s.gate.inside, len(s.gate.waiting)
		}
		return len(s.fifo), 0
	}
	st := s.ctrl.StatsAt(at(s.now()))
	for _, c := range st.Classes {
		if c.Name != admission.ControlClass {
			inside += c.Running
			waiting += c.Queued
		}
	}
	return inside, waiting
}

func (s *sim) desc() *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: service,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Refresh", Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.Int64Value)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) { return s.handle(ctx, req.(*wrapperspb.Int64Value)) }
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: refresh}, h)
		}}},
	}
}

// runScenario runs one scenario within ctx, the bound on the whole run.
func runScenario(ctx context.Context, cfg Config, sc scenario) (*ScenarioReport, error) {
	s := &sim{ctx: ctx, service: cfg.ServiceTicks, horizon: sc.horizon, refused: map[string]int{}}
	s.cond = sync.NewCond(&s.mu)
	switch {
	case sc.classes != nil:
		ctrl, err := admission.New(
			admission.WithClasses(*sc.classes),
			admission.WithStages(sc.stages),
			admission.WithObserver(s.observe),
		)
		if err != nil {
			return nil, err
		}
		defer ctrl.Close()
		s.ctrl = ctrl
	case sc.gate > 0:
		s.gate = &gate{limit: sc.gate, room: sc.gateRoom}
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(s.admit))
	srv.RegisterService(s.desc(), s)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	defer func() {
		srv.Stop()
		<-served
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// Wake waiters of the condition when the run's bound ends.
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer stop()

	rep := &ScenarioReport{Admission: sc.label, Waves: sc.waves, Horizon: sc.horizon}
	var wg sync.WaitGroup
	sent := 0
	for _, w := range sc.waves {
		for s.now() < w.At && ctx.Err() == nil {
			s.step()
			s.record()
		}
		for range w.Count {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = conn.Invoke(ctx, refresh, wrapperspb.Int64(int64(w.Deadline)), &emptypb.Empty{})
			}()
		}
		sent += w.Count
		if err := s.awaitArrivals(ctx, sent); err != nil {
			return nil, fmt.Errorf("arrivals not acknowledged within the run's bound (-timeout %v): %w", cfg.Timeout, err)
		}
		s.record()
	}
	// Run the worker until every accepted job has finished (the fixture
	// finishes expired work rather than cancelling it).
	for !s.idle() {
		s.step()
		s.record()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("run did not finish within the run's bound (-timeout %v): %w", cfg.Timeout, ctx.Err())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rep.Offered = sent
	rep.Completed, rep.Useful, rep.Late, rep.After = s.completed, s.useful, s.late, s.after
	rep.Refused, rep.Discarded, rep.LastTick = s.refused, s.discarded, s.tick
	rep.Inside, rep.Waiting = s.maxInside, s.maxWaiting
	return rep, nil
}
