package idempotency_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	_ "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// A ballot for a method declared NO_SIDE_EFFECTS is answered UNKNOWN and
// fences nothing, as tollgate's server interceptor answers it: such calls
// keep no records, so a tombstone would promise what no try heeds. Before,
// the service alone answered FENCED and stored a tombstone, so the same
// server answered the same ballot two ways depending on whether tollgate's
// interceptor sat in front of it.
func TestAttemptServiceFenceOfRecordlessMethodIsUnknown(t *testing.T) {
	f := newFixture(t)
	client := serve(t, f.store)
	const get = "/tollgate.testing.v1.TestService/Get"
	require.True(t, idempotency.BypassesRecords(get))
	id := storetest.AttemptIDAt(f.clock.Now())

	rec, err := client.FenceAttempt(as("t"), &tollgatev1.FenceAttemptRequest{AttemptId: id, Call: "0", Method: get, FenceThroughTry: 3})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, rec.GetState())
	require.Equal(t, id, rec.GetAttemptId())
	require.Equal(t, "0", rec.GetCall())
	require.Equal(t, get, rec.GetMethod())
	require.Zero(t, rec.GetFencedThroughTry())

	// Nothing was stored: the store still vouches for the call's absence.
	rec, err = client.GetAttempt(as("t"), &tollgatev1.GetAttemptRequest{AttemptId: id, Call: "0", Method: get})
	require.NoError(t, err)
	require.Equal(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec.GetState())

	// A malformed ballot is still INVALID_ARGUMENT, whatever the method.
	_, err = client.FenceAttempt(as("t"), &tollgatev1.FenceAttemptRequest{AttemptId: id, Call: "0", Method: get, FenceThroughTry: 0})
	require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err))
}
