package admission

import (
	"context"
	"testing"
	"time"
)

// peekAllocs is how many allocations peekMode makes, on a controller with
// degradation windows, n overrides that expire one after another and a time
// past all of them and past a window's end: the metrics callback's peek
// after a quiet spell.
func peekAllocs(t *testing.T, n int) float64 {
	t.Helper()
	t0 := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	c, err := New(WithClasses(Class{Name: "work", Slots: 8, QueueItems: 8}), WithDefaultClass("work"),
		WithDegradation(Degradation{Window: time.Second, MaxQueueAge: 500 * time.Millisecond}),
		withClock(func() time.Time { return t0 }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	for i := range n {
		o := Override{Actor: "test", Reason: "r15", TTL: time.Duration(i+1) * time.Millisecond, Class: "work", Slots: 1 + i%8}
		if _, err := c.SetOverrideAt(context.Background(), o, t0); err != nil {
			t.Fatal(err)
		}
	}
	now := t0.Add(time.Minute)
	var peeked Mode
	allocs := testing.AllocsPerRun(20, func() {
		c.mu.Lock()
		peeked = c.peekMode(now)
		c.mu.Unlock()
	})
	// The peek changed nothing: the live list is whole, in its order.
	c.mu.Lock()
	if len(c.ovr.list) != n {
		t.Fatalf("the peek left %d of %d overrides in the live list", len(c.ovr.list), n)
	}
	for i, a := range c.ovr.list {
		if a.Expires != t0.Add(time.Duration(i+1)*time.Millisecond) || a.Slots != 1+i%8 {
			t.Fatalf("the peek changed the live list's override %d: %+v", i, a)
		}
	}
	c.mu.Unlock()
	if m := c.ModeAt(now); m != peeked {
		t.Fatalf("the peek said %v, the mode at the same time is %v", peeked, m)
	}
	return allocs
}

// A review found that peekMode, which the metrics callback runs at every
// collection, built a new list of the overrides still in force for each
// expiry it replays: n overrides expiring by the collection's time cost
// O(n²) bytes and O(n log n) allocations. Doubling the overrides must at
// most double its allocations.
func TestR15PeekModeAllocationsGrowAtMostLinearly(t *testing.T) {
	const n = MaxOverrides / 2 // 2n: as many as may be in force
	one, two := peekAllocs(t, n), peekAllocs(t, 2*n)
	t.Logf("peekMode allocations: %v for %d overrides, %v for %d", one, n, two, 2*n)
	if two > 2*one+2 {
		t.Fatalf("peekMode makes %v allocations for %d overrides, %v for %d: more than linear growth", one, n, two, 2*n)
	}
}
