// Package nilvalue tells a nil held in a non-nil interface, which the
// constructors that take a store refuse as they refuse a nil one.
package nilvalue

import "reflect"

// Typed reports whether x, a non-nil interface, holds a nil pointer, map,
// slice, channel, function or interface: a value whose methods would panic
// (a failed redisstore.New returns a nil *Store, say). A nil x is false.
func Typed(x any) bool {
	v := reflect.ValueOf(x)
	switch v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func, reflect.Interface:
		return v.IsNil()
	}
	return false
}
