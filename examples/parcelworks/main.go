// Command parcelworks reproduces the ParcelWorks scenario of seeds 000/001
// over real gRPC on loopback TCP: eight execution slots reserved as six for
// heavy test jobs and two for delivery-control tasks, queues of twelve and
// four, and a burst of twenty heavy and eight control long tasks. Only the
// slot and queue stages are on (no deadline stage, tenants or degradation,
// which would change the counts). It prints what it measured: per class the
// tasks accepted and refused (counted by reason at the server), the most
// that ever ran at once, and how promptly control probes started while the
// heavy class was saturated.
//
//	go run ./examples/parcelworks
//	go run ./examples/parcelworks -json
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
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/types/known/emptypb"
)

// Config is what the run is configured with; every field has a flag.
type Config struct {
	HeavySlots     int           `json:"heavy_slots"`
	ControlSlots   int           `json:"control_slots"`
	HeavyQueue     int           `json:"heavy_queue"`
	ControlQueue   int           `json:"control_queue"`
	HeavyOffered   int           `json:"heavy_offered"`
	ControlOffered int           `json:"control_offered"`
	Probes         int           `json:"control_probes"`
	Timeout        time.Duration `json:"-"`
}

// ClassReport is what one class did.
type ClassReport struct {
	Slots      int            `json:"slots"`
	Queue      int            `json:"queue"`
	Offered    int            `json:"offered"`
	Accepted   int            `json:"accepted"`
	Refused    map[string]int `json:"refused"`
	MaxRunning int64          `json:"max_running"`
}

// ProbeReport is what the control probes saw while heavy was saturated.
type ProbeReport struct {
	Sent          int       `json:"sent"`
	Admitted      int       `json:"admitted"`
	StartDelaysMs []float64 `json:"start_delays_ms"`
	// MaxStartDelayMs is the largest of StartDelaysMs; nil (left out of
	// the JSON) when no probe started, so no delay was measured.
	MaxStartDelayMs *float64 `json:"max_start_delay_ms,omitempty"`
	HeavyRunning    int      `json:"heavy_running_meanwhile"`
	HeavyQueued     int      `json:"heavy_queued_meanwhile"`
}

// Report is the run's result; every number is counted from what ran.
type Report struct {
	Config     Config                  `json:"config"`
	Classes    map[string]*ClassReport `json:"classes"`
	TotalSlots int                     `json:"total_slots"`
	MaxRunning int64                   `json:"max_running"` // probes included
	Probes     ProbeReport             `json:"control_probes"`
	ElapsedMs  float64                 `json:"elapsed_ms"`
}

const (
	service      = "parcelworks.Platform"
	heavyMethod  = "/" + service + "/RunTest"
	controlMeth  = "/" + service + "/Control"
	probeMethod  = "/" + service + "/Probe"
	heavyClass   = "heavy"
	controlClass = admission.ControlClass
)

func main() {
	cfg := Config{}
	flag.IntVar(&cfg.HeavySlots, "heavy-slots", 6, "slots reserved for heavy test jobs")
	flag.IntVar(&cfg.ControlSlots, "control-slots", 2, "slots reserved for delivery-control tasks")
	flag.IntVar(&cfg.HeavyQueue, "heavy-queue", 12, "heavy tasks that may wait")
	flag.IntVar(&cfg.ControlQueue, "control-queue", 4, "control tasks that may wait")
	flag.IntVar(&cfg.HeavyOffered, "heavy-offered", 20, "heavy long tasks in the burst")
	flag.IntVar(&cfg.ControlOffered, "control-offered", 8, "control long tasks in the burst")
	flag.IntVar(&cfg.Probes, "probes", 4, "control tasks sent one by one while heavy is saturated")
	flag.DurationVar(&cfg.Timeout, "timeout", 30*time.Second, "bound on the whole run")
	asJSON := flag.Bool("json", false, "print the report as JSON")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "parcelworks: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	rep, err := Run(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "parcelworks:", err)
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
	c := r.Config
	fmt.Fprintf(w, "configured: %d slots = %d heavy + %d control; queues %d heavy + %d control; slots and queues only\n",
		c.HeavySlots+c.ControlSlots, c.HeavySlots, c.ControlSlots, c.HeavyQueue, c.ControlQueue)
	fmt.Fprintf(w, "burst: %d heavy + %d control long tasks\n", c.HeavyOffered, c.ControlOffered)
	refused := 0
	for _, name := range []string{heavyClass, controlClass} {
		cr := r.Classes[name]
		n := 0
		for _, v := range cr.Refused {
			n += v
		}
		refused += n
		fmt.Fprintf(w, "  %-7s offered %2d  accepted %2d  refused %d %v  max running %d of %d\n",
			name, cr.Offered, cr.Accepted, n, cr.Refused, cr.MaxRunning, cr.Slots)
	}
	fmt.Fprintf(w, "accepted %d, refused %d with typed reasons, never more than %d running, probes included (slots %d)\n",
		r.Classes[heavyClass].Accepted+r.Classes[controlClass].Accepted, refused, r.MaxRunning, r.TotalSlots)
	p := r.Probes
	delays := make([]time.Duration, 0, len(p.StartDelaysMs))
	for _, ms := range p.StartDelaysMs {
		delays = append(delays, time.Duration(ms*float64(time.Millisecond)).Round(100*time.Nanosecond))
	}
	heavy := "busy"
	switch {
	case p.HeavyRunning >= r.Classes[heavyClass].Slots:
		heavy = "saturated"
	case p.HeavyRunning == 0 && p.HeavyQueued == 0:
		heavy = "idle"
	}
	measured := "none measured"
	if len(delays) > 0 {
		measured = fmt.Sprintf("%v (max %v)", delays, slices.Max(delays))
	}
	fmt.Fprintf(w, "control probes while heavy %s (%d running of %d, %d queued): %d/%d admitted, start delays %s\n",
		heavy, p.HeavyRunning, r.Classes[heavyClass].Slots, p.HeavyQueued, p.Admitted, p.Sent, measured)
	fmt.Fprintf(w, "elapsed %.1f ms\n", r.ElapsedMs)
}

// server is the platform: it admits through the controller, runs long
// tasks until their class's gate opens, and counts at the server.
type server struct {
	ctrl *admission.Controller

	mu       sync.Mutex
	cond     *sync.Cond
	decided  int                       // arrivals admitted, queued or refused
	admitted int                       // arrivals admitted to a slot
	entered  int                       // admitted arrivals whose task has begun
	taken    map[string]int            // class → arrivals admitted or queued
	refused  map[string]map[string]int // class → reason → count
	accepted map[string]int            // class → tasks that ran
	delays   []time.Duration           // probe start delays

	running     atomic.Int64
	maxRunning  atomic.Int64
	classRun    map[string]*atomic.Int64
	classMax    map[string]*atomic.Int64
	heavyGate   chan struct{}
	controlGate chan struct{}
}

func newServer() *server {
	s := &server{
		refused:     map[string]map[string]int{heavyClass: {}, controlClass: {}},
		accepted:    map[string]int{},
		taken:       map[string]int{},
		classRun:    map[string]*atomic.Int64{heavyClass: {}, controlClass: {}},
		classMax:    map[string]*atomic.Int64{heavyClass: {}, controlClass: {}},
		heavyGate:   make(chan struct{}),
		controlGate: make(chan struct{}),
	}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// observe counts arrival decisions, so the driver knows when a burst has
// been decided without sleeping.
func (s *server) observe(e admission.Event) {
	switch e.Kind {
	case admission.EventAdmitted, admission.EventQueued, admission.EventRefused:
		s.mu.Lock()
		s.decided++
		if e.Kind == admission.EventAdmitted {
			s.admitted++
		}
		if e.Kind != admission.EventRefused {
			s.taken[e.Class]++
		}
		s.cond.Broadcast()
		s.mu.Unlock()
	}
}

func (s *server) awaitDecided(ctx context.Context, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Admitted is not yet running: wait until every admitted task has
	// begun, so that opening a gate cannot end one before the last starts.
	for s.decided < n || s.entered < s.admitted {
		if err := ctx.Err(); err != nil {
			return err
		}
		s.cond.Wait()
	}
	return nil
}

type startKey struct{}

// count is the server's outermost interceptor: it stamps each request's
// arrival (for start delays) and counts, by class and reason, the refusals
// tollgate's interceptor answers with.
func (s *server) count(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(context.WithValue(ctx, startKey{}, time.Now()), req)
	s.noteRefusal(err)
	return resp, err
}

// countTap counts the refusals of the admission tap, which answer before any
// interceptor runs and before the controller's observer hears of them: each
// is an arrival decided.
func (s *server) countTap(next tap.ServerInHandle) tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		ctx, err := next(ctx, info)
		if err != nil {
			s.noteRefusal(err)
			s.mu.Lock()
			s.decided++
			s.cond.Broadcast()
			s.mu.Unlock()
		}
		return ctx, err
	}
}

func (s *server) noteRefusal(err error) {
	o := status.OutcomeOf(err)
	if o.Kind != status.KindNotAdmitted {
		return
	}
	class := o.Detail.GetWorkloadClass()
	s.mu.Lock()
	if s.refused[class] == nil {
		s.refused[class] = map[string]int{}
	}
	s.refused[class][status.ReasonName(o.Reason)]++
	s.mu.Unlock()
}

// task runs one task of class on its slot: it counts how many run at once
// and waits for gate (nil: returns at once). A probe (a control task without
// a gate) counts in the server's running tasks, which the slots bound, but
// not in its class's, which report the burst as offered and accepted do.
func (s *server) task(ctx context.Context, class string, gate chan struct{}) (*emptypb.Empty, error) {
	n := s.running.Add(1)
	raise(&s.maxRunning, n)
	defer s.running.Add(-1)
	if gate != nil {
		raise(s.classMax[class], s.classRun[class].Add(1))
		defer s.classRun[class].Add(-1)
	}
	s.mu.Lock()
	s.entered++
	s.cond.Broadcast()
	s.mu.Unlock()
	if class == controlClass && gate == nil {
		arrived, _ := ctx.Value(startKey{}).(time.Time)
		s.mu.Lock()
		s.delays = append(s.delays, time.Since(arrived))
		s.mu.Unlock()
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	s.mu.Lock()
	s.accepted[class]++
	s.cond.Broadcast()
	s.mu.Unlock()
	return &emptypb.Empty{}, nil
}

func raise(m *atomic.Int64, n int64) {
	for {
		old := m.Load()
		if n <= old || m.CompareAndSwap(old, n) {
			return
		}
	}
}

func (s *server) desc() *grpc.ServiceDesc {
	method := func(name, class string, gate func() chan struct{}) grpc.MethodDesc {
		full := "/" + service + "/" + name
		return grpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(emptypb.Empty)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, _ any) (any, error) { return s.task(ctx, class, gate()) }
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: full}, h)
		}}
	}
	return &grpc.ServiceDesc{
		ServiceName: service,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			method("RunTest", heavyClass, func() chan struct{} { return s.heavyGate }),
			method("Control", controlClass, func() chan struct{} { return s.controlGate }),
			method("Probe", controlClass, func() chan struct{} { return nil }),
		},
	}
}

// Run runs the scenario once and reports what it measured.
func Run(cfg Config) (*Report, error) {
	if cfg.HeavySlots < 1 || cfg.ControlSlots < 1 || cfg.HeavyQueue < 0 || cfg.ControlQueue < 0 ||
		cfg.HeavyOffered < 0 || cfg.ControlOffered < 0 || cfg.Probes < 0 {
		return nil, errors.New("slots must be positive and counts not negative")
	}
	if cfg.Timeout <= 0 {
		return nil, fmt.Errorf("-timeout %v: must be positive", cfg.Timeout)
	}
	begin := time.Now()
	s := newServer()
	ctrl, err := admission.New(
		admission.WithClasses(
			admission.Class{Name: heavyClass, Slots: cfg.HeavySlots, QueueItems: cfg.HeavyQueue},
			admission.Class{Name: controlClass, Slots: cfg.ControlSlots, QueueItems: cfg.ControlQueue},
		),
		admission.WithDefaultClass(heavyClass),
		admission.WithMethods(controlClass, controlMeth, probeMethod),
		admission.WithStages(0), // slots and queues only
		admission.WithObserver(s.observe),
	)
	if err != nil {
		return nil, err
	}
	defer ctrl.Close()
	s.ctrl = ctrl

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	// tollgate's server options wire the controller in; the example adds
	// its own outer interceptor and tap only to count refusals by reason.
	opts := []interceptor.ServerOption{interceptor.WithAdmission(ctrl), interceptor.WithoutAdmissionTap()}
	srv := grpc.NewServer(append([]grpc.ServerOption{
		grpc.ChainUnaryInterceptor(s.count),
		grpc.InTapHandle(s.countTap(interceptor.AdmissionTap(ctrl, opts...))),
	}, interceptor.ServerOptions(opts...)...)...)
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
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
	defer cancel()
	// Wake the driver's waits when the run times out.
	defer context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})()
	timedOut := fmt.Errorf("run did not finish within %v", cfg.Timeout)

	// The burst: every task at once, heavy and control interleaved.
	var wg sync.WaitGroup
	send := func(method string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = conn.Invoke(ctx, method, &emptypb.Empty{}, &emptypb.Empty{})
		}()
	}
	for i := range max(cfg.HeavyOffered, cfg.ControlOffered) {
		if i < cfg.HeavyOffered {
			send(heavyMethod)
		}
		if i < cfg.ControlOffered {
			send(controlMeth)
		}
	}
	if err := s.awaitDecided(ctx, cfg.HeavyOffered+cfg.ControlOffered); err != nil {
		close(s.controlGate)
		close(s.heavyGate)
		wg.Wait()
		return nil, timedOut
	}

	// Control work drains through its own slots while heavy stays saturated.
	close(s.controlGate)
	s.mu.Lock()
	for s.accepted[controlClass] < s.taken[controlClass] && ctx.Err() == nil {
		s.cond.Wait()
	}
	s.mu.Unlock()
	heavy, _ := ctrl.Stats().Class(heavyClass)
	probes := ProbeReport{Sent: cfg.Probes, HeavyRunning: heavy.Running, HeavyQueued: heavy.Queued, StartDelaysMs: []float64{}}
	for range cfg.Probes {
		if err := conn.Invoke(ctx, probeMethod, &emptypb.Empty{}, &emptypb.Empty{}); err == nil {
			probes.Admitted++
		}
	}
	close(s.heavyGate)
	wg.Wait()
	if ctx.Err() != nil {
		return nil, timedOut
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.delays {
		ms := float64(d) / float64(time.Millisecond)
		probes.StartDelaysMs = append(probes.StartDelaysMs, ms)
	}
	if len(probes.StartDelaysMs) > 0 {
		m := slices.Max(probes.StartDelaysMs)
		probes.MaxStartDelayMs = &m
	}
	rep := &Report{
		Config:     cfg,
		Classes:    map[string]*ClassReport{},
		TotalSlots: cfg.HeavySlots + cfg.ControlSlots,
		MaxRunning: s.maxRunning.Load(),
		Probes:     probes,
	}
	for _, c := range []struct {
		name                  string
		slots, queue, offered int
	}{
		{heavyClass, cfg.HeavySlots, cfg.HeavyQueue, cfg.HeavyOffered},
		{controlClass, cfg.ControlSlots, cfg.ControlQueue, cfg.ControlOffered},
	} {
		accepted := s.accepted[c.name]
		if c.name == controlClass {
			accepted -= probes.Admitted // probes are reported on their own
		}
		rep.Classes[c.name] = &ClassReport{
			Slots: c.slots, Queue: c.queue, Offered: c.offered, Accepted: accepted,
			Refused: s.refused[c.name], MaxRunning: s.classMax[c.name].Load(),
		}
	}
	rep.ElapsedMs = float64(time.Since(begin).Microseconds()) / 1000
	return rep, nil
}
