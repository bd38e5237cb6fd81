package status

import (
	"time"

	tollgatev1 "github.com/tollgate-go/tollgate/proto/tollgate/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The details are encoded by hand: building the messages and marshalling them
// through proto costs several allocations per refusal (each message, each
// Duration, each output buffer, each type URL); encoding both into one buffer
// costs one. TestDetailEncoding checks the bytes against proto.Unmarshal and
// fails when OutcomeDetail gains a field this encoder does not know.

const typeURLPrefix = "type.googleapis.com/"

var (
	outcomeDetailURL = typeURL(&tollgatev1.OutcomeDetail{})
	retryInfoURL     = typeURL(&errdetails.RetryInfo{})
	errorInfoURL     = typeURL(&errdetails.ErrorInfo{})
)

func typeURL(m proto.Message) string {
	return typeURLPrefix + string(m.ProtoReflect().Descriptor().FullName())
}

// OutcomeDetail field numbers (proto/tollgate/v1/tollgate.proto).
const (
	fieldOutcome          protowire.Number = 1
	fieldReason           protowire.Number = 2
	fieldAttemptID        protowire.Number = 3
	fieldCall             protowire.Number = 4
	fieldTry              protowire.Number = 5
	fieldRetryAfter       protowire.Number = 6
	fieldWorkloadClass    protowire.Number = 7
	fieldUnitsRemaining   protowire.Number = 8
	fieldFinal            protowire.Number = 9
	fieldFencedThroughTry protowire.Number = 10
)

// encodeDetails returns the wire form of e's OutcomeDetail and, when e
// suggests a delay, of its google.rpc.RetryInfo, both in one allocation.
func (e *Error) encodeDetails() (detail, retryInfo []byte) {
	durLen := 0
	if e.f.RetryAfter > 0 {
		durLen = durationSize(e.f.RetryAfter)
	}
	n := varintFieldSize(fieldOutcome, uint64(int64(e.outcome))) +
		varintFieldSize(fieldReason, uint64(int64(e.reason))) +
		stringFieldSize(fieldAttemptID, e.f.AttemptID) +
		stringFieldSize(fieldCall, e.f.Call) +
		varintFieldSize(fieldTry, uint64(e.f.Try)) +
		stringFieldSize(fieldWorkloadClass, e.f.Class) +
		varintFieldSize(fieldUnitsRemaining, uint64(e.f.UnitsRemaining)) +
		varintFieldSize(fieldFinal, protowire.EncodeBool(e.f.Final)) +
		varintFieldSize(fieldFencedThroughTry, uint64(e.f.FencedThroughTry))
	msgFieldLen := 0
	if durLen > 0 {
		msgFieldLen = protowire.SizeTag(fieldRetryAfter) + protowire.SizeBytes(durLen)
	}
	n += msgFieldLen // retry_after in the detail, field 6
	// RetryInfo.retry_delay is field 1; its tag has the same size as field 6's.

	buf := make([]byte, 0, n+msgFieldLen)
	b := buf
	b = appendVarintField(b, fieldOutcome, uint64(int64(e.outcome)))
	b = appendVarintField(b, fieldReason, uint64(int64(e.reason)))
	b = appendStringField(b, fieldAttemptID, e.f.AttemptID)
	b = appendStringField(b, fieldCall, e.f.Call)
	b = appendVarintField(b, fieldTry, uint64(e.f.Try))
	if durLen > 0 {
		b = appendDurationField(b, fieldRetryAfter, e.f.RetryAfter, durLen)
	}
	b = appendStringField(b, fieldWorkloadClass, e.f.Class)
	b = appendVarintField(b, fieldUnitsRemaining, uint64(e.f.UnitsRemaining))
	b = appendVarintField(b, fieldFinal, protowire.EncodeBool(e.f.Final))
	b = appendVarintField(b, fieldFencedThroughTry, uint64(e.f.FencedThroughTry))
	detail = b[:len(b):len(b)]
	if durLen > 0 {
		retryInfo = appendDurationField(b[len(b):], 1, e.f.RetryAfter, durLen)
	}
	return detail, retryInfo
}

func varintFieldSize(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0 // proto3: zero values are not sent
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func stringFieldSize(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(s))
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// durationParts splits a positive duration as google.protobuf.Duration does.
func durationParts(d time.Duration) (seconds int64, nanos int32) {
	return int64(d / time.Second), int32(d % time.Second)
}

// durationSize is the encoded size of a google.protobuf.Duration holding d.
func durationSize(d time.Duration) int {
	s, ns := durationParts(d)
	return varintFieldSize(1, uint64(s)) + varintFieldSize(2, uint64(int64(ns)))
}

func appendDurationField(b []byte, num protowire.Number, d time.Duration, size int) []byte {
	s, ns := durationParts(d)
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	b = appendVarintField(b, 1, uint64(s))
	return appendVarintField(b, 2, uint64(int64(ns)))
}
