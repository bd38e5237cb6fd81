package callkey_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/internal/callkey"
	"github.com/tollgate-go/tollgate/internal/header"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestOrigin(t *testing.T) {
	var o callkey.Origin
	for i, want := range []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11"} {
		require.Equal(t, want, o.Next(), "call %d", i)
	}
	k, err := o.Explicit("reserve-stock")
	require.NoError(t, err)
	require.Equal(t, "reserve-stock", k)
	require.Equal(t, "12", o.Next(), "Explicit does not advance the numbering")
}

func TestRun(t *testing.T) {
	r := callkey.NewRun("0", 2)
	require.Equal(t, "0", r.Parent())
	for _, want := range []string{"0.2.1", "0.2.2", "0.2.3"} {
		k, err := r.Next()
		require.NoError(t, err)
		require.Equal(t, want, k)
		require.NoError(t, callkey.Validate(k))
	}
	k, err := r.Explicit("reserve-stock")
	require.NoError(t, err)
	require.Equal(t, "0.reserve-stock", k)
	require.Equal(t, uint64(3), r.Count(), "Explicit does not advance k")

	below := callkey.NewRun("0.2.1", 1)
	k, err = below.Next()
	require.NoError(t, err)
	require.Equal(t, "0.2.1.1.1", k)
}

func TestExplicitNames(t *testing.T) {
	r := callkey.NewRun("0.1.1", 1)
	for _, bad := range []string{"", "2", "123", "a.b", "a b", "a/b", "é", strings.Repeat("x", 129)} {
		_, err := r.Explicit(bad)
		require.ErrorIs(t, err, callkey.ErrBadName, "%q", bad)
		var o callkey.Origin
		_, err = o.Explicit(bad)
		require.ErrorIs(t, err, callkey.ErrBadName, "%q", bad)
	}
	for _, good := range []string{"x", "2a", "a-1", "v1:put", "0x10"} {
		k, err := r.Explicit(good)
		require.NoError(t, err, good)
		require.Equal(t, "0.1.1."+good, k)
	}
	// A name that fits alone but not under a long parent.
	long := callkey.NewRun(strings.Repeat("7", 120), 1)
	_, err := long.Explicit("abcdefgh")
	require.ErrorIs(t, err, callkey.ErrTooLong)
	k, err := long.Explicit("abcdefg")
	require.NoError(t, err)
	require.Len(t, k, header.MaxCallLen)
}

func TestOverlongKeys(t *testing.T) {
	// 124-char parent + ".1." + "1" = 128: fits; k=10 would be 129.
	r := callkey.NewRun(strings.Repeat("1", 124), 1)
	for range 9 {
		k, err := r.Next()
		require.NoError(t, err)
		require.Len(t, k, 128)
	}
	_, err := r.Next()
	require.ErrorIs(t, err, callkey.ErrTooLong)

	// Deep trees: the key grows per tier until it is refused.
	key, depth := "0", 0
	for {
		k, err := callkey.NewRun(key, 1).Next()
		if err != nil {
			require.ErrorIs(t, err, callkey.ErrTooLong)
			break
		}
		key = k
		depth++
	}
	require.Greater(t, depth, 25)
	require.LessOrEqual(t, len(key), header.MaxCallLen)
}

func TestValidate(t *testing.T) {
	require.NoError(t, callkey.Validate("0.1.2.name"))
	require.ErrorIs(t, callkey.Validate(""), callkey.ErrBadKey)
	require.ErrorIs(t, callkey.Validate("a/b"), callkey.ErrBadKey)
	require.ErrorIs(t, callkey.Validate(strings.Repeat("1", 129)), callkey.ErrTooLong)
}

// TestUniqueUnderConcurrency mints keys from many goroutines at the origin
// and in nested runs (including explicit keys and re-runs of the same call
// with a new try) and checks no key repeats within the attempt.
func TestUniqueUnderConcurrency(t *testing.T) {
	const workers, perWorker = 8, 200
	var (
		mu   sync.Mutex
		seen = map[string]bool{}
	)
	add := func(k string) {
		mu.Lock()
		defer mu.Unlock()
		require.False(t, seen[k], "duplicate key %q", k)
		seen[k] = true
	}
	var o callkey.Origin
	roots := make([]string, 3)
	for i := range roots {
		roots[i] = o.Next()
		add(roots[i])
	}
	var wg sync.WaitGroup
	for _, root := range roots {
		for try := uint32(1); try <= 2; try++ { // two runs of the same call
			run := callkey.NewRun(root, try)
			for w := range workers {
				wg.Go(func() {
					for i := range perWorker {
						k, err := run.Next()
						if err != nil {
							t.Error(err)
							return
						}
						add(k)
						if i%50 == 0 { // one tier further down
							sub := callkey.NewRun(k, 1)
							k2, err := sub.Next()
							if err != nil {
								t.Error(err)
								return
							}
							add(k2)
							e, err := sub.Explicit("w" + string(rune('a'+w)))
							if err != nil {
								t.Error(err)
								return
							}
							add(e)
						}
					}
				})
			}
		}
		e, err := callkey.NewRun(root, 1).Explicit("named")
		require.NoError(t, err)
		add(e)
	}
	wg.Wait()
	require.Len(t, seen, 3+3*2*workers*perWorker+3*2*workers*(perWorker/50)*2+3)
}

func BenchmarkRunNext(b *testing.B) {
	r := callkey.NewRun("0.2.1", 1)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Next(); err != nil {
			b.Fatal(err)
		}
	}
}

func TestExplicit(t *testing.T) {
	for key, want := range map[string]bool{
		"0": false, "12": false, "0.1.2": false, "0.reserve.1.3": false,
		"reserve": true, "0.reserve": true, "0.1.2.a1": true, "3.2.1.x-y": true,
	} {
		if got := callkey.Explicit(key); got != want {
			t.Errorf("Explicit(%q) = %v, want %v", key, got, want)
		}
	}
	var o callkey.Origin
	k, err := o.Explicit("name")
	if err != nil || !callkey.Explicit(k) {
		t.Fatalf("Origin.Explicit: %q, %v", k, err)
	}
	if callkey.Explicit(o.Next()) {
		t.Fatal("an origin's numbered key read as explicit")
	}
}
