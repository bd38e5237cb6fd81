package interceptor_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
)

// r15LaggingCtx is a request's context whose deadline has come while its
// Done channel is still open: what every context is between its deadline
// and the moment its timer fires, which a busy process can make long. Its
// deadline is its own; Done, Err and values are the request's (whose client
// sends no deadline).
type r15LaggingCtx struct {
	context.Context
	deadline time.Time
}

func (c r15LaggingCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// r15LaggingStream is a server stream whose context is an r15LaggingCtx.
type r15LaggingStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *r15LaggingStream) Context() context.Context { return s.ctx }

// r15AnswersPastDeadline is a memory store whose Begin answers once the
// wall clock has passed deadline: a lookup that crosses its try's deadline
// while the try's context still lives.
type r15AnswersPastDeadline struct {
	*idempotency.MemoryStore
	deadline time.Time
}

func (s *r15AnswersPastDeadline) Begin(ctx context.Context, req idempotency.BeginRequest) (idempotency.BeginResult, error) {
	if d := time.Until(s.deadline); d >= 0 {
		t := time.NewTimer(d + time.Millisecond)
		<-t.C
	}
	return s.MemoryStore.Begin(ctx, req)
}

// A review found the defect this test guards against.
//
// A late try (it came after its attempt's deadline) that its store refuses
// for its lateness is counted in tollgate.deadline.misses{stage=arrival}
// (lateRefusal). Its lookup permit was then released, not abandoned,
// whenever the try's context had not ended when the interceptor looked:
// the lookup was its work. But the deadline of that context can pass
// between the look and the release (here: it has passed, its timer has not
// fired yet), and admission's Release then counted the same try again, as a
// miss of stage run. Each try must count at most once: the release of a
// lookup whose miss the interceptor counted still teaches the service time,
// and counts no miss.
func TestR15LateTryRefusedWhileItsDeadlinePassesIsCountedOnce(t *testing.T) {
	for _, stream := range []bool{false, true} {
		name := "unary"
		if stream {
			name = "stream"
		}
		t.Run(name, func(t *testing.T) {
			mp, reader := testMeter(t)
			ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 4}),
				admission.WithDefaultClass("work"), admission.WithMeterProvider(mp))
			require.NoError(t, err)
			t.Cleanup(func() { _ = ctrl.Close() })
			// The try's own deadline: in time for admission, passed by the
			// time the store answers.
			deadline := time.Now().Add(300 * time.Millisecond)
			store := &r15AnswersPastDeadline{MemoryStore: memoryStore(t), deadline: deadline}
			unary := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				return h(r15LaggingCtx{Context: ctx, deadline: deadline}, req)
			})
			streams := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				return h(srv, &r15LaggingStream{ServerStream: ss, ctx: r15LaggingCtx{Context: ss.Context(), deadline: deadline}})
			})
			svc := &testsvc.Service{}
			opts := append([]grpc.ServerOption{unary, streams}, serverOpts(interceptor.WithAttemptStore(store),
				interceptor.WithAdmission(ctrl), interceptor.WithoutAdmissionTap(), interceptor.WithServerMeterProvider(mp))...)
			end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { svc.Register(s) }, opts...)
			client := testingv1.NewTestServiceClient(end.DialT(t))

			// Try 2 of a call with no record comes after its attempt's
			// deadline: the store refuses it for that.
			id, _ := uuid.NewV7()
			ctx := r14Header(t.Context(), id, 2, time.Now().Add(-time.Second))
			if stream {
				up, err := client.Upload(ctx)
				require.NoError(t, err)
				_, err = up.CloseAndRecv()
				require.Equal(t, status.ReasonDeadlineExpired, status.OutcomeOf(err).Reason, "%v", err)
			} else {
				_, err := client.Apply(ctx, &testingv1.ApplyRequest{})
				require.Equal(t, status.ReasonDeadlineExpired, status.OutcomeOf(err).Reason, "%v", err)
			}
			require.Zero(t, svc.Calls("Apply")+svc.Calls("Upload"))

			var rm metricdata.ResourceMetrics
			require.NoError(t, reader.Collect(t.Context(), &rm))
			require.Equal(t, map[string]int64{"arrival": 1}, r14Misses(t, rm),
				"a late try refused for its lateness is counted once, on arrival, whenever its deadline passes")
			var served uint64
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == "tollgate.task.service_time" {
						for _, dp := range h.DataPoints {
							served += dp.Count
						}
					}
				}
			}
			require.Equal(t, uint64(1), served, "the lookup was its work: its time is a service time")
		})
	}
}
