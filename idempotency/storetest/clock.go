package storetest

import (
	"encoding/binary"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Clock is a manual clock for stores under test: it reads the time it was set
// to and moves only when told, so tests expire leases and records without
// sleeping. Its time has millisecond precision, as records do. It is safe for
// concurrent use; the zero value reads the zero time.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock that reads start, truncated to the millisecond.
func NewClock(start time.Time) *Clock {
	return &Clock{now: start.Truncate(time.Millisecond)}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d (backward for a negative d).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// AttemptIDAt returns a new random UUIDv7 attempt ID whose time is t (to the
// millisecond), for tests of the horizon.
func AttemptIDAt(t time.Time) string {
	u, err := uuid.NewV7()
	if err != nil {
		panic(err)
	}
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(t.UnixMilli()))
	copy(u[0:6], ms[2:8])
	return u.String()
}

// ClockLead is how far ahead of the real clock the suites start their
// clocks. A Redis store moves a lost or new horizon to the later of the
// call's reading and Redis's own time (TIME), so that a call whose reading
// is old cannot set it before records Redis lost; a test clock that starts
// at the real time falls behind Redis's as soon as real time passes, and
// the horizon would then follow Redis's time instead of the test's. A
// loaded machine may spend the lead before a horizon starts (building the
// store takes round trips): the suites move their clocks ClockLead ahead of
// real time again just before they start horizons, and check afterwards that
// real time, and so Redis's, is still behind the clock. They move it only
// when real time has come within half the lead of it: a store whose horizon
// started when it was built (memory's) has it at the clock's time then,
// which a move would leave behind by the time the move made up.
const ClockLead = time.Second

// lead moves c to ClockLead ahead of real time when real time has come
// within ClockLead/2 of it, and reports whether it moved c.
func lead(c *Clock) bool {
	now := time.Now().Truncate(time.Millisecond)
	if c.Now().Sub(now) >= ClockLead/2 {
		return false
	}
	c.Advance(now.Add(ClockLead).Sub(c.Now()))
	return true
}
