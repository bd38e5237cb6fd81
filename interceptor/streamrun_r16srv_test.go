package interceptor_test

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// A review found the defect this test guards against.
//
// A unary call whose handler finishes after its deadline is counted in
// tollgate.deadline.misses{stage=run}: admission judges the release of its
// permit against the deadline it was admitted under. A stream's permit was
// only ever abandoned (its lifetime is not a service time), which judges
// nothing: a client-streaming or bidi call whose handler's context ran out
// while it ran, and which ended DEADLINE_EXCEEDED or with its context's
// error, was counted in no stage at all. It is now judged as a unary
// call's permit is — an end after the deadline it was admitted under is a
// run miss, and a false accept — still teaching nothing of its lifetime to
// the service estimate. As for unary calls, a stream that ends in time
// (its client cancelled it before its deadline, or its handler finished)
// missed nothing, and a server without admission counts no run miss for
// either (admission judges them).
func TestR16SrvStreamWhoseHandlerRunsOutItsDeadlineIsARunMiss(t *testing.T) {
	waitCtx := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	for _, tc := range []struct {
		name      string
		method    string // Get (unary, the reference), Upload or Chat
		noCtrl    bool   // a server without admission
		store     bool
		noTimeout bool          // the client sends no grpc-timeout (only the header's d)
		cancel    time.Duration // the client cancels after this long (0: it does not)
		handler   func(ctx context.Context) error
		wantCode  codes.Code
		wantMiss  map[string]int64
		wantFalse uint64 // false accepts
	}{
		{name: "unary/reference", method: "Get", handler: waitCtx, wantCode: codes.DeadlineExceeded,
			wantMiss: map[string]int64{"run": 1}, wantFalse: 1},
		{name: "upload/context-error", method: "Upload", handler: waitCtx, wantCode: codes.DeadlineExceeded,
			wantMiss: map[string]int64{"run": 1}, wantFalse: 1},
		{name: "chat/deadline-exceeded-status", method: "Chat", handler: func(ctx context.Context) error {
			<-ctx.Done()
			return grpcstatus.Error(codes.DeadlineExceeded, "the handler's deadline passed")
		}, wantCode: codes.DeadlineExceeded, wantMiss: map[string]int64{"run": 1}, wantFalse: 1},
		{name: "chat/recorded/header-d-only", method: "Chat", store: true, noTimeout: true, handler: waitCtx,
			wantCode: codes.DeadlineExceeded, wantMiss: map[string]int64{"run": 1}, wantFalse: 1},
		{name: "chat/cancelled-before-deadline", method: "Chat", cancel: 100 * time.Millisecond, handler: waitCtx,
			wantCode: codes.Canceled, wantMiss: map[string]int64{}},
		{name: "chat/in-time", method: "Chat", handler: func(context.Context) error { return nil },
			wantCode: codes.OK, wantMiss: map[string]int64{}},
		{name: "unary/no-admission", method: "Get", noCtrl: true, handler: waitCtx, wantCode: codes.DeadlineExceeded,
			wantMiss: map[string]int64{}},
		{name: "chat/no-admission", method: "Chat", noCtrl: true, handler: waitCtx, wantCode: codes.DeadlineExceeded,
			wantMiss: map[string]int64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mp, reader := testMeter(t)
			extra := []interceptor.ServerOption{interceptor.WithServerMeterProvider(mp)}
			if tc.store {
				extra = append(extra, interceptor.WithAttemptStore(memoryStore(t)))
			}
			var ctrl *admission.Controller
			if !tc.noCtrl {
				var err error
				ctrl, err = admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 4,
					ExpectedServiceTime: 10 * time.Millisecond}),
					admission.WithDefaultClass("work"), admission.WithMeterProvider(mp))
				require.NoError(t, err)
				t.Cleanup(func() { _ = ctrl.Close() })
				extra = append(extra, interceptor.WithAdmission(ctrl))
			}
			svc := &testsvc.Service{
				GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
					if err := tc.handler(ctx); err != nil {
						return nil, err
					}
					return &testingv1.GetResponse{}, nil
				},
				UploadFunc: func(st grpc.ClientStreamingServer[testingv1.UploadRequest, testingv1.UploadResponse]) error {
					if err := tc.handler(st.Context()); err != nil {
						return err
					}
					return st.SendAndClose(&testingv1.UploadResponse{})
				},
				ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
					return tc.handler(st.Context())
				},
			}
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(extra...)...)
			conn := r16Ready(t, end.DialT(t))
			var mean time.Duration
			if ctrl != nil {
				cs, _ := ctrl.Stats().Class("work")
				mean = cs.ServiceMean
			}

			// The attempt's deadline, the trusted peer's d, is the handler's;
			// the client's own (its grpc-timeout) comes well after it, so
			// that the handler's context ends by that deadline, not by the
			// client's RST_STREAM at its own, which may reach the server
			// before the server's timer for the same deadline fires and
			// ends the call, by the server's clock, in time (a caller's
			// cancellation, no miss, for unary calls and streams alike).
			id, _ := uuid.NewV7()
			ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate",
				fmt.Sprintf("a=%s;c=0;t=1;d=%d", id, time.Now().Add(300*time.Millisecond).UnixMilli()))
			var cancel context.CancelFunc
			if tc.noTimeout {
				ctx, cancel = context.WithCancel(ctx)
			} else {
				ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
			}
			defer cancel()
			if tc.cancel > 0 {
				go func() { time.Sleep(tc.cancel); cancel() }()
			}
			var err error
			switch tc.method {
			case "Get":
				_, err = testingv1.NewTestServiceClient(conn).Get(ctx, &testingv1.GetRequest{Key: "k"})
			case "Upload":
				var st grpc.ClientStreamingClient[testingv1.UploadRequest, testingv1.UploadResponse]
				st, err = testingv1.NewTestServiceClient(conn).Upload(ctx)
				require.NoError(t, err)
				_, err = st.CloseAndRecv()
			case "Chat":
				var st grpc.BidiStreamingClient[testingv1.ChatRequest, testingv1.ChatResponse]
				st, err = testingv1.NewTestServiceClient(conn).Chat(ctx)
				require.NoError(t, err)
				require.NoError(t, st.CloseSend())
				_, err = st.Recv()
				if err == io.EOF {
					err = nil
				}
			}
			require.Equal(t, tc.wantCode, grpcstatus.Code(err), "%v", err)

			misses := func() map[string]int64 {
				var rm metricdata.ResourceMetrics
				require.NoError(t, reader.Collect(t.Context(), &rm))
				return r14Misses(t, rm)
			}
			if ctrl != nil {
				// The permit ends after the client saw the answer: wait for it.
				require.Eventually(t, func() bool { cs, _ := ctrl.Stats().Class("work"); return cs.Running == 0 },
					2*time.Second, 5*time.Millisecond)
			}
			time.Sleep(100 * time.Millisecond) // whatever would count has had time to
			require.Equal(t, tc.wantMiss, misses())
			if ctrl != nil {
				cs, _ := ctrl.Stats().Class("work")
				require.Equal(t, tc.wantFalse, cs.FalseAccepts)
				if tc.method != "Get" {
					require.Equal(t, mean, cs.ServiceMean, "a stream's lifetime teaches no service time")
				}
			}
		})
	}
}
