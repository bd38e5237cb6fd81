package status_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/status"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// A review found the defect this test guards against (fixed since; the text
// below is the review's account of the code before the fix).
//
// Bounded, and the details an outcome carries of another error's status
// (WithDetailsOf, OutcomeUnknown), count each detail by the length of its
// type URL and encoded value only, not by the protobuf framing it takes in
// the status as sent: the tags and lengths of its Any's fields and its own
// tag and length in google.rpc.Status. A detail with an empty value costs
// at least 2 bytes on the wire, and up to 9 more for the framing of a
// larger one, so thousands of tiny details pass the 3 KiB bound whole
// (an empty Any counts as 0 bytes: any number of them pass) and push the
// status past a caller's 8 KiB header list limit, which loses the answer
// to a transport INTERNAL. Each detail is now counted by its wire size in
// the status.
func TestR14BoundCountsTheFramingOfDetails(t *testing.T) {
	p := grpcstatus.New(codes.InvalidArgument, "bad request").Proto()
	for range 5000 {
		p.Details = append(p.Details, &anypb.Any{TypeUrl: "t"})
	}
	for range 5000 {
		p.Details = append(p.Details, &anypb.Any{})
	}
	handler := grpcstatus.FromProto(p).Err()
	detailsWire := func(err error) int {
		return proto.Size(&spb.Status{Details: grpcstatus.Convert(err).Proto().GetDetails()})
	}

	bounded := status.Bounded(handler)
	require.Equal(t, codes.InvalidArgument, grpcstatus.Code(bounded))
	require.LessOrEqual(t, detailsWire(bounded), 3<<10, "Bounded: the details as sent fit the bound")
	require.NotEmpty(t, grpcstatus.Convert(bounded).Details(), "what fits is kept")

	// An outcome carries such details after its own (about 100 bytes).
	for _, outcome := range []error{
		status.OutcomeUnknown(handler),
		status.NotAdmitted(status.ReasonQueueFull, status.WithDetailsOf(handler)),
	} {
		require.LessOrEqual(t, detailsWire(outcome), 3<<10+200, "an outcome carries no more than the bound: %.200v", outcome)
	}
}
