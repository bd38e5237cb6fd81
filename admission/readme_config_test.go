package admission_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// TestReadmeAdmissionConfig runs the README's admission configuration and
// override snippets as written and checks what the README says of them:
// the classification (a whole service, an exact method, the default class,
// AttemptService in the control class), that with TenantRunning 1 and
// TenantQueued 4 on the control class one tenant's burst of more than 5
// queries is refused TENANT_LIMIT while another tenant's queries still
// find a slot and places in the queue, and that the override freezes its
// class (SHED). (Review r12: the README's snippet had QueueItems 4 and
// TenantQueued 8 and said a burst of more than 9 was refused; the class's
// queue of 4 refused the 6th, and TenantQueued never bound.)
func TestReadmeAdmissionConfig(t *testing.T) {
	// --- the README's configuration, as written ---
	ctrl, err := admission.New(
		admission.WithClasses(
			admission.Class{Name: "heavy", Slots: 6, QueueItems: 12, QueueBytes: 8 << 20,
				ExpectedServiceTime: 2 * time.Second, MaxServiceTime: time.Minute,
				TenantRunning: 2, TenantQueueWork: 30 * time.Second},
			admission.Class{Name: "batch", Slots: 4, QueueItems: 32, Optional: true, LendIdle: true},
			admission.Class{Name: admission.ControlClass, Slots: 2, QueueItems: 8, // replaces the default
				TenantRunning: 1, TenantQueued: 4},
		),
		admission.WithMethods("batch", "/reports.Exporter/"),                // a whole service
		admission.WithMethods(admission.ControlClass, "/ops.Deploy/Cancel"), // an exact method
		admission.WithDefaultClass("heavy"),
		admission.WithDegradation(admission.Degradation{Window: time.Second, ExitAfter: 3, MaxQueueAge: 5 * time.Second}),
	)
	// --- end ---
	require.NoError(t, err)
	defer ctrl.Close()
	ctx := context.Background()
	deadline := time.Now().Add(time.Minute)

	for method, class := range map[string]string{
		"/reports.Exporter/Export":               "batch",
		"/ops.Deploy/Cancel":                     admission.ControlClass,
		"/orders.Orders/Place":                   "heavy",
		"/tollgate.v1.AttemptService/GetAttempt": admission.ControlClass,
	} {
		p, d, err := ctrl.AdmitDecision(ctx, admission.Request{Method: method, Deadline: deadline})
		require.NoError(t, err, method)
		require.Equal(t, class, d.Class, method)
		p.Release()
	}

	// One tenant's burst of queries: 1 runs, 4 wait, the 6th is refused.
	query := admission.Request{Method: "/tollgate.v1.AttemptService/FenceAttempt", Tenant: "a", Deadline: deadline}
	running, err := ctrl.Admit(ctx, query)
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if p, err := ctrl.Admit(wctx, query); err == nil {
				p.Release()
			}
		}()
	}
	defer func() {
		cancel()
		wg.Wait()
	}()
	waitUntil(t, func() bool {
		s, _ := ctrl.Stats().Class(admission.ControlClass)
		return s.Tenants["a"].Queued == 4
	})
	_, err = ctrl.Admit(ctx, query)
	o := status.OutcomeOf(err)
	require.Equal(t, status.KindNotAdmitted, o.Kind, "%v", err)
	require.Equal(t, status.ReasonTenantLimit, o.Reason, "the 6th query of one tenant: %v", err)
	other := admission.Request{Method: query.Method, Tenant: "b", Deadline: deadline}
	otherRunning, err := ctrl.Admit(ctx, other)
	require.NoError(t, err, "another tenant's query still runs on the class's second slot")
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if p, err := ctrl.Admit(wctx, other); err == nil {
				p.Release()
			}
		}()
	}
	waitUntil(t, func() bool {
		s, _ := ctrl.Stats().Class(admission.ControlClass)
		return s.Tenants["b"].Queued == 2 && s.Queued == 6
	})
	otherRunning.Release()
	running.Release()

	// --- the README's override, as written ---
	id, err := ctrl.SetOverride(ctx, admission.Override{
		Actor: "oncall@example.com", Reason: "INC-1640", TTL: 10 * time.Minute,
		Class: "batch", Freeze: true, // or Slots: 1, QueueItems: 4, or Mode: admission.ModeDegraded
	})
	// --- end ---
	require.NoError(t, err)
	require.NotZero(t, id)
	_, err = ctrl.Admit(ctx, admission.Request{Method: "/reports.Exporter/Export", Deadline: deadline})
	require.Equal(t, status.ReasonShed, status.OutcomeOf(err).Reason, "%v", err)
}

// waitUntil polls cond until it holds, failing the test after a minute.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	stop := time.Now().Add(time.Minute)
	for !cond() {
		require.True(t, time.Now().Before(stop), "condition never held")
		timer := time.NewTimer(time.Millisecond)
		<-timer.C
	}
}
