package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
)

// A review found that a plain Release whose permit started on one clock and
// that ends on the other still judged the finish against the deadline: a
// permit admitted by AdmitAt in 2020 (deadline in 2020), released plainly
// after an Admit returned the controller to the wall clock, counted a false
// accept (and a run miss), though the wall clock proves nothing of when the
// work ended on the caller's clock — the same reason such a Release teaches
// no service time. Likewise a permit started on the wall clock, released
// plainly while the controller is driven by a caller whose time is ahead
// of the wall clock. A Release whose end is on another clock than its start
// judges nothing; the slot is returned all the same.
func TestPlainReleaseAcrossClocksJudgesNoDeadline(t *testing.T) {
	newCtl := func(t *testing.T) *admission.Controller {
		c, err := admission.New(admission.WithClasses(
			admission.Class{Name: "work", Slots: 2, QueueItems: 4, ExpectedServiceTime: 100 * time.Millisecond}),
			admission.WithDefaultClass("work"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		end  func(p *admission.Permit)
	}{
		{"Release", (*admission.Permit).Release},
		{"ReleaseMissCounted", (*admission.Permit).ReleaseMissCounted},
	} {
		t.Run(tc.name+", started virtual, released real", func(t *testing.T) {
			c := newCtl(t)
			t0 := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
			r := work("/demo.W/Do")
			r.Deadline = t0.Add(10 * time.Second)
			p, err := c.AdmitAt(ctx, r, t0)
			require.NoError(t, err)
			q, err := c.Admit(ctx, work("/demo.W/Do")) // back to the wall clock
			require.NoError(t, err)
			tc.end(p)
			s := workStats(t, c.Stats())
			require.Zero(t, s.FalseAccepts, "the wall clock proves nothing of a deadline on the caller's clock")
			require.EqualValues(t, 1, s.Running, "p's slot was returned")
			q.Release()
		})
		t.Run(tc.name+", started real, released virtual", func(t *testing.T) {
			c := newCtl(t)
			r := work("/demo.W/Do")
			r.Deadline = time.Now().Add(time.Hour)
			p, err := c.Admit(ctx, r)
			require.NoError(t, err)
			ahead := time.Now().Add(24 * time.Hour) // a simulation set tomorrow
			q, err := c.AdmitAt(ctx, work("/demo.W/Do"), ahead)
			require.NoError(t, err)
			tc.end(p)
			s := workStats(t, c.StatsAt(ahead))
			require.Zero(t, s.FalseAccepts, "the caller's time proves nothing of a deadline on the wall clock")
			require.EqualValues(t, 1, s.Running, "p's slot was returned")
			q.ReleaseAt(ahead)
		})
	}
	// On one clock, the judging stands: a permit of the real clock released
	// plainly after its deadline is a false accept.
	t.Run("real clock, late", func(t *testing.T) {
		c := newCtl(t)
		r := work("/demo.W/Do")
		r.Deadline = time.Now().Add(150 * time.Millisecond)
		p, err := c.Admit(ctx, r)
		require.NoError(t, err)
		time.Sleep(200 * time.Millisecond)
		p.Release()
		require.EqualValues(t, 1, workStats(t, c.Stats()).FalseAccepts)
	})
}
