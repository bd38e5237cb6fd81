package interceptor_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
)

// AdmissionTap(ctrl) — the call form every composed tap used before it took
// options, which still compiles — read default options (30s maximum attempt
// time) while the server's interceptors read WithMaxAttemptTime(2m): the tap
// bounded the stream's context at 30.5s, cutting off a 31s call the server
// allows (found by review). Without options the tap bounds nothing: the
// handler's deadline is the caller's.
func TestAdmissionTapWithoutOptionsBoundsNothing(t *testing.T) {
	ctrl, err := admission.New()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	deadlines := make(chan time.Time, 1)
	svc := &testsvc.Service{
		ApplyFunc: func(ctx context.Context, _ *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			d, _ := ctx.Deadline()
			deadlines <- d
			return &testingv1.ApplyResponse{}, nil
		},
	}
	opts := []interceptor.ServerOption{interceptor.WithAdmission(ctrl), interceptor.WithoutAdmissionTap(),
		interceptor.WithMaxAttemptTime(2 * time.Minute)}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register,
		append(interceptor.ServerOptions(opts...), grpc.InTapHandle(interceptor.AdmissionTap(ctrl)))...)
	c := testingv1.NewTestServiceClient(end.DialT(t))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	_, err = c.Apply(ctx, &testingv1.ApplyRequest{Key: "k"})
	require.NoError(t, err)
	d := <-deadlines
	require.Greater(t, d.Sub(start), 50*time.Second,
		"the handler's deadline is the caller's minute, which the server's 2m maximum allows, not the tap's default 30s")
}

// The tap created its bounded context (a timer) before asking the
// controller, and on a refusal grpc-go drops the returned context without
// cancelling the stream's context (http2_server.go operateHeaders: the tap
// error path returns without s.cancel()): each refused request kept a live
// timer and its contexts (metadata included) until the bound, so memory grew
// with the refusal rate under overload (found by review). The bound is now
// made only for a request the tap lets in.
func TestTapRefusalsDoNotRetainMemory(t *testing.T) {
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	block := make(chan struct{})
	svc := &testsvc.Service{
		ApplyFunc: func(ctx context.Context, _ *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
			<-block
			return &testingv1.ApplyResponse{}, nil
		},
	}
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, interceptor.ServerOptions(interceptor.WithAdmission(ctrl))...)
	c := testingv1.NewTestServiceClient(end.DialT(t))
	go func() { _, _ = c.Apply(t.Context(), &testingv1.ApplyRequest{Key: "hold"}) }()
	require.Eventually(t, func() bool { s, _ := ctrl.Stats().Class("work"); return s.Running == 1 }, 5*time.Second, time.Millisecond)
	defer close(block)

	refuse := func(n int) {
		for range n {
			_, err := c.Apply(t.Context(), &testingv1.ApplyRequest{Key: "x"})
			require.Equal(t, status.KindNotAdmitted, status.OutcomeOf(err).Kind, "%v", err)
		}
	}
	refuse(200) // warm up
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	const n = 5000
	refuse(n)
	after := heap()
	per := (int64(after) - int64(before)) / n
	t.Logf("retained per refused request: %d bytes", per)
	require.Less(t, per, int64(100), "each tap refusal retains memory until the attempt bound")
}
