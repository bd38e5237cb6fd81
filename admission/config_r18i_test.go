package admission_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
)

// TenantQueued on a class without a queue is refused, but TenantQueueWork
// and QueueBytes were accepted there and bound nothing: nothing of such a
// class ever waits (a tenant whose learned mean exceeded a 1 ms
// TenantQueueWork was admitted to a free slot). Both are ErrInvalidConfig,
// with a message like TenantQueued's.
func TestR18iQueueOnlyLimitsNeedAQueue(t *testing.T) {
	for name, tc := range map[string]struct {
		class admission.Class
		want  string
	}{
		"TenantQueueWork": {admission.Class{Name: "a", Slots: 4, TenantQueueWork: time.Millisecond},
			`class "a": TenantQueueWork 1ms bounds a queue the class does not have (QueueItems 0)`},
		"QueueBytes": {admission.Class{Name: "a", Slots: 4, QueueBytes: 100},
			`class "a": QueueBytes 100 bounds a queue the class does not have (QueueItems 0)`},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := admission.New(admission.WithClasses(tc.class))
			if err == nil {
				_ = c.Close()
			}
			require.ErrorIs(t, err, admission.ErrInvalidConfig)
			require.ErrorContains(t, err, tc.want)
		})
	}
	c, err := admission.New(admission.WithClasses(admission.Class{Name: "a", Slots: 4, QueueItems: 1,
		TenantQueueWork: time.Millisecond, QueueBytes: 100}))
	require.NoError(t, err)
	require.NoError(t, c.Close())
}

// A class named "a\xff" was accepted, and its refusals then carried
// "a\uFFFD" (protobuf strings are UTF-8): a name that does not survive the
// wire, or one with control characters, is refused at New.
func TestR18iClassNameMustBePrintableUTF8(t *testing.T) {
	for _, name := range []string{"a\xff", "a\n", "a\x00b", "a\x7f", "a\u0085"} {
		c, err := admission.New(admission.WithClasses(admission.Class{Name: name, Slots: 1}))
		if err == nil {
			_ = c.Close()
		}
		require.ErrorIs(t, err, admission.ErrInvalidConfig, "%q", name)
		require.ErrorContains(t, err, "UTF-8", "%q", name)
	}
	for _, name := range []string{"a b", "heavy-β", "x:y/z"} {
		c, err := admission.New(admission.WithClasses(admission.Class{Name: name, Slots: 1}))
		require.NoError(t, err, "%q", name)
		require.NoError(t, c.Close())
	}
}

// WithMethods("default", "/") was refused as `pattern "/" must start with
// "/"`, which it does: the error says what is wrong with it.
func TestR18iSlashPatternMessage(t *testing.T) {
	_, err := admission.New(admission.WithMethods(admission.DefaultClass, "/"))
	require.ErrorIs(t, err, admission.ErrInvalidConfig)
	require.NotContains(t, err.Error(), "must start with")
	require.ErrorContains(t, err, `pattern "/" is neither a full method`)

	_, err = admission.New(admission.WithMethods(admission.DefaultClass, "pkg.S/M"))
	require.ErrorContains(t, err, `pattern "pkg.S/M" must start with "/"`)
}

// Override.Actor and Override.Reason were unbounded: 1 MiB of either was
// accepted and emitted as span attributes. Each is at most
// 256 bytes (MaxOverrideTextBytes) of valid UTF-8.
func TestR18iOverrideActorAndReasonAreBounded(t *testing.T) {
	c, err := admission.New(admission.WithClasses(admission.Class{Name: "a", Slots: 2, QueueItems: 2}))
	require.NoError(t, err)
	defer c.Close()
	ctx := context.Background()
	base := admission.Override{Actor: "ops", Reason: "incident", TTL: time.Minute, Class: "a", Slots: 1}
	long := strings.Repeat("x", maxOverrideText+1)
	for name, mut := range map[string]func(*admission.Override){
		"actor 1 MiB":      func(o *admission.Override) { o.Actor = strings.Repeat("x", 1<<20) },
		"actor too long":   func(o *admission.Override) { o.Actor = long },
		"reason too long":  func(o *admission.Override) { o.Reason = long },
		"actor not UTF-8":  func(o *admission.Override) { o.Actor = "op\xff" },
		"reason not UTF-8": func(o *admission.Override) { o.Reason = "why\xc3" },
	} {
		t.Run(name, func(t *testing.T) {
			o := base
			mut(&o)
			_, err := c.SetOverride(ctx, o)
			require.ErrorIs(t, err, admission.ErrInvalidOverride)
			_, err = c.SetOverrideAt(ctx, o, time.Now())
			require.ErrorIs(t, err, admission.ErrInvalidOverride)
		})
	}
	o := base
	o.Actor = strings.Repeat("é", maxOverrideText/2)
	o.Reason = strings.Repeat("r", maxOverrideText)
	id, err := c.SetOverride(ctx, o)
	require.NoError(t, err)
	require.True(t, c.ClearOverride(ctx, id))
}

// maxOverrideText is admission.MaxOverrideTextBytes (a literal, so that the
// test compiled before the bound existed).
const maxOverrideText = 256
