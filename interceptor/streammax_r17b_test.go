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

// A review found the defect this test guards against.
//
// A long-lived stream (a watch, a chat) whose request carries no deadline
// runs until the server's maximum handler time (WithMaxAttemptTime), which
// the server gives it (DESIGN.md §3.1: a request with no deadline gets the
// server's maximum). Its handler's context ends there and its permit was
// ended with EndStream, which judged that deadline as one the request had
// missed: each such stream counted a miss of stage run in
// tollgate.deadline.misses and a false accept (DESIGN.md §5), though no
// deadline the request carried was missed — the server ended the stream by
// its own limit. The same holds when the caller's deadline (the header's d
// or its grpc-timeout) is later than the server's maximum, which caps it:
// the stream ends at the cap, not at a deadline it carried. A stream whose
// own deadline, under the maximum, runs out is still a run miss and a false
// accept (the reference case).
func TestR17bStreamEndedByTheServersMaximumIsNoRunMiss(t *testing.T) {
	const maxTime = 300 * time.Millisecond
	for _, tc := range []struct {
		name     string
		method   string        // Chat (bidi) or Watch (server-streaming, received first)
		header   time.Duration // send a trusted tollgate header with d = now + header (0: no header)
		timeout  time.Duration // the client's grpc-timeout (0: none)
		store    bool
		maxTime  time.Duration
		wantMiss map[string]int64
		wantFA   uint64
	}{
		{name: "chat/no-deadline", method: "Chat", maxTime: maxTime, wantMiss: map[string]int64{}},
		{name: "chat/recorded/no-deadline", method: "Chat", store: true, maxTime: maxTime, wantMiss: map[string]int64{}},
		{name: "watch/no-deadline", method: "Watch", maxTime: maxTime, wantMiss: map[string]int64{}},
		{name: "chat/header-d-beyond-maximum", method: "Chat", header: time.Hour, maxTime: maxTime, wantMiss: map[string]int64{}},
		{name: "chat/grpc-timeout-beyond-maximum", method: "Chat", timeout: 10 * time.Second, maxTime: maxTime,
			wantMiss: map[string]int64{}},
		// The reference: the header's d, under the maximum, is the
		// stream's deadline, and the handler runs out of it.
		{name: "chat/header-d-under-maximum", method: "Chat", header: maxTime, maxTime: time.Minute,
			wantMiss: map[string]int64{"run": 1}, wantFA: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mp, reader := testMeter(t)
			ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 4,
				ExpectedServiceTime: 10 * time.Millisecond}),
				admission.WithDefaultClass("work"), admission.WithMeterProvider(mp))
			require.NoError(t, err)
			t.Cleanup(func() { _ = ctrl.Close() })
			extra := []interceptor.ServerOption{interceptor.WithServerMeterProvider(mp), interceptor.WithAdmission(ctrl),
				interceptor.WithMaxAttemptTime(tc.maxTime)}
			if tc.store {
				extra = append(extra, interceptor.WithAttemptStore(memoryStore(t)))
			}
			svc := &testsvc.Service{
				ChatFunc: func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
					<-st.Context().Done() // a long-lived stream: it ends when its context does
					return st.Context().Err()
				},
				WatchFunc: func(_ *testingv1.WatchRequest, st grpc.ServerStreamingServer[testingv1.WatchResponse]) error {
					<-st.Context().Done()
					return st.Context().Err()
				},
			}
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, serverOpts(extra...)...)
			conn := r16Ready(t, end.DialT(t))

			ctx := t.Context()
			if tc.header > 0 {
				id, _ := uuid.NewV7()
				ctx = metadata.AppendToOutgoingContext(ctx, "tollgate",
					fmt.Sprintf("a=%s;c=0;t=1;d=%d", id, time.Now().Add(tc.header).UnixMilli()))
			}
			var cancel context.CancelFunc
			if tc.timeout > 0 {
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
			} else {
				ctx, cancel = context.WithCancel(ctx)
			}
			defer cancel()
			client := testingv1.NewTestServiceClient(conn)
			switch tc.method {
			case "Chat":
				st, err := client.Chat(ctx)
				require.NoError(t, err)
				_, err = st.Recv()
				require.Equal(t, codes.DeadlineExceeded, grpcstatus.Code(err), "%v", err)
			case "Watch":
				st, err := client.Watch(ctx, &testingv1.WatchRequest{})
				require.NoError(t, err)
				_, err = st.Recv()
				require.Equal(t, codes.DeadlineExceeded, grpcstatus.Code(err), "%v", err)
			}
			require.EqualValues(t, 1, svc.Calls(tc.method), "the handler ran")

			// The permit ends after the client saw the answer: wait for it.
			require.Eventually(t, func() bool { cs, _ := ctrl.Stats().Class("work"); return cs.Running == 0 },
				2*time.Second, 5*time.Millisecond)
			var rm metricdata.ResourceMetrics
			require.NoError(t, reader.Collect(t.Context(), &rm))
			require.Equal(t, tc.wantMiss, r14Misses(t, rm))
			cs, _ := ctrl.Stats().Class("work")
			require.Equal(t, tc.wantFA, cs.FalseAccepts, "false accepts")
		})
	}
}
