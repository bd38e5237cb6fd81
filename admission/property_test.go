package admission_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// TestPropertyBoundedAdmission drives controllers with random classes and
// random arrival sequences (seeded) and checks invariant 9 at every instant
// (after every change of state, under the controller's lock: slots, queue
// items and bytes, tenant limits, accounts; the queue bound in force at every
// instant and the slots in force at every start, overrides and degradation
// included), that no request starts after its
// deadline, that every Admit call ends exactly once, and that permits balance
// once everything is released.
func TestPropertyBoundedAdmission(t *testing.T) {
	for seed := range uint64(100) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0x7011))
			var classes []admission.Class
			var methods []string
			var opts []admission.Option
			for i := range 1 + rng.IntN(3) {
				cl := admission.Class{
					Name:                fmt.Sprint("c", i),
					Slots:               1 + rng.IntN(3),
					QueueItems:          rng.IntN(5),
					LendIdle:            rng.IntN(3) == 0,
					Optional:            rng.IntN(3) == 0,
					ExpectedServiceTime: time.Duration(rng.IntN(20)) * time.Millisecond,
				}
				// New refuses QueueBytes and TenantQueueWork without a
				// queue, where they bound nothing (the draws keep the
				// seeds' runs).
				if rng.IntN(2) == 0 {
					if b := int64(50 + rng.IntN(200)); cl.QueueItems > 0 {
						cl.QueueBytes = b
					}
				}
				if rng.IntN(2) == 0 {
					cl.TenantRunning = 1 + rng.IntN(2)
					// New refuses TenantQueued without a queue, where
					// it bound nothing (the draw keeps the seeds' runs).
					if q := rng.IntN(3); cl.QueueItems > 0 {
						cl.TenantQueued = q
					}
				}
				if rng.IntN(3) == 0 {
					if w := time.Duration(10+rng.IntN(50)) * time.Millisecond; cl.QueueItems > 0 {
						cl.TenantQueueWork = w
					}
				}
				if rng.IntN(4) == 0 {
					cl.MaxRequestBytes = 80
				}
				classes = append(classes, cl)
				m := fmt.Sprintf("/p.S%d/M", i)
				methods = append(methods, m)
				opts = append(opts, admission.WithMethods(cl.Name, m))
			}
			methods = append(methods, "/grpc.health.v1.Health/Check")
			opts = append(opts, admission.WithClasses(classes...),
				admission.WithDegradation(admission.Degradation{Window: 50 * time.Millisecond, MinDecisions: 2, MaxQueueAge: 40 * time.Millisecond}))
			h := newHarness(t, opts...)

			type live struct {
				id       int
				deadline time.Time
			}
			running := map[int]*admission.Permit{}
			waiting := map[int]live{}
			ended := map[int]bool{}
			starts, releases := 0, 0
			settle := func(evs []admission.Event) {
				for _, e := range evs {
					if (e.Kind == admission.EventAdmitted || e.Kind == admission.EventStarted) && !e.Deadline.IsZero() {
						require.False(t, e.At.After(e.Deadline), "expired work started")
					}
				}
				// Collect every decided request's result exactly once.
				for id, r := range h.done {
					require.False(t, ended[id], "request %d ended twice", id)
					delete(h.done, id)
					delete(waiting, id)
					if r.err != nil {
						require.Equal(t, status.KindNotAdmitted, status.OutcomeOf(r.err).Kind)
						ended[id] = true
						continue
					}
					starts++
					running[id] = r.permit
				}
			}
			pick := func(m map[int]*admission.Permit) int {
				for id := range m {
					return id
				}
				return 0
			}
			for range 400 {
				switch op := rng.IntN(10); {
				case op < 5:
					r := admission.Request{
						Method: methods[rng.IntN(len(methods))],
						Tenant: []string{"", "A", "B", "C"}[rng.IntN(4)],
						Size:   rng.IntN(120) - 10,
					}
					if rng.IntN(2) == 0 {
						r.Deadline = h.clk.Now().Add(time.Duration(rng.IntN(80)) * time.Millisecond)
					}
					id, e := h.arrive(r)
					if e.Kind == admission.EventQueued {
						waiting[id] = live{id, r.Deadline}
					}
					settle(h.log[len(h.log)-1:])
				case op < 8:
					if id := pick(running); id != 0 {
						p := running[id]
						delete(running, id)
						ended[id] = true
						releases++
						if rng.IntN(4) == 0 {
							p.Abandon() // work that never ran: the slot comes back all the same
							settle(h.drain())
						} else {
							settle(h.release(p))
						}
						if rng.IntN(5) == 0 {
							p.Release() // a second end does nothing
							p.Abandon()
							settle(h.drain())
						}
					}
				case op < 9 && rng.IntN(4) == 0:
					// An operator override: freeze a random class, lower its
					// slots or queue bound, or force a mode, for a short while.
					cl := classes[rng.IntN(len(classes))]
					o := admission.Override{Actor: "prop", Reason: "random", TTL: time.Duration(1+rng.IntN(60)) * time.Millisecond, Class: cl.Name}
					switch rng.IntN(4) {
					case 0:
						o.Freeze = true
					case 1:
						o.Slots = 1 + rng.IntN(cl.Slots)
					case 2:
						if cl.QueueItems == 0 {
							o.Freeze = true
							break
						}
						o.QueueItems = 1 + rng.IntN(cl.QueueItems)
					default:
						o.Class, o.Mode = "", admission.Mode(1+rng.IntN(3))
					}
					_, err := h.ctrl.SetOverride(context.Background(), o)
					require.NoError(t, err)
					settle(h.drain())
				case op < 9:
					for id := range waiting {
						r := h.cancel(id)
						h.done[id] = r
						break
					}
					settle(h.cancelEvents) // the starts a cancel lets happen are checked too
				default:
					settle(h.tick(time.Duration(rng.IntN(30)) * time.Millisecond))
				}
			}
			// Drain: release everything; waiters start or are dropped.
			for len(running) > 0 || len(waiting) > 0 {
				if id := pick(running); id != 0 {
					p := running[id]
					delete(running, id)
					ended[id] = true
					releases++
					settle(h.release(p))
					continue
				}
				for id := range waiting {
					h.done[id] = h.cancel(id)
					break
				}
				settle(h.cancelEvents)
			}
			t.Logf("%d requests, %d started, transitions %d", h.nextID, starts, h.ctrl.Stats().Transitions)
			require.Equal(t, starts, releases, "permits balance")
			require.Len(t, ended, h.nextID, "every Admit call ended exactly once")
			for _, cs := range h.ctrl.Stats().Classes {
				require.Zero(t, cs.UsedSlots, cs.Name)
				require.Zero(t, cs.Running, cs.Name)
				require.Zero(t, cs.Queued, cs.Name)
			}
		})
	}
}
