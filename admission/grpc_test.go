package admission_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/tap"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// admit is the server glue the interceptor package will provide: it asks
// the controller, refuses with the typed status (and the pushback trailer),
// runs the handler and releases the permit exactly once.
func admit(ctrl *admission.Controller, calls *sync.Map) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if calls != nil {
			v, _ := calls.LoadOrStore(info.FullMethod, new(atomic.Int64))
			v.(*atomic.Int64).Add(1)
		}
		var tenant string
		if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get("tenant")) > 0 {
			tenant = md.Get("tenant")[0]
		}
		r := admission.Request{Method: info.FullMethod, Tenant: tenant, Size: -1}
		if m, ok := req.(proto.Message); ok {
			r.Size = proto.Size(m)
		}
		r.Deadline, _ = ctx.Deadline()
		p, err := ctrl.Admit(ctx, r)
		if err != nil {
			_ = status.SetPushbackTrailer(ctx, err)
			return nil, err
		}
		defer p.Release()
		return handler(ctx, req)
	}
}

// gates lets a test decide when each request's handler returns.
type gates struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

func (g *gates) get(id string) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil {
		g.m = map[string]chan struct{}{}
	}
	ch, ok := g.m[id]
	if !ok {
		ch = make(chan struct{})
		g.m[id] = ch
	}
	return ch
}

func (g *gates) open(id string) { close(g.get(id)) }

// jobs is a service registered by hand: each method's handler waits for
// its request's gate ("" never waits).
type jobs struct{ g *gates }

func (j *jobs) run(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	if in.GetValue() == "" {
		return in, nil
	}
	select {
	case <-j.g.get(in.GetValue()):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return in, nil
}

func jobsDesc(service string, methods ...string) *grpc.ServiceDesc {
	d := &grpc.ServiceDesc{ServiceName: service, HandlerType: (*any)(nil)}
	for _, m := range methods {
		full := "/" + service + "/" + m
		d.Methods = append(d.Methods, grpc.MethodDesc{
			MethodName: m,
			Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
				in := new(wrapperspb.StringValue)
				if err := dec(in); err != nil {
					return nil, err
				}
				h := func(ctx context.Context, req any) (any, error) {
					return srv.(*jobs).run(ctx, req.(*wrapperspb.StringValue))
				}
				if ic == nil {
					return h(ctx, in)
				}
				return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: full}, h)
			},
		})
	}
	return d
}

// server is an in-process gRPC server over bufconn with the admission glue,
// the jobs service and a health service.
type server struct {
	conn  *grpc.ClientConn
	gates *gates
	calls *sync.Map
}

func startServer(t *testing.T, ctrl *admission.Controller, withTap bool) *server {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	s := &server{gates: &gates{}, calls: &sync.Map{}}
	opts := []grpc.ServerOption{grpc.ChainUnaryInterceptor(admit(ctrl, s.calls))}
	if withTap {
		opts = append(opts, grpc.InTapHandle(ctrl.TapHandle))
	}
	srv := grpc.NewServer(opts...)
	srv.RegisterService(jobsDesc("demo.Jobs", "Heavy", "Light"), &jobs{g: s.gates})
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	s.conn = conn
	t.Cleanup(func() {
		s.gates.mu.Lock()
		for _, ch := range s.gates.m {
			select {
			case <-ch:
			default:
				close(ch)
			}
		}
		s.gates.mu.Unlock()
		conn.Close()
		srv.Stop()
	})
	return s
}

// call is one RPC in flight.
type call struct {
	done chan error
}

func (s *server) start(ctx context.Context, method, id, tenant string) *call {
	c := &call{done: make(chan error, 1)}
	if tenant != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "tenant", tenant)
	}
	go func() {
		c.done <- s.conn.Invoke(ctx, method, wrapperspb.String(id), new(wrapperspb.StringValue))
	}()
	return c
}

// events returns an observer option and the channel its events go to.
func events() (admission.Option, chan admission.Event) {
	ch := make(chan admission.Event, 4096)
	return admission.WithObserver(func(e admission.Event) { ch <- e }), ch
}

// next returns the next event of one of kinds, skipping others.
func next(ch chan admission.Event, kinds ...admission.EventKind) admission.Event {
	for {
		e := <-ch
		for _, k := range kinds {
			if e.Kind == k {
				return e
			}
		}
	}
}

var decided = []admission.EventKind{admission.EventAdmitted, admission.EventQueued, admission.EventRefused}

func wrapValue(s string) *wrapperspb.StringValue { return wrapperspb.String(s) }

func healthClient(cc *grpc.ClientConn) healthpb.HealthClient { return healthpb.NewHealthClient(cc) }

func healthReq() *healthpb.HealthCheckRequest { return &healthpb.HealthCheckRequest{} }

// The tap refused health checks when AttemptService queries (waiting on a
// slow store, say) filled the control class: an orchestrator would then
// restart a server whose data path is healthy. Health, answered from memory,
// is never refused at the tap; AttemptService still is.
func TestTapNeverRefusesHealth(t *testing.T) {
	c, err := admission.New(admission.WithClasses(
		admission.Class{Name: admission.ControlClass, Slots: 1},
		admission.Class{Name: "work", Slots: 1}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	p, err := c.Admit(ctx, admission.Request{Method: "/tollgate.v1.AttemptService/GetAttempt", Size: -1})
	require.NoError(t, err)
	defer p.Release()
	_, err = c.TapHandle(ctx, &tap.Info{FullMethodName: "/tollgate.v1.AttemptService/FenceAttempt"})
	require.Equal(t, status.ReasonConcurrencyFull, status.OutcomeOf(err).Reason, "the control class is full: %v", err)
	for _, m := range []string{"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"} {
		_, err = c.TapHandle(ctx, &tap.Info{FullMethodName: m})
		require.NoError(t, err, m)
	}
}

// Without a control class, health and reflection fall in the default class;
// tollgate's interceptor still runs them without a slot, so the tap must
// not refuse them when that class is full. A review found it refused a
// health Check QUEUE_FULL there.
func TestTapPassesSlotlessControlMethodsWithoutAControlClass(t *testing.T) {
	h := newHarness(t, admission.WithoutControlClass(), admission.WithClasses(
		admission.Class{Name: "B", Slots: 1, QueueItems: 1, ExpectedServiceTime: 10 * time.Millisecond}),
		admission.WithDefaultClass("B"))
	p := h.admitted(work("/demo.B/Do"))
	defer p.Abandon()
	h.queued(work("/demo.B/Do"))
	_, err := h.ctrl.TapHandle(context.Background(), &tap.Info{FullMethodName: "/demo.B/Do"})
	require.Error(t, err, "precondition: the class is full and the tap refuses its methods")
	for _, m := range []string{"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch",
		"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"} {
		_, err := h.ctrl.TapHandle(context.Background(), &tap.Info{FullMethodName: m})
		require.NoError(t, err, m)
	}
	for _, r := range h.done {
		if r.permit != nil {
			r.permit.Abandon()
		}
	}
}
