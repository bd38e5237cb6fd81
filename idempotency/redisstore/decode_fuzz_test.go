package redisstore

import (
	"bytes"
	"strconv"
	"testing"

	"github.com/tollgate-go/tollgate/idempotency"
)

// FuzzDecode feeds decode script replies of any shape — what a Redis, or a
// hash at a record key that this store did not write, may send back: it
// must answer a kind, a record or an error, never panic, and never a
// record-carrying kind without its record.
func FuzzDecode(f *testing.F) {
	f.Add([]byte("i9\x00i3\x00i1\x00i0\x00i0\x00\x00\x00ok\x00i1\x00i2\x00i5\x00i6\x00i7\x00fp"))
	f.Add([]byte("i1"))
	f.Add([]byte("i9\x00garbage"))
	f.Add([]byte("i7\x00i123"))
	f.Add([]byte("i9\x00i3\x00i1\x00i0\x00i0\x00\x00\xff\xfe\x00ok\x00i1\x00i2\x00i5\x00i6\x00i7\x00fp"))
	key := idempotency.Key{Tenant: "t", AttemptID: "0190a5b2-7c3e-7def-8123-456789abcdef", Call: "0", Method: "/x.Y/Z"}
	f.Fuzz(func(t *testing.T, data []byte) {
		var v []any
		if len(data) > 0 {
			for _, part := range bytes.Split(data, []byte{0}) {
				if n, err := strconv.ParseInt(string(bytes.TrimPrefix(part, []byte("i"))), 10, 64); err == nil && bytes.HasPrefix(part, []byte("i")) {
					v = append(v, n)
				} else {
					v = append(v, string(part))
				}
			}
		}
		kind, rec, err := decode(key, v)
		if err != nil {
			return
		}
		switch kind {
		case kindFinished, kindInProgress, kindAbandoned, kindFenced, kindMismatch, kindRecord:
			if rec == nil {
				t.Fatalf("kind %d without its record from %q", kind, v)
			}
		}
	})
}
