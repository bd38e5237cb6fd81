package admission

import (
	"context"

	"google.golang.org/grpc/tap"
)

// TapHandle is the controller's early refusal (stub until issue 6 lands).
func (c *Controller) TapHandle(ctx context.Context, _ *tap.Info) (context.Context, error) {
	return ctx, nil
}
