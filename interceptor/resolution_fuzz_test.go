package interceptor_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// lyingAttemptService is a peer's AttemptService that answers FenceAttempt
// with whatever record the fuzzer chose: the client reads every field of it
// (state, ids, fence, units, response, status) from the wire.
type lyingAttemptService struct {
	tollgatev1.UnimplementedAttemptServiceServer
	mu       sync.Mutex
	answers  []*tollgatev1.AttemptRecord // answer i to poll i, the last one repeated
	echo     bool                        // copy attempt ID, call and method from the request
	polls    int
	coverRun bool // some answer was FENCED, echoed, covering the try asked about
}

func (s *lyingAttemptService) FenceAttempt(_ context.Context, req *tollgatev1.FenceAttemptRequest) (*tollgatev1.AttemptRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.answers[min(s.polls, len(s.answers)-1)]
	s.polls++
	out := &tollgatev1.AttemptRecord{}
	*out = tollgatev1.AttemptRecord{ // a copy: the record is reused across polls
		AttemptId: rec.AttemptId, Call: rec.Call, Method: rec.Method, State: rec.State, Try: rec.Try,
		StatusCode: rec.StatusCode, StatusMessage: rec.StatusMessage, StatusDetails: rec.StatusDetails,
		Response: rec.Response, ResponseRetained: rec.ResponseRetained, UnitsSpent: rec.UnitsSpent,
		FinishedAt: rec.FinishedAt, FencedThroughTry: rec.FencedThroughTry,
	}
	if s.echo {
		out.AttemptId, out.Call, out.Method = req.GetAttemptId(), req.GetCall(), req.GetMethod()
		if out.State == tollgatev1.AttemptState_ATTEMPT_STATE_FENCED && out.FencedThroughTry >= req.GetFenceThroughTry() {
			s.coverRun = true
		}
	}
	return out, nil
}

// FuzzResolutionAnswer: the FenceAttempt answer is data a
// peer sends; the owner reads it to decide whether to return a stored
// response, a definite error, repeat, or stop. Whatever the answer — any
// state (also undeclared ones), ids that do not match, fences below or above
// the try, negative or huge units, garbage responses and status details —
// the call must return without panicking, never succeed unless a record
// said SUCCEEDED (the handler always fails), and never run the handler again
// unless an answer fenced the try in doubt.
func FuzzResolutionAnswer(f *testing.F) {
	f.Add(int32(3), int32(3), true, uint32(0), int64(1), true, true, []byte{0x0a, 0x01, 0x78}, int32(0), []byte(nil))
	f.Add(int32(5), int32(5), true, uint32(1), int64(-5), true, false, []byte(nil), int32(0), []byte(nil))
	f.Add(int32(5), int32(5), true, uint32(1000), int64(1<<62), true, false, []byte(nil), int32(0), []byte(nil))
	f.Add(int32(2), int32(4), true, uint32(0), int64(0), false, false, []byte(nil), int32(3), []byte{0x08, 0x01})
	f.Add(int32(4), int32(4), true, uint32(0), int64(2), true, false, []byte(nil), int32(14), []byte{0x08, 0x01, 0x10, 0x07})
	f.Add(int32(3), int32(3), false, uint32(0), int64(0), true, true, []byte{0xff, 0xff}, int32(0), []byte(nil))
	f.Add(int32(99), int32(-1), true, uint32(0), int64(0), true, true, []byte{0xff}, int32(-7), []byte{0xff, 0x00})
	f.Add(int32(5), int32(5), true, uint32(0), int64(0), true, false, []byte(nil), int32(0), []byte(nil))
	f.Add(int32(5), int32(5), false, uint32(1), int64(0), true, false, []byte(nil), int32(0), []byte(nil))

	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return nil, grpcstatus.Error(codes.Internal, "boom after a possible effect") // UNKNOWN: the owner asks
	}}
	var current atomic.Pointer[lyingAttemptService]
	end, err := testsvc.Start(testsvc.Bufconn, func(s *grpc.Server) {
		svc.Register(s)
		tollgatev1.RegisterAttemptServiceServer(s, &lyingHolder{cur: &current})
	}, serverOpts()...)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(end.Stop)
	conn, err := end.Dial(interceptor.DialOptions(
		interceptor.WithRetry(interceptor.RetryPolicy{MaxTries: 2, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}),
		interceptor.WithoutRetryBudget(), interceptor.WithAllowance(3),
		interceptor.WithAttemptTimeout(300*time.Millisecond), interceptor.WithResolutionGrace(50*time.Millisecond))...)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = conn.Close() })
	client := testingv1.NewTestServiceClient(conn)

	f.Fuzz(func(t *testing.T, state1, state2 int32, echo bool, fenced uint32, units int64, finished, retained bool,
		response []byte, code int32, detail []byte) {
		rec := func(st int32) *tollgatev1.AttemptRecord {
			r := &tollgatev1.AttemptRecord{
				AttemptId: "0190a5b2-7c3e-7def-8123-456789abcdef", Call: "9", Method: "/x.Y/Z",
				State: tollgatev1.AttemptState(st), Try: fenced, FencedThroughTry: fenced, UnitsSpent: units,
				Response: response, ResponseRetained: retained, StatusCode: code, StatusMessage: "lying peer",
			}
			if finished {
				r.FinishedAt = timestamppb.Now()
			}
			if detail != nil {
				r.StatusDetails = []*anypb.Any{{TypeUrl: "type.googleapis.com/tollgate.v1.OutcomeDetail", Value: detail}}
			}
			return r
		}
		ls := &lyingAttemptService{answers: []*tollgatev1.AttemptRecord{rec(state1), rec(state2)}, echo: echo}
		current.Store(ls)
		before := svc.Calls("Apply")
		_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k", Amount: 1})
		runs := svc.Calls("Apply") - before

		ls.mu.Lock()
		defer ls.mu.Unlock()
		if err == nil && !(echo && (state1 == int32(tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED) ||
			state2 == int32(tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED))) {
			t.Fatalf("the call succeeded, but the handler always fails and no record said SUCCEEDED")
		}
		if runs > 2 || (runs > 1 && !ls.coverRun) {
			t.Fatalf("the handler ran %d times; a fence covering the try in doubt was answered: %v", runs, ls.coverRun)
		}
		if err != nil {
			o := status.OutcomeOf(err)
			t.Logf("outcome %v reason %v code %v", o.Kind, o.Reason, o.Code)
		}
	})
}

// lyingHolder serves the current fuzz input's lyingAttemptService.
type lyingHolder struct {
	tollgatev1.UnimplementedAttemptServiceServer
	cur *atomic.Pointer[lyingAttemptService]
}

func (h *lyingHolder) FenceAttempt(ctx context.Context, req *tollgatev1.FenceAttemptRequest) (*tollgatev1.AttemptRecord, error) {
	return h.cur.Load().FenceAttempt(ctx, req)
}
