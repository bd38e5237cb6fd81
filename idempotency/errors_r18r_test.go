package idempotency_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// An operator found three errors that mislead.
//
// A Finish with another request's fingerprint said "the record is
// ATTEMPT_STATE_IN_PROGRESS with try 1" of the running try 1 itself, and
// ErrNotRunning's doc did not list that cause. It now says the fingerprint
// differs.
func TestFinishWithAnotherFingerprintSaysSo(t *testing.T) {
	clock, _, s := clockedMemory(t)
	clock.Advance(storetest.Policy().Skew)
	k := keyNow(clock, "0")
	res, err := s.Begin(context.Background(), idempotency.BeginRequest{Key: k, Try: 1, Fingerprint: idempotency.Digest{1},
		Deadline: clock.Now().Add(5 * time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started)
	err = s.Finish(context.Background(), idempotency.FinishRequest{Key: k, Try: 1, Fingerprint: idempotency.Digest{2},
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED})
	require.ErrorIs(t, err, idempotency.ErrNotRunning)
	require.ErrorContains(t, err, "fingerprint")
}

// A FAILED finish without a status code said "malformed key", though the
// key was fine; it still matches ErrMalformedKey, as every malformed input.
func TestMalformedFinishIsNotAMalformedKey(t *testing.T) {
	clock, _, s := clockedMemory(t)
	k := keyNow(clock, "0")
	err := s.Finish(context.Background(), idempotency.FinishRequest{Key: k, Try: 1,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_FAILED, Code: codes.OK})
	require.ErrorIs(t, err, idempotency.ErrMalformedKey)
	require.NotContains(t, err.Error(), "malformed key")
	require.ErrorContains(t, err, "status code")
}

// A tenant at its record bound was refused with "idempotency: store
// unavailable: idempotency: store full: …", and the AttemptService's
// NOT_ADMITTED STORE_UNAVAILABLE said "store unavailable" a third time.
// Each is said once now; errors.Is still matches both sentinels.
func TestStoreFullSaysEachThingOnce(t *testing.T) {
	f := newFixture(t, idempotency.WithMaxRecordsPerTenant(1))
	_, err := f.store.Fence(context.Background(), idempotency.Key{Tenant: "t", AttemptID: storetest.AttemptIDAt(f.clock.Now()), Call: "0", Method: placeMethod}, 1)
	require.NoError(t, err)
	_, err = f.store.Fence(context.Background(), idempotency.Key{Tenant: "t", AttemptID: storetest.AttemptIDAt(f.clock.Now()), Call: "1", Method: placeMethod}, 1)
	require.ErrorIs(t, err, idempotency.ErrStoreFull)
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	onceEach(t, err.Error())

	client := serve(t, f.store)
	_, err = client.FenceAttempt(as("t"), &tollgatev1.FenceAttemptRequest{AttemptId: storetest.AttemptIDAt(f.clock.Now()), Call: "2", Method: placeMethod, FenceThroughTry: 1})
	require.Error(t, err)
	onceEach(t, grpcstatus.Convert(err).Message())
}

// onceEach requires msg to say "idempotency:", "store unavailable" and
// "store full" at most once each.
func onceEach(t *testing.T, msg string) {
	t.Helper()
	for _, s := range []string{"idempotency:", "store unavailable", "store full"} {
		require.LessOrEqual(t, strings.Count(msg, s), 1, "%q says %q more than once", msg, s)
	}
}
