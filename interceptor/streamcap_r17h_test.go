package interceptor_test

import (
	"context"
	"fmt"
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

// TestR17hStreamEndedByTheTapsCapIsNoRunMiss: the admission tap bounds a
// stream's context by the server's maximum counted from the tap's now
// (AdmissionTap). When the interceptor runs later (here an outer
// interceptor, as an authenticating one would, takes 300 ms), a caller's
// deadline between the tap's cap and the interceptor's is no longer capped
// by the interceptor's maximum (inbound.capped is false), yet the handler's
// deadline is still the tap's cap, earlier than any deadline the request
// carried. A long-lived stream that runs to it was ended by the server's
// own limit, as TestR17bStreamEndedByTheServersMaximumIsNoRunMiss's are,
// and must count no run miss and no false accept (DESIGN.md §3.1, §5);
// inbound.serverLimit looked only at the interceptor's own cap, so each
// such stream counted both.
func TestR17hStreamEndedByTheTapsCapIsNoRunMiss(t *testing.T) {
	const (
		maxTime = time.Second
		outer   = 300 * time.Millisecond // the interceptor runs this long after the tap
		slack   = 100 * time.Millisecond // the tap runs within this of the call
	)
	for _, tc := range []struct {
		name    string
		header  bool // the deadline travels as a trusted header's d, else as grpc-timeout
		delayed bool
	}{
		{name: "header-d/reference", header: true},
		{name: "header-d/interceptor-later", header: true, delayed: true},
		{name: "grpc-timeout/reference"},
		{name: "grpc-timeout/interceptor-later", delayed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mp, reader := testMeter(t)
			ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 4,
				ExpectedServiceTime: 10 * time.Millisecond}),
				admission.WithDefaultClass("work"), admission.WithMeterProvider(mp))
			require.NoError(t, err)
			t.Cleanup(func() { _ = ctrl.Close() })
			svc := &testsvc.Service{
				ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
					<-st.Context().Done() // a long-lived stream: it ends when its context does
					return st.Context().Err()
				},
			}
			slow := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				if tc.delayed {
					time.Sleep(outer)
				}
				return h(srv, ss)
			})
			opts := append([]grpc.ServerOption{slow}, serverOpts(interceptor.WithServerMeterProvider(mp),
				interceptor.WithAdmission(ctrl), interceptor.WithMaxAttemptTime(maxTime))...)
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, opts...)
			conn := r16Ready(t, end.DialT(t))

			deadline := time.Now().Add(maxTime + slack) // later than the tap's cap, earlier than the interceptor's
			ctx, cancel := context.WithDeadline(t.Context(), deadline)
			if tc.header {
				cancel()
				id, _ := uuid.NewV7()
				ctx, cancel = context.WithCancel(metadata.AppendToOutgoingContext(t.Context(), "tollgate",
					fmt.Sprintf("a=%s;c=0;t=1;d=%d", id, deadline.UnixMilli())))
			}
			defer cancel()
			st, err := testingv1.NewTestServiceClient(conn).Chat(ctx)
			require.NoError(t, err)
			_, err = st.Recv()
			require.Equal(t, codes.DeadlineExceeded, grpcstatus.Code(err), "%v", err)
			require.EqualValues(t, 1, svc.Calls("Chat"), "the handler ran")

			require.Eventually(t, func() bool { cs, _ := ctrl.Stats().Class("work"); return cs.Running == 0 },
				2*time.Second, 5*time.Millisecond)
			var rm metricdata.ResourceMetrics
			require.NoError(t, reader.Collect(t.Context(), &rm))
			require.Equal(t, map[string]int64{}, r14Misses(t, rm), "the server's cap ended the stream")
			cs, _ := ctrl.Stats().Class("work")
			require.Zero(t, cs.FalseAccepts, "false accepts")
		})
	}
}
