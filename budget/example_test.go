package budget_test

import (
	"context"
	"fmt"
	"time"

	"github.com/tollgate-go/tollgate/budget"
	"github.com/tollgate-go/tollgate/status"
)

// A middle tier granted 6 units sends a call with a 3-try policy: it takes a
// unit for the send and lends the rest but the 2 units its further tries may
// need. The callee reports having spent 1, so 2 units come back.
func ExampleAllowance() {
	a := budget.NewAllowance(6)
	if err := a.Take(); err != nil {
		fmt.Println(err)
		return
	}
	loan := a.LendFree(2)
	fmt.Println("grant u =", loan.Units())
	loan.Settle(1) // the callee's tollgate-spent
	fmt.Printf("%+v\n", a.Snapshot())
	fmt.Println("tollgate-spent:", a.Seal())
	// Output:
	// grant u = 3
	// {Total:6 Free:4 Reserved:0 Held:0 Spent:2 Origin:false Sealed:false}
	// tollgate-spent: 2
}

// A call whose response was lost holds its grant until the call's record says
// what it spent; a refusal at the origin is final only when every unit is
// spent.
func ExampleLoan_Hold() {
	origin := budget.NewAllowance(2, budget.AtOrigin())
	loan := origin.LendFree(0) // the origin's own try is not charged
	loan.Hold()                // deadline exceeded: nothing is known
	o := status.OutcomeOf(origin.Check())
	fmt.Println(o.Reason, "final:", o.Final())
	loan.Reconcile(2) // the record finished: 2 units spent below
	o = status.OutcomeOf(origin.Check())
	fmt.Println(o.Reason, "final:", o.Final())
	// Output:
	// REASON_ALLOWANCE_EXHAUSTED final: false
	// REASON_ALLOWANCE_EXHAUSTED final: true
}

// A handler that fans out to three backends splits its 10 free units: one
// unit per send, and grants of 3, 2 and 2.
func ExampleSplit() {
	ctx := budget.NewContext(context.Background(), budget.NewAllowance(10))
	for i, c := range budget.Split(ctx, 3) {
		g, _ := budget.GrantFromContext(c)
		fmt.Printf("backend %d: u=%d\n", i, g)
	}
	// Output:
	// backend 0: u=3
	// backend 1: u=2
	// backend 2: u=2
}

// A new budget starts with its reserve; once retries spend it, the next one
// waits for ten requests' worth of tokens or one second of the floor.
func ExampleRetryBudget() {
	// A reserve of 2 tokens, refilled at 1 per second, and 10% of requests.
	rb, _ := budget.NewRetryBudget(budget.WithMaxRetryTokens(2))
	t0 := time.Unix(1764474000, 0)
	rb.DepositAt(t0)
	fmt.Println(rb.WithdrawAt(t0), rb.WithdrawAt(t0), rb.WithdrawAt(t0))
	fmt.Println(rb.WithdrawAt(t0.Add(time.Second)))
	// Output:
	// true true false
	// true
}
