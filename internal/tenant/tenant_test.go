package tenant_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/internal/tenant"
)

// The mapping keys stored records: it must give the tokens the
// interceptor's own mapping gave before it moved here (values computed
// independently: "h." and the first 20 bytes of SHA-256, in hex).
func TestTokenIsStable(t *testing.T) {
	for in, want := range map[string]string{
		"":                                  "",
		"acme":                              "acme",
		"a.b_c:d-e":                         "a.b_c:d-e",
		"spiffe://example.org/ns/shop/sa/x": "h.a6a5e03aa7d2866af35b6a8f5b3c9db24bba8639",
		"h.x":                               "h.ad2191923a9419876dd2ab3f9f65e62417d97fc6",
		"alice@example.com":                 "h.ff8d9819fc0e12bf0d24892e45987e249a28dce8",
	} {
		require.Equal(t, want, tenant.Token(in), in)
	}
}
