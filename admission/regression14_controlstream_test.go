package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"google.golang.org/grpc/tap"
)

// Without a control class, health and reflection fall in the default class;
// tollgate's interceptor still runs them without a slot, so the tap must
// not refuse them when that class is full. A review found it refused a
// health Check QUEUE_FULL there.
func TestRegression14TapPassesSlotlessControlMethodsWithoutAControlClass(t *testing.T) {
	h := newHarness(t, admission.WithoutControlClass(), admission.WithClasses(
		admission.Class{Name: "B", Slots: 1, QueueItems: 1, ExpectedServiceTime: 10 * time.Millisecond}),
		admission.WithDefaultClass("B"))
	p := h.admitted(work("/demo.B/Do"))
	defer p.Abandon()
	h.queued(work("/demo.B/Do"))
	_, err := h.ctrl.TapHandle(context.Background(), &tap.Info{FullMethodName: "/demo.B/Do"})
	require.Error(t, err, "precondition: the class is full and the tap refuses its methods")
	for _, m := range []string{"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch",
		"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"} {
		_, err := h.ctrl.TapHandle(context.Background(), &tap.Info{FullMethodName: m})
		require.NoError(t, err, m)
	}
	for _, r := range h.done {
		if r.permit != nil {
			r.permit.Abandon()
		}
	}
}
