package header_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/tollgate-go/tollgate/internal/header"
)

// FuzzParse checks that Parse never panics, that every error is an *Error
// wrapping a sentinel, and that formatting is the inverse of parsing on the
// values Parse accepts: Parse(h.String()) == h.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		example,
		"a=x",
		"a=x;c=0.1.1;t=2;d=1;u=0;n=t;r=1",
		"a=x;u=1000000000000000000",        // allowance 10^18
		"a=x;u=-1", "a=x;t=-3", "a=x;d=-1", // negative numbers
		"a=" + strings.Repeat("7", 65<<10),      // 65 KB ID
		"a=x;c=" + strings.Repeat("c", 65<<10),  // 65 KB call key
		"a=x;a=y", "a=x;t=1;t=1", "a=x;r=1;r=1", // repeated keys
		"a=x;d=99999999999999999999", "a=x;d=253402300799999", // far future
		"a=\u00e9t\u00e9", "a=x;n=\u4e2d", "a=x;\xff=\xfe", // non-ASCII
		"a=x;;c=", "a=;c=1", ";", "=", "a", "a==", // empty fields
		"a=x;", "a=x;;;", // trailing ';'
		"a=x;t=01", "a=x;t=+1", "a=x;u= 1", "a=x;r=0", "a=x;zz=1;zz=2",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		h, err := header.Parse(in)
		if err != nil {
			var he *header.Error
			if !errors.As(err, &he) || he.Err == nil || !strings.HasPrefix(err.Error(), "header: ") {
				t.Fatalf("Parse(%q): error %v is not a *header.Error", in, err)
			}
			if h != (header.Header{}) {
				t.Fatalf("Parse(%q) returned %+v with error", in, h)
			}
			return
		}
		if err := h.Validate(); err != nil {
			t.Fatalf("Parse(%q) = %+v, which does not validate: %v", in, h, err)
		}
		out := h.String()
		if len(out) > len(in) {
			t.Fatalf("String() = %q is longer than the input %q", out, in)
		}
		h2, err := header.Parse(out)
		if err != nil {
			t.Fatalf("Parse(%q) (formatted from %q): %v", out, in, err)
		}
		if h2 != h {
			t.Fatalf("round trip of %q: %+v != %+v", in, h2, h)
		}
		if out2 := h2.String(); out2 != out {
			t.Fatalf("formatting is not canonical: %q != %q", out2, out)
		}
	})
}
