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
	"github.com/tollgate-go/tollgate/status"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// A review found the defect this test guards against.
//
// A server-streaming call received first (before admission, its one
// request read by the server interceptor) waited for that request bounded
// by nothing but the stream's own context: with the admission tap, the
// tap's bound; with a grpc-timeout, that. A server without the tap (no
// admission, only a store; or WithoutAdmissionTap) whose client sent no
// grpc-timeout — a trusted peer whose header carries the attempt's
// deadline d, or an origin under the server's maximum attempt time — kept
// the stream, and the goroutine serving it, for as long as the client kept
// the stream open, long past the deadline its handler would have had; and
// a grpc-timeout later than d + skew was waited out in full. The wait is
// now bounded by the deadline the handler would get. A stream whose request
// had not come by it is counted once in
// tollgate.deadline.misses{stage=arrival}, nothing admitted, begun or run,
// and its trailer (tollgate-spent 0 for a strict caller) is the
// interceptor's. Its answer is the one a request coming after that
// deadline gets where no record could answer such a request (the call
// keeps none, or its attempt was minted here), or where only the server's
// cap passed (a repeat would be answered by the record): NOT_ADMITTED
// DEADLINE_EXPIRED, final or not as for that request. A try of a caller's
// recorded attempt ends as one a grpc-timeout ended does,
// DEADLINE_EXCEEDED "context deadline exceeded" (its record, which a
// tollgate client then asks, is what could answer it).
func TestR16SrvStreamRequestWaitIsBoundedByTheHandlersDeadline(t *testing.T) {
	for _, tc := range []struct {
		name      string
		store     bool
		admission bool          // with a controller, but WithoutAdmissionTap
		header    bool          // a trusted peer's header with d 300 ms ahead; else the server's 300 ms maximum
		timeout   time.Duration // the client's own deadline (grpc-timeout) from now; 0: none
		strict    bool          // the header asks r=1
		refused   bool          // answered NOT_ADMITTED DEADLINE_EXPIRED; else DEADLINE_EXCEEDED, as the reference
		final     bool          // when refused
	}{
		{name: "reference/grpc-timeout-at-d", store: true, header: true, timeout: 300 * time.Millisecond},
		{name: "store/header-d", store: true, header: true},
		{name: "store/header-d/strict", store: true, header: true, strict: true},
		{name: "store/grpc-timeout-after-d", store: true, header: true, timeout: time.Minute},
		{name: "store/server-maximum", store: true, refused: true},
		{name: "store+admission-without-tap/header-d", store: true, admission: true, header: true},
		{name: "admission-without-tap/server-maximum", admission: true, refused: true},
		{name: "admission-without-tap/header-d", admission: true, header: true, refused: true, final: true},
		{name: "admission-without-tap/header-d/strict", admission: true, header: true, strict: true, refused: true, final: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mp, reader := testMeter(t)
			extra := []interceptor.ServerOption{interceptor.WithServerMeterProvider(mp),
				interceptor.WithMaxAttemptTime(time.Minute)}
			if !tc.header {
				extra = append(extra, interceptor.WithMaxAttemptTime(300*time.Millisecond))
			}
			store := memoryStore(t)
			if tc.store {
				extra = append(extra, interceptor.WithAttemptStore(store))
			}
			var ctrl *admission.Controller
			if tc.admission {
				var err error
				ctrl, err = admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 4}),
					admission.WithDefaultClass("work"), admission.WithMeterProvider(mp))
				require.NoError(t, err)
				t.Cleanup(func() { _ = ctrl.Close() })
				extra = append(extra, interceptor.WithAdmission(ctrl), interceptor.WithoutAdmissionTap())
			}
			c := newConsumer()
			end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { testingv1.RegisterTestServiceServer(s, c) },
				serverOpts(extra...)...)
			conn := r16Ready(t, end.DialT(t))

			ctx := t.Context()
			if tc.header {
				id, _ := uuid.NewV7()
				h := fmt.Sprintf("a=%s;c=0;t=1;d=%d", id, time.Now().Add(300*time.Millisecond).UnixMilli())
				if tc.strict {
					h += ";r=1"
				}
				ctx = metadata.AppendToOutgoingContext(ctx, "tollgate", h)
			}
			var cancel context.CancelFunc
			if tc.timeout > 0 {
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
			} else {
				ctx, cancel = context.WithCancel(ctx)
			}
			defer cancel()
			s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, testingv1.TestService_Consume_FullMethodName)
			require.NoError(t, err)

			// No request is sent, and the client does not cancel: only the
			// server can end the stream. The wait is a guard against a hang.
			ended := make(chan error, 1)
			go func() { ended <- s.RecvMsg(new(testingv1.ConsumeResponse)) }()
			select {
			case err = <-ended:
			case <-time.After(10 * time.Second):
				cancel()
				<-ended
				t.Fatal("the server kept waiting for the request long past the deadline its handler would have had")
			}
			if tc.refused {
				o := status.OutcomeOf(err)
				require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
				require.Equal(t, status.ReasonDeadlineExpired, o.Reason, "%v", err)
				require.Equal(t, tc.final, o.Final(), "%v", err)
			} else {
				st := grpcstatus.Convert(err)
				require.Equal(t, codes.DeadlineExceeded, st.Code(), "%v", err)
				if tc.timeout != 300*time.Millisecond { // the reference's client may end it first, with a message of its own
					require.Equal(t, "context deadline exceeded", st.Message(), "as a stream a grpc-timeout ended")
				}
			}
			if tc.strict {
				require.Equal(t, []string{"0"}, s.Trailer().Get("tollgate-spent"), "the interceptor's trailer")
			}

			misses := func() map[string]int64 {
				var rm metricdata.ResourceMetrics
				require.NoError(t, reader.Collect(t.Context(), &rm))
				return r14Misses(t, rm)
			}
			// The server's interceptor counts after the client saw the end.
			require.Eventually(t, func() bool { return len(misses()) > 0 }, 2*time.Second, 5*time.Millisecond)
			time.Sleep(100 * time.Millisecond) // whatever else would count has had time to
			require.Equal(t, map[string]int64{"arrival": 1}, misses(), "counted once, on arrival")
			require.Zero(t, c.runs.Load(), "nothing ran")
			require.Zero(t, store.Len(), "nothing was begun")
			if ctrl != nil {
				cs, _ := ctrl.Stats().Class("work")
				require.Zero(t, cs.Admitted, "nothing was admitted")
				require.Zero(t, cs.Running)
			}
		})
	}
}

// The same bound for a try that came after its attempt's deadline, of a
// recorded call of a caller's attempt: only its record may answer it
// (DESIGN.md §3.7), so its request is still received, but no handler
// deadline is left to bound the wait: it is bounded by the time the
// server gives a record's Finish once its caller may have gone (5 s). A
// trusted peer that opens such a stream and never sends held it for ever.
// It ends DEADLINE_EXCEEDED, as one a grpc-timeout ended, counted once on
// arrival; nothing looked up, begun or run.
func TestR16SrvLateStreamRequestWaitIsBounded(t *testing.T) {
	mp, reader := testMeter(t)
	store := memoryStore(t)
	c := newConsumer()
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { testingv1.RegisterTestServiceServer(s, c) },
		serverOpts(interceptor.WithServerMeterProvider(mp), interceptor.WithAttemptStore(store))...)
	conn := end.DialT(t)
	id, _ := uuid.NewV7()
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate",
		fmt.Sprintf("a=%s;c=0;t=2;d=%d", id, time.Now().Add(-time.Second).UnixMilli()))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, testingv1.TestService_Consume_FullMethodName)
	require.NoError(t, err)
	ended := make(chan error, 1)
	go func() { ended <- s.RecvMsg(new(testingv1.ConsumeResponse)) }()
	select {
	case err = <-ended:
	case <-time.After(30 * time.Second):
		cancel()
		<-ended
		t.Fatal("the server kept waiting for a late try's request")
	}
	st := grpcstatus.Convert(err)
	require.Equal(t, codes.DeadlineExceeded, st.Code(), "%v", err)
	require.Equal(t, "context deadline exceeded", st.Message())
	misses := func() map[string]int64 {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(t.Context(), &rm))
		return r14Misses(t, rm)
	}
	require.Eventually(t, func() bool { return len(misses()) > 0 }, 2*time.Second, 5*time.Millisecond)
	time.Sleep(100 * time.Millisecond) // whatever else would count has had time to
	require.Equal(t, map[string]int64{"arrival": 1}, misses())
	require.Zero(t, c.runs.Load())
	require.Zero(t, store.Len())
}

// r16Ready returns conn once it is connected, so that a stream opened on it
// under a short deadline does not spend it connecting.
func r16Ready(t *testing.T, conn *grpc.ClientConn) *grpc.ClientConn {
	t.Helper()
	conn.Connect()
	for st := conn.GetState(); st != connectivity.Ready; st = conn.GetState() {
		require.True(t, conn.WaitForStateChange(t.Context(), st), "the connection never became ready")
	}
	return conn
}

// r16SilentStream opens, on conn, a server-streaming Consume of a trusted
// peer's attempt a minute long, and sends neither a grpc-timeout nor a
// request, nor cancels: only the server can end it. It returns the
// attempt's ID and the error the stream ended with, failing the test with
// hang (what the server should not have kept waiting for) when the server
// has not ended it within 10 s (a guard against the hang, not a timing
// assertion). cancel cancels the stream's context (also done when the test
// ends).
func r16SilentStream(t *testing.T, conn *grpc.ClientConn, hang string) (id uuid.UUID, cancel context.CancelFunc, err error) {
	t.Helper()
	id, _ = uuid.NewV7()
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate",
		fmt.Sprintf("a=%s;c=0;t=1;d=%d", id, time.Now().Add(time.Minute).UnixMilli()))
	ctx, cancel = context.WithCancel(ctx)
	t.Cleanup(cancel)
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, testingv1.TestService_Consume_FullMethodName)
	require.NoError(t, err)
	ended := make(chan error, 1)
	go func() { ended <- s.RecvMsg(new(testingv1.ConsumeResponse)) }()
	select {
	case err = <-ended:
	case <-time.After(10 * time.Second):
		cancel()
		<-ended
		t.Fatal(hang)
	}
	return id, cancel, err
}
