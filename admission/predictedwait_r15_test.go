package admission

import (
	"context"
	"testing"
	"time"
)

// A review found that Stats.PredictedWait, with a slot free in a class
// running no streams, spread the running requests' remaining work over all
// of the class's slots: a class of two slots with one request running (1 s
// of service left) reported a 500 ms wait, while a request arriving then
// starts at once — admission itself admitted, on that free slot, a request
// whose deadline left exactly its service time and no wait. (With a stream
// on the busy slot the play-out already said 0: TestPlayOutCountsAFreeSlotAsFreeNow.)
// The wait a request arriving now would have is 0 when it would start at
// once, on its class's slot or one lent to it.
func TestR15PredictedWaitIsZeroWithASlotFree(t *testing.T) {
	t0 := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	ctx := context.Background()
	c, err := New(WithClasses(
		Class{Name: "w", Slots: 2, QueueItems: 4, ExpectedServiceTime: time.Second},
		Class{Name: "one", Slots: 1, QueueItems: 4, ExpectedServiceTime: time.Second},
		Class{Name: "lender", Slots: 1, LendIdle: true, ExpectedServiceTime: time.Second}),
		WithDefaultClass("w"), WithMethods("one", "/demo.One/"), WithMethods("lender", "/demo.Lender/"),
		WithSafetyMargin(0), withClock(func() time.Time { return t0 }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })

	// w: one of two slots busy.
	p1, err := c.AdmitAt(ctx, Request{Method: "/demo.W/Do", Size: -1}, t0)
	if err != nil {
		t.Fatal(err)
	}
	now := t0.Add(100 * time.Millisecond)
	st, _ := c.StatsAt(now).Class("w")
	if st.UsedSlots != 1 || st.Queued != 0 {
		t.Fatalf("setup: %d slots used, %d queued", st.UsedSlots, st.Queued)
	}
	predicted := st.PredictedWait
	// What admission decides for a request arriving now: its deadline
	// leaves its service time (1 s) and no wait, and it starts at once.
	p2, d, err := c.AdmitDecisionAt(ctx, Request{Method: "/demo.W/Do", Size: -1, Deadline: now.Add(time.Second)}, now)
	if err != nil {
		t.Fatalf("a request that fits with no wait, a slot free: %v", err)
	}
	if !p2.start.Equal(now) || d.QueuedAhead != 0 {
		t.Fatalf("it started at %v behind %d, want at once", p2.start, d.QueuedAhead)
	}
	if predicted != 0 {
		t.Fatalf("Stats.PredictedWait %v with a slot free; a request arriving then started at once", predicted)
	}
	p2.ReleaseAt(now)

	// one: its only slot busy, the lender's idle slot free to borrow.
	p3, err := c.AdmitAt(ctx, Request{Method: "/demo.One/Do", Size: -1}, now)
	if err != nil {
		t.Fatal(err)
	}
	st, _ = c.StatsAt(now).Class("one")
	predicted = st.PredictedWait
	p4, d, err := c.AdmitDecisionAt(ctx, Request{Method: "/demo.One/Do", Size: -1, Deadline: now.Add(time.Second)}, now)
	if err != nil {
		t.Fatalf("a request that fits with no wait, a lent slot free: %v", err)
	}
	if p4.owner.cfg.Name != "lender" || d.QueuedAhead != 0 {
		t.Fatalf("it started on %s's slot behind %d, want on the lender's at once", p4.owner.cfg.Name, d.QueuedAhead)
	}
	if predicted != 0 {
		t.Fatalf("Stats.PredictedWait %v with a lent slot free; a request arriving then started at once", predicted)
	}
	// Now full (its slot and the lender's busy): the wait is its running
	// work's (p3 has 1 s left, p4 1 s, on the two slots it holds: the
	// first frees in 1 s) — nonzero, as the deadline stage sees it.
	st, _ = c.StatsAt(now).Class("one")
	if st.PredictedWait <= 0 {
		t.Fatalf("a full class predicts a wait of %v", st.PredictedWait)
	}
	_, err = c.AdmitAt(ctx, Request{Method: "/demo.One/Do", Size: -1, Deadline: now.Add(time.Second)}, now)
	if err == nil {
		t.Fatal("a request with no time to wait was admitted into a full class")
	}
	p4.ReleaseAt(now)
	p3.ReleaseAt(now)
	p1.ReleaseAt(now)
}
