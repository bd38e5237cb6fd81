package interceptor_test

import "strconv"

func strconvFormat(n int64) string { return strconv.FormatInt(n, 10) }
