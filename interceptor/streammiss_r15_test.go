package interceptor_test

import (
	"context"
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
	grpcstatus "google.golang.org/grpc/status"
)

// A review found the defect this test guards against.
//
// A recorded server-streaming try (Consume) is received first: the server
// interceptor waits for its one request before admission and before it
// begins the try's record. A client that opens the stream and sends no
// request until the try's deadline ends it was in no miss count at all:
// the receive failed, and the interceptor returned its error uncounted.
// It came in time but its request did not: it is counted once, on arrival
// (stage arrival, as a request received after the attempt's deadline is),
// and in no other stage, with or without admission (it holds no permit,
// so admission counts nothing). A client that cancels before any deadline
// missed none.
func TestR15StreamWithoutRequestByItsDeadlineIsCountedOnce(t *testing.T) {
	for _, tc := range []struct {
		name      string
		admission bool          // with an admission controller and its tap
		ownTimer  bool          // the client's context carries the deadline (grpc-timeout); else only the header's d
		noStore   bool          // no attempt store: received first for admission alone
		cancel    time.Duration // the client cancels after this long (0: it does not)
		want      map[string]int64
	}{
		{name: "store/grpc-timeout", ownTimer: true, want: map[string]int64{"arrival": 1}},
		{name: "store+admission/grpc-timeout", admission: true, ownTimer: true, want: map[string]int64{"arrival": 1}},
		{name: "store+admission/tap-bound", admission: true, want: map[string]int64{"arrival": 1}},
		{name: "admission/grpc-timeout", admission: true, noStore: true, ownTimer: true, want: map[string]int64{"arrival": 1}},
		// No deadline but the header's d: the server ends the wait at the
		// attempt's deadline (plus the skew), as the handler's deadline
		// (receiveFirst); the try missed it.
		{name: "store/header-deadline-only", want: map[string]int64{"arrival": 1}},
		{name: "store/cancelled-before-deadline", ownTimer: true, cancel: 50 * time.Millisecond, want: map[string]int64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mp, reader := testMeter(t)
			extra := []interceptor.ServerOption{interceptor.WithServerMeterProvider(mp)}
			if !tc.noStore {
				extra = append(extra, interceptor.WithAttemptStore(memoryStore(t)))
			}
			if tc.admission {
				ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 4}),
					admission.WithDefaultClass("work"), admission.WithMeterProvider(mp))
				require.NoError(t, err)
				t.Cleanup(func() { _ = ctrl.Close() })
				extra = append(extra, interceptor.WithAdmission(ctrl))
			}
			svc := &testsvc.Service{}
			end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { svc.Register(s) }, serverOpts(extra...)...)
			conn := end.DialT(t)

			deadline := time.Now().Add(300 * time.Millisecond)
			id, _ := uuid.NewV7()
			ctx := r14Header(t.Context(), id, 1, deadline)
			var cancel context.CancelFunc
			if tc.ownTimer {
				ctx, cancel = context.WithDeadline(ctx, deadline)
			} else {
				ctx, cancel = context.WithCancel(ctx)
			}
			defer cancel()
			s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, testingv1.TestService_Consume_FullMethodName)
			require.NoError(t, err)
			if tc.cancel > 0 {
				time.Sleep(tc.cancel) // the server waits for the request
				cancel()
			}
			// No request is sent: the client waits for the stream's end.
			err = s.RecvMsg(new(testingv1.ConsumeResponse))
			want := codes.DeadlineExceeded
			if tc.cancel > 0 {
				want = codes.Canceled
			}
			require.Equal(t, want, grpcstatus.Code(err), "%v", err)

			misses := func() map[string]int64 {
				var rm metricdata.ResourceMetrics
				require.NoError(t, reader.Collect(t.Context(), &rm))
				return r14Misses(t, rm)
			}
			if len(tc.want) > 0 {
				// The server's interceptor counts after the client saw the end.
				require.Eventually(t, func() bool { return len(misses()) > 0 }, 2*time.Second, 5*time.Millisecond)
			}
			time.Sleep(100 * time.Millisecond) // whatever else would count has had time to
			require.Equal(t, tc.want, misses(), "a stream whose request did not come by its deadline is counted once, on arrival")
			require.Zero(t, svc.Calls("Consume"), "nothing ran")
		})
	}
}
