package admission

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func overrideCtl(t *testing.T, t0 time.Time) *Controller {
	t.Helper()
	c, err := New(WithClasses(Class{Name: "work", Slots: 8, QueueItems: 8}), WithDefaultClass("work"),
		WithDegradation(Degradation{Window: time.Second, MaxQueueAge: 500 * time.Millisecond}),
		withClock(func() time.Time { return t0 }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A review found that nothing bounded the overrides in force at once: every
// expiry (advance's, and the metrics callback's peekMode at each
// collection) walks the whole list and recomputes the limits from all of
// it, so n overrides expiring at n different times cost O(n²) under the
// controller's lock. SetOverride refuses an override beyond MaxOverrides
// in force, with an error naming the bound; one that expired or was
// cleared makes room again.
func TestR15SetOverrideRefusesBeyondMaxOverrides(t *testing.T) {
	if MaxOverrides != 64 {
		t.Fatalf("MaxOverrides is %d; README.md's admission section says 64", MaxOverrides)
	}
	t0 := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	c := overrideCtl(t, t0)
	ctx := context.Background()
	o := func(ttl time.Duration) Override {
		return Override{Actor: "test", Reason: "r15", TTL: ttl, Class: "work", Slots: 4}
	}
	ids := make([]uint64, 0, MaxOverrides)
	for i := range MaxOverrides {
		// Each expires at a time of its own: the costly case.
		id, err := c.SetOverrideAt(ctx, o(time.Minute+time.Duration(i)*time.Millisecond), t0)
		if err != nil {
			t.Fatalf("override %d of %d refused: %v", i+1, MaxOverrides, err)
		}
		ids = append(ids, id)
	}
	_, err := c.SetOverrideAt(ctx, o(time.Hour), t0)
	if err == nil {
		t.Fatalf("override %d accepted: nothing bounds the overrides in force", MaxOverrides+1)
	}
	if !errors.Is(err, ErrInvalidOverride) || !strings.Contains(err.Error(), fmt.Sprint(MaxOverrides)) {
		t.Fatalf("override %d refused with %v: want ErrInvalidOverride naming the bound %d", MaxOverrides+1, err, MaxOverrides)
	}
	if n := len(c.OverridesAt(t0)); n != MaxOverrides {
		t.Fatalf("%d overrides in force after the refusal, want %d", n, MaxOverrides)
	}

	// A cleared one makes room.
	if !c.ClearOverride(ctx, ids[len(ids)-1]) {
		t.Fatal("the last override was not in force")
	}
	if _, err := c.SetOverrideAt(ctx, o(time.Hour), t0); err != nil {
		t.Fatalf("after a clear: %v", err)
	}
	// So do expired ones, without a call in between: the first expires at
	// t0 + 1 min, and the set at that time expires it first.
	if _, err := c.SetOverrideAt(ctx, o(time.Hour), t0.Add(time.Minute)); err != nil {
		t.Fatalf("after an expiry: %v", err)
	}
	if n := len(c.OverridesAt(t0.Add(time.Minute))); n != MaxOverrides {
		t.Fatalf("%d overrides in force, want %d", n, MaxOverrides)
	}
	// The mode override counts too: it is one more override in force.
	_, err = c.SetOverrideAt(ctx, Override{Actor: "test", Reason: "r15", TTL: time.Hour, Mode: ModeDegraded}, t0.Add(time.Minute))
	if !errors.Is(err, ErrInvalidOverride) {
		t.Fatalf("a mode override beyond the bound: %v, want ErrInvalidOverride", err)
	}
}
