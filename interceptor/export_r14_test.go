package interceptor

// RerootedTries is the process-wide count of RPCs the stats handler saw
// carrying a try's tollgate header in a context without its delivery
// record (see rerootedTries), for the black-box tests.
func RerootedTries() uint64 { return rerootedTries.Load() }

// RerootedQueries is the count of resolution queries sent so (see
// rerootedQueries).
func RerootedQueries() uint64 { return rerootedQueries.Load() }
