package interceptor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// r14Header is the tollgate header of try n of call "0" of attempt id with
// deadline d.
func r14Header(ctx context.Context, id uuid.UUID, n int, d time.Time) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "tollgate", fmt.Sprintf("a=%s;c=0;t=%d;d=%d", id, n, d.UnixMilli()))
}

// r14DetailsWireSize is what details take in a status as it is sent.
func r14DetailsWireSize(details []*anypb.Any) int {
	return proto.Size(&spb.Status{Details: details})
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
//
// The server bounds a handler's fresh definite error (status.Bounded in
// answer) before it answers and records it, but a try answered from a
// finished record is sent what the record holds, unbounded: a FAILED record
// written by a build from before the bound, or by a store directly, whose
// message or details are larger than a caller's header list limit (8 KiB
// in grpc-java and gRPC C++) is lost by that caller to a transport
// INTERNAL, on every later try of the call. What is replayed must be
// bounded as the fresh answer is, and every later try reads the same one.
func TestR14ReplayOfAStoredFailedRecordIsBounded(t *testing.T) {
	big := strings.Repeat("x", 64<<10)
	var details []*anypb.Any
	for i := range 3 {
		a, err := anypb.New(&errdetails.DebugInfo{Detail: fmt.Sprintf("%d", i) + strings.Repeat("y", 16<<10)})
		require.NoError(t, err)
		details = append(details, a)
	}
	for _, tc := range []struct {
		name    string
		state   tollgatev1.AttemptState
		code    codes.Code
		msg     string
		details []*anypb.Any
	}{
		{"failed message", tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, codes.InvalidArgument, "bad request: " + big, nil},
		{"failed details", tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, codes.InvalidArgument, "bad request", details},
		{"unknown message and details", tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, codes.Internal, "lost: " + big, details},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := memoryStore(t)
			svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
				return &testingv1.ApplyResponse{}, nil
			}}
			end := recordedServer(t, svc, store)
			client := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithMaxHeaderListSize(8<<10)))

			// Try 1's record, as an older build (or the store itself) left it.
			id, _ := uuid.NewV7()
			d := time.Now().Add(5 * time.Second)
			req := &testingv1.ApplyRequest{Key: "k"}
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
			require.NoError(t, err)
			method := testingv1.TestService_Apply_FullMethodName
			key := idempotency.Key{AttemptID: id.String(), Call: "0", Method: method}
			fp := idempotency.Fingerprint(method, b)
			res, err := store.Begin(t.Context(), idempotency.BeginRequest{Key: key, Try: 1, Fingerprint: fp, Deadline: d})
			require.NoError(t, err)
			require.True(t, res.Started)
			require.NoError(t, store.Finish(t.Context(), idempotency.FinishRequest{Key: key, Try: 1, Fingerprint: fp,
				State: tc.state, Code: tc.code, Message: tc.msg, Details: tc.details}))

			var answers []string
			for n := 2; n <= 3; n++ {
				_, err := client.Apply(r14Header(t.Context(), id, n, d), req)
				st := grpcstatus.Convert(err)
				require.Equal(t, tc.code, st.Code(), "the record's answer arrives: %.300v", err)
				require.LessOrEqual(t, len(st.Message()), 1<<10, "the message is bounded")
				require.LessOrEqual(t, r14DetailsWireSize(st.Proto().GetDetails()), 4<<10,
					"the details are bounded (3 KiB carried, and tollgate's own)")
				answers = append(answers, st.Message())
			}
			require.Equal(t, answers[0], answers[1], "every try reads the same message")
			require.Zero(t, svc.Calls("Apply"), "the record answered: nothing ran")
		})
	}
}

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
//
// status.Bounded counts each detail by its type URL and encoded value
// only, not by the protobuf framing each detail takes in the status as
// sent (its Any's field tags and lengths, and its own tag and length in
// the status): thousands of tiny details count as next to nothing and pass
// the 3 KiB bound whole, and a handler's definite error carrying them
// reaches a caller whose header list limit is 8 KiB as a transport
// INTERNAL, while its record holds them all.
func TestR14ManyTinyDetailsAreBounded(t *testing.T) {
	store := memoryStore(t)
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		p := grpcstatus.New(codes.InvalidArgument, "bad request").Proto()
		for range 5000 {
			p.Details = append(p.Details, &anypb.Any{TypeUrl: "t"})
		}
		return nil, grpcstatus.FromProto(p).Err()
	}}
	end := recordedServer(t, svc, store)
	client := testingv1.NewTestServiceClient(end.DialT(t, grpc.WithMaxHeaderListSize(8<<10)))

	id, _ := uuid.NewV7()
	d := time.Now().Add(5 * time.Second)
	_, err := client.Apply(r14Header(t.Context(), id, 1, d), &testingv1.ApplyRequest{Key: "k"})
	st := grpcstatus.Convert(err)
	require.Equal(t, codes.InvalidArgument, st.Code(), "the definite answer arrives: %.300v", err)
	require.LessOrEqual(t, r14DetailsWireSize(st.Proto().GetDetails()), 3<<10)
	require.NotEmpty(t, st.Proto().GetDetails(), "what fits is kept")

	rec, err := store.Get(t.Context(), idempotency.Key{AttemptID: id.String(), Call: "0", Method: testingv1.TestService_Apply_FullMethodName})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, rec.GetState())
	require.LessOrEqual(t, r14DetailsWireSize(rec.GetStatusDetails()), 3<<10, "the record holds what was answered")
}
