package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Key names one record: the calls of one attempt are told apart by their
// call key and method, and every tenant has its own records. Its zero value
// is not a valid key; see [ValidateKey].
type Key struct {
	// Tenant is the caller's tenant; "" when the server has none. 0–64
	// characters of [A-Za-z0-9._:-].
	Tenant string
	// AttemptID is the attempt's identity (the header's "a"), 1–64 characters
	// of [A-Za-z0-9._:-], minted as a UUIDv7.
	AttemptID string
	// Call is the call key (the header's "c"), 1–128 characters of
	// [A-Za-z0-9._:-].
	Call string
	// Method is the call's gRPC path, "/service/method" (see ValidateKey).
	Method string
}

// ErrMalformedKey is matched (errors.Is) by every error that reports a
// malformed key, try number or request; one about another part of a
// request than its key and try reads "idempotency: malformed request". The
// AttemptService answers it with INVALID_ARGUMENT.
var ErrMalformedKey = errors.New("idempotency: malformed key")

// Limits of a key's parts (DESIGN.md §2.1, §2.2).
const (
	maxTenantLen  = 64
	maxAttemptLen = 64
	maxCallLen    = 128
	maxMethodLen  = 512
	// MaxTry is the highest try number (the header's "t" is 1–1000).
	MaxTry = 1000
)

// ValidateKey reports whether k is well formed: a tenant of 0–64 and an
// attempt ID of 1–64 characters of [A-Za-z0-9._:-], a call key of 1–128 such
// characters, and a method that is a gRPC path, "/service/method": both parts
// non-empty, at most 512 bytes of printable ASCII without spaces, '{', '}'
// or '|'. The error
// wraps [ErrMalformedKey] and says which part is wrong. It does not require the
// attempt ID to be a UUIDv7: an ID that is not one is well formed but lies
// outside every store's horizon.
func ValidateKey(k Key) error {
	if len(k.Tenant) > maxTenantLen || !tokenChars(k.Tenant) {
		return fmt.Errorf("%w: tenant must be at most %d characters of [A-Za-z0-9._:-]", ErrMalformedKey, maxTenantLen)
	}
	if k.AttemptID == "" {
		return fmt.Errorf("%w: attempt_id is empty", ErrMalformedKey)
	}
	if len(k.AttemptID) > maxAttemptLen || !tokenChars(k.AttemptID) {
		return fmt.Errorf("%w: attempt_id must be 1–%d characters of [A-Za-z0-9._:-]", ErrMalformedKey, maxAttemptLen)
	}
	if k.Call == "" {
		return fmt.Errorf("%w: call is empty (the first call of an attempt is \"0\")", ErrMalformedKey)
	}
	if len(k.Call) > maxCallLen || !tokenChars(k.Call) {
		return fmt.Errorf("%w: call must be 1–%d characters of [A-Za-z0-9._:-]", ErrMalformedKey, maxCallLen)
	}
	if k.Method == "" {
		return fmt.Errorf("%w: method is empty", ErrMalformedKey)
	}
	if !validMethod(k.Method) {
		return fmt.Errorf("%w: method must be a full gRPC method name, \"/package.Service/Method\", of printable ASCII without spaces, '{', '}' or '|'", ErrMalformedKey)
	}
	return nil
}

func validTry(try uint32) error {
	if try < 1 || try > MaxTry {
		return fmt.Errorf("%w: try must be 1–%d, not %d", ErrMalformedKey, MaxTry, try)
	}
	return nil
}

// tokenChars reports whether s holds only [A-Za-z0-9._:-].
func tokenChars(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

// validMethod reports whether m is a gRPC path, "/service/method": both
// parts non-empty, of printable ASCII without '/', a space, or the '{', '}'
// and '|' that Redis keys and hash tags are built with. gRPC asks little
// more of a method's name; a service need not be described in protobuf (a
// hand-written ServiceDesc may name its methods "apply-v2").
func validMethod(m string) bool {
	if len(m) < 4 || len(m) > maxMethodLen || m[0] != '/' {
		return false
	}
	slash := -1
	for i := 1; i < len(m); i++ {
		c := m[i]
		switch {
		case c == '/':
			if slash >= 0 {
				return false
			}
			slash = i
		case c < 0x21 || c > 0x7e, c == '{', c == '}', c == '|':
			return false
		}
	}
	return slash > 1 && slash < len(m)-1
}

// AttemptTime returns the creation time carried by an attempt ID that is a
// UUIDv7 in its canonical text form (8-4-4-4-12 hexadecimal digits, version
// 7, RFC 9562 variant), and false for any other ID. The time has millisecond
// precision. It never panics, whatever the input.
func AttemptTime(id string) (time.Time, bool) {
	ms, ok := attemptMillis(id)
	if !ok {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}

// attemptMillis is [AttemptTime] in Unix milliseconds.
func attemptMillis(id string) (int64, bool) {
	if len(id) != 36 || id[8] != '-' || id[13] != '-' || id[18] != '-' || id[23] != '-' {
		return 0, false
	}
	if id[14] != '7' {
		return 0, false
	}
	switch id[19] {
	case '8', '9', 'a', 'b', 'A', 'B':
	default:
		return 0, false
	}
	var ms int64
	for i := 0; i < 36; i++ {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			continue
		}
		v, ok := hexVal(id[i])
		if !ok {
			return 0, false
		}
		if i < 13 { // the first 48 bits: 8 digits, a hyphen, 4 digits
			ms = ms<<4 | int64(v)
		}
	}
	return ms, true
}

func hexVal(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// Digest is a 128-bit request fingerprint; see [Fingerprint]. The zero Digest
// means "no fingerprint": a tombstone made by a fence before any try began
// holds it, and a try begun with it makes a record that every request
// matches (no later try is refused ATTEMPT_REQUEST_MISMATCH), in every store.
type Digest [16]byte

// Fingerprint returns the 128-bit fingerprint of a request: the first 16
// bytes of SHA-256 over the method's length (8 bytes, big-endian), the method
// and the request bytes. SHA-256 is in the standard library, is the same on
// every platform and in every release, and resists deliberate collisions, so
// one caller cannot craft a request that replays another's stored response;
// 128 bits keep accidental collisions out of reach. The length prefix keeps
// (method, request) pairs from running into one another. It costs at most
// one allocation and is safe for concurrent use.
func Fingerprint(method string, request []byte) Digest {
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(method)))
	h.Write(n[:])
	h.Write([]byte(method))
	h.Write(request)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	var d Digest
	copy(d[:], sum[:16])
	return d
}
