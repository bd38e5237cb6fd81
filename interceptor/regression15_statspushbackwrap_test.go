package interceptor_test

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A review found the defect this test guards against (fixed since; the
// text below is the review's account of the code before the fix).
//
// a5d7958: parsePushback now reads grpc-retry-pushback-ms with strconv.Atoi,
// which accepts up to 19 digits (the old reader refused more than 10, as "do
// not retry"). owner.proceed turns the value into a wait with
// time.Duration(ms)*time.Millisecond, which overflows past ~9.2e12 ms: a
// callee's "wait 317 years" (1e13 ms) wraps to a negative wait, and the call
// is retried at once instead of stopping (the wait passes the deadline).
func TestRegression15StatsPushbackWrap(t *testing.T) {
	for _, val := range []string{"9999999999 (control)", "10000000000000", "9223372036854775807"} {
		t.Run(val, func(t *testing.T) {
			v := val
			if v == "9999999999 (control)" {
				v = "9999999999"
			}
			runs, err := getPushedBack(t, v)
			require.Equal(t, int64(1), runs, "the callee asked for a wait of %s ms, far past any deadline; the call was retried (err %v)", v, err)
			require.Error(t, err)
		})
	}
}
