package interceptor_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// tollgate has been tested with stats handlers of its own; users put
// otelgrpc's beside it. These tests install otelgrpc's client and server
// handlers together with tollgate's DialOptions and ServerOptions (the
// admission tap included), in both orders, over the real OTel SDK, and
// check that tollgate's behaviour and the trace both hold: one attempt
// across tiers, tollgate-spent read from the trailer, one trace in which
// tollgate.call parents each try's otelgrpc client span, retries and
// resolution queries as children of the call, and the server-streaming
// first-receive bound under otelgrpc's TagRPC context.

// r17bOrders are the two orders of otelgrpc's handler and tollgate's
// options: otelgrpc's first (its client TagRPC runs before tollgate's stats
// handler), or last.
var r17bOrders = []struct {
	name      string
	otelFirst bool
}{{"otelgrpc-first", true}, {"otelgrpc-last", false}}

// r17bServer returns the server options of a trusting tollgate tier
// (serverOpts, with extra) and otelgrpc's server handler on tp, in the
// order otelFirst says. tollgate's server records its events on the
// request's span, otelgrpc's.
func r17bServer(tp trace.TracerProvider, otelFirst bool, extra ...interceptor.ServerOption) []grpc.ServerOption {
	h := grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp),
		otelgrpc.WithPropagators(propagation.TraceContext{})))
	tg := serverOpts(extra...)
	if otelFirst {
		return append([]grpc.ServerOption{h}, tg...)
	}
	return append(tg, h)
}

// r17bDial returns tollgate's dial options (with tp and extra) and
// otelgrpc's client handler on tp, in the order otelFirst says.
func r17bDial(tp trace.TracerProvider, otelFirst bool, extra ...interceptor.ClientOption) []grpc.DialOption {
	h := grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp),
		otelgrpc.WithPropagators(propagation.TraceContext{})))
	tg := interceptor.DialOptions(append([]interceptor.ClientOption{interceptor.WithClientTracerProvider(tp)}, extra...)...)
	if otelFirst {
		return append([]grpc.DialOption{h}, tg...)
	}
	return append(tg, h)
}

// r17bChain is origin → mid → dep, every hop with otelgrpc beside tollgate,
// mid with an admission controller (and its tap). mid's handlers call dep's
// Get: its Get twice, its streams as callingStreams's do; dep's Get is
// depGet.
type r17bChain struct {
	tp      *sdktrace.TracerProvider
	spans   *tracetest.InMemoryExporter
	depSeen seen
	dep     *testsvc.Service
	ctrl    *admission.Controller
	client  testingv1.TestServiceClient
}

func newR17bChain(t *testing.T, otelFirst bool, midRetry interceptor.RetryPolicy,
	depGet func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error)) *r17bChain {
	t.Helper()
	c := &r17bChain{dep: &testsvc.Service{}}
	c.tp, c.spans = testTracer(t)
	c.dep.GetFunc = func(ctx context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		c.depSeen.note(ctx)
		return depGet(ctx, r)
	}
	depEnd := testsvc.StartT(t, testsvc.Bufconn, c.dep.Register, r17bServer(c.tp, otelFirst)...)
	callDep := getsFrom(testingv1.NewTestServiceClient(depEnd.DialT(t, r17bDial(c.tp, otelFirst, interceptor.WithRetry(midRetry))...)))
	mid := callingStreams(callDep)
	mid.GetFunc = func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		if err := callDep(ctx, 2); err != nil {
			return nil, err
		}
		return &testingv1.GetResponse{Value: "m"}, nil
	}
	var err error
	c.ctrl, err = admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 4}),
		admission.WithDefaultClass("work"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.ctrl.Close() })
	midEnd := testsvc.StartT(t, testsvc.Bufconn, mid.Register,
		r17bServer(c.tp, otelFirst, interceptor.WithAdmission(c.ctrl), interceptor.WithMaxAttemptTime(time.Minute))...)
	c.client = testingv1.NewTestServiceClient(midEnd.DialT(t, r17bDial(c.tp, otelFirst)...))
	return c
}

// r17bTrace is the spans of one trace, by span ID.
type r17bTrace struct {
	root  tracetest.SpanStub
	spans map[trace.SpanID]tracetest.SpanStub
}

// children returns the spans of the trace whose parent is p, of the given
// kind and name ("" for any).
func (tr r17bTrace) children(p tracetest.SpanStub, kind trace.SpanKind, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range tr.spans {
		if s.Parent.SpanID() == p.SpanContext.SpanID() && s.SpanKind == kind && (name == "" || s.Name == name) {
			out = append(out, s)
		}
	}
	return out
}

// r17bTraceOf waits until the trace whose root is the origin's tollgate.call
// span of attempt id holds want spans, and returns it. It fails the test
// when another span of the attempt lies outside that trace, or when the
// trace holds a span whose parent is not in it.
func r17bTraceOf(t *testing.T, spans *tracetest.InMemoryExporter, id string, want int) r17bTrace {
	t.Helper()
	var tr r17bTrace
	collect := func() bool {
		tr = r17bTrace{spans: map[trace.SpanID]tracetest.SpanStub{}}
		roots := 0
		all := spans.GetSpans()
		for _, s := range all {
			if v, ok := attr(s.Attributes, "tollgate.attempt.id"); ok && v.AsString() == id && !s.Parent.IsValid() {
				tr.root = s
				roots++
			}
		}
		if roots != 1 {
			return false
		}
		for _, s := range all {
			if s.SpanContext.TraceID() == tr.root.SpanContext.TraceID() {
				tr.spans[s.SpanContext.SpanID()] = s
			}
		}
		return len(tr.spans) >= want
	}
	// Server spans end when their RPC's stats end, which may come after the
	// client saw the answer.
	require.Eventually(t, collect, 5*time.Second, 5*time.Millisecond, "the trace of attempt %s", id)
	require.Len(t, tr.spans, want, "the trace's spans")
	require.Equal(t, "tollgate.call", tr.root.Name, "the origin's call span is the trace's root")
	for _, s := range spans.GetSpans() {
		if v, ok := attr(s.Attributes, "tollgate.attempt.id"); ok && v.AsString() == id {
			require.Equal(t, tr.root.SpanContext.TraceID(), s.SpanContext.TraceID(), "every span of the attempt is in one trace: %s", s.Name)
		}
	}
	for _, s := range tr.spans {
		if s.SpanContext.SpanID() != tr.root.SpanContext.SpanID() {
			_, ok := tr.spans[s.Parent.SpanID()]
			require.True(t, ok, "span %s (%v) has its parent in the trace", s.Name, s.SpanKind)
		}
	}
	return tr
}

// r17bOneChild returns the one child of p of the kind and name.
func r17bOneChild(t *testing.T, tr r17bTrace, p tracetest.SpanStub, kind trace.SpanKind, name string) tracetest.SpanStub {
	t.Helper()
	c := tr.children(p, kind, name)
	require.Len(t, c, 1, "%v children %q of %s", kind, name, p.Name)
	return c[0]
}

func r17bHasEvent(s tracetest.SpanStub, name string) bool {
	for _, e := range s.Events {
		if e.Name == name {
			return true
		}
	}
	return false
}

// r17bUnaryTrailer gives a unary call's trailer as an ended stream's
// (callingStreamRun): only Trailer is used.
type r17bUnaryTrailer struct {
	grpc.ClientStream
	trailer metadata.MD
}

func (u r17bUnaryTrailer) Trailer() metadata.MD { return u.trailer }

// TestR17bOtelgrpcBesideTollgatePropagatesAndTracesOneAttempt runs a unary
// call and each stream kind from an origin through a middle tier whose
// handler calls the dependency, otelgrpc installed at every hop beside
// tollgate (and mid's admission tap): the dependency sees the origin's
// attempt, the origin reads tollgate-spent from the trailer and is charged
// it, and the spans form one trace: the origin's tollgate.call is the root
// and parent of its otelgrpc client span, whose server span on mid (with
// tollgate's admission event) parents mid's tollgate.call spans, each the
// parent of one client span whose server span is the dependency's.
func TestR17bOtelgrpcBesideTollgatePropagatesAndTracesOneAttempt(t *testing.T) {
	for _, order := range r17bOrders {
		t.Run(order.name, func(t *testing.T) {
			c := newR17bChain(t, order.otelFirst, interceptor.RetryPolicy{MaxTries: 1},
				func(context.Context, *testingv1.GetRequest) (*testingv1.GetResponse, error) {
					return &testingv1.GetResponse{Value: "d"}, nil
				})
			unary := callingStreamRun{"unary", "Get", 2, func(t *testing.T, ctx context.Context, client testingv1.TestServiceClient) (grpc.ClientStream, error) {
				var trailer metadata.MD
				resp, err := client.Get(ctx, &testingv1.GetRequest{}, grpc.Trailer(&trailer))
				if err != nil {
					return nil, err
				}
				require.Equal(t, "m", resp.GetValue())
				return r17bUnaryTrailer{trailer: trailer}, nil
			}}
			for _, tc := range append([]callingStreamRun{unary}, callingStreamRuns...) {
				t.Run(tc.name, func(t *testing.T) {
					ctx, err := interceptor.StartAttempt(t.Context(), 8, 5*time.Second)
					require.NoError(t, err)
					a, _ := interceptor.AttemptFromContext(ctx)
					before, _ := c.depSeen.all()
					st, err := tc.run(t, ctx, c.client)
					require.NoError(t, err)
					requireSpentReported(t, ctx, st.Trailer(), tc.spent, &c.depSeen, len(before))

					// 1 origin call + its client span + mid's server span,
					// and per dependency call mid's call, client and dep's
					// server span.
					tr := r17bTraceOf(t, c.spans, a.ID, 3+3*int(tc.spent))
					full := "tollgate.testing.v1.TestService/" + tc.method
					oc := r17bOneChild(t, tr, tr.root, trace.SpanKindClient, full)
					ms := r17bOneChild(t, tr, oc, trace.SpanKindServer, full)
					require.True(t, r17bHasEvent(ms, "tollgate.admission"), "mid's admission event is on its server span")
					calls := tr.children(ms, trace.SpanKindInternal, "tollgate.call")
					require.Len(t, calls, int(tc.spent), "mid's calls to the dependency")
					for _, call := range calls {
						v, _ := attr(call.Attributes, "tollgate.attempt.id")
						require.Equal(t, a.ID, v.AsString())
						dc := r17bOneChild(t, tr, call, trace.SpanKindClient, "tollgate.testing.v1.TestService/Get")
						r17bOneChild(t, tr, dc, trace.SpanKindServer, "tollgate.testing.v1.TestService/Get")
					}
				})
			}
		})
	}
}

// TestR17bOtelgrpcBesideTollgateRetries: the dependency refuses each call's
// first try (NOT_ADMITTED, QUEUE_FULL), so mid's owner repeats it, with
// otelgrpc beside tollgate: the dependency sees tries 1 and 2 of each call
// under the origin's attempt, the origin reads the four units spent from
// the trailer, and each of mid's tollgate.call spans, with its retry
// event, parents one otelgrpc client span per try, each with the
// dependency's server span.
func TestR17bOtelgrpcBesideTollgateRetries(t *testing.T) {
	for _, order := range r17bOrders {
		t.Run(order.name, func(t *testing.T) {
			c := newR17bChain(t, order.otelFirst,
				interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond},
				func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
					if a, _ := interceptor.AttemptFromContext(ctx); a.Try == 1 {
						return nil, status.NotAdmitted(status.ReasonQueueFull)
					}
					return &testingv1.GetResponse{Value: "d"}, nil
				})
			ctx, err := interceptor.StartAttempt(t.Context(), 8, 5*time.Second)
			require.NoError(t, err)
			a, _ := interceptor.AttemptFromContext(ctx)
			var trailer metadata.MD
			resp, err := c.client.Get(ctx, &testingv1.GetRequest{}, grpc.Trailer(&trailer))
			require.NoError(t, err)
			require.Equal(t, "m", resp.GetValue())
			require.Equal(t, []string{"4"}, trailer.Get("tollgate-spent"), "two tries of each of mid's two calls")
			ledger, _ := budget.FromContext(ctx)
			require.Equal(t, int64(4), ledger.Snapshot().Spent)

			seen, _ := c.depSeen.all()
			require.Len(t, seen, 4)
			keys := map[string][]uint32{}
			for _, got := range seen {
				require.Equal(t, a.ID, got.ID, "one attempt ID at the dependency")
				keys[got.Call] = append(keys[got.Call], got.Try)
			}
			require.Len(t, keys, 2, "two calls")
			for k, tries := range keys {
				require.Equal(t, []uint32{1, 2}, tries, "call %s", k)
			}

			tr := r17bTraceOf(t, c.spans, a.ID, 3+2*(1+2+2))
			full := "tollgate.testing.v1.TestService/Get"
			oc := r17bOneChild(t, tr, tr.root, trace.SpanKindClient, full)
			ms := r17bOneChild(t, tr, oc, trace.SpanKindServer, full)
			calls := tr.children(ms, trace.SpanKindInternal, "tollgate.call")
			require.Len(t, calls, 2)
			for _, call := range calls {
				require.True(t, r17bHasEvent(call, "tollgate.retry"), "the repeat is on its call's span")
				tries := tr.children(call, trace.SpanKindClient, full)
				require.Len(t, tries, 2, "one client span per try, children of the call")
				for _, try := range tries {
					r17bOneChild(t, tr, try, trace.SpanKindServer, full)
				}
			}
		})
	}
}

// TestR17bOtelgrpcBesideTollgateResolves: a recorded dependency whose first
// Apply try ran, but whose answer a layer outside tollgate's interceptor
// replaced with a plain UNAVAILABLE (the response was lost): the owner
// asks FenceAttempt, with otelgrpc beside tollgate, and returns the stored
// response; the handler ran once. The query's otelgrpc client span is a
// child of the call's tollgate.call span, beside the try's, each with the
// dependency's server span.
func TestR17bOtelgrpcBesideTollgateResolves(t *testing.T) {
	for _, order := range r17bOrders {
		t.Run(order.name, func(t *testing.T) {
			tp, spans := testTracer(t)
			store := memoryStore(t)
			ledger := newLedger(nil)
			var lost atomic.Bool
			lose := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
				resp, err := handler(ctx, req)
				if info.FullMethod == testingv1.TestService_Apply_FullMethodName && lost.CompareAndSwap(false, true) {
					return nil, grpcstatus.Error(codes.Unavailable, "the response was lost")
				}
				return resp, err
			}
			opts := append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(lose)},
				r17bServer(tp, order.otelFirst, interceptor.WithAttemptStore(store))...)
			end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) {
				ledger.Register(s)
				tollgatev1.RegisterAttemptServiceServer(s, idempotency.NewAttemptService(store))
			}, opts...)
			client := testingv1.NewTestServiceClient(end.DialT(t, r17bDial(tp, order.otelFirst,
				interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))...))

			ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
			require.NoError(t, err)
			a, _ := interceptor.AttemptFromContext(ctx)
			resp, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "acct", Amount: 5})
			require.NoError(t, err, "the record answers the lost try")
			require.Equal(t, int64(5), resp.GetTotal())
			require.Equal(t, int64(1), ledger.effects.Load(), "the handler ran once")

			tr := r17bTraceOf(t, spans, a.ID, 5)
			require.True(t, r17bHasEvent(tr.root, "tollgate.attempt.query"), "the query is on the call's span")
			try := r17bOneChild(t, tr, tr.root, trace.SpanKindClient, "tollgate.testing.v1.TestService/Apply")
			r17bOneChild(t, tr, try, trace.SpanKindServer, "tollgate.testing.v1.TestService/Apply")
			q := r17bOneChild(t, tr, tr.root, trace.SpanKindClient, "tollgate.v1.AttemptService/FenceAttempt")
			r17bOneChild(t, tr, q, trace.SpanKindServer, "tollgate.v1.AttemptService/FenceAttempt")
		})
	}
}

// TestR17bOtelgrpcServerStreamFirstReceiveBound: a trusted peer opens a
// recorded server-streaming call (received first) with its attempt's
// deadline 300 ms ahead, no grpc-timeout, and never sends its request, on a
// server with otelgrpc's handler, whose TagRPC gives the RPC its context:
// the handler's deadline still ends the wait, with the tap's bound and
// without the tap, DEADLINE_EXCEEDED as from a grpc-timeout, counted once
// on arrival; nothing is begun or run, and the server's otelgrpc span is
// the child of the client's.
func TestR17bOtelgrpcServerStreamFirstReceiveBound(t *testing.T) {
	for _, order := range r17bOrders {
		for _, tap := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/tap=%v", order.name, tap), func(t *testing.T) {
				tp, spans := testTracer(t)
				mp, reader := testMeter(t)
				store := memoryStore(t)
				ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 4}),
					admission.WithDefaultClass("work"))
				require.NoError(t, err)
				t.Cleanup(func() { _ = ctrl.Close() })
				extra := []interceptor.ServerOption{interceptor.WithAttemptStore(store), interceptor.WithMaxAttemptTime(time.Minute),
					interceptor.WithAdmission(ctrl), interceptor.WithServerMeterProvider(mp)}
				if !tap {
					extra = append(extra, interceptor.WithoutAdmissionTap())
				}
				cs := newConsumer()
				end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { testingv1.RegisterTestServiceServer(s, cs) },
					r17bServer(tp, order.otelFirst, extra...)...)
				conn := r16Ready(t, end.DialT(t, grpc.WithStatsHandler(otelgrpc.NewClientHandler(
					otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(propagation.TraceContext{})))))

				r16dTapBoundStream(t, conn)
				require.Zero(t, cs.runs.Load(), "nothing ran")
				require.Zero(t, store.Len(), "nothing was begun")
				misses := func() map[string]int64 {
					var rm metricdata.ResourceMetrics
					require.NoError(t, reader.Collect(t.Context(), &rm))
					return r14Misses(t, rm)
				}
				require.Eventually(t, func() bool { return len(misses()) > 0 }, 2*time.Second, 5*time.Millisecond)
				require.Equal(t, map[string]int64{"arrival": 1}, misses(), "counted once, on arrival")

				var client, server tracetest.SpanStub
				require.Eventually(t, func() bool {
					for _, s := range spans.GetSpans() {
						switch s.SpanKind {
						case trace.SpanKindClient:
							client = s
						case trace.SpanKindServer:
							server = s
						}
					}
					return client.SpanContext.IsValid() && server.SpanContext.IsValid()
				}, 5*time.Second, 5*time.Millisecond)
				require.Equal(t, client.SpanContext.TraceID(), server.SpanContext.TraceID())
				require.Equal(t, client.SpanContext.SpanID(), server.Parent.SpanID())
			})
		}
	}
}

// TestR17bOtelgrpcBesideTollgateRepeatsStreams: a tollgate server refuses
// each stream's first try (NOT_ADMITTED, QUEUE_FULL, without effect, before
// any response),
// and the origin's stream owner repeats it, with otelgrpc beside tollgate:
// every kind of stream ends OK on its second try, and the call's
// tollgate.call span, with its retry event, parents one otelgrpc client
// span per try, each with the server's span.
func TestR17bOtelgrpcBesideTollgateRepeatsStreams(t *testing.T) {
	for _, order := range r17bOrders {
		for _, k := range streamGuardKinds {
			t.Run(order.name+"/"+k.name, func(t *testing.T) {
				tp, spans := testTracer(t)
				first := func(ctx context.Context) bool {
					a, _ := interceptor.AttemptFromContext(ctx)
					return a.Try == 1
				}
				refusal := status.WithoutEffect(status.NotAdmitted(status.ReasonQueueFull, status.WithRetryAfter(time.Millisecond)))
				svc := &testsvc.Service{
					WatchFunc: func(r *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
						if first(st.Context()) {
							return refusal
						}
						return st.Send(&testingv1.WatchResponse{Value: "w"})
					},
					UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
						if first(st.Context()) {
							return refusal
						}
						n, err := testsvc.DrainUpload(st)
						if err != nil {
							return err
						}
						return st.SendAndClose(&testingv1.UploadResponse{Count: n})
					},
					ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
						if first(st.Context()) {
							return refusal
						}
						return echoChat(st, nil)
					},
				}
				end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, r17bServer(tp, order.otelFirst)...)
				client := testingv1.NewTestServiceClient(end.DialT(t, r17bDial(tp, order.otelFirst, fastRetry(3))...))
				ctx, err := interceptor.StartAttempt(t.Context(), 4, 5*time.Second)
				require.NoError(t, err)
				a, _ := interceptor.AttemptFromContext(ctx)
				require.NoError(t, k.run(ctx, client))
				require.Equal(t, int64(2), svc.Calls(k.method), "repeated once")

				tr := r17bTraceOf(t, spans, a.ID, 5)
				require.True(t, r17bHasEvent(tr.root, "tollgate.retry"), "the repeat is on the call's span")
				full := "tollgate.testing.v1.TestService/" + k.method
				tries := tr.children(tr.root, trace.SpanKindClient, full)
				require.Len(t, tries, 2, "one client span per try, children of the call")
				for _, try := range tries {
					r17bOneChild(t, tr, try, trace.SpanKindServer, full)
				}
			})
		}
	}
}
