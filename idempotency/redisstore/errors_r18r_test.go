package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/redisstore"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// An operator found that a Finish with another request's fingerprint said
// "the record is ATTEMPT_STATE_IN_PROGRESS with try 1" of the running try 1
// itself, and that a tenant at its record bound was refused with
// "idempotency: store unavailable: idempotency: store full: …". The first
// now says the fingerprint differs; the second says each thing once, and
// still matches both sentinels.
func TestRedisErrorsSayWhatHappenedOnce_r18r(t *testing.T) {
	c, prefix := newClient(t)
	ctx := context.Background()
	s := newStore(t, c, prefix, redisstore.WithMaxRecordsPerTenant(1))
	lookUp(t, s, "acme")
	time.Sleep(idempotency.DefaultPolicy().Skew + 2*time.Millisecond)
	k := idempotency.Key{Tenant: "acme", AttemptID: storetest.AttemptIDAt(time.Now()), Call: "0", Method: "/x.Y/Z"}
	res, err := s.Begin(ctx, idempotency.BeginRequest{Key: k, Try: 1, Fingerprint: idempotency.Digest{1}, Deadline: time.Now().Add(5 * time.Second)})
	require.NoError(t, err)
	require.True(t, res.Started, "%v", res.Refusal)
	err = s.Finish(ctx, idempotency.FinishRequest{Key: k, Try: 1, Fingerprint: idempotency.Digest{2},
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED})
	require.ErrorIs(t, err, idempotency.ErrNotRunning)
	require.ErrorContains(t, err, "fingerprint")

	k1 := k
	k1.Call = "1"
	_, err = s.Fence(ctx, k1, 1)
	require.ErrorIs(t, err, idempotency.ErrStoreFull)
	require.ErrorIs(t, err, idempotency.ErrStoreUnavailable)
	for _, part := range []string{"idempotency:", "store unavailable", "store full"} {
		require.LessOrEqual(t, strings.Count(err.Error(), part), 1, "%q says %q more than once", err, part)
	}
}
