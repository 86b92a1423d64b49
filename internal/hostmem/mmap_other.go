//go:build !unix

package hostmem

func mapAnon(n int) ([]byte, error) { return make([]byte, n), nil }

func unmap([]byte) error { return nil }
