// Package tenant maps a tenant function's name to the token that keys its
// records and travels in the tollgate header (field "n"), the same way for
// tollgate's server interceptor and idempotency's AttemptService, so that
// the same tenant function given to both keys and finds the same records.
package tenant

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/tollgate-go/tollgate/internal/header"
)

// Token returns t when it is a valid tenant token (1–64 characters of
// [A-Za-z0-9._:-]) not starting with "h.", or empty, and otherwise a stable
// digest of it, "h." and 40 hex digits of SHA-256, so that any tenant name
// (a SPIFFE ID, an e-mail) keeps its records apart and can travel in the
// header. A name that starts with "h." is hashed too, although it is a
// token: else a tenant named like another's digest would be that tenant.
// Records are keyed by it: it must not change.
func Token(t string) string {
	if t == "" || (!strings.HasPrefix(t, "h.") && header.ValidToken(t, header.MaxTenantLen) == nil) {
		return t
	}
	sum := sha256.Sum256([]byte(t))
	return "h." + hex.EncodeToString(sum[:20])
}
