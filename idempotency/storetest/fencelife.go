package storetest

import (
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// testFenceOutlivesFencedTry: the Store API gives Fence and Get no
// deadline d, while records must be kept until d + skew + grace (DESIGN.md
// §3.7), so a review asked whether a tombstone laid by a fence can expire
// before the fenced try's deadline, letting the try begin after all. It
// cannot start: a fence lays a tombstone only for an attempt created at
// most a skew after its reading, and keeps it a TTL from that reading,
// until the attempt's time - skew + TTL or later, after which the absence
// of any record of the attempt is no evidence and every try is refused
// UNVERIFIABLE, whatever its deadline (Minted or not). Here the attempt is
// created a skew ahead of the fence (its tombstone's shortest life) and
// its try carries a deadline past the tombstone's expiry.
func testFenceOutlivesFencedTry(e *env) {
	k := e.key()
	k.AttemptID = AttemptIDAt(e.clock.Now().Add(e.p.Skew))
	rec := e.fence(k, 1)
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, rec.GetState())
	gone := e.clock.Now().Add(e.p.TTL) // the attempt's time - skew + TTL
	d := gone.Add(5 * time.Second)
	e.clock.Advance(gone.Add(-time.Millisecond).Sub(e.clock.Now()))
	res := e.begin(k, 1, fpA, d)
	require.Equal(e.t, idempotency.RefusedFenced, res.Refusal, "the tombstone stands until the attempt's time - skew + TTL")

	e.clock.Advance(time.Millisecond)
	for _, minted := range []bool{false, true} {
		res, err := e.s.Begin(e.ctx, idempotency.BeginRequest{Key: k, Try: 1, Fingerprint: fpA, Deadline: d, Minted: minted})
		require.NoError(e.t, err)
		require.False(e.t, res.Started, "the fenced try began once its tombstone expired (minted %v)", minted)
		require.Equal(e.t, idempotency.RefusedUnverifiable, res.Refusal, "minted %v", minted)
	}
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, e.get(k).GetState(), "never UNSEEN")
	require.Equal(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNKNOWN, e.fence(k, 1).GetState(), "no new tombstone")
	res = e.begin(k, 2, fpA, d)
	require.False(e.t, res.Started)
}
