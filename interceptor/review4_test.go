package interceptor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// A review found that a recorded server-streaming try whose request came
// after the server's maximum attempt time (WithMaxAttemptTime, counted from
// the stream's arrival) had passed was refused DEADLINE_EXPIRED final,
// although only that cap — the try's own loss: a repeat arrives under a
// later one — had passed, and the caller's own deadline was far off: the
// stream interceptor, which receives the request before it begins the try,
// took the cap for the attempt's deadline. A trusted caller's try went to
// the store as a late one and was refused final by it; a minted attempt's
// was refused final at once. Only the caller's own deadline (none, or its
// d or grpc-timeout) may make it final, as tryDeadlineOnly decides for
// admission's refusals.
func TestStreamRequestAfterCapIsNotFinal(t *testing.T) {
	for _, trusted := range []bool{true, false} {
		t.Run(fmt.Sprintf("header=%v", trusted), func(t *testing.T) {
			end := testsvc.StartT(t, testsvc.Bufconn, (&testsvc.Service{}).Register,
				serverOpts(interceptor.WithAttemptStore(noSkewStore(t)), interceptor.WithMaxAttemptTime(100*time.Millisecond))...)
			conn := end.DialT(t)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			if trusted {
				id, _ := uuid.NewV7()
				d := time.Now().Add(10 * time.Second)
				ctx = metadata.AppendToOutgoingContext(ctx, "tollgate", fmt.Sprintf("a=%s;c=0;t=1;d=%d", id, d.UnixMilli()))
			}
			s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, testingv1.TestService_Consume_FullMethodName)
			require.NoError(t, err)
			time.Sleep(250 * time.Millisecond) // past the server's cap, far from the caller's deadline
			require.NoError(t, s.SendMsg(&testingv1.ConsumeRequest{}))
			require.NoError(t, s.CloseSend())
			err = s.RecvMsg(&testingv1.ConsumeResponse{})
			o := status.OutcomeOf(err)
			t.Logf("%v final=%v: %v", status.ReasonName(o.Reason), o.Final(), err)
			require.Equal(t, status.KindNotAdmitted, o.Kind)
			require.Equal(t, status.ReasonDeadlineExpired, o.Reason)
			require.False(t, o.Final(), "only the server's cap, counted from this try's arrival, passed: a repeat gets a new one")
		})
	}
}

// cancelOnRecv is a stream whose context its first received message cancels,
// as a user's interceptor that ends a stream's context might.
type cancelOnRecv struct {
	grpc.ServerStream
	ctx    context.Context
	cancel context.CancelFunc
}

func (s *cancelOnRecv) Context() context.Context { return s.ctx }

func (s *cancelOnRecv) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	s.cancel()
	return err
}

// A review found that contextEnded, for a try whose context was canceled
// (no deadline passed) once the attempt's deadline plus the skew had,
// judged its finality by the context's deadline, which had not come: when
// that deadline is the server's cap (WithMaxAttemptTime), only the try's
// own loss, and the context's deadline lies at or past the caller's own
// deadline (its grpc-timeout, the caller's d at zero skew), the refusal was
// final although the caller's deadline was far off. The deadline that ended
// such a try is the one that passed, by now.
func TestCanceledAfterCapIsNotFinal(t *testing.T) {
	outer := grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		ctx, cancel := context.WithCancel(ss.Context())
		defer cancel()
		return h(srv, &cancelOnRecv{ServerStream: ss, ctx: ctx, cancel: cancel})
	})
	opts := append([]grpc.ServerOption{outer},
		serverOpts(interceptor.WithAttemptStore(noSkewStore(t)), interceptor.WithMaxAttemptTime(100*time.Millisecond))...)
	end := testsvc.StartT(t, testsvc.Bufconn, (&testsvc.Service{}).Register, opts...)
	conn := end.DialT(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	dl, _ := ctx.Deadline()
	id, _ := uuid.NewV7()
	ctx = metadata.AppendToOutgoingContext(ctx, "tollgate", fmt.Sprintf("a=%s;c=0;t=1;d=%d", id, dl.UnixMilli()))
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, testingv1.TestService_Consume_FullMethodName)
	require.NoError(t, err)
	time.Sleep(250 * time.Millisecond) // past the server's cap, far from the caller's deadline
	require.NoError(t, s.SendMsg(&testingv1.ConsumeRequest{}))
	require.NoError(t, s.CloseSend())
	err = s.RecvMsg(&testingv1.ConsumeResponse{})
	o := status.OutcomeOf(err)
	t.Logf("%v final=%v: %v", status.ReasonName(o.Reason), o.Final(), err)
	require.Equal(t, status.KindNotAdmitted, o.Kind)
	require.False(t, o.Final(), "only the server's cap had passed; the caller's deadline is 10 s away")
}
