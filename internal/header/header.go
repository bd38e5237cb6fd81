// Package header parses and formats the tollgate request header (DESIGN.md
// §2.1): one metadata value of ';'-separated key=value fields that carries an
// attempt's identity, the call key and try, the attempt deadline, the units
// granted to the callee, the tenant and the strict-accounting flag.
//
//	tollgate: a=0190a5b2-7c3e-7def-8123-456789abcdef;c=0.2.1;t=1;d=1764474000123;u=4
//
// Fields come in any order; each known key appears at most once; unknown keys
// are ignored (so that later versions may add fields), and so are empty
// fields, such as the one a trailing ';' leaves. The whole value is at most
// [MaxLen] bytes. Numbers are strict decimals: digits only, no sign, no
// leading zeros, no spaces, no overflow.
//
// [Parse] never panics and allocates nothing on success: the strings of a
// parsed [Header] are substrings of its input. Its errors are *[Error] values
// that wrap one of the Err… sentinels and name the offending key; the
// interceptor turns any of them into a MALFORMED_HEADER refusal (trusted peer)
// or ignores the header (untrusted peer).
package header

import (
	"errors"
	"strconv"
	"time"
)

// Key is the metadata key of the header.
const Key = "tollgate"

// Limits of the header's fields (DESIGN.md §2.1).
const (
	// MaxLen is the largest header value in bytes.
	MaxLen = 384
	// MaxAttemptLen is the longest attempt ID (field a).
	MaxAttemptLen = 64
	// MaxCallLen is the longest call key (field c).
	MaxCallLen = 128
	// MaxTenantLen is the longest tenant (field n).
	MaxTenantLen = 64
	// MaxTry is the highest try number (field t).
	MaxTry = 1000
	// MaxUnits is the largest grant (field u).
	MaxUnits = 1_000_000
	// MaxDeadline is the latest deadline (field d) in Unix milliseconds:
	// 9999-12-31T23:59:59.999Z. Servers cap deadlines far tighter; this bound
	// only keeps the value inside what time.Time represents exactly.
	MaxDeadline = 253402300799999
)

// DefaultCall is the call key of a header without field c.
const DefaultCall = "0"

// Header is the decoded value of the tollgate header. Its zero value is not
// a valid header (the attempt ID is required); [Parse] fills in the defaults
// of absent fields. A Header is a plain value, safe to copy and to share.
type Header struct {
	// Attempt is the attempt ID (field a), required.
	Attempt string
	// Call is the call key (field c); Parse sets DefaultCall when absent.
	Call string
	// Try is the try number (field t), 1–MaxTry; Parse sets 1 when absent.
	Try uint32
	// Deadline is the attempt deadline in Unix milliseconds (field d),
	// 1–MaxDeadline; 0 means the header carries none.
	Deadline int64
	// Units is the number of units granted to the callee (field u),
	// 0–MaxUnits.
	Units int64
	// Tenant is the tenant (field n); "" means the header carries none.
	Tenant string
	// Strict is set by field r=1: the caller asks for strict accounting.
	Strict bool
}

// Sentinel errors wrapped by *Error. Branch on them with errors.Is.
var (
	// ErrAbsent: no tollgate header was sent. Not malformed: the request
	// simply starts a new attempt.
	ErrAbsent = errors.New("header: absent")
	// ErrTooLong: the value, or a field, is longer than allowed.
	ErrTooLong = errors.New("header: too long")
	// ErrRepeated: a key appears twice, or two header values were sent.
	ErrRepeated = errors.New("header: repeated")
	// ErrMissing: a required field is absent or empty.
	ErrMissing = errors.New("header: missing")
	// ErrSyntax: a field is not key=value, or a key is empty.
	ErrSyntax = errors.New("header: syntax")
	// ErrCharset: a value holds a character outside [A-Za-z0-9._:-].
	ErrCharset = errors.New("header: bad character")
	// ErrNumber: a value is not a strict decimal.
	ErrNumber = errors.New("header: not a decimal")
	// ErrRange: a number is outside its field's range.
	ErrRange = errors.New("header: out of range")
)

// Error is a malformed header: the key of the offending field ("" for the
// value as a whole) and the sentinel that says what is wrong with it.
type Error struct {
	// Key is the field's key, or "" when the problem is not one field's.
	Key string
	// Err is one of the Err… sentinels.
	Err error
}

// Error returns a message such as "header: field t: out of range".
func (e *Error) Error() string {
	what := e.Err.Error()
	if len(what) > len("header: ") && what[:len("header: ")] == "header: " {
		what = what[len("header: "):]
	}
	if e.Key == "" {
		return "header: " + what
	}
	return "header: field " + e.Key + ": " + what
}

// Unwrap returns the sentinel.
func (e *Error) Unwrap() error { return e.Err }

func fail(key string, err error) error { return &Error{Key: key, Err: err} }

// bits for repeated-key detection.
const (
	seenA = 1 << iota
	seenC
	seenT
	seenD
	seenU
	seenN
	seenR
)

// ParseValues parses the values of the tollgate metadata key as received: no
// value is [ErrAbsent] (not wrapped: the request carries no header), more
// than one is [ErrRepeated] (a gateway that forwards incoming metadata must
// not produce two), exactly one is [Parse]d.
func ParseValues(vs []string) (Header, error) {
	switch len(vs) {
	case 0:
		return Header{}, ErrAbsent
	case 1:
		return Parse(vs[0])
	default:
		return Header{}, fail("", ErrRepeated)
	}
}

// Parse decodes one header value. It returns an *[Error] wrapping one of the
// Err… sentinels when the value is malformed, and never panics. On success it
// allocates nothing: the strings of the Header are substrings of v. Absent
// fields get their defaults (call DefaultCall, try 1).
func Parse(v string) (Header, error) {
	var h Header
	if len(v) > MaxLen {
		return h, fail("", ErrTooLong)
	}
	var seen uint8
	for len(v) > 0 {
		var field string
		if i := indexByte(v, ';'); i >= 0 {
			field, v = v[:i], v[i+1:]
		} else {
			field, v = v, ""
		}
		if field == "" {
			continue // empty field, e.g. after a trailing ';'
		}
		eq := indexByte(field, '=')
		if eq <= 0 {
			return Header{}, fail("", ErrSyntax)
		}
		key, val := field[:eq], field[eq+1:]
		if len(key) != 1 {
			// An unknown key is ignored, but not a padded one: " t" is
			// the field t written loosely, and ignoring it would read t as
			// absent (try 1).
			if padded(key) {
				return Header{}, fail("", ErrSyntax)
			}
			continue
		}
		var bit uint8
		var err error
		switch key[0] {
		case 'a':
			bit = seenA
			h.Attempt, err = token(val, MaxAttemptLen)
		case 'c':
			bit = seenC
			h.Call, err = token(val, MaxCallLen)
		case 't':
			bit = seenT
			var n uint64
			n, err = Decimal(val, 1, MaxTry)
			h.Try = uint32(n)
		case 'd':
			bit = seenD
			var n uint64
			n, err = Decimal(val, 1, MaxDeadline)
			h.Deadline = int64(n)
		case 'u':
			bit = seenU
			var n uint64
			n, err = Decimal(val, 0, MaxUnits)
			h.Units = int64(n)
		case 'n':
			bit = seenN
			h.Tenant, err = token(val, MaxTenantLen)
		case 'r':
			bit = seenR
			if val != "1" {
				err = ErrRange
			}
			h.Strict = true
		default:
			if padded(key) {
				return Header{}, fail("", ErrSyntax) // as for a longer key
			}
			continue // unknown key
		}
		if seen&bit != 0 {
			return Header{}, fail(key, ErrRepeated)
		}
		seen |= bit
		if err != nil {
			return Header{}, fail(key, err)
		}
	}
	if seen&seenA == 0 {
		return Header{}, fail("a", ErrMissing)
	}
	if seen&seenC == 0 {
		h.Call = DefaultCall
	}
	if seen&seenT == 0 {
		h.Try = 1
	}
	return h, nil
}

// padded reports whether key holds a space or a control character.
func padded(key string) bool {
	for i := 0; i < len(key); i++ {
		if key[i] <= ' ' || key[i] == 0x7f {
			return true
		}
	}
	return false
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// token checks a 1–max character value of [A-Za-z0-9._:-].
func token(v string, maxLen int) (string, error) {
	if err := ValidToken(v, maxLen); err != nil {
		return "", err
	}
	return v, nil
}

// ValidToken reports whether s is 1–maxLen characters of [A-Za-z0-9._:-], the
// charset of attempt IDs, call keys and tenants: nil, or [ErrMissing] (empty),
// [ErrTooLong] or [ErrCharset]. It allocates nothing.
func ValidToken(s string, maxLen int) error {
	if s == "" {
		return ErrMissing
	}
	if len(s) > maxLen {
		return ErrTooLong
	}
	for i := 0; i < len(s); i++ {
		if !IsTokenByte(s[i]) {
			return ErrCharset
		}
	}
	return nil
}

// IsTokenByte reports whether c is in [A-Za-z0-9._:-].
func IsTokenByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	case c == '.', c == '_', c == ':', c == '-':
		return true
	}
	return false
}

// Decimal parses v as a strict decimal in [lo, hi]: digits only, no sign, no
// leading zero (except "0" itself), no overflow; hi must be below 2^63. The
// error is ErrNumber or ErrRange. The header's numbers and the tollgate-spent
// trailer are spelled this way.
func Decimal(v string, lo, hi uint64) (uint64, error) {
	if v == "" {
		return 0, ErrNumber
	}
	if len(v) > 1 && v[0] == '0' {
		return 0, ErrNumber
	}
	var n uint64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, ErrNumber
		}
		if d := uint64(c - '0'); d > hi || n > (hi-d)/10 {
			// n*10 + d would exceed hi (and hi < 2^63, so it cannot wrap).
			return 0, ErrRange
		}
		n = n*10 + uint64(c-'0')
	}
	if n < lo {
		return 0, ErrRange
	}
	return n, nil
}

// Validate reports whether h would format to a header that [Parse] accepts:
// nil, or an *[Error] naming the first bad field. Call and Try may be left
// zero ("" and 0): they stand for their defaults.
func (h Header) Validate() error {
	if err := ValidToken(h.Attempt, MaxAttemptLen); err != nil {
		return fail("a", err)
	}
	if h.Call != "" {
		if err := ValidToken(h.Call, MaxCallLen); err != nil {
			return fail("c", err)
		}
	}
	if h.Try > MaxTry {
		return fail("t", ErrRange)
	}
	if h.Deadline < 0 || h.Deadline > MaxDeadline {
		return fail("d", ErrRange)
	}
	if h.Units < 0 || h.Units > MaxUnits {
		return fail("u", ErrRange)
	}
	if h.Tenant != "" {
		if err := ValidToken(h.Tenant, MaxTenantLen); err != nil {
			return fail("n", err)
		}
	}
	if len(h.String()) > MaxLen {
		return fail("", ErrTooLong)
	}
	return nil
}

// Append appends the header's value to dst and returns the extended slice.
// It writes the fields in the order a, c, t, d, u, n, r and leaves out those
// that hold their defaults (call DefaultCall or "", try 0 or 1, deadline 0,
// units 0, tenant "", not strict), so that Parse(string(h.Append(nil))) ==
// h for every h that Parse returned. It does not validate: see
// [Header.Validate]. It allocates only when dst lacks capacity.
func (h Header) Append(dst []byte) []byte {
	dst = append(dst, "a="...)
	dst = append(dst, h.Attempt...)
	if h.Call != "" && h.Call != DefaultCall {
		dst = append(dst, ";c="...)
		dst = append(dst, h.Call...)
	}
	if h.Try > 1 {
		dst = append(dst, ";t="...)
		dst = strconv.AppendUint(dst, uint64(h.Try), 10)
	}
	if h.Deadline != 0 {
		dst = append(dst, ";d="...)
		dst = strconv.AppendInt(dst, h.Deadline, 10)
	}
	if h.Units != 0 {
		dst = append(dst, ";u="...)
		dst = strconv.AppendInt(dst, h.Units, 10)
	}
	if h.Tenant != "" {
		dst = append(dst, ";n="...)
		dst = append(dst, h.Tenant...)
	}
	if h.Strict {
		dst = append(dst, ";r=1"...)
	}
	return dst
}

// String returns the header's value as [Header.Append] writes it. It
// allocates the string (one allocation for a header up to MaxLen bytes).
func (h Header) String() string {
	var buf [MaxLen]byte
	return string(h.Append(buf[:0]))
}

// DeadlineTime returns the deadline as a time.Time, and false when the header
// carries none.
func (h Header) DeadlineTime() (time.Time, bool) {
	if h.Deadline == 0 {
		return time.Time{}, false
	}
	return time.UnixMilli(h.Deadline), true
}
