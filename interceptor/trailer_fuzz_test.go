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
		// Several values read as their largest, and only if each reads.
		if m, ok2 := parseSpent([]string{"0", v}); ok2 != ok || (ok && m != n) {
			t.Fatalf("parseSpent([0 %q]) = %d, %v; alone %d, %v", v, m, ok2, n, ok)
		}
		if m, ok2 := parseSpent([]string{v, "1000000"}); ok2 != ok || (ok && m != maxUnitsOnWire) {
			t.Fatalf("parseSpent([%q 1000000]) = %d, %v", v, m, ok2)
		}
		// As grpc-go reads it: strconv.Atoi, stopping on an error or a
		// negative value.
		p := parsePushback([]string{v})
		if want, err := strconv.Atoi(v); err != nil || want < 0 {
			if p != stopPushback {
				t.Fatalf("parsePushback(%q) = %d, want stop", v, p)
			}
		} else if p != min(int64(want), maxPushbackMs) {
			t.Fatalf("parsePushback(%q) = %d, want %d", v, p, want)
		}
	})
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
	if n, ok := parseSpent([]string{"3", "1"}); !ok || n != 3 {
		t.Fatalf("two values read as %d, %v, not their largest", n, ok)
	}
	if _, ok := parseSpent([]string{"3", "x"}); ok {
		t.Fatal("a value that does not read was ignored")
	}
	if _, ok := parseSpent(nil); ok {
		t.Fatal("no value accepted")
	}
	if parsePushback([]string{"120"}) != 120 || parsePushback([]string{"-1"}) != stopPushback || parsePushback(nil) != stopPushback {
		t.Fatal("parsePushback")
	}
}
