// Package callkey mints the call keys of DESIGN.md §2.2, which name every
// logical RPC inside an attempt.
//
// At the origin, the calls made under one attempt are keyed 0, 1, 2, … in
// the order they are made ([Origin]). Below it, a call made during try T of
// call p gets p.T.k, where k counts the outbound calls of that handler run
// from 1 in the order they are sent ([Run]). A caller may instead name a call
// explicitly, p.name, so that a downstream effect deduplicates across re-runs
// of its handler ([Run.Explicit], [Origin.Explicit]).
//
// Keys are unique within an attempt whatever the order of concurrent calls.
// Their grammar keeps them unambiguous: a key is an origin component (digits,
// or an explicit name at the origin) followed by per-run pairs ".T.k" (both
// decimal) and explicit components ".name". An explicit name contains no '.'
// and at least one character that is not a digit, so it can never be read as
// part of a per-run pair: p.2 then p.2.1 could otherwise collide with the
// per-run key p.2.1.
//
// Keys are at most [header.MaxCallLen] characters of [A-Za-z0-9._:-]; a key
// that would be longer is an error, which the client interceptor turns into a
// local MALFORMED_HEADER refusal (final) before anything is sent. Keys grow by
// about four characters per tier, so only call trees some thirty tiers deep
// reach the limit.
package callkey

import (
	"errors"
	"strconv"
	"sync/atomic"

	"github.com/tollgate-go/tollgate/internal/header"
)

// ErrTooLong is returned for a key longer than header.MaxCallLen characters.
var ErrTooLong = errors.New("callkey: key longer than 128 characters")

// ErrBadName is returned for an explicit name that is empty, holds a
// character outside [A-Za-z0-9_:-] (no '.'), or consists of digits only.
var ErrBadName = errors.New("callkey: explicit name must be 1-128 characters of [A-Za-z0-9_:-] with a non-digit")

// ErrBadKey is returned by [Validate] for a key that is empty or holds a
// character outside [A-Za-z0-9._:-].
var ErrBadKey = errors.New("callkey: key must be 1-128 characters of [A-Za-z0-9._:-]")

// Validate reports whether key is a well-formed call key: nil, [ErrTooLong]
// or [ErrBadKey]. It allocates nothing.
func Validate(key string) error {
	switch header.ValidToken(key, header.MaxCallLen) {
	case nil:
		return nil
	case header.ErrTooLong:
		return ErrTooLong
	default:
		return ErrBadKey
	}
}

// ValidName checks an explicit name: 1–MaxCallLen characters of the key
// charset without '.', at least one of them not a digit.
func ValidName(name string) error { return validName(name) }

func validName(name string) error {
	if name == "" || len(name) > header.MaxCallLen {
		return ErrBadName
	}
	digits := true
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c == '.' || !header.IsTokenByte(c) {
			return ErrBadName
		}
		if c < '0' || c > '9' {
			digits = false
		}
	}
	if digits {
		return ErrBadName
	}
	return nil
}

// Origin numbers the calls an origin makes under one attempt: 0, 1, 2, … .
// The zero value is ready to use and its first key is "0". An Origin is safe
// for concurrent use; each key costs one atomic add and, above "9", one small
// allocation.
type Origin struct {
	next atomic.Uint64
}

// Next returns the key of the origin's next call. Concurrent calls get
// distinct keys.
func (o *Origin) Next() string {
	n := o.next.Add(1) - 1
	if n < 10 {
		return smallKeys[n]
	}
	return strconv.FormatUint(n, 10)
}

var smallKeys = [10]string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}

// Explicit returns the key of an explicitly named call at the origin: the
// name itself, which cannot collide with a numbered key because it contains
// a non-digit. It does not advance the numbering. The error is ErrBadName.
func (o *Origin) Explicit(name string) (string, error) {
	if err := validName(name); err != nil {
		return "", err
	}
	return name, nil
}

// Run numbers the outbound calls of one handler run: the run serving try T
// of call p keys its calls p.T.1, p.T.2, … in the order they are sent. Create
// one per handler run with [NewRun], or embed one in a larger struct and
// [Run.Init] it; the zero value is not useful. A Run is safe for concurrent
// use (after Init): each key costs one atomic add and one allocation (the key
// string); building a Run allocates nothing more than the Run itself.
type Run struct {
	parent string
	try    uint32
	next   atomic.Uint64
}

// NewRun returns the numbering of the handler run that serves try of call
// parent. parent is the key the run's request carried (header field c).
func NewRun(parent string, try uint32) *Run {
	r := &Run{}
	r.Init(parent, try)
	return r
}

// Init readies r, a Run embedded in a larger value, as NewRun would. It must
// be called once, before r is shared.
func (r *Run) Init(parent string, try uint32) {
	r.parent, r.try = parent, try
}

// Parent returns the key of the call this run serves.
func (r *Run) Parent() string { return r.parent }

// Next returns the key of the run's next outbound call. Concurrent calls get
// distinct keys; a call that is not sent after all (refused locally) still
// uses its number, so keys may skip, never repeat. tollgate's own queries must
// not call Next. The error is [ErrTooLong] when the key would exceed
// header.MaxCallLen characters (the number is used anyway).
func (r *Run) Next() (string, error) {
	k := r.next.Add(1)
	if len(r.parent)+digits(uint64(r.try))+digits(k)+2 > header.MaxCallLen {
		return "", ErrTooLong
	}
	var buf [header.MaxCallLen]byte
	b := append(buf[:0], r.parent...)
	b = append(b, '.')
	b = strconv.AppendUint(b, uint64(r.try), 10)
	b = append(b, '.')
	b = strconv.AppendUint(b, k, 10)
	return string(b), nil
}

// Count returns how many keys Next has handed out.
func (r *Run) Count() uint64 { return r.next.Load() }

// Explicit returns parent.name, the key of an explicitly named call: the same
// on every re-run of the handler, so that the callee's record deduplicates it.
// It does not advance the numbering. The errors are [ErrBadName] and
// [ErrTooLong].
func (r *Run) Explicit(name string) (string, error) {
	if err := validName(name); err != nil {
		return "", err
	}
	if len(r.parent)+1+len(name) > header.MaxCallLen {
		return "", ErrTooLong
	}
	return r.parent + "." + name, nil
}

func digits(n uint64) int {
	d := 1
	for n >= 10 {
		n /= 10
		d++
	}
	return d
}

// Explicit reports whether key names an explicitly keyed call: whether its
// last component is a name (it holds a character that is not a digit)
// rather than a number of the origin or of a per-run pair. Every run of
// the calling handler sends such a key, so its first try may follow
// another run's.
func Explicit(key string) bool {
	for i := len(key) - 1; i >= 0 && key[i] != '.'; i-- {
		if key[i] < '0' || key[i] > '9' {
			return true
		}
	}
	return false
}
