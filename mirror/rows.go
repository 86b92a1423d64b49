package mirror

// runEnd returns the end j > i of the run of slots from i on that continue
// slots[i] one by one (slots[k] == slots[i]+(k-i)) and stay below end.
// The scatter and gather loops copy such a run (within one chunk) with one
// copy: a prefill's rows go to runs of consecutive slots, and a call to
// memmove per row of 64 bytes costs more than its move (a decode step's
// rows, one per request, stay one copy each). Callers test the next slot
// before they work out end: a lone row then costs one compare (calling
// runEnd for every row is slower for a decode step's scattered rows, as
// BenchmarkRuns row=64 pattern=decode64 shows).
func runEnd(slots []int32, i int, end int32) int {
	s := slots[i]
	j := i + 1
	for j < len(slots) && s+int32(j-i) < end && slots[j] == s+int32(j-i) {
		j++
	}
	return j
}
