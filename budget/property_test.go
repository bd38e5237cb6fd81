package budget_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/budget"
)

// The property test plays random call trees against real ledgers: every
// server builds a ledger from its grant, its handler takes a unit per RPC,
// lends grants (default, explicit or split), runs the callee (inline, in
// concurrent goroutines, or detached so that it outlives the handler), and
// ends each loan in one of the ways the interceptor may (report, refund of a
// callee that spent nothing, hold, hold then reconcile from the callee's
// finished total, several tries reconciled at once, double endings); then it
// seals. Whatever the interleaving:
//
//   - each ledger conserves its units (free+reserved+held+spent == total) at
//     every step;
//   - the RPCs sent below any ledger (by it and its subtree) never exceed its
//     allowance, and never exceed what it reported when sealed;
//   - in particular the RPCs below the origin never exceed the allowance.

type propNode struct {
	a      *budget.Allowance
	total  int64
	parent *propNode
	sent   atomic.Int64 // RPCs sent by this ledger and its subtree
	report atomic.Int64 // Seal's result, -1 until sealed
}

type propWorld struct {
	t     *testing.T
	wg    sync.WaitGroup
	mu    sync.Mutex
	nodes []*propNode
	fails atomic.Int64
}

func (w *propWorld) newNode(units int64, parent *propNode) *propNode {
	n := &propNode{a: budget.NewAllowance(units), total: units, parent: parent}
	n.report.Store(-1)
	w.mu.Lock()
	w.nodes = append(w.nodes, n)
	w.mu.Unlock()
	return n
}

// errorf records a failure from any goroutine (require must not be called
// off the test goroutine).
func (w *propWorld) errorf(format string, args ...any) {
	if w.fails.Add(1) <= 5 {
		w.t.Errorf(format, args...)
	}
}

func (w *propWorld) checkConserved(n *propNode) {
	s := n.a.Snapshot()
	if s.Free+s.Reserved+s.Held+s.Spent != s.Total || s.Free < 0 || s.Reserved < 0 || s.Held < 0 || s.Spent < 0 {
		w.errorf("units not conserved: %+v", s)
	}
}

// send takes a unit for one RPC and counts it in every ledger above.
func (w *propWorld) send(n *propNode) bool {
	if n.a.Take() != nil {
		return false
	}
	for p := n; p != nil; p = p.parent {
		p.sent.Add(1)
	}
	return true
}

// seal answers the server's request: seal and remember the report.
func (w *propWorld) seal(n *propNode) int64 {
	r := n.a.Seal()
	n.report.Store(r)
	w.checkConserved(n)
	return r
}

// handler plays one handler run on ledger n.
func (w *propWorld) handler(ctx context.Context, rng *rand.Rand, n *propNode, depth int) {
	ops := rng.IntN(5)
	for range ops {
		w.op(ctx, rng, n, depth)
		w.checkConserved(n)
	}
}

// callee serves one RPC whose grant is g: it runs a handler on a new ledger
// and seals it; it returns the node and its report.
func (w *propWorld) callee(rng *rand.Rand, parent *propNode, g *budget.Loan, depth int) (*propNode, int64) {
	c := w.newNode(g.Units(), parent)
	w.handler(budget.NewContext(context.Background(), c.a), rng, c, depth+1)
	return c, w.seal(c)
}

func (w *propWorld) lend(ctx context.Context, rng *rand.Rand, n *propNode) *budget.Loan {
	if g, ok := budget.GrantFromContext(ctx); ok {
		return n.a.Lend(g)
	}
	switch rng.IntN(3) {
	case 0:
		return n.a.LendFree(rng.Int64N(3)) // default grant, keeping units for further tries
	case 1:
		return n.a.Lend(rng.Int64N(n.total + 2))
	default:
		return nil // a leaf call
	}
}

func (w *propWorld) op(ctx context.Context, rng *rand.Rand, n *propNode, depth int) {
	leaf := depth >= 4
	switch k := rng.IntN(10); {
	case k == 0 || leaf: // a call to a leaf that spends nothing: refunded
		if w.send(n) {
			l := w.lend(ctx, rng, n)
			if l != nil && !l.Refund() && !n.a.Snapshot().Sealed {
				w.errorf("refund of a fresh loan had no effect")
			}
		}
	case k <= 4: // a call whose callee answers: one of the endings
		if !w.send(n) {
			return
		}
		l := w.lend(ctx, rng, n)
		_, rep := w.callee(rng, n, l, depth)
		closed := true
		switch rng.IntN(5) {
		case 0:
			l.Settle(rep) // the trailer
		case 1:
			l.Settle(rep + rng.Int64N(3)) // over-reporting is clamped
		case 2:
			if rep == 0 {
				l.Refund() // an ending §2.3 allows: the callee spent nothing
			} else {
				l.Settle(rep)
			}
		case 3:
			l.Hold() // lost response, later reconciled from the record
			l.Reconcile(rep)
		default:
			l.Hold() // never resolved
			closed = false
		}
		// A second ending is a no-op.
		if l.Refund() || l.Settle(0) || l.Hold() || (closed && l.Reconcile(0)) {
			w.errorf("a second ending had an effect")
		}
	case k == 5: // one call, two tries, reconciled together from the record
		var loans []*budget.Loan
		var cumulative int64
		for try := range 2 {
			if !w.send(n) {
				break
			}
			l := w.lend(ctx, rng, n)
			_, rep := w.callee(rng, n, l, depth)
			cumulative += rep
			if try == 0 && rng.IntN(2) == 0 {
				l.Settle(rep)
			} else {
				l.Hold()
			}
			loans = append(loans, l)
		}
		budget.ReconcileCall(cumulative, loans...)
	case k == 6: // a callee that outlives the call: the response is lost
		if !w.send(n) {
			return
		}
		l := w.lend(ctx, rng, n)
		if rng.IntN(2) == 0 {
			l.Hold()
		} // else: still reserved when the handler answers
		seed := rng.Uint64()
		w.wg.Go(func() {
			w.callee(rand.New(rand.NewPCG(seed, 1)), n, l, depth)
		})
	case k == 7: // concurrent calls from one handler run, joined
		fan := 1 + rng.IntN(3)
		var wg sync.WaitGroup
		for range fan {
			seed := rng.Uint64()
			wg.Go(func() {
				r := rand.New(rand.NewPCG(seed, 2))
				w.op(ctx, r, n, depth)
				w.checkConserved(n)
			})
		}
		wg.Wait()
	case k == 8: // fan-out with Split, concurrently
		fan := 1 + rng.IntN(3)
		ctxs := budget.Split(budget.NewContext(ctx, n.a), fan)
		var wg sync.WaitGroup
		for _, c := range ctxs {
			seed := rng.Uint64()
			wg.Go(func() {
				r := rand.New(rand.NewPCG(seed, 3))
				w.op(c, r, n, depth)
			})
		}
		wg.Wait()
	default: // a goroutine of the handler that outlives it and keeps calling
		seed := rng.Uint64()
		w.wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, 4))
			for range 3 {
				w.op(ctx, r, n, depth+1)
			}
		})
	}
}

func TestPropertyAllowanceNeverOverspent(t *testing.T) {
	iterations := 1500
	if testing.Short() {
		iterations = 50
	}
	var totalNodes, totalSent, exhausted int
	defer func() {
		t.Logf("%d call trees, %d ledgers, %d RPCs sent below the origins, %d trees used their whole allowance",
			iterations, totalNodes, totalSent, exhausted)
	}()
	for seed := range uint64(iterations) {
		rng := rand.New(rand.NewPCG(seed, 0))
		w := &propWorld{t: t}
		allowance := rng.Int64N(40)
		// The origin's own tries are not charged: it lends everything to
		// the first tier, whose ledger holds the whole allowance.
		origin := budget.NewAllowance(allowance, budget.AtOrigin())
		var below []*propNode
		for range 1 + rng.IntN(3) {
			if origin.Check() != nil {
				break
			}
			g := origin.LendFree(0)
			first := w.newNode(g.Units(), nil)
			below = append(below, first)
			w.handler(budget.NewContext(context.Background(), first.a), rng, first, 1)
			rep := w.seal(first)
			if rng.IntN(3) == 0 {
				g.Hold()
			} else {
				g.Settle(rep)
			}
		}
		w.wg.Wait()
		for _, n := range w.nodes {
			w.checkConserved(n)
		}

		var sent int64
		for _, f := range below {
			sent += f.sent.Load()
		}
		totalNodes += len(w.nodes)
		totalSent += int(sent)
		if sent == allowance {
			exhausted++
		}
		require.LessOrEqual(t, sent, allowance, "seed %d: RPCs below the origin exceed the allowance", seed)
		for _, n := range w.nodes {
			require.LessOrEqual(t, n.sent.Load(), n.total, "seed %d: a subtree overspent its grant", seed)
			require.LessOrEqual(t, n.sent.Load(), n.report.Load(), "seed %d: a ledger reported less than its subtree sent", seed)
		}
		s := origin.Snapshot()
		require.Equal(t, s.Total, s.Free+s.Reserved+s.Held+s.Spent, "seed %d", seed)
		require.LessOrEqual(t, sent, s.Spent+s.Held+s.Reserved, "seed %d: the origin counts less than was sent", seed)
		require.Zero(t, w.fails.Load(), "seed %d", seed)
	}
}

// Many goroutines drive one ledger with every operation; the piles must be
// conserved and non-negative at every read, nothing may succeed on the
// ledger once Seal has returned, and the sealed total never moves.
func TestLedgerConservedUnderConcurrentUse(t *testing.T) {
	for round := range 200 {
		total := int64(1 + round%50)
		origin := round%3 == 0
		var opts []budget.AllowanceOption
		if origin {
			opts = append(opts, budget.AtOrigin())
		}
		a := budget.NewAllowance(total, opts...)
		ctx := budget.NewContext(context.Background(), a)
		var sealedDone atomic.Bool
		var sealedTotal atomic.Int64
		sealedTotal.Store(-1)
		var fails atomic.Int64
		fail := func(format string, args ...any) {
			if fails.Add(1) <= 5 {
				t.Errorf(format, args...)
			}
		}
		check := func() {
			s := a.Snapshot()
			if s.Free+s.Reserved+s.Held+s.Spent != s.Total || s.Free < 0 || s.Reserved < 0 || s.Held < 0 || s.Spent < 0 || s.Total != total {
				fail("round %d: not conserved: %+v", round, s)
			}
			if s.Sealed && s.Reserved+s.Held != 0 {
				fail("round %d: sealed ledger with open units: %+v", round, s)
			}
		}
		var wg sync.WaitGroup
		var loansMu sync.Mutex
		var loans []*budget.Loan
		for g := range 8 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(round), uint64(g)))
				for range 300 {
					wasSealed := sealedDone.Load()
					switch rng.IntN(10) {
					case 0, 1:
						if a.Take() == nil {
							if wasSealed {
								fail("take after seal")
							}
							if rng.IntN(4) == 0 && a.Unsend() && wasSealed {
								fail("unsend after seal")
							}
						}
					case 2:
						l := a.Lend(rng.Int64N(5) - 1)
						if l != nil {
							if wasSealed {
								fail("lend after seal")
							}
							loansMu.Lock()
							loans = append(loans, l)
							loansMu.Unlock()
						}
					case 3:
						l := a.LendFree(rng.Int64N(4))
						if l != nil {
							if wasSealed {
								fail("lendfree after seal")
							}
							loansMu.Lock()
							loans = append(loans, l)
							loansMu.Unlock()
						}
					case 4, 5, 6:
						loansMu.Lock()
						var l *budget.Loan
						var some []*budget.Loan
						if len(loans) > 0 {
							l = loans[rng.IntN(len(loans))]
							for range 3 {
								some = append(some, loans[rng.IntN(len(loans))])
							}
						}
						loansMu.Unlock()
						var ok bool
						switch rng.IntN(5) {
						case 0:
							ok = l.Settle(rng.Int64N(10) - 2)
						case 1:
							ok = l.Refund()
						case 2:
							ok = l.Hold()
						case 3:
							ok = l.Reconcile(rng.Int64N(10) - 2)
						case 4:
							// distinct loans only
							seen := map[*budget.Loan]bool{}
							var uniq []*budget.Loan
							for _, x := range some {
								if !seen[x] {
									seen[x] = true
									uniq = append(uniq, x)
								}
							}
							ok = budget.ReconcileCall(rng.Int64N(20)-2, uniq...) > 0
						}
						if ok && wasSealed {
							fail("loan ending took effect after seal")
						}
					case 7:
						for _, c := range budget.Split(ctx, 1+rng.IntN(4)) {
							g, _ := budget.GrantFromContext(c)
							if g > a.Snapshot().Total {
								fail("split grant %d over total", g)
							}
						}
					case 8:
						_ = a.Check()
					case 9:
						if rng.IntN(20) == 0 {
							s := a.Seal()
							if !sealedTotal.CompareAndSwap(-1, s) && sealedTotal.Load() != s {
								fail("seal total moved: %d then %d", sealedTotal.Load(), s)
							}
							sealedDone.Store(true)
						}
					}
					check()
				}
			})
		}
		wg.Wait()
		check()
		if s := sealedTotal.Load(); s >= 0 && a.Seal() != s {
			fail("seal total moved at the end")
		}
	}
}
