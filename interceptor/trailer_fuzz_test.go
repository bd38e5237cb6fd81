package interceptor

import (
	"strconv"
	"testing"
)

// FuzzTrailers: the trailers a callee sends (tollgate-spent,
// grpc-retry-pushback-ms) are parsed without panicking, and only strict
// decimals in range are taken.
func FuzzTrailers(f *testing.F) {
	for _, s := range []string{"0", "1", "1000000", "1000001", "-1", "+1", "01", "", " 1", "1e3", "9999999999", "99999999999", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		n, ok := parseSpent([]string{v})
		if ok {
			if n < 0 || n > maxUnitsOnWire || strconv.FormatInt(n, 10) != v {
				t.Fatalf("parseSpent(%q) = %d, not a canonical decimal in range", v, n)
			}
		}
		if _, ok := parseSpent([]string{v, v}); ok {
			t.Fatalf("two tollgate-spent values accepted")
		}
		p := parsePushback([]string{v})
		if p != stopPushback && (p < 0 || strconv.FormatInt(p, 10) != trimZeros(v)) {
			t.Fatalf("parsePushback(%q) = %d", v, p)
		}
	})
}

func trimZeros(v string) string {
	for len(v) > 1 && v[0] == '0' {
		v = v[1:]
	}
	return v
}

func TestTrailerParsers(t *testing.T) {
	for v, want := range map[string]int64{"5": 5, "0": 0, "1000000": 1000000} {
		n, ok := parseSpent([]string{v})
		if !ok || n != want {
			t.Fatalf("parseSpent(%q) = %d, %v", v, n, ok)
		}
	}
	for _, v := range []string{"", "-1", "01", "1000001", "x"} {
		if _, ok := parseSpent([]string{v}); ok {
			t.Fatalf("parseSpent(%q) accepted", v)
		}
	}
	if parsePushback([]string{"120"}) != 120 || parsePushback([]string{"-1"}) != stopPushback || parsePushback(nil) != stopPushback {
		t.Fatal("parsePushback")
	}
}
