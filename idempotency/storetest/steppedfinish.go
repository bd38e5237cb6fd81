package storetest

import (
	"errors"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// testSteppedBackFinish: a try of an attempt created a skew ahead of the
// store's clock (as the skew allows) begins; the clock steps back by less
// than the skew plus the grace (a wall clock may); the try finishes. The
// record must then outlive the absence's evidence, ts - skew + TTL
// (DESIGN.md §3.8): a record gone before it reads UNSEEN, and a fence lays a
// tombstone over a call that SUCCEEDED. A store may refuse the finish
// (ErrNotRunning): its clock reads the attempt as created more than a skew
// ahead; the record then stays as it was begun.
func testSteppedBackFinish(e *env) {
	ahead := e.clock.Now().Add(e.p.Skew)
	k := idempotency.Key{Tenant: "tenant-a", AttemptID: AttemptIDAt(ahead), Call: "0", Method: method}
	e.mustStart(k, 1, e.clock.Now().Add(time.Second))
	back := e.p.Skew + e.p.Grace - time.Millisecond
	e.clock.Advance(-back)
	err := e.s.Finish(e.ctx, idempotency.FinishRequest{Key: k, Try: 1, Fingerprint: fpA,
		State: tollgatev1.AttemptState_ATTEMPT_STATE_SUCCEEDED, Response: []byte("charged")})
	if err != nil && !errors.Is(err, idempotency.ErrNotRunning) {
		require.NoError(e.t, err)
	}
	// The last millisecond in which the absence of k's record is evidence.
	e.clock.Advance(ahead.Add(-e.p.Skew + e.p.TTL - time.Millisecond).Sub(e.clock.Now()))
	require.NotEqual(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, e.get(k).GetState(),
		"the record of a try that ran is gone while its absence is still evidence")
	require.NotEqual(e.t, tollgatev1.AttemptState_ATTEMPT_STATE_FENCED, e.fence(k, 1).GetState(),
		"a fence laid a tombstone over a try that ran")
}
