// Addresses and sizes: a block's value addresses, formatted from
// per-key templates, and the bytes of its rows and of its value.

package tier

import (
	"unsafe"
)

// Addr is the address of block hash's value of key k (Namespace.Keys
// order).
func (t *Tier) Addr(hash uint64, k int) string {
	return string(t.appendAddr(make([]byte, 0, t.addrLen(k)), hash, k))
}

// appendAddr appends Addr(hash, k) to b.
func (t *Tier) appendAddr(b []byte, hash uint64, k int) []byte {
	start := len(b)
	b = append(b, t.tmpl[k]...)
	putHex(b[start+len(t.prefix):], hash)
	return b
}

// addrLen is the length of key k's addresses.
func (t *Tier) addrLen(k int) int { return len(t.tmpl[k]) }

// addrs are the addresses of every key of every block, block-major: views
// into one buffer, so a batch allocates twice, not once per value. Each is
// its key's template with the hash written in: one copy a value (a
// scheduler's Lookup of a long prompt asks for thousands).
func (t *Tier) addrs(hashes []uint64) []string {
	nk := len(t.ns.Keys)
	size := 0
	for k := range t.ns.Keys {
		size += t.addrLen(k)
	}
	buf := make([]byte, 0, size*len(hashes)) // never grown: the views stay valid
	keys := make([]string, 0, len(hashes)*nk)
	for _, h := range hashes {
		for k := range t.ns.Keys {
			start := len(buf)
			buf = t.appendAddr(buf, h, k)
			keys = append(keys, unsafe.String(&buf[start], len(buf)-start))
		}
	}
	return keys
}

// putHex writes h as 16 lower-case hex digits, zero-padded, into b[:16].
func putHex(b []byte, h uint64) {
	const digits = "0123456789abcdef"
	_ = b[15]
	for i := 15; i >= 0; i-- {
		b[i] = digits[h&15]
		h >>= 4
	}
}

// BlockBytes is the size of one block's rows of key k.
func (t *Tier) BlockBytes(k int) int { return t.ns.BlockSize * t.ns.Keys[k].RowBytes }

// ValueBytes is the encoded size of one block's value of key k.
func (t *Tier) ValueBytes(k int) int {
	return t.seal.valueSize(t.addrLen(k), t.ns.BlockSize, t.ns.Keys[k].RowBytes)
}
