package budget

// Unsend gives back the unit Allowance.Take took for an RPC that provably
// never left the client (its headers were never queued: no stats OutHeader),
// spent → free, since the allowance counts RPCs sent. Call it at most once
// per Take and only for such an RPC. It reports whether it had an effect; it
// does nothing on a sealed ledger or one with nothing spent.
func (a *Allowance) Unsend() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sealed || a.spent <= 0 {
		return false
	}
	a.spent--
	a.free++
	return true
}
