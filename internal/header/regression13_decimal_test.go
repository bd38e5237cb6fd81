package header_test

import (
	"testing"

	"github.com/tollgate-go/tollgate/internal/header"
)

// Decimal promises a value in [lo, hi]. With hi below 9, the overflow guard
// (hi-d)/10 wraps around for a digit d > hi and lets the digit through.
func TestRegression13DecimalRespectsSmallHi(t *testing.T) {
	for _, tc := range []struct {
		v      string
		lo, hi uint64
	}{
		{"5", 0, 3},
		{"9", 0, 8},
		{"2", 0, 1},
		{"1", 0, 0},
	} {
		n, err := header.Decimal(tc.v, tc.lo, tc.hi)
		if err == nil {
			t.Errorf("Decimal(%q, %d, %d) = %d, nil; want ErrRange (value above hi)", tc.v, tc.lo, tc.hi, n)
		}
	}
}
