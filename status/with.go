package status

import "errors"

// With returns a copy of the *Error in err's chain with opts applied (for
// example to name the attempt, call and try a refusal answers), and err
// unchanged when its chain holds no *Error. The copy keeps the original's
// code, outcome, reason, message, cause and carried details; a WithMessage
// option appends to the message.
func With(err error, opts ...Option) error {
	var te *Error
	if !errors.As(err, &te) || te == nil {
		return err
	}
	e := &Error{code: te.code, msg: te.msg, cause: te.cause, outcome: te.outcome, reason: te.reason, f: te.f, carried: te.carried}
	e.f.Message = ""
	return build(e, opts, true, true)
}
