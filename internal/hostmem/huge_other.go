//go:build !linux

package hostmem

const hugePages = false

func mapHuge(n int) ([]byte, error) { return mapAnon(n) }

func unmapHuge(b []byte) error { return unmap(b) }

func populate([]byte) bool { return false }

func release([]byte) error { return nil }
