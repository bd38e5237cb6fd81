package main

import (
	"testing"

	"github.com/tollgate-go/tollgate/budget"
)

// The ledger ran one intended change twice, under two call keys of one
// attempt (a re-run of a frontend handler makes new keys, DESIGN.md §2.2).
// The call was judged "duplicate", yet the scenario's (and the total's)
// duplicates stayed 0 and lost stayed 0, so main exited 0: the headline
// numbers counted only a repeat under the same call key, which the record
// store already excludes by construction (found by review).
func TestDuplicateUnderANewCallKeyIsCounted(t *testing.T) {
	l := newLedger()
	for _, call := range []string{"0.1.1", "0.2.1"} {
		k := effectKey{"A", call}
		l.log[k] = &logEntry{account: "acct", count: 1}
		l.order = append(l.order, k)
	}
	s := &scenarioResult{Calls: []callResult{{Account: "acct", AttemptID: "A", Outcome: "OK"}}}
	s.finish(l, budget.Snapshot{})
	t.Logf("verdict=%s executed=%d intended=%d", s.Calls[0].Verdict, s.ExecutedEffects, s.IntendedEffects)
	if s.Calls[0].Verdict != "duplicate" {
		t.Fatalf("verdict %q, want duplicate", s.Calls[0].Verdict)
	}
	if s.Duplicates != 1 {
		t.Fatalf("a change run twice counts duplicates=%d, want 1: the run would exit 0", s.Duplicates)
	}
}
