package interceptor_test

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// A review found that the message of a status tollgate rebuilds was
// unbounded, although its details were bounded (TestDetailsChainCarries
// BoundedDetails): tollgate embeds the other error's message in its own (an
// unknown outcome's cause, a re-addressed refusal's text, the last try of a
// spent retry budget…), and the message goes on the wire twice, as
// grpc-message and again inside grpc-status-details-bin, base64-encoded. A
// handler's 4 KiB message at the bottom of a chain of tollgate tiers thus
// made a trailer of over 9 KiB, which a caller whose header list limit is
// 8 KiB (grpc-java's and gRPC C++'s default) refuses: it read a detail-less
// INTERNAL, an unknown outcome, where the callee had refused the call. The
// message of an outcome tollgate builds is now bounded (status,
// # Messages): the answer arrives, its message cut in the middle.
func TestMessageChainKeepsAnswerOfLargeMessage(t *testing.T) {
	big := strings.Repeat("é", 2<<10) // 4 KiB of UTF-8, 12 KiB percent-encoded
	for _, tc := range []struct {
		name    string
		handler func() error
		want    tollgatev1.Outcome
	}{
		{"refusal", func() error {
			// A handler explains its refusal with what its backend said.
			return status.WithoutEffect(status.NotAdmitted(status.ReasonShed, status.WithMessage("backend: "+big)))
		}, tollgatev1.Outcome_OUTCOME_NOT_ADMITTED},
		{"refusal with details", func() error {
			// The same, with as many details as a rebuilt status carries.
			p := grpcstatus.Convert(status.NotAdmitted(status.ReasonShed, status.WithMessage("backend: "+big))).Proto()
			a, err := anypb.New(&errdetails.DebugInfo{Detail: strings.Repeat("x", 3<<10-100)})
			require.NoError(t, err)
			p.Details = append(p.Details, a)
			return status.WithoutEffect(grpcstatus.FromProto(p).Err())
		}, tollgatev1.Outcome_OUTCOME_NOT_ADMITTED},
		{"unknown", func() error {
			return grpcstatus.Error(codes.Unavailable, "backend: "+big)
		}, tollgatev1.Outcome_OUTCOME_UNKNOWN},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dep := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
				return nil, tc.handler()
			}}
			next := testsvc.StartT(t, testsvc.Bufconn, dep.Register, serverOpts()...)
			// Two middle tiers, each passing up what it got; their clients
			// keep grpc-go's large default header list limit.
			for range 2 {
				below := testingv1.NewTestServiceClient(next.DialT(t, interceptor.DialOptions(fastRetry(1))...))
				mid := &testsvc.Service{ApplyFunc: func(ctx context.Context, r *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
					resp, err := below.Apply(ctx, r)
					if err != nil && status.OutcomeOf(err).Kind == status.KindNotAdmitted {
						return nil, status.WithoutEffect(err) // nothing ran below: pass the refusal up
					}
					return resp, err
				}}
				next = testsvc.StartT(t, testsvc.Bufconn, mid.Register, serverOpts()...)
			}
			origin := testingv1.NewTestServiceClient(next.DialT(t, append(interceptor.DialOptions(fastRetry(1)),
				grpc.WithMaxHeaderListSize(8<<10))...))

			_, err := origin.Apply(t.Context(), &testingv1.ApplyRequest{Key: "k"})
			o := status.OutcomeOf(err)
			require.NotNil(t, o.Detail, "the answer was lost: %.200v", err)
			require.Equal(t, tc.want, o.Detail.GetOutcome(), "%.200v", err)
			msg := grpcstatus.Convert(err).Message()
			require.LessOrEqual(t, percentEncodedSize(msg), 1<<10, "the message is bounded as grpc-message sends it (status, # Messages: 1 KiB)")
			require.True(t, utf8.ValidString(msg), "cut on a rune boundary")
			require.True(t, strings.HasPrefix(msg, "tollgate: "), "tollgate's own words come first: %q", msg)
			require.Contains(t, msg, "backend: é", "the message keeps the start of what the handler said")
			require.Contains(t, msg, "…", "the cut is marked")
			require.NotContains(t, msg, "RST_STREAM")
		})
	}
}

// percentEncodedSize is the size of msg as grpc-message carries it: every
// byte outside printable ASCII, and '%', percent-encoded.
func percentEncodedSize(msg string) int {
	n := 0
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c < ' ' || c > '~' || c == '%' {
			n += 3
		} else {
			n++
		}
	}
	return n
}
