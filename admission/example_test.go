package admission_test

import (
	"context"
	"fmt"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A server with a heavy class (6 slots, 12 waiting) and a reserved control
// class (2 slots, 4 waiting) for delivery-control methods. A request either
// gets a permit, which it releases when its work ends, or a typed refusal.
func ExampleNew() {
	ctrl, err := admission.New(
		admission.WithClasses(
			admission.Class{Name: "heavy", Slots: 6, QueueItems: 12, ExpectedServiceTime: 2 * time.Second},
			admission.Class{Name: admission.ControlClass, Slots: 2, QueueItems: 4},
		),
		admission.WithMethods(admission.ControlClass, "/parcelworks.Platform/"),
		admission.WithDefaultClass("heavy"),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ctrl.Close()

	ctx := context.Background()
	p, err := ctrl.Admit(ctx, admission.Request{Method: "/ci.Tests/Run", Size: 512})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("admitted into", p.Class())
	p.Release()

	// A deadline that the learned service time cannot meet is refused
	// before the work is queued, with a stable reason.
	_, err = ctrl.Admit(ctx, admission.Request{
		Method: "/ci.Tests/Run", Size: 512, Deadline: time.Now().Add(time.Second),
	})
	o := status.OutcomeOf(err)
	fmt.Println(o.Kind, status.ReasonName(o.Reason), o.Detail.GetWorkloadClass())
	// Output:
	// admitted into heavy
	// NOT_ADMITTED DEADLINE_UNREACHABLE heavy
}

// An operator freezes a class for ten minutes during an incident; the
// override is attributed and expires by itself.
func ExampleController_SetOverride() {
	ctrl, _ := admission.New(admission.WithClasses(admission.Class{Name: "batch", Slots: 4, QueueItems: 8}))
	defer ctrl.Close()
	ctx := context.Background()
	_, err := ctrl.SetOverride(ctx, admission.Override{
		Actor: "oncall@example.com", Reason: "INC-1640: database saturated",
		TTL: 10 * time.Minute, Class: "batch", Freeze: true,
	})
	fmt.Println(err)
	_, err = ctrl.Admit(ctx, admission.Request{Method: "/batch.Jobs/Run", Size: -1})
	fmt.Println(status.ReasonName(status.OutcomeOf(err).Reason))
	_, err = ctrl.SetOverride(ctx, admission.Override{
		Actor: "oncall@example.com", Reason: "more", TTL: time.Minute, Class: "batch", Slots: 16,
	})
	fmt.Println(err)
	// Output:
	// <nil>
	// SHED
	// admission: invalid override: slots 16 above the configured 4
}

// AdmitDecision reports, with the permit or the refusal, how many requests
// were queued ahead of the request when the controller decided: here one
// slot and one place; the third request finds the one waiting request ahead
// of it and is refused.
func ExampleController_AdmitDecision() {
	queued := make(chan struct{}, 1)
	ctrl, err := admission.New(
		admission.WithClasses(admission.Class{Name: "batch", Slots: 1, QueueItems: 1}),
		admission.WithDefaultClass("batch"),
		admission.WithObserver(func(e admission.Event) {
			if e.Kind == admission.EventQueued {
				queued <- struct{}{}
			}
		}),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ctrl.Close()
	ctx := context.Background()
	r := admission.Request{Method: "/batch.Jobs/Run", Size: -1}

	running, d, _ := ctrl.AdmitDecision(ctx, r)
	fmt.Println("admitted into", d.Class, "behind", d.QueuedAhead)

	waiting := make(chan *admission.Permit)
	go func() {
		p, _ := ctrl.Admit(ctx, r)
		waiting <- p
	}()
	<-queued

	_, d, err = ctrl.AdmitDecision(ctx, r)
	fmt.Println(status.ReasonName(status.OutcomeOf(err).Reason), "behind", d.QueuedAhead)

	running.Release()
	p := <-waiting
	fmt.Println("the waiter started; it had joined the queue behind", p.QueuedAhead())
	p.Release()
	// Output:
	// admitted into batch behind 0
	// QUEUE_FULL behind 1
	// the waiter started; it had joined the queue behind 0
}
