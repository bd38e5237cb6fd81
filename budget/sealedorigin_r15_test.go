package budget_test

import (
	"testing"

	"github.com/tollgate-go/tollgate/budget"
)

// A sealed origin ledger with units still free refused takes as not final,
// while the client interceptor's own refusal (originFinal) calls the same
// state final: no unit of a sealed ledger can ever come back, so no call
// under it can be sent again. Below the origin a refusal stays not final.
func TestSealedOriginRefusalIsFinal(t *testing.T) {
	a := budget.NewAllowance(3, budget.AtOrigin())
	a.Seal()
	requireExhausted(t, a.Take(), true, 0)
	requireExhausted(t, a.Check(), true, 0)

	below := budget.NewAllowance(3)
	below.Seal()
	requireExhausted(t, below.Take(), false, 0)
}
