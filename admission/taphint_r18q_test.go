package admission_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc/tap"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// The tap's hint held a predicted wait (a duration) while the class is
// full, and the instant it can be admitted again (Unix ns) while it is
// shed or frozen; its flag and its hint are two atomics, set one after the
// other. A tap call that reads the flag of one state and the hint of the
// other took an instant for a wait — a CONCURRENCY_FULL with a retry-after
// at the bound — or a wait for an instant — a SHED with the floor, the
// freeze's hour ignored. A class frozen and thawed while it is full: each
// refusal's retry-after is its own reason's.
func TestR18qTapRetryAfterNeverMixesTheFullAndShedHints(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: "a", Slots: 1, ExpectedServiceTime: 10 * time.Millisecond}),
		admission.WithDefaultClass("a"), admission.WithMaxRetryAfter(10*time.Hour))
	require.NoError(t, err)
	defer func() { require.NoError(t, ctrl.Close()) }()
	p, err := ctrl.Admit(context.Background(), admission.Request{Method: "/a.A/Do", Size: -1})
	require.NoError(t, err)
	defer p.Abandon()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			id, err := ctrl.SetOverride(context.Background(), admission.Override{Actor: "a", Reason: "r", TTL: time.Hour, Class: "a", Freeze: true})
			if err != nil {
				panic(err)
			}
			ctrl.ClearOverride(context.Background(), id)
		}
	}()
	var full, shed int
	for range 200000 {
		_, err := ctrl.TapHandle(context.Background(), &tap.Info{FullMethodName: "/a.A/Do"})
		if err == nil {
			continue
		}
		ra, _ := status.RetryAfter(err)
		switch status.OutcomeOf(err).Reason {
		case status.ReasonConcurrencyFull:
			full++
			if ra > time.Second {
				close(stop)
				wg.Wait()
				t.Fatalf("CONCURRENCY_FULL with a retry-after of %v (of a 10 ms wait)", ra)
			}
		case status.ReasonShed:
			shed++
			if ra < 50*time.Minute {
				close(stop)
				wg.Wait()
				t.Fatalf("SHED with a retry-after of %v (of an hour's freeze)", ra)
			}
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d CONCURRENCY_FULL, %d SHED", full, shed)
}
