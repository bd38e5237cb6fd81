package admission_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/status"
)

// A waiter that can no longer finish by its deadline (its deadline less the
// class's service estimate has passed) gives up by a timer of its own and is
// refused DEADLINE_EXPIRED while its caller still listens; before, it waited
// until its caller's context ended (found by review). The refusal does not
// wrap the context's error: the context had not ended.
func TestWaiterGivesUpOnceItCannotFinish(t *testing.T) {
	c, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 1, QueueItems: 1,
		ExpectedServiceTime: 100 * time.Millisecond}), admission.WithDefaultClass("work"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := c.Admit(context.Background(), admission.Request{Method: "/a/b"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	deadline := time.Now().Add(600 * time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	_, err = c.Admit(ctx, admission.Request{Method: "/a/b", Deadline: deadline})
	o := status.OutcomeOf(err)
	if o.Kind != status.KindNotAdmitted || o.Reason != status.ReasonDeadlineExpired {
		t.Fatalf("queued past the point it could finish: %v, want NOT_ADMITTED DEADLINE_EXPIRED", err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the waiter waited for its caller's context to end: %v", err)
	}
	if s, _ := c.Stats().Class("work"); s.Queued != 0 {
		t.Fatalf("the waiter still holds its place: %+v", s)
	}
}
