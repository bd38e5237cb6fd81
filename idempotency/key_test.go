package idempotency_test

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/idempotency"
	"github.com/tollgate-go/tollgate/idempotency/storetest"
)

func TestAttemptTime(t *testing.T) {
	at := time.UnixMilli(1764474000123)
	id := storetest.AttemptIDAt(at)
	got, ok := idempotency.AttemptTime(id)
	require.True(t, ok)
	require.True(t, got.Equal(at), "%v != %v", got, at)
	got, ok = idempotency.AttemptTime(strings.ToUpper(id))
	require.True(t, ok)
	require.True(t, got.Equal(at))
	got, ok = idempotency.AttemptTime("0190a5b2-7c3e-7def-8123-456789abcdef") // DESIGN.md §2.1's example
	require.True(t, ok)
	require.Equal(t, int64(0x0190a5b27c3e), got.UnixMilli())
	for _, bad := range []string{
		"", "0", uuid.NewString(), // v4
		"0190a5b2-7c3e-7def-c123-456789abcdef", // wrong variant
		"0190a5b27c3e7def8123456789abcdef",     // no hyphens
		"0190a5b2-7c3e-7def-8123-456789abcdeg", // not hex
		"{0190a5b2-7c3e-7def-8123-456789abcde}",
	} {
		_, ok := idempotency.AttemptTime(bad)
		require.False(t, ok, bad)
	}
}

// FuzzAttemptTime checks the UUIDv7 time extraction, which reads peer input,
// against github.com/google/uuid: it never panics, and accepts exactly the
// canonical version-7, RFC 9562-variant UUIDs, with their time.
func FuzzAttemptTime(f *testing.F) {
	f.Add("0190a5b2-7c3e-7def-8123-456789abcdef")
	f.Add(uuid.NewString())
	f.Add("0190A5B2-7C3E-7DEF-B123-456789ABCDEF")
	f.Add("order-42")
	f.Fuzz(func(t *testing.T, id string) {
		got, ok := idempotency.AttemptTime(id)
		u, err := uuid.Parse(id)
		want := err == nil && len(id) == 36 && u.Version() == 7 && u.Variant() == uuid.RFC4122
		if ok != want {
			t.Fatalf("AttemptTime(%q) ok=%v, uuid says %v (err %v)", id, ok, want, err)
		}
		if ok {
			sec, nsec := u.Time().UnixTime()
			if got.UnixMilli() != sec*1000+nsec/1e6 {
				t.Fatalf("AttemptTime(%q) = %v, uuid says %v", id, got.UnixMilli(), sec*1000+nsec/1e6)
			}
		}
	})
}

func TestValidateKey(t *testing.T) {
	good := idempotency.Key{Tenant: "acme", AttemptID: "0190a5b2-7c3e-7def-8123-456789abcdef", Call: "0.2.reserve-stock", Method: "/tollgate.v1.AttemptService/GetAttempt"}
	require.NoError(t, idempotency.ValidateKey(good))
	noTenant := good
	noTenant.Tenant = ""
	require.NoError(t, idempotency.ValidateKey(noTenant))
	cases := map[string]func(k *idempotency.Key){
		"attempt_id is empty":       func(k *idempotency.Key) { k.AttemptID = "" },
		"attempt_id must be":        func(k *idempotency.Key) { k.AttemptID = strings.Repeat("a", 65) },
		"attempt_id must be 1":      func(k *idempotency.Key) { k.AttemptID = "a/b" },
		"call is empty":             func(k *idempotency.Key) { k.Call = "" },
		"call must be":              func(k *idempotency.Key) { k.Call = strings.Repeat("c", 129) },
		"call must be 1":            func(k *idempotency.Key) { k.Call = "0|1" },
		"method is empty":           func(k *idempotency.Key) { k.Method = "" },
		"method must be":            func(k *idempotency.Key) { k.Method = "tollgate.v1.AttemptService/GetAttempt" },
		"method must be a":          func(k *idempotency.Key) { k.Method = "/tollgate.v1.AttemptService/" },
		"method must be a full":     func(k *idempotency.Key) { k.Method = "/a/b/c" },
		"method must be a full gRP": func(k *idempotency.Key) { k.Method = "/a b/c" },
		"method must be a full gR":  func(k *idempotency.Key) { k.Method = "/a/b\n" },
		"method must be a full g":   func(k *idempotency.Key) { k.Method = "/a/{b}" },
		"tenant must be":            func(k *idempotency.Key) { k.Tenant = "{acme}" },
	}
	for want, mutate := range cases {
		k := good
		mutate(&k)
		err := idempotency.ValidateKey(k)
		require.ErrorIs(t, err, idempotency.ErrMalformedKey, want)
		require.ErrorContains(t, err, want)
		require.True(t, strings.HasPrefix(err.Error(), "idempotency: "))
	}
	k := good
	k.Call = strings.Repeat("c", 128)
	require.NoError(t, idempotency.ValidateKey(k))
	// Any gRPC path: a hand-written ServiceDesc's names need not be
	// protobuf identifiers.
	for _, m := range []string{"/pkg.Svc/apply-v2", "/a..b/c", "/Svc/do:it"} {
		k := good
		k.Method = m
		require.NoError(t, idempotency.ValidateKey(k), m)
	}
}

// FuzzValidateKey: key validation reads peer input (AttemptService requests,
// headers); it never panics, and what it accepts is safe to build Redis keys
// and log lines from.
func FuzzValidateKey(f *testing.F) {
	f.Add("acme", "0190a5b2-7c3e-7def-8123-456789abcdef", "0", "/a.B/C")
	f.Add("", "x", "0.1.2", "/a/b")
	f.Add("{t}", "a|b", "", "//")
	f.Fuzz(func(t *testing.T, tenant, id, call, method string) {
		err := idempotency.ValidateKey(idempotency.Key{Tenant: tenant, AttemptID: id, Call: call, Method: method})
		if err != nil {
			if !errors.Is(err, idempotency.ErrMalformedKey) {
				t.Fatalf("error %v does not wrap ErrMalformedKey", err)
			}
			return
		}
		for _, s := range []string{tenant, id, call, method} {
			if strings.ContainsAny(s, "{}| \r\n\x00") {
				t.Fatalf("accepted %q", s)
			}
		}
		if id == "" || call == "" || len(id) > 64 || len(call) > 128 || len(tenant) > 64 || !strings.HasPrefix(method, "/") || strings.Count(method, "/") != 2 {
			t.Fatalf("accepted %q %q %q %q", tenant, id, call, method)
		}
	})
}

func TestFingerprint(t *testing.T) {
	m := "/tollgate.testing.v1.TestService/Put"
	req := []byte("k=v")
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(m)))
	h.Write(n[:])
	h.Write([]byte(m))
	h.Write(req)
	var want idempotency.Digest
	copy(want[:], h.Sum(nil))
	require.Equal(t, want, idempotency.Fingerprint(m, req))
	// The method's length keeps method and request apart.
	require.NotEqual(t, idempotency.Fingerprint("/a.B/C", []byte("x")), idempotency.Fingerprint("/a.B/Cx", nil))
	require.NotEqual(t, idempotency.Digest{}, idempotency.Fingerprint("", nil))
	allocs := testing.AllocsPerRun(100, func() { idempotency.Fingerprint(m, req) })
	t.Logf("Fingerprint allocates %v times", allocs)
	require.LessOrEqual(t, allocs, 1.0)
}

func TestPolicyVouches(t *testing.T) {
	p := storetest.Policy()
	horizon := time.UnixMilli(1764474000000)
	now := horizon.Add(5 * time.Second)
	at := func(d time.Duration) string { return storetest.AttemptIDAt(horizon.Add(d)) }
	require.True(t, p.Vouches(at(p.Skew), horizon, now))
	require.False(t, p.Vouches(at(p.Skew-time.Millisecond), horizon, now))
	require.True(t, p.Vouches(at(5*time.Second+p.Skew), horizon, now))
	require.False(t, p.Vouches(at(5*time.Second+p.Skew+time.Millisecond), horizon, now))
	require.False(t, p.Vouches("not-a-uuid", horizon, now))
	// Once a record of the attempt could have expired, absence proves nothing.
	id := at(5 * time.Second)
	require.True(t, p.Vouches(id, horizon, now.Add(p.TTL-p.Skew-time.Millisecond)))
	require.False(t, p.Vouches(id, horizon, now.Add(p.TTL-p.Skew)))
	require.NoError(t, idempotency.DefaultPolicy().Validate())
}
