package interceptor_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tollgate-go/tollgate/admission"
	"github.com/tollgate-go/tollgate/interceptor"
	testingv1 "github.com/tollgate-go/tollgate/internal/testproto/tollgate/testing/v1"
	"github.com/tollgate-go/tollgate/internal/testsvc"
	"github.com/tollgate-go/tollgate/status"
	"google.golang.org/grpc/metadata"
)

// AdmissionTap let through any request whose tollgate header claimed a past
// deadline, without asking whether the peer was trusted. The interceptor
// ignores an untrusted peer's header, so the exemption bought that peer
// nothing but a way around the tap: while the class was frozen (SHED), every
// such request had its body read and decoded (here 1 MiB) and reached Admit
// (found by review). Only a trusted peer's late try goes past the tap, and
// only to a server that keeps records.
func TestUntrustedStaleHeaderDoesNotBypassTheTap(t *testing.T) {
	var admitted atomic.Int64 // decisions Admit made (the tap's refusals make none)
	ctrl, err := admission.New(admission.WithClasses(admission.Class{Name: "work", Slots: 4}),
		admission.WithObserver(func(e admission.Event) {
			if e.Kind == admission.EventRefused {
				admitted.Add(1)
			}
		}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ctrl.Close() })
	_, err = ctrl.SetOverride(t.Context(), admission.Override{Actor: "op", Reason: "test", TTL: time.Hour, Class: "work", Freeze: true})
	require.NoError(t, err)
	svc := &testsvc.Service{ApplyFunc: func(context.Context, *testingv1.ApplyRequest) (*testingv1.ApplyResponse, error) {
		return &testingv1.ApplyResponse{}, nil
	}}
	// No WithTrustedPeer: every peer is untrusted.
	end := testsvc.StartT(t, testsvc.Bufconn, svc.Register, interceptor.ServerOptions(interceptor.WithAdmission(ctrl))...)
	client := testingv1.NewTestServiceClient(end.DialT(t))
	big := &testingv1.ApplyRequest{Key: strings.Repeat("x", 1<<20)}

	_, err = client.Apply(t.Context(), big)
	require.Equal(t, status.ReasonShed, status.OutcomeOf(err).Reason)
	require.Zero(t, admitted.Load(), "without a header the tap refuses before the body is read")

	ctx := metadata.AppendToOutgoingContext(t.Context(), "tollgate", "a=x;d=1")
	_, err = client.Apply(ctx, big)
	require.Equal(t, status.ReasonShed, status.OutcomeOf(err).Reason)
	require.Zero(t, admitted.Load(), "an untrusted peer's stale header took its 1 MiB request past the tap to Admit")
}
