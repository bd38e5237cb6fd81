package interceptor_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// A review (r15) found the unary and the stream owner disagreeing about the
// verifying try: the try that follows a resolution which found a finished
// record under the call's explicit key, and which the store answers from
// that record (it runs nothing, and needs no unit below: DESIGN.md §1, an
// allowance is what the layers below the origin may spend, and §3.3,
// AttemptService queries are never charged, one retry-budget token per
// resolution bounding them). The unary owner sends it at once, at the
// origin past a spent allowance, covered by the resolution's token. The
// stream owner sent it as any repeat, through proceed:
//
//   - at the origin, once the callee had spent every unit, it refused the
//     verifying try locally, and the stream ended UNKNOWN where the record
//     would have said COMMITTED;
//   - with units left, proceed withdrew a second retry-budget token for it,
//     so one resolution path cost the target's budget two tokens (and, with
//     a budget of one, ended UNKNOWN RETRY_BUDGET_EXHAUSTED).
//
// Each case below runs one call keyed "pay" at the origin, whose first try
// runs (recorded SUCCEEDED) and whose answer a proxy loses, then probes how
// many of the target's two retry-budget tokens are left. Unary and stream
// must agree: the verifying try is sent (two tries reach the server, the
// handler runs once), the call ends with the record's answer (the stored
// response; COMMITTED for a stream), and exactly one token was spent.
func TestStreamVerifyingTryAgreesWithUnary(t *testing.T) {
	for _, spent := range []bool{true, false} {
		name := "allowance-left"
		if spent {
			name = "allowance-spent"
		}
		t.Run(name, func(t *testing.T) {
			t.Run("unary", func(t *testing.T) {
				v := newVerifyCase(t, spent)
				resp, err := v.client.Apply(v.ctx(t), &testingv1.ApplyRequest{Key: "acct", Amount: 7})
				require.NoError(t, err, "the record holds this request's response: %v", status.OutcomeOf(err))
				require.Equal(t, int64(7), resp.GetTotal())
				v.check(t, &v.applies)
			})
			t.Run("stream", func(t *testing.T) {
				v := newVerifyCase(t, spent)
				err := chatOnce(t, v.ctx(t), v.client)
				o := status.OutcomeOf(err)
				require.Equal(t, status.KindCommitted, o.Kind,
					"the record says the stream took effect, as the verifying try would learn: %v (reason %s)", err, status.ReasonName(o.Reason))
				v.check(t, &v.chats)
			})
		})
	}
}

// verifyCase is one run of TestStreamVerifyingTryAgreesWithUnary: a
// recorded server whose Apply and Chat handlers spend the handler's one unit
// when spend is set, whose first Apply and first Chat answers are lost, and
// whose Get sheds each key's first try (the token probe); and a client of it
// with three tries and a retry budget of two tokens that never refills.
type verifyCase struct {
	client         testingv1.TestServiceClient
	ledger         *ledgerService
	applies, chats atomic.Int32
	chatRuns       atomic.Int32
	spend          bool
	getMu          sync.Mutex
	getRuns        map[string]int
}

func newVerifyCase(t *testing.T, spend bool) *verifyCase {
	t.Helper()
	v := &verifyCase{spend: spend, getRuns: map[string]int{}}
	v.ledger = newLedger(func(ctx context.Context, _ *testingv1.ApplyRequest) {
		if spend {
			spendOne(t, ctx)
		}
	})
	v.ledger.ChatFunc = func(st grpc.BidiStreamingServer[testingv1.ChatRequest, testingv1.ChatResponse]) error {
		v.chatRuns.Add(1)
		if spend {
			spendOne(t, st.Context())
		}
		return drainChat(st)
	}
	v.ledger.GetFunc = func(_ context.Context, r *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		v.getMu.Lock()
		v.getRuns[r.GetKey()]++
		first := v.getRuns[r.GetKey()] == 1
		v.getMu.Unlock()
		if first {
			return nil, shed()
		}
		return &testingv1.GetResponse{Value: "ok"}, nil
	}
	loseFirstApply := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if info.FullMethod != testingv1.TestService_Apply_FullMethodName || v.applies.Add(1) != 1 {
			return h(ctx, req)
		}
		_, _ = h(ctx, req) // recorded SUCCEEDED; the proxy loses the answer
		return nil, grpcstatus.Error(codes.Internal, "proxy: upstream connection reset")
	})
	end := recordedServer(t, &v.ledger.Service, memoryStore(t), loseFirstApply, loseFirstChatAnswer(&v.chats))
	v.client = testingv1.NewTestServiceClient(end.DialT(t, interceptor.DialOptions(fastRetry(3),
		interceptor.WithRetryBudget(budget.WithRetryRatio(0), budget.WithMinRetriesPerSecond(0), budget.WithMaxRetryTokens(2)))...))
	return v
}

// ctx is the call's context: a new attempt of one unit (which the handler
// spends when spend is set), the call keyed "pay".
func (v *verifyCase) ctx(t *testing.T) context.Context {
	units := int64(1)
	if !v.spend {
		units = 4
	}
	ctx, err := interceptor.StartAttempt(t.Context(), units, 5*time.Second)
	require.NoError(t, err)
	return interceptor.WithCallKey(ctx, "pay")
}

// check requires, after the call: two tries of it reached the server (the
// first, whose answer was lost, and the verifying try), its handler ran
// once, and exactly one of the two retry-budget tokens was spent (the
// resolution's): call "b" gets the token left for its repeat, call "c"
// finds none.
func (v *verifyCase) check(t *testing.T, tries *atomic.Int32) {
	t.Helper()
	require.EqualValues(t, 2, tries.Load(), "the verifying try reached the server")
	require.EqualValues(t, 1, v.ledger.effects.Load()+int64(v.chatRuns.Load()), "the handler ran once")
	_, err := v.client.Get(t.Context(), &testingv1.GetRequest{Key: "b"})
	require.NoError(t, err, "no retry-budget token left: the call spent two (%v)", status.OutcomeOf(err))
	_, err = v.client.Get(t.Context(), &testingv1.GetRequest{Key: "c"})
	require.Equal(t, status.ReasonRetryBudgetExhausted, status.OutcomeOf(err).Reason,
		"a token was left: the call spent none (%v)", err)
}
