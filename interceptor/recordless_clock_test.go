package interceptor

import (
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// wallStepped returns t with its wall reading moved by d (whole seconds) and
// its monotonic reading kept: what time.Now returns after an NTP step of d.
// It writes time.Time's wall field as the time package lays it out (the
// monotonic flag in bit 63, seconds in the 33 bits above bit 30), which
// has not changed since Go 1.9: no public API builds such a time.
func wallStepped(t time.Time, d time.Duration) time.Time {
	type timeLayout struct {
		wall uint64
		ext  int64
		loc  *time.Location
	}
	p := (*timeLayout)(unsafe.Pointer(&t))
	if p.wall&(1<<63) == 0 {
		panic("no monotonic reading")
	}
	p.wall += uint64(d/time.Second) << 30
	return t
}

// A recordless mark lasts recordlessFor of elapsed time: a wall-clock step
// forward right after the mark must not end it, or a call with side effects
// begun then takes a FENCED answer of the store backend as vouching for a
// try that may have run at the store-less one. A review found the mark kept
// in Unix ns, which a step forward ended at once.
func TestRecordlessMarkSurvivesAWallClockStepForward(t *testing.T) {
	base := time.Now()
	now := base
	c, err := newClient([]ClientOption{withClientClock(func() time.Time { return now })}, false)
	require.NoError(t, err)
	tg := c.targetOf("x")
	c.setRecordless(tg)
	now = wallStepped(base.Add(time.Second), 2*time.Minute)
	require.Equal(t, time.Second, now.Sub(base), "precondition: one second elapsed")
	require.Equal(t, 2*time.Minute+time.Second, now.Round(0).Sub(base.Round(0)),
		"precondition: the wall clock stepped (time.Time's layout is as wallStepped writes it)")
	require.True(t, c.recordless(tg), "the mark was set one second ago")
}

// A test clock that read the zero time when the client was built and a real
// date later spans more than a Duration holds: a review found that a mark
// kept as time elapsed since the client was built then wrapped negative and
// never held. The mark is now a time of the client's clock.
func TestRecordlessMarkHoldsFarFromTheEpoch(t *testing.T) {
	var now time.Time
	c, err := newClient([]ClientOption{withClientClock(func() time.Time { return now })}, false)
	require.NoError(t, err)
	tg := c.targetOf("x")
	now = time.Unix(1_800_000_000, 0)
	c.setRecordless(tg)
	require.True(t, c.recordless(tg), "the mark was just set")
}
