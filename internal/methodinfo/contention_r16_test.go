package methodinfo

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Once maxUnknown unknown names are cached, a further unknown name (a
// proxy's UnknownServiceHandler sees any a peer sends) is looked up in the
// registry without the writers' lock: every call of such a server would
// otherwise take one process-wide mutex. The test holds that lock while it
// asks for new unknown names; they must be answered.
func TestOfUnknownBeyondBoundTakesNoLock(t *testing.T) {
	for i := range maxUnknown + 1 {
		Of(fmt.Sprintf("/peer.Fill/Name%d", i))
	}
	cache.mu.Lock()
	done := make(chan Info, 1)
	go func() { done <- Of("/peer.Other/NeverSeen") }()
	select {
	case info := <-done:
		cache.mu.Unlock()
		require.Equal(t, Info{}, info)
	case <-time.After(10 * time.Second):
		cache.mu.Unlock()
		<-done
		t.Fatal("an unknown name beyond the bound waited for the cache's lock")
	}
}
