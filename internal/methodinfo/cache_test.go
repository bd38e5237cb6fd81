package methodinfo

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
)

func cached() int {
	if m := cache.m.Load(); m != nil {
		return len(*m)
	}
	return 0
}

// A peer that sends ever new method names (a proxy's UnknownServiceHandler
// runs the stream interceptor for any name) cannot grow the cache past
// maxUnknown unknown names; registered methods are still cached after that,
// and every answer stays right.
func TestCacheBoundsUnknownNames(t *testing.T) {
	for i := range 4 * maxUnknown {
		require.Equal(t, Info{}, Of(fmt.Sprintf("/peer.Chosen/Name%d", i)))
	}
	require.LessOrEqual(t, cached(), maxUnknown+16, "unknown names grew the cache without bound")

	before := cached()
	info := Of(testingv1.TestService_Put_FullMethodName)
	require.Equal(t, Idempotent, info.Level)
	_, ok := (*cache.m.Load())[testingv1.TestService_Put_FullMethodName]
	require.True(t, ok, "a registered method is cached even once the bound is reached")
	require.LessOrEqual(t, cached(), before+1)
	require.Equal(t, Info{}, Of("/peer.Chosen/Name0"), "an unknown name looked up again, cached or not, answers the same")
}

// Reading a cached method allocates nothing.
func TestOfCachedAllocatesNothing(t *testing.T) {
	Of(testingv1.TestService_Get_FullMethodName)
	require.Zero(t, testing.AllocsPerRun(100, func() { Of(testingv1.TestService_Get_FullMethodName) }))
}
