package status

import (
	"errors"

	grpcstatus "google.golang.org/grpc/status"
)

// With returns a copy of the *Error in err's chain with opts applied (for
// example to name the attempt, call and try a refusal answers), and err
// unchanged when its chain holds no *Error. The copy keeps the original's
// code, outcome, reason, cause and carried details; a WithMessage option
// appends to the message.
//
// When the *Error decides err's status (as [OutcomeOf] reads it), the
// copy's message is what grpc-go sends as the status message of err: the
// *Error's own message, and the text of a wrapper without a status of its
// own (a fmt.Errorf("reserve: %w", …) prefix), but not the text an error
// with its own GRPCStatus method adds to Error() alone. What wraps it is
// otherwise not kept — errors.Is and errors.As no longer find the other
// errors of err's chain — but for a [WithoutEffect] that encloses it,
// which the copy keeps: With(WithoutEffect(na), …) is WithoutEffect of the
// copy, and [HandlerOutcome] still reads it NOT_ADMITTED. When another
// error decides err's status (one errors.As looks past to find the *Error:
// an errors.Join's first branch, a status type that keeps the *Error as
// its cause), the copy has the *Error's own message, and no WithoutEffect:
// HandlerOutcome reads err UNKNOWN, and the copy so too.
func With(err error, opts ...Option) error {
	var te *Error
	if !errors.As(err, &te) || te == nil {
		return err
	}
	x := inspect(err)
	decides := decidedBy(&x, te)
	msg := te.msg
	if decides && err != error(te) {
		msg = grpcstatus.Convert(err).Message()
	}
	e := &Error{code: te.code, msg: msg, cause: te.cause, outcome: te.outcome, reason: te.reason, f: te.f, carried: te.carried}
	e.f.Message = ""
	e = build(e, opts, true, true)
	if decides && x.withoutEffect {
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
