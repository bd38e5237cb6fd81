package status

import (
	"errors"

	grpcstatus "google.golang.org/grpc/status"
)

// With returns a copy of the *Error that decides err's status (as
// [OutcomeOf] reads it) with opts applied (for example to name the attempt,
// call and try a refusal answers), and err unchanged when no *Error decides
// its status: when its chain holds none, or when another error does (one
// errors.As looks past to find the *Error: an errors.Join's first
// status-bearing branch, a status type that keeps the *Error as its cause),
// since that error's status is what grpc-go sends for err and the copy
// would send the *Error's instead. The copy keeps the original's code,
// outcome, reason, cause and carried details; a WithMessage option appends
// to the message.
//
// The copy's message is what grpc-go sends as the status message of err:
// the *Error's own message, and the text of a wrapper without a status of
// its own (a fmt.Errorf("reserve: %w", …) prefix), but not the text an
// error with its own GRPCStatus method adds to Error() alone; it is bounded
// and repaired as every message this package builds is (# Messages). What
// wraps the *Error is otherwise not kept — errors.Is and errors.As no
// longer find the other errors of err's chain — but for a [WithoutEffect]
// that encloses it, which the copy keeps: With(WithoutEffect(na), …) is
// WithoutEffect of the copy, and [HandlerOutcome] still reads it
// NOT_ADMITTED.
func With(err error, opts ...Option) error {
	var te *Error
	if !errors.As(err, &te) || te == nil {
		return err
	}
	x := inspect(err)
	if !decidedBy(&x, te) {
		return err
	}
	msg := te.msg
	if err != error(te) {
		msg = grpcstatus.Convert(err).Message()
	}
	e := &Error{code: te.code, msg: msg, cause: te.cause, outcome: te.outcome, reason: te.reason, f: te.f, carried: te.carried}
	e.f.Message = ""
	e = build(e, opts, true, true)
	if x.withoutEffect {
		return WithoutEffect(e)
	}
	return e
}

// decidedBy reports whether te decides the status x was read from: te
// itself, or an error whose GRPCStatus is te's (admission's refusal of a
// wait that its context ended).
func decidedBy(x *inspection, te *Error) bool {
	if x.te != nil {
		return x.te == te
	}
	return x.st != nil && x.st == te.GRPCStatus()
}
