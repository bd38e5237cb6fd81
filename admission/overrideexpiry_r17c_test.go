package admission_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// MaxOverrides overrides of every kind, with expiries in a shuffled order
// and some at the same instant, expire each at its own expiry: driven
// through every expiry, the overrides left are those that end later, in
// the order they were set, and the limits and the mode in force are theirs
// (the lowest slots and queue bound, a freeze, the latest forced mode);
// taken at once by one call far ahead, they expire in order of expiry
// (those ending together in the order they were set), as the traces show,
// and leave the configured limits.
func TestR17cOverridesExpireInOrderWithTheirEffects(t *testing.T) {
	type set struct {
		o   admission.Override
		ttl time.Duration
	}
	rng := rand.New(rand.NewPCG(17, 3))
	var sets []set
	for i := range admission.MaxOverrides {
		o := admission.Override{Actor: "r17c", Reason: "expiry"}
		switch i % 5 {
		case 0:
			o.Class, o.Slots = "a", 1+rng.IntN(8)
		case 1:
			o.Class, o.QueueItems = "b", 1+rng.IntN(8)
		case 2:
			o.Class, o.Freeze = "b", true
		case 3:
			o.Mode = []admission.Mode{admission.ModeNormal, admission.ModeDegraded, admission.ModeRecovering}[rng.IntN(3)]
		default:
			o.Class, o.Slots, o.QueueItems = "a", 1+rng.IntN(8), 1+rng.IntN(8)
		}
		// 40 distinct expiries for 64 overrides: some end together.
		sets = append(sets, set{o, time.Duration(1+rng.IntN(40)) * time.Millisecond})
	}
	build := func(t *testing.T) (*admission.Controller, *tracetest.SpanRecorder, []admission.ActiveOverride) {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		c, err := admission.New(admission.WithTracerProvider(tp), admission.WithClock(newClock().Now),
			admission.WithDegradation(admission.Degradation{Window: 5 * time.Millisecond, MaxRefusalRatio: -1}),
			admission.WithClasses(
				admission.Class{Name: "a", Slots: 8, QueueItems: 8},
				admission.Class{Name: "b", Slots: 8, QueueItems: 8, Optional: true}))
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, c.Close()) })
		for _, s := range sets {
			o := s.o
			o.TTL = s.ttl
			_, err := c.SetOverrideAt(context.Background(), o, epoch)
			require.NoError(t, err)
		}
		all := c.OverridesAt(epoch)
		require.Len(t, all, admission.MaxOverrides)
		return c, rec, all
	}
	expiredOrder := func(rec *tracetest.SpanRecorder) []int64 {
		var ids []int64
		for _, sp := range rec.Ended() {
			for _, ev := range sp.Events() {
				var action string
				var id int64
				for _, kv := range ev.Attributes {
					switch kv.Key {
					case "action":
						action = kv.Value.AsString()
					case "id":
						id = kv.Value.AsInt64()
					}
				}
				if action == "expire" {
					ids = append(ids, id)
				}
			}
		}
		return ids
	}
	// byExpiry is the order they must expire in: by expiry, those ending
	// together in the order they were set.
	byExpiry := func(all []admission.ActiveOverride) []int64 {
		sorted := slices.Clone(all)
		slices.SortStableFunc(sorted, func(x, y admission.ActiveOverride) int { return x.Expires.Compare(y.Expires) })
		var ids []int64
		for _, a := range sorted {
			ids = append(ids, int64(a.ID))
		}
		return ids
	}

	t.Run("stepped", func(t *testing.T) {
		c, rec, all := build(t)
		var times []time.Time
		for _, a := range all {
			if !slices.ContainsFunc(times, a.Expires.Equal) {
				times = append(times, a.Expires)
			}
		}
		slices.SortFunc(times, time.Time.Compare)
		for _, e := range times {
			for _, at := range []time.Time{e.Add(-1), e} {
				var left []admission.ActiveOverride
				for _, a := range all {
					if at.Before(a.Expires) {
						left = append(left, a)
					}
				}
				require.Equal(t, left, c.OverridesAt(at), "in force at %v", at.Sub(epoch))
				slotsA, queueB, frozenB, mode := 8, 8, false, admission.ModeNormal
				for _, a := range left {
					if a.Class == "a" && a.Slots > 0 {
						slotsA = min(slotsA, a.Slots)
					}
					if a.Class == "b" && a.QueueItems > 0 {
						queueB = min(queueB, a.QueueItems)
					}
					frozenB = frozenB || a.Freeze
					if a.Mode != 0 {
						mode = a.Mode // the latest set wins
					}
				}
				s := c.StatsAt(at)
				require.Equal(t, mode, s.Mode, "at %v", at.Sub(epoch))
				sa, _ := s.Class("a")
				sb, _ := s.Class("b")
				require.Equal(t, slotsA, sa.Slots, "a's slots at %v", at.Sub(epoch))
				require.Equal(t, queueB, sb.QueueLimit, "b's queue bound at %v", at.Sub(epoch))
				if frozenB || mode == admission.ModeDegraded {
					require.Zero(t, sb.Slots, "b frozen or shed at %v", at.Sub(epoch))
				}
			}
		}
		require.Equal(t, byExpiry(all), expiredOrder(rec))
	})
	t.Run("at once", func(t *testing.T) {
		c, rec, all := build(t)
		far := epoch.Add(time.Second)
		require.Empty(t, c.OverridesAt(far))
		require.Equal(t, byExpiry(all), expiredOrder(rec))
		s := c.StatsAt(far)
		sa, _ := s.Class("a")
		sb, _ := s.Class("b")
		require.Equal(t, 8, sa.Slots)
		require.Equal(t, 8, sb.Slots)
		require.Equal(t, 8, sb.QueueLimit)
		require.Equal(t, admission.ModeNormal, s.Mode)
	})
}
