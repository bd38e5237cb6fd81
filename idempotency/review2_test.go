package idempotency_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
)

// A second review of bfc1e2c (the memory store never vouches for an attempt
// created no later than the newest one whose record it swept): its commit
// said that, with the clock going forward, such attempts were past their
// evidence anyway, "so nothing else changes". Not so when the server's clock
// stayed stepped forward longer than the TTL and the server minted attempts
// meanwhile (callers that send no tollgate header): their records, created
// at the stepped time, are swept by the stepped clock, and once the clock is
// corrected every new attempt — created before that stepped time — is
// refused as unverifiable until real time catches up, an hour for a clock an
// hour ahead. The refusal is right (by its time alone such an attempt cannot
// be told from one whose record was swept), and final; but it came with no
// VerifiableFrom, so the server sent no retry-after, and its caller was told
// a new attempt could succeed at once: each new attempt was refused again.
// It now says, as the horizon's refusal does, from when a new attempt can
// be vouched for.
func TestMemorySweptRefusalSaysWhenANewAttemptCanPass(t *testing.T) {
	clock, p, s := clockedMemory(t)

	// The clock steps an hour ahead and stays there longer than the TTL;
	// the server mints an attempt for a request, which SUCCEEDS.
	step := time.Hour
	clock.Advance(step)
	minted := keyNow(clock, "0")
	mintedAt := clock.Now()
	beginSucceeded(t, s, clock, minted, true, "ok")
	clock.Advance(p.TTL + 2*time.Second)
	probeNow(t, s, clock) // this reading sweeps the minted attempt's record

	// NTP corrects the clock: a caller's new attempt, created now.
	clock.Advance(-step)
	res := beginNow(t, s, clock, keyNow(clock, "0"), false)
	require.False(t, res.Started, "precondition: an attempt created before a swept one is not vouched for")
	require.Equal(t, idempotency.RefusedUnverifiable, res.Refusal)
	require.False(t, res.VerifiableFrom.IsZero(),
		"the refusal does not say when a new attempt can be vouched for: its caller repeats new attempts at once, each refused again")
	require.True(t, res.VerifiableFrom.After(mintedAt), "a new attempt created no later than the swept one is vouched for: %v", res.VerifiableFrom)

	// A new attempt created from then is started; the swept one is not.
	clock.Advance(res.VerifiableFrom.Sub(clock.Now()))
	res = beginNow(t, s, clock, keyNow(clock, "0"), false)
	require.True(t, res.Started, "an attempt created at VerifiableFrom was refused %v", res.Refusal)
	rec, err := s.Get(context.Background(), minted)
	require.NoError(t, err)
	require.NotEqual(t, tollgatev1.AttemptState_ATTEMPT_STATE_UNSEEN, rec.GetState(), "the swept attempt reads UNSEEN")
}

// bfc1e2c's rule also refused an attempt the server minted for the request
// (BeginRequest.Minted: its caller sent no tollgate header, or is not
// trusted) while a swept attempt was created later than it. A minted attempt
// is new: no try of it can have run before, so no record of it can have been
// swept (the horizon skips it for that reason), and every request of such a
// caller was refused as unverifiable until real time passed the swept
// attempt's time.
func TestMemoryMintedAttemptIsNotRefusedForASweptOne(t *testing.T) {
	clock, p, s := clockedMemory(t)

	step := time.Hour
	clock.Advance(step)
	beginSucceeded(t, s, clock, keyNow(clock, "0"), true, "ok")
	clock.Advance(p.TTL + 2*time.Second)
	probeNow(t, s, clock) // sweeps the stepped attempt's record
	clock.Advance(-step)

	res := beginNow(t, s, clock, keyNow(clock, "0"), false)
	require.False(t, res.Started, "precondition: a caller's attempt created before the swept one is not vouched for")

	res = beginNow(t, s, clock, keyNow(clock, "0"), true)
	require.True(t, res.Started, "an attempt the server just minted was refused %v for a swept one", res.Refusal)
}
