package tier

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"fmt"
	"hash"
	"hash/crc32"
	"sync"
)

// Value layout (little endian), one full block's rows of one key:
//
//	off  size  field
//	0    4     magic: "octr" (sealed with crc32c) or "octm" (sealed with a
//	           keyed MAC, Options.Secret)
//	4    2     format version (FormatVersion)
//	6    2     address length n
//	8    4     block size (rows)
//	12   4     row bytes
//	16   8     the block's chained hash
//	24   n     the value's own address (Tier.Addr): namespace model, key
//	           layout fingerprint, block size, block hash and key name
//	24+n rows  blockSize × rowBytes
//	end  4|16  the seal of every byte before it: crc32c (Castagnoli), or
//	           the first 16 bytes of HMAC-SHA256 under Options.Secret
//
// A value is bound to its exact address: the reader compares the address
// in the header with the one it fetched, byte for byte, so a value copied
// under another address (another model's namespace, another layout,
// another block or key) is rejected even though its rows and checksum are
// intact. The crc32c seal detects accidents (a torn or flipped value);
// where others can write to the store, the MAC seal makes a value that was
// not written by a holder of the secret fail its check too. A value whose
// header disagrees with what the reader expects, or whose seal does not
// match, is a miss (ErrCorrupt wrapping ErrMiss), never served.
const (
	// FormatVersion is the value format this package writes and reads.
	FormatVersion = 2
	headerBytes   = 24
	crcBytes      = 4
	macBytes      = 16
	magicCRC      = "octr"
	magicMAC      = "octm"
	// MinSecretBytes is the shortest Options.Secret accepted.
	MinSecretBytes = 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sealer seals and checks values: crc32c without a secret, a truncated
// HMAC-SHA256 with one. Safe for concurrent use.
type sealer struct {
	secret []byte
	macs   sync.Pool // *macState
}

type macState struct {
	h   hash.Hash
	sum [sha256.Size]byte
}

func newSealer(secret []byte) *sealer {
	s := &sealer{}
	if len(secret) > 0 {
		s.secret = append([]byte(nil), secret...)
		s.macs.New = func() any { return &macState{h: hmac.New(sha256.New, s.secret)} }
	}
	return s
}

func (s *sealer) keyed() bool { return s.secret != nil }

func (s *sealer) tagBytes() int {
	if s.keyed() {
		return macBytes
	}
	return crcBytes
}

func (s *sealer) magic() string {
	if s.keyed() {
		return magicMAC
	}
	return magicCRC
}

// valueSize is the encoded size of a block whose address is addrLen bytes.
func (s *sealer) valueSize(addrLen, blockSize, rowBytes int) int {
	return headerBytes + addrLen + blockSize*rowBytes + s.tagBytes()
}

// encode appends the value of one block's rows (blockSize*rowBytes bytes)
// stored at addr to dst.
func (s *sealer) encode(dst []byte, addr string, hash uint64, blockSize, rowBytes int, rows []byte) []byte {
	if len(rows) != blockSize*rowBytes {
		panic(fmt.Sprintf("tier: encode of %d bytes for %d rows of %d bytes", len(rows), blockSize, rowBytes))
	}
	start := len(dst)
	dst = s.encodeHeader(dst, addr, hash, blockSize, rowBytes)
	dst = append(dst, rows...)
	dst = append(dst, make([]byte, s.tagBytes())...)
	s.seal(dst[start:])
	return dst
}

// encodeHeader appends a value's header (everything before the rows).
func (s *sealer) encodeHeader(dst []byte, addr string, hash uint64, blockSize, rowBytes int) []byte {
	dst = append(dst, s.magic()...)
	dst = binary.LittleEndian.AppendUint16(dst, FormatVersion)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(addr)))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(blockSize))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(rowBytes))
	dst = binary.LittleEndian.AppendUint64(dst, hash)
	return append(dst, addr...)
}

// seal writes the seal of a value built in place (header and rows
// written, the seal's space at the end).
func (s *sealer) seal(v []byte) {
	n := len(v) - s.tagBytes()
	if !s.keyed() {
		binary.LittleEndian.PutUint32(v[n:], crc32.Checksum(v[:n], castagnoli))
		return
	}
	m := s.macs.Get().(*macState)
	m.h.Reset()
	m.h.Write(v[:n])
	copy(v[n:], m.h.Sum(m.sum[:0]))
	s.macs.Put(m)
}

// sealed reports whether v's seal matches its contents.
func (s *sealer) sealed(v []byte) bool {
	n := len(v) - s.tagBytes()
	if !s.keyed() {
		return crc32.Checksum(v[:n], castagnoli) == binary.LittleEndian.Uint32(v[n:])
	}
	m := s.macs.Get().(*macState)
	m.h.Reset()
	m.h.Write(v[:n])
	ok := subtle.ConstantTimeCompare(m.h.Sum(m.sum[:0])[:macBytes], v[n:]) == 1
	s.macs.Put(m)
	return ok
}

// decode checks v against the address it was read from and returns its
// rows (a sub-slice of v). Any mismatch is ErrCorrupt (which matches
// ErrMiss).
func (s *sealer) decode(v []byte, addr string, hash uint64, blockSize, rowBytes int) ([]byte, error) {
	want := s.valueSize(len(addr), blockSize, rowBytes)
	bad := func(format string, a ...any) ([]byte, error) {
		return nil, fmt.Errorf("%w: %w: "+format, append([]any{ErrMiss, ErrCorrupt}, a...)...)
	}
	if len(v) < headerBytes {
		return bad("%d bytes, want %d", len(v), want)
	}
	if m := string(v[:4]); m != s.magic() {
		if m == magicCRC || m == magicMAC {
			return bad("sealed with %s, this tier %s (Options.Secret set on one side only)", sealName(m), sealName(s.magic()))
		}
		return bad("magic %q", v[:4])
	}
	if ver := binary.LittleEndian.Uint16(v[4:]); ver != FormatVersion {
		return bad("format version %d, want %d", ver, FormatVersion)
	}
	if len(v) != want {
		return bad("%d bytes, want %d", len(v), want)
	}
	if !s.sealed(v) {
		if s.keyed() {
			return bad("MAC does not match (written without this tier's secret, or altered)")
		}
		return bad("checksum does not match")
	}
	n := int(binary.LittleEndian.Uint16(v[6:]))
	bs := int(binary.LittleEndian.Uint32(v[8:]))
	rb := int(binary.LittleEndian.Uint32(v[12:]))
	h := binary.LittleEndian.Uint64(v[16:])
	switch {
	case n != len(addr) || string(v[headerBytes:headerBytes+n]) != addr:
		return bad("stored for address %q, read at %q", v[headerBytes:headerBytes+min(n, len(v)-headerBytes)], addr)
	case bs != blockSize:
		return bad("block size %d, want %d", bs, blockSize)
	case rb != rowBytes:
		return bad("row bytes %d, want %d", rb, rowBytes)
	case h != hash:
		return bad("block hash %016x, want %016x", h, hash)
	}
	return v[headerBytes+n : len(v)-s.tagBytes()], nil
}

func sealName(magic string) string {
	if magic == magicMAC {
		return "a keyed MAC"
	}
	return "crc32c"
}
