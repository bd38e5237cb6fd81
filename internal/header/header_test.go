package header_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/internal/header"
)

const example = "a=0190a5b2-7c3e-7def-8123-456789abcdef;c=0.2.1;t=1;d=1764474000123;u=4"

func TestParseExample(t *testing.T) {
	h, err := header.Parse(example)
	require.NoError(t, err)
	require.Equal(t, header.Header{
		Attempt:  "0190a5b2-7c3e-7def-8123-456789abcdef",
		Call:     "0.2.1",
		Try:      1,
		Deadline: 1764474000123,
		Units:    4,
	}, h)
	dl, ok := h.DeadlineTime()
	require.True(t, ok)
	require.Equal(t, time.UnixMilli(1764474000123), dl)
	require.Equal(t, "a=0190a5b2-7c3e-7def-8123-456789abcdef;c=0.2.1;d=1764474000123;u=4", h.String())
}

func TestParseDefaultsAndAllFields(t *testing.T) {
	h, err := header.Parse("a=x")
	require.NoError(t, err)
	require.Equal(t, header.Header{Attempt: "x", Call: "0", Try: 1}, h)
	_, ok := h.DeadlineTime()
	require.False(t, ok)

	h, err = header.Parse("r=1;n=tenant-7;u=1000000;d=253402300799999;t=1000;c=0.3.2.name;a=A.b:c-9;zz=ignored;x=\xff")
	require.NoError(t, err)
	require.Equal(t, header.Header{
		Attempt: "A.b:c-9", Call: "0.3.2.name", Try: 1000, Deadline: header.MaxDeadline,
		Units: header.MaxUnits, Tenant: "tenant-7", Strict: true,
	}, h)
	require.Equal(t, "a=A.b:c-9;c=0.3.2.name;t=1000;d=253402300799999;u=1000000;n=tenant-7;r=1", h.String())
	require.NoError(t, h.Validate())
}

func TestParseErrors(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	tests := []struct {
		name, in string
		key      string
		want     error
	}{
		{"empty", "", "a", header.ErrMissing},
		{"no attempt", "c=1;t=2", "a", header.ErrMissing},
		{"empty attempt", "a=", "a", header.ErrMissing},
		{"attempt 65", "a=" + long(65), "a", header.ErrTooLong},
		{"attempt 64 ok but call 129", "a=" + long(64) + ";c=" + long(129), "c", header.ErrTooLong},
		{"value 385", "a=x;zz=" + long(header.MaxLen-6), "", header.ErrTooLong},
		{"65 KB id", "a=" + long(65<<10), "", header.ErrTooLong},
		{"attempt charset", "a=ab/c", "a", header.ErrCharset},
		{"attempt space", "a=ab c", "a", header.ErrCharset},
		{"attempt non-ascii", "a=é", "a", header.ErrCharset},
		{"tenant charset", "a=x;n=t/1", "n", header.ErrCharset},
		{"call empty", "a=x;c=", "c", header.ErrMissing},
		{"repeated a", "a=x;a=y", "a", header.ErrRepeated},
		{"repeated u", "a=x;u=1;u=1", "u", header.ErrRepeated},
		{"repeated r", "r=1;a=x;r=1", "r", header.ErrRepeated},
		{"no equals", "a=x;garbage", "", header.ErrSyntax},
		{"empty key", "a=x;=3", "", header.ErrSyntax},
		{"padded key", "a=x; t=2", "", header.ErrSyntax},
		{"padded key after", "a=x;t =2", "", header.ErrSyntax},
		{"tab key", "a=x;\tt=2", "", header.ErrSyntax},
		{"space key", "a=x; =2", "", header.ErrSyntax},
		{"try 0", "a=x;t=0", "t", header.ErrRange},
		{"try 1001", "a=x;t=1001", "t", header.ErrRange},
		{"try negative", "a=x;t=-1", "t", header.ErrNumber},
		{"try plus", "a=x;t=+1", "t", header.ErrNumber},
		{"try space", "a=x;t= 1", "t", header.ErrNumber},
		{"try leading zero", "a=x;t=01", "t", header.ErrNumber},
		{"try hex", "a=x;t=0x1", "t", header.ErrNumber},
		{"try empty", "a=x;t=", "t", header.ErrNumber},
		{"units 10^18", "a=x;u=1000000000000000000", "u", header.ErrRange},
		{"units overflow", "a=x;u=99999999999999999999999999", "u", header.ErrRange},
		{"units 1000001", "a=x;u=1000001", "u", header.ErrRange},
		{"units negative", "a=x;u=-5", "u", header.ErrNumber},
		{"deadline 0", "a=x;d=0", "d", header.ErrRange},
		{"deadline far future", "a=x;d=253402300800000", "d", header.ErrRange},
		{"deadline uint64 max", "a=x;d=18446744073709551615", "d", header.ErrRange},
		{"deadline negative", "a=x;d=-1764474000123", "d", header.ErrNumber},
		{"deadline fraction", "a=x;d=1.5", "d", header.ErrNumber},
		{"strict 0", "a=x;r=0", "r", header.ErrRange},
		{"strict true", "a=x;r=true", "r", header.ErrRange},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := header.Parse(tt.in)
			require.ErrorIs(t, err, tt.want)
			require.Equal(t, header.Header{}, h)
			var he *header.Error
			require.True(t, errors.As(err, &he))
			require.Equal(t, tt.key, he.Key)
			require.True(t, strings.HasPrefix(err.Error(), "header: "), err.Error())
		})
	}
}

func TestParseTolerates(t *testing.T) {
	for _, in := range []string{
		"a=x;", ";a=x", "a=x;;", ";;a=x;;;",
		"a=x;future=whatever=1", "a=x;zz=1;zz=2", "a=x;é=é",
	} {
		h, err := header.Parse(in)
		require.NoError(t, err, in)
		require.Equal(t, header.Header{Attempt: "x", Call: "0", Try: 1}, h, in)
	}
	h, err := header.Parse("a=x;u=0;d=1")
	require.NoError(t, err)
	require.Equal(t, header.Header{Attempt: "x", Call: "0", Try: 1, Deadline: 1}, h)
}

func TestErrorMessage(t *testing.T) {
	_, err := header.Parse("a=x;t=0")
	require.EqualError(t, err, "header: field t: out of range")
	_, err = header.ParseValues([]string{"a=x", "a=y"})
	require.EqualError(t, err, "header: repeated")
}

func TestParseValues(t *testing.T) {
	_, err := header.ParseValues(nil)
	require.ErrorIs(t, err, header.ErrAbsent)
	var he *header.Error
	require.False(t, errors.As(err, &he), "absence is not malformed")

	h, err := header.ParseValues([]string{"a=x;t=3"})
	require.NoError(t, err)
	require.Equal(t, uint32(3), h.Try)

	_, err = header.ParseValues([]string{"a=x", "a=x"})
	require.ErrorIs(t, err, header.ErrRepeated)
	require.True(t, errors.As(err, &he))
}

func TestValidate(t *testing.T) {
	ok := header.Header{Attempt: "x"}
	require.NoError(t, ok.Validate())
	for _, tt := range []struct {
		h    header.Header
		key  string
		want error
	}{
		{header.Header{}, "a", header.ErrMissing},
		{header.Header{Attempt: "x", Call: "a b"}, "c", header.ErrCharset},
		{header.Header{Attempt: "x", Try: 1001}, "t", header.ErrRange},
		{header.Header{Attempt: "x", Deadline: -1}, "d", header.ErrRange},
		{header.Header{Attempt: "x", Units: -1}, "u", header.ErrRange},
		{header.Header{Attempt: "x", Units: 1e18}, "u", header.ErrRange},
		{header.Header{Attempt: "x", Tenant: strings.Repeat("t", 65)}, "n", header.ErrTooLong},
		{header.Header{
			Attempt: strings.Repeat("a", 64), Call: strings.Repeat("c", 128), Tenant: strings.Repeat("n", 64),
			Try: 999, Deadline: header.MaxDeadline, Units: header.MaxUnits, Strict: true,
		}, "", nil},
	} {
		err := tt.h.Validate()
		if tt.want == nil {
			require.NoError(t, err)
			continue
		}
		require.ErrorIs(t, err, tt.want)
		var he *header.Error
		require.True(t, errors.As(err, &he))
		require.Equal(t, tt.key, he.Key)
	}
}

func TestIsTokenByte(t *testing.T) {
	var got []byte
	for c := 0; c < 256; c++ {
		if header.IsTokenByte(byte(c)) {
			got = append(got, byte(c))
		}
	}
	require.Equal(t, "-.0123456789:ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz", string(got))
}

func TestParseAllocatesNothing(t *testing.T) {
	full := "a=0190a5b2-7c3e-7def-8123-456789abcdef;c=0.2.1;t=2;d=1764474000123;u=4;n=acme;r=1"
	allocs := testing.AllocsPerRun(100, func() {
		h, err := header.Parse(full)
		if err != nil || h.Tenant != "acme" {
			panic("bad parse")
		}
	})
	require.Zero(t, allocs)

	h, err := header.Parse(full)
	require.NoError(t, err)
	buf := make([]byte, 0, header.MaxLen)
	allocs = testing.AllocsPerRun(100, func() { buf = h.Append(buf[:0]) })
	require.Zero(t, allocs)
	require.Equal(t, full, string(buf))
}

func BenchmarkParse(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := header.Parse(example); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppend(b *testing.B) {
	h, err := header.Parse(example)
	require.NoError(b, err)
	buf := make([]byte, 0, header.MaxLen)
	b.ReportAllocs()
	for b.Loop() {
		buf = h.Append(buf[:0])
	}
}

func BenchmarkString(b *testing.B) {
	h, err := header.Parse(example)
	require.NoError(b, err)
	b.ReportAllocs()
	for b.Loop() {
		_ = h.String()
	}
}

// Decimal promises a value in [lo, hi]. With hi below 9, the overflow guard
// (hi-d)/10 wraps around for a digit d > hi and lets the digit through.
func TestDecimalRespectsSmallHi(t *testing.T) {
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
