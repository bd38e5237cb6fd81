package idempotency_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
)

// An operator found that the memory store answered a try of a new call of an
// attempt created longer ago than the TTL (less the skew) with a
// VerifiableFrom, as if a clock had stepped forward and been corrected: the
// ordinary sweep of the attempt's own expired record set the store's swept
// time, and Begin took it for the clock-step case. The interceptor then
// blamed a restart or a clock step. The Redis store, same steps, answers
// a zero VerifiableFrom, as BeginResult documents for an ordinary expiry.
func TestMemoryExpiredAttemptIsNotAClockStep(t *testing.T) {
	clock, p, s := clockedMemory(t)
	clock.Advance(p.Skew)
	k := keyNow(clock, "0")
	beginSucceeded(t, s, clock, k, false, "charged")

	// Past the record's expiry: the next call sweeps it, in the ordinary way.
	clock.Advance(p.TTL + time.Second)
	k1 := k
	k1.Call = "1"
	res := beginNow(t, s, clock, k1, false)
	require.Equal(t, idempotency.RefusedUnverifiable, res.Refusal)
	require.True(t, res.VerifiableFrom.IsZero(), "an attempt past the TTL read as swept by a clock step: VerifiableFrom %v", res.VerifiableFrom)

	// The same, when the sweep came from another write first.
	clock2, p2, s2 := clockedMemory(t)
	clock2.Advance(p2.Skew)
	k2 := keyNow(clock2, "0")
	beginSucceeded(t, s2, clock2, k2, false, "charged")
	clock2.Advance(p2.TTL + time.Second)
	probeNow(t, s2, clock2)
	k2.Call = "1"
	res = beginNow(t, s2, clock2, k2, false)
	require.Equal(t, idempotency.RefusedUnverifiable, res.Refusal)
	require.True(t, res.VerifiableFrom.IsZero(), "VerifiableFrom %v", res.VerifiableFrom)
}
