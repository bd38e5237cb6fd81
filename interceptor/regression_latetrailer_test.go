package interceptor_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
)

// gateDeadlock bounds every wait: it only turns a deadlock into a failure.
const gateDeadlock = 30 * time.Second

func gateWait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	timer := time.NewTimer(gateDeadlock)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		t.Fatalf("deadlock: no %s within %v", what, gateDeadlock)
	}
}

// tryOf returns the try named by the tollgate header of the try whose
// (client-side) stats context ctx is: its t field, 1 when absent (the
// header's default), "" without a header.
func tryOf(ctx context.Context) string {
	md, _ := metadata.FromOutgoingContext(ctx)
	vs := md.Get("tollgate")
	if len(vs) == 0 {
		return ""
	}
	for _, f := range strings.Split(vs[0], ";") {
		if strings.HasPrefix(f, "t=") {
			return f[2:]
		}
	}
	return "1"
}

// trailerGate is a client stats handler. Installed before tollgate's, it
// holds the transport's reader in HandleRPC(InTrailer) of try 1 until open
// is closed (a slow stats handler, e.g. an exporter, does the same).
// Installed after tollgate's, it reports when tollgate's handler has seen
// try 1's InTrailer.
type trailerGate struct {
	open  chan struct{} // nil: do not hold
	seen  chan struct{} // nil: do not report
	fired sync.Once
}

func (g *trailerGate) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (g *trailerGate) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (g *trailerGate) HandleConn(context.Context, stats.ConnStats) {}
func (g *trailerGate) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.InTrailer); !ok || tryOf(ctx) != "1" {
		return
	}
	if g.open != nil {
		<-g.open
	}
	if g.seen != nil {
		g.fired.Do(func() { close(g.seen) })
	}
}

// TestLateTrailerOfAnEarlierTryDoesNotMarkTheNext: the transport reader
// delivers a try's InTrailer to the stats handlers before it closes the
// stream, so the client may stop waiting for try 1 (its per-try timeout)
// while try 1's trailer is still on its way to tollgate's handler. That
// trailer must not land in try 2's record: try 2, which never got an answer
// (the caller cancelled it), holds its grant (DESIGN.md §2.3, §3.3: "a call
// whose response never arrived counts its grant as spent until
// reconciled") instead of being settled with try 1's tollgate-spent. Each
// repeat has a delivery record of its own (found by an adversarial review;
// the unary owner once reused one record for every try of a call).
func TestLateTrailerOfAnEarlierTryDoesNotMarkTheNext(t *testing.T) {
	try2 := make(chan struct{})
	var try2Once sync.Once
	leaf := &testsvc.Service{GetFunc: func(ctx context.Context, _ *testingv1.GetRequest) (*testingv1.GetResponse, error) {
		a, _ := interceptor.AttemptFromContext(ctx)
		if a.Try == 1 {
			ledger, _ := budget.FromContext(ctx)
			require.NoError(t, ledger.Take())
			require.NoError(t, ledger.Take()) // try 1 reports tollgate-spent: 2
			return &testingv1.GetResponse{}, nil
		}
		try2Once.Do(func() { close(try2) })
		<-ctx.Done() // try 2 never answers: the caller gives up
		return nil, ctx.Err()
	}}
	end := testsvc.StartT(t, testsvc.Bufconn, leaf.Register, serverOpts()...)

	hold := &trailerGate{open: make(chan struct{})}
	after := &trailerGate{seen: make(chan struct{})}
	var openOnce sync.Once
	openGate := func() { openOnce.Do(func() { close(hold.open) }) }
	t.Cleanup(openGate)
	opts := append([]grpc.DialOption{grpc.WithStatsHandler(hold)}, interceptor.DialOptions(
		interceptor.WithoutRetryBudget(),
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 2, PerTryTimeout: 300 * time.Millisecond,
			InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
	)...)
	opts = append(opts, grpc.WithStatsHandler(after))
	client := testingv1.NewTestServiceClient(end.DialT(t, opts...))

	ctx, err := interceptor.StartAttempt(t.Context(), 10, 30*time.Second)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(budget.WithGrant(ctx, 3))
	defer cancel()
	ledger, _ := budget.FromContext(ctx)

	done := make(chan struct{})
	var callErr error
	go func() {
		defer close(done)
		_, callErr = client.Get(ctx, &testingv1.GetRequest{})
	}()
	// Try 1 answered, but its trailer is held in the reader; the client's
	// per-try timeout ends it (no InTrailer seen: its grant of 3 is held)
	// and the owner sends try 2 (Get is NO_SIDE_EFFECTS).
	gateWait(t, try2, "try 2 at the server")
	openGate() // the reader now delivers try 1's trailer
	gateWait(t, after.seen, "try 1's InTrailer at tollgate's stats handler")
	cancel() // try 2 never gets an answer
	gateWait(t, done, "the call's end")
	require.Error(t, callErr)

	snap := ledger.Snapshot()
	require.Equal(t, budget.Snapshot{Total: 10, Free: 4, Held: 6, Origin: true}, snap,
		"neither try's answer arrived at the owner: both grants (3+3) are held, nothing is known spent")
}
