package interceptor_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// A review found the defect this test guards against.
//
// receiveFirst receives a server-streaming call's request on the handler's
// goroutine when the stream's context has its own deadline before the
// wait's bound and recvWatches says grpc-go's RecvMsg ends with that
// context. recvWatches compares the context's Done channel with that of the
// transport stream's Context(); but grpc-go v1.85 replaces the transport
// stream's context (SetContext) with the one its stats handler's TagRPC
// returned, after the transport's reader was set up on the earlier one:
// a TagRPC that gives the RPC a deadline (or a cancellation) of its own
// makes recvWatches say yes, while RecvMsg watches only the context the
// transport made. A client that opened the stream and sent nothing then
// held it past that deadline, for as long as it kept the stream open.
//
// With tollgate's admission tap, whose bound RecvMsg does watch, the
// stats handler's earlier deadline must end the wait all the same.
func TestR16cStreamRequestWaitHonoursAStatsHandlersContext(t *testing.T) {
	for _, tap := range []bool{false, true} {
		t.Run(fmt.Sprintf("tap=%v", tap), func(t *testing.T) { r16cStatsHandlerDeadline(t, tap) })
	}
}

func r16cStatsHandlerDeadline(t *testing.T, tap bool) {
	sh := &r16cTimeoutTagger{d: 300 * time.Millisecond}
	conn, c, store := r16StatsHandlerServer(t, tap, sh)
	leaks := goleak.IgnoreCurrent()

	_, cancel, err := r16SilentStream(t, conn, "the server kept waiting for the request after the deadline its stats handler gave the RPC")
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonDeadlineExpired, o.Reason, "%v", err)
	require.Zero(t, c.runs.Load(), "nothing ran")
	require.Zero(t, store.Len(), "nothing was begun")
	cancel()
	require.NoError(t, goleak.Find(r16dIgnoreConn(leaks)...), "the receive's goroutine ends with the stream")
}

// r16cTimeoutTagger is a server stats handler whose TagRPC gives each RPC a
// deadline of its own, released when the RPC ends.
type r16cTimeoutTagger struct {
	d       time.Duration
	mu      sync.Mutex
	cancels map[context.Context]context.CancelFunc
}

type r16cTagKey struct{}

func (h *r16cTimeoutTagger) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	ctx, cancel := context.WithTimeout(ctx, h.d)
	key := new(int)
	ctx = context.WithValue(ctx, r16cTagKey{}, key)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cancels == nil {
		h.cancels = map[context.Context]context.CancelFunc{}
	}
	h.cancels[ctx] = cancel
	return ctx
}

func (h *r16cTimeoutTagger) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.End); !ok {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, cancel := range h.cancels {
		if k.Value(r16cTagKey{}) == ctx.Value(r16cTagKey{}) {
			cancel()
			delete(h.cancels, k)
		}
	}
}

func (*r16cTimeoutTagger) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}

func (*r16cTimeoutTagger) HandleConn(context.Context, stats.ConnStats) {}

// r16StatsHandlerServer serves a consumer on bufconn, with a memory store,
// a server maximum attempt time of a minute, the stats handler sh and,
// with tap, an admission controller (and so its tap), and returns a ready
// connection to it, the consumer and the store.
func r16StatsHandlerServer(t *testing.T, tap bool, sh stats.Handler) (*grpc.ClientConn, *consumer, *idempotency.MemoryStore) {
	t.Helper()
	store := memoryStore(t)
	extra := []interceptor.ServerOption{interceptor.WithAttemptStore(store), interceptor.WithMaxAttemptTime(time.Minute)}
	if tap {
		ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4, QueueItems: 4}),
			admission.WithDefaultClass("work"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = ctrl.Close() })
		extra = append(extra, interceptor.WithAdmission(ctrl))
	}
	c := newConsumer()
	end := testsvc.StartT(t, testsvc.Bufconn, func(s *grpc.Server) { testingv1.RegisterTestServiceServer(s, c) },
		append([]grpc.ServerOption{grpc.StatsHandler(sh)}, serverOpts(extra...)...)...)
	return r16Ready(t, end.DialT(t)), c, store
}
