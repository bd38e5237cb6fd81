package interceptor_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	"github.com/tollgate-go/tollgate/internal/header"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// A review found this defect (the text is the review's account of the
// code before the fix).
//
// A peer's status details can carry any string, and a client reads its
// answer's OutcomeDetail as it came: a hostile or broken peer that names
// the call's own attempt (it reads it from the tollgate header) with a
// megabyte call key and class made every reading of the error copy them,
// and the client put the class on its tollgate.call span as it came
// (tollgate.class), for the exporter to ship. The header bounds an attempt
// ID to 64 characters and a call key to 128 (DESIGN.md §2.1), and Fields a
// class to 256 bytes; a detail's strings are now read within those bounds
// (status.Outcome's Detail), and the span gets the bounded class. A
// megabyte attempt ID, which names another attempt, still makes the
// refusal UNKNOWN, as TestPlainMiddleRelayingARefusalIsUnknown requires.
func TestR15PeersHugeDetailStringsAreBounded(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	for _, tc := range []struct {
		name     string
		ownID    bool // the refusal names the call's own attempt
		wantKind status.Kind
	}{
		{"naming the call's attempt", true, status.KindNotAdmitted},
		{"naming another attempt", false, status.KindUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &testsvc.Service{ApplyFunc: func(ctx context.Context, _ *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
				md, _ := metadata.FromIncomingContext(ctx)
				h, err := header.ParseValues(md.Get(header.Key))
				if err != nil {
					return nil, err
				}
				id := huge
				if tc.ownID {
					id = h.Attempt
				}
				d, err := anypb.New(&tollgatev1.OutcomeDetail{Outcome: tollgatev1.Outcome_OUTCOME_NOT_ADMITTED,
					Reason: tollgatev1.Reason_REASON_QUEUE_FULL, AttemptId: id, Call: huge, Try: 1,
					WorkloadClass: huge, Final: true})
				if err != nil {
					return nil, err
				}
				return nil, grpcstatus.ErrorProto(&spb.Status{Code: int32(codes.ResourceExhausted), Message: "refused", Details: []*anypb.Any{d}})
			}}
			end := testsvc.StartT(t, testsvc.Bufconn, svc.Register) // a plain server: anything may answer
			tp, spans := testTracer(t)
			client := fastClient(t, end, 2, interceptor.WithClientTracerProvider(tp))
			_, err := client.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
			require.Error(t, err)

			o := status.OutcomeOf(err)
			require.Equal(t, tc.wantKind, o.Kind, "the bound changes no reading")
			require.LessOrEqual(t, len(o.Detail.GetAttemptId()), header.MaxAttemptLen)
			require.LessOrEqual(t, len(o.Detail.GetCall()), header.MaxCallLen)
			require.LessOrEqual(t, len(o.Detail.GetWorkloadClass()), 256)
			if tc.ownID {
				require.Equal(t, "…", o.Detail.GetCall(), "a call key beyond the bound names none")
			}

			var found bool
			for _, s := range spans.GetSpans() {
				if s.Name != "tollgate.call" {
					continue
				}
				found = true
				for _, kv := range s.Attributes {
					require.LessOrEqual(t, len(kv.Value.String()), 256, "span attribute %s is bounded", kv.Key)
				}
			}
			require.True(t, found, "precondition: the call's span was exported")
		})
	}
}
