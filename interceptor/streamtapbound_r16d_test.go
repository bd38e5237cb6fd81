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
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// A review found the defect this test guards against.
//
// With tollgate's admission tap, a server-streaming call received first
// whose request has not come by the tap's bound (the attempt's deadline d
// plus the skew) ends as a grpc-timeout would end it: grpc-go's receive,
// which watches the bound, fails DEADLINE_EXCEEDED, and a try of a
// caller's recorded attempt carries no tollgate detail (only its record,
// which a tollgate client then asks, could answer it). A stats handler
// whose TagRPC gives the RPC a cancellation of its own, which it never
// uses before the RPC ends, moved the wait onto a goroutine (right: its
// context is not the one the reader watches); but when the tap's bound
// ended that context too, receiveFirst took the deadline for one the
// stats handler had set and refused the try NOT_ADMITTED DEADLINE_EXPIRED,
// as one whose context ended before its request came: the same request
// got another answer because the server had a stats handler.
func TestR16dStreamRequestWaitEndedByTheTapsBoundUnderAStatsHandler(t *testing.T) {
	for _, tagged := range []bool{false, true} {
		t.Run(fmt.Sprintf("tagged=%v", tagged), func(t *testing.T) {
			store := memoryStore(t)
			ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 4}),
				admission.WithDefaultClass("work"))
			require.NoError(t, err)
			t.Cleanup(func() { _ = ctrl.Close() })
			opts := serverOpts(interceptor.WithAttemptStore(store), interceptor.WithMaxAttemptTime(time.Minute),
				interceptor.WithAdmission(ctrl))
			if tagged {
				opts = append([]grpc.ServerOption{grpc.StatsHandler(&r16dCancelTagger{tagged: make(chan struct{}, 1)})}, opts...)
			}
			c := newConsumer()
			end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { testingv1.RegisterTestServiceServer(s, c) }, opts...)
			conn := r16Ready(t, end.DialT(t))

			// The receive and the wait's end race: several streams give the
			// wrong answer its chance to show.
			for range 8 {
				r16dTapBoundStream(t, conn)
			}
			require.Zero(t, c.runs.Load(), "nothing ran")
			require.Zero(t, store.Len(), "nothing was begun")
		})
	}
}

// r16dTapBoundStream opens a stream as a trusted peer's attempt 300 ms
// long, with no grpc-timeout, sends no request and does not cancel: only
// the tap's bound ends it, DEADLINE_EXCEEDED without a tollgate detail.
func r16dTapBoundStream(t *testing.T, conn *grpc.ClientConn) {
	id, _ := uuid.NewV7()
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate",
		fmt.Sprintf("a=%s;c=0;t=1;d=%d", id, time.Now().Add(300*time.Millisecond).UnixMilli()))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, testingv1.TestService_Consume_FullMethodName)
	require.NoError(t, err)
	ended := make(chan error, 1)
	go func() { ended <- s.RecvMsg(new(testingv1.ConsumeResponse)) }()
	select {
	case err = <-ended:
	case <-time.After(10 * time.Second): // a guard against a hang, not a timing assertion
		cancel()
		<-ended
		t.Fatal("the server kept waiting for the request past the tap's bound")
	}
	st := grpcstatus.Convert(err)
	require.Equal(t, codes.DeadlineExceeded, st.Code(), "%v", err)
	require.Equal(t, status.KindUnknown, status.OutcomeOf(err).Kind, "no tollgate detail: %v", err)
	require.Empty(t, st.Details(), "%v", err)
}
