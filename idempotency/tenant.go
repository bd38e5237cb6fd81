package idempotency

import "context"

type tenantKey struct{}

// ContextWithTenant returns a copy of ctx that carries tenant. tollgate's
// server interceptor calls it with the tenant it resolved for a request, so
// that an [AttemptService] answers under it (whatever its [WithTenant]
// function says: the tries were keyed under it). tenant is used as it is,
// not mapped as a WithTenant function's name is: it must be 0–64 characters
// of [A-Za-z0-9._:-], or every query under it fails INTERNAL.
func ContextWithTenant(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, tenantKey{}, tenant)
}

// TenantFromContext returns the tenant put in ctx by [ContextWithTenant], and
// "" (no tenant) when there is none.
func TenantFromContext(ctx context.Context) string {
	t, _ := ctx.Value(tenantKey{}).(string)
	return t
}
