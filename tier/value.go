package tier

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// Value layout (little endian), one full block's rows of one key:
//
//	off  size  field
//	0    4     magic "octr"
//	4    2     format version (FormatVersion)
//	6    2     key name length n
//	8    4     block size (rows)
//	12   4     row bytes
//	16   8     the block's chained hash (the address names it too: a value
//	           stored under another block's address fails the check)
//	24   n     key name
//	24+n rows  blockSize × rowBytes
//	end  4     crc32c (Castagnoli) of every byte before it
//
// A value whose header disagrees with what the reader expects (version, key
// name, row bytes, block size, hash) or whose checksum does not match is a
// miss (ErrCorrupt wrapping ErrMiss), never served.
const (
	// FormatVersion is the value format this package writes and reads.
	FormatVersion = 1
	headerBytes   = 24
	crcBytes      = 4
	magic         = "octr"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// valueSize is the encoded size of a block of key k.
func valueSize(name string, blockSize, rowBytes int) int {
	return headerBytes + len(name) + blockSize*rowBytes + crcBytes
}

// encode appends the value of one block's rows (blockSize*rowBytes bytes)
// of key name to dst.
func encode(dst []byte, name string, hash uint64, blockSize, rowBytes int, rows []byte) []byte {
	if len(rows) != blockSize*rowBytes {
		panic(fmt.Sprintf("tier: encode of %d bytes for %d rows of %d bytes", len(rows), blockSize, rowBytes))
	}
	start := len(dst)
	dst = encodeHeader(dst, name, hash, blockSize, rowBytes)
	dst = append(dst, rows...)
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// encodeHeader appends a value's header (everything before the rows).
func encodeHeader(dst []byte, name string, hash uint64, blockSize, rowBytes int) []byte {
	dst = append(dst, magic...)
	dst = binary.LittleEndian.AppendUint16(dst, FormatVersion)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(name)))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(blockSize))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(rowBytes))
	dst = binary.LittleEndian.AppendUint64(dst, hash)
	return append(dst, name...)
}

// seal writes the checksum of a value built in place (header and rows
// written, checksum space at the end).
func seal(v []byte) {
	n := len(v) - crcBytes
	binary.LittleEndian.PutUint32(v[n:], crc32.Checksum(v[:n], castagnoli))
}

// decode checks v against what the reader expects and returns its rows
// (a sub-slice of v). Any mismatch is ErrCorrupt (which matches ErrMiss).
func decode(v []byte, name string, hash uint64, blockSize, rowBytes int) ([]byte, error) {
	want := valueSize(name, blockSize, rowBytes)
	bad := func(format string, a ...any) ([]byte, error) {
		return nil, fmt.Errorf("%w: %w: "+format, append([]any{ErrMiss, ErrCorrupt}, a...)...)
	}
	if len(v) != want {
		return bad("%d bytes, want %d", len(v), want)
	}
	if string(v[:4]) != magic {
		return bad("magic %q", v[:4])
	}
	if ver := binary.LittleEndian.Uint16(v[4:]); ver != FormatVersion {
		return bad("format version %d, want %d", ver, FormatVersion)
	}
	if got := crc32.Checksum(v[:len(v)-crcBytes], castagnoli); got != binary.LittleEndian.Uint32(v[len(v)-crcBytes:]) {
		return bad("checksum %08x does not match", got)
	}
	n := int(binary.LittleEndian.Uint16(v[6:]))
	bs := int(binary.LittleEndian.Uint32(v[8:]))
	rb := int(binary.LittleEndian.Uint32(v[12:]))
	h := binary.LittleEndian.Uint64(v[16:])
	switch {
	case n != len(name) || string(v[headerBytes:headerBytes+n]) != name:
		return bad("key name %q, want %q", v[headerBytes:headerBytes+min(n, len(v)-headerBytes)], name)
	case bs != blockSize:
		return bad("block size %d, want %d", bs, blockSize)
	case rb != rowBytes:
		return bad("row bytes %d, want %d", rb, rowBytes)
	case h != hash:
		return bad("block hash %016x, want %016x", h, hash)
	}
	return v[headerBytes+n : len(v)-crcBytes], nil
}
