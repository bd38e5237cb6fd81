package interceptor_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// cancelSwitch is the cancel function of the try in flight, set by an
// interceptor chained outside tollgate's (as a user's timeout interceptor
// would cut a try) and pulled by the store while it begins the try.
type cancelSwitch struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	armed  bool
}

func (c *cancelSwitch) set(f context.CancelFunc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cancel = f
}

// pull cancels the try once, if armed, and reports whether it did.
func (c *cancelSwitch) pull() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.armed || c.cancel == nil {
		return false
	}
	c.armed = false
	c.cancel()
	return true
}

// lostReplyHook runs a pipeline (the Redis store's Begin script) and then,
// when its switch is armed, cancels the try and loses the script's reply to
// the cancellation: Redis ran the script, the store reads only the
// context's error, as when a client's cancel arrives while the reply is on
// its way.
type lostReplyHook struct{ sw *cancelSwitch }

func (lostReplyHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h lostReplyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil || cmd.Name() != "evalsha" || !h.sw.pull() {
			return err
		}
		<-ctx.Done() // the try's own context: the switch just ended it
		cmd.SetErr(ctx.Err())
		return ctx.Err()
	}
}
func (h lostReplyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err != nil || !h.sw.pull() {
			return err
		}
		<-ctx.Done() // the try's own context: the switch just ended it
		for _, c := range cmds {
			c.SetErr(ctx.Err())
		}
		return ctx.Err()
	}
}

// cancelBeforeBegin is a memory store whose Begin cancels the try first
// (when its switch is armed): the cancellation comes while the try waits
// for the store.
type cancelBeforeBegin struct {
	*idempotency.MemoryStore
	sw *cancelSwitch
}

func (s cancelBeforeBegin) Begin(ctx context.Context, req idempotency.BeginRequest) (idempotency.BeginResult, error) {
	if s.sw.pull() {
		<-ctx.Done()
	}
	return s.MemoryStore.Begin(ctx, req)
}

// Review 13 asked whether a recorded unary try, whose store Begin runs on
// the client's (cancellable) context while its handler would run detached,
// can have its record begun while the server answers that it was not
// admitted, or the reverse, when the try is canceled during Begin. It
// cannot: the server answers NOT_ADMITTED (no reason, not final), and the
// record agrees — absent (memory: the cancel came first) or a tombstone of
// the try (Redis: the script ran and its reply was lost, and the store
// fenced what it may have begun) — so the next try of the call starts and
// runs the handler once, and a query reads no try that ran.
func TestReview13CancelDuringBeginAgreesWithRecord(t *testing.T) {
	for _, backend := range []string{"memory", "redis"} {
		t.Run(backend, func(t *testing.T) {
			sw := &cancelSwitch{}
			var store idempotency.Store
			switch backend {
			case "memory":
				store = cancelBeforeBegin{MemoryStore: memoryStore(t), sw: sw}
			case "redis":
				c, prefix := killRedis(t)
				c.AddHook(lostReplyHook{sw: sw})
				rs, err := redisstore.New(t.Context(), c, redisstore.WithPrefix(prefix), redisstore.WithPolicy(killPolicy(0)))
				require.NoError(t, err)
				t.Cleanup(func() { _ = rs.Close() }) // after the server's stop (cleanups run last first)
				store = rs
			}
			outer := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				ctx, cancel := context.WithCancel(ctx)
				defer cancel()
				sw.set(cancel)
				return h(ctx, req)
			})
			svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
				return &testingv1.ApplyResponse{}, nil
			}}
			end := recordedServer(t, svc, store, outer)
			client := testingv1.NewTestServiceClient(end.DialT(t))
			query := tollgatev1.NewAttemptServiceClient(end.DialT(t))
			// A call of an attempt minted by the server starts the tenant's
			// horizon on Redis; the test's attempt is created after it.
			_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "warm"})
			require.NoError(t, err)
			for start := time.Now().UnixMilli(); time.Now().UnixMilli() <= start; {
				runtime.Gosched()
			}

			id, _ := uuid.NewV7()
			d := time.Now().Add(5 * time.Second)
			try := func(n int) error {
				ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", fmt.Sprintf("a=%s;c=0;t=%d;d=%d", id, n, d.UnixMilli()))
				_, err := client.Apply(ctx, &testingv1.ApplyRequest{Key: "k"})
				return err
			}
			sw.mu.Lock()
			sw.armed = true
			sw.mu.Unlock()
			err = try(1)
			sw.mu.Lock()
			pulled := !sw.armed
			sw.mu.Unlock()
			require.True(t, pulled, "the try was canceled during its Begin")
			o := status.OutcomeOf(err)
			require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
			require.False(t, o.Final(), "%v", err)
			require.EqualValues(t, 1, svc.Calls("Apply"), "the handler did not run (only the warm-up call ran)")

			ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", fmt.Sprintf("a=%s;c=0;t=1;d=%d", id, d.UnixMilli()))
			rec, err := query.GetAttempt(ctx, &tollgatev1.GetAttemptRequest{AttemptId: id.String(), Call: "0",
				Method: testingv1.TestService_Apply_FullMethodName})
			require.NoError(t, err)
			require.Contains(t, []tollgatev1.AttemptState{tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED},
				rec.GetState(), "the record says no try ran, as the answer did: %v", rec)

			require.NoError(t, try(2), "the call's next try starts")
			require.EqualValues(t, 2, svc.Calls("Apply"))
		})
	}
}
