//go:build unix

package hostmem

import (
	"fmt"
	"syscall"
)

func mapAnon(n int) ([]byte, error) {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("hostmem: mmap of %d bytes: %w", n, err)
	}
	return b, nil
}

func unmap(b []byte) error {
	if err := syscall.Munmap(b); err != nil {
		return fmt.Errorf("hostmem: munmap of %d bytes: %w", len(b), err)
	}
	return nil
}
